"""The ``tpuprov`` console script: plan on the bundled examples, help, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.paths import REPO
from tpuprov.main import main


def test_plan_multislice_example_json(capsys):
    assert main(["plan", "-f", str(REPO / "examples/jobset-v6e-multislice.yaml"), "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["slice"], r["machine_type"], r["node_count"], r["total_chips"]) for r in rows] == [
        ("slice[0]", "ct6e-standard-4t", 4, 16),
        ("slice[1]", "ct6e-standard-4t", 4, 16),
    ]
    assert len({r["pool"] for r in rows}) == 2 and all(len(r["pool"]) <= 40 for r in rows)
    assert all(r["placement"] == "COMPACT 4x4" for r in rows)


def test_plan_single_host_spot_example_table(capsys):
    assert main(["plan", "-f", str(REPO / "examples/jobset-v5e-single-host-spot.yaml")]) == 0
    out = capsys.readouterr().out
    assert "ct5lp-hightpu-8t" in out and "spot" in out and "COMPACT" not in out


def test_plan_shows_the_capacity_order_of_the_jobsets_policy(tmp_path, monkeypatch, capsys):
    manifest = yaml.safe_load((REPO / "examples/jobset-v6e-multislice.yaml").read_text())
    manifest["metadata"].setdefault("annotations", {})["tpuprov.dev/capacity-policy"] = "spot, on-demand"
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(manifest))
    monkeypatch.delenv("CAPACITY_POLICY", raising=False)
    assert main(["plan", "-f", str(path), "--output", "json", "--location", "us-east5-b"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["capacity"] for r in rows} == {"spot@us-east5-b -> on-demand@us-east5-b"}
    assert all(r["note"] == "spot" for r in rows)  # the first attempt is a Spot pool


def test_plan_reports_unsupported_shapes(tmp_path, capsys):
    manifest = (REPO / "examples/jobset-v6e-multislice.yaml").read_text().replace("4x4", "3x3")
    path = tmp_path / "bad.yaml"
    path.write_text(manifest)
    assert main(["plan", "-f", str(path), "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["pool"] == "" and "3x3" in r["note"] for r in rows)


@pytest.mark.parametrize(
    "content", ["", "kind: ConfigMap\n", ": : :\n- ["], ids=["empty", "no-jobset", "bad-yaml"]
)
def test_plan_bad_files_exit_2(tmp_path, content, capsys):
    path = tmp_path / "x.yaml"
    path.write_text(content)
    assert main(["plan", "-f", str(path)]) == 2
    assert "tpuprov plan" in capsys.readouterr().err


def test_console_script_help_lists_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "tpuprov", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("plan", "catalog", "decode"):
        assert command in out.stdout
