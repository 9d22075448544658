"""The ``tpuprov`` console script: plan on the bundled examples, help, bad input."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.paths import REPO
from tpuprov.main import build_parser, main


def test_plan_multislice_example_json(monkeypatch, capsys):
    monkeypatch.setenv("NODE_LABEL_KEYS", "team")  # the example selects team=research
    assert main(["plan", "-f", str(REPO / "examples/jobset-v6e-multislice.yaml"), "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["slice"], r["machine_type"], r["node_count"], r["total_chips"]) for r in rows] == [
        ("slice[0]", "ct6e-standard-4t", 4, 16),
        ("slice[1]", "ct6e-standard-4t", 4, 16),
    ]
    assert len({r["pool"] for r in rows}) == 2 and all(len(r["pool"]) <= 40 for r in rows)
    assert all(r["placement"] == "COMPACT 4x4" for r in rows)


def test_plan_refuses_a_selector_no_operator_allowed_as_a_node_label(monkeypatch, capsys):
    # Under the defaults no tenant selector becomes a node label: the example's team=research is
    # refused with the way forward, and nothing would be bought.
    monkeypatch.delenv("NODE_LABEL_KEYS", raising=False)
    assert main(["plan", "-f", str(REPO / "examples/jobset-v6e-multislice.yaml"), "--output", "json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert all("NODE_LABEL_KEYS does not allow that key" in r["refused"] and not r["pool"] for r in rows)


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
    monkeypatch.setenv("NODE_LABEL_KEYS", "team")
    assert main(["plan", "-f", str(path), "--output", "json", "--location", "us-east5-b"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["capacity"] for r in rows} == {"spot@us-east5-b -> on-demand@us-east5-b"}
    assert all(r["note"] == "spot" for r in rows)  # the first attempt is a Spot pool


def test_plan_reports_unsupported_shapes(tmp_path, capsys):
    manifest = (REPO / "examples/jobset-v6e-multislice.yaml").read_text().replace("4x4", "3x3")
    path = tmp_path / "bad.yaml"
    path.write_text(manifest)
    assert main(["plan", "-f", str(path), "--output", "json"]) == 1, "a refused slice fails the plan"
    captured = capsys.readouterr()
    offered = "v6e (tpu-v6e-slice) offers 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16"
    why = f"TPU topology 3x3 is not offered for v6e; {offered}"
    assert json.loads(captured.out) == [
        {
            "jobset": "team-a/llama-pretrain",
            "slice": f"slice[{i}]",
            "pool": "",
            "machine_type": "",
            "node_count": 0,
            "topology": "",
            "total_chips": 0,
            "placement": "",
            "capacity": "",
            "note": why,
            "refused": why,
            "selectors": {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice: set by GKE from config.machineType",
                "cloud.google.com/gke-tpu-topology": "3x3: set by GKE from placementPolicy.tpuTopology",
                "team": "research: set by the product as a node label",
            },
            "warning": "",
        }
        for i in (0, 1)
    ]
    assert captured.err.splitlines()[-1] == "tpuprov plan: 2 slice(s) would be refused"


def test_plan_of_a_cpu_job_beside_tpu_slices_is_not_a_refusal(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NODE_LABEL_KEYS", "team")
    manifest = yaml.safe_load((REPO / "examples/jobset-v6e-multislice.yaml").read_text())
    cpu = yaml.safe_load(yaml.safe_dump(manifest["spec"]["replicatedJobs"][0]))
    cpu["name"], cpu["replicas"] = "coordinator", 1
    cpu["template"]["spec"]["template"]["spec"]["nodeSelector"] = {}
    cpu["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
    manifest["spec"]["replicatedJobs"].append(cpu)
    path = tmp_path / "mixed.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert main(["plan", "-f", str(path), "-o", "yaml"]) == 0
    rows = yaml.safe_load(capsys.readouterr().out)
    assert [(r["slice"], bool(r["pool"]), r["refused"]) for r in rows] == [
        ("slice[0]", True, ""),
        ("slice[1]", True, ""),
        ("coordinator[0]", False, ""),
    ]


BAD_MANIFESTS = {
    "empty": ("", "x.yaml is empty"),
    "blank": ("\n  \n", "x.yaml is empty"),
    "no-jobset": ("kind: ConfigMap\n", "no JobSet in x.yaml (no document has kind: JobSet)"),
    "not-yaml": (
        ": : :\n- [",
        "x.yaml is not valid YAML: expected <block end>, but found ':' (line 1, column 1)",
    ),
    "scalar-document": (
        "just words\n",
        "x.yaml is not a valid manifest: document 1 is the string 'just words', not a Kubernetes object",
    ),
    "spec-5": (
        "kind: JobSet\nmetadata: {name: a}\nspec: 5\n",
        "x.yaml is not a valid manifest: JobSet a: spec must be a mapping, not the number 5",
    ),
    "no-spec-no-name": (
        "kind: JobSet\n",
        "x.yaml is not a valid manifest: the JobSet of document 1: metadata.name is required; "
        "the JobSet of document 1: spec is required",
    ),
    "replicas-two": (
        "kind: JobSet\nmetadata: {name: a}\nspec:\n  replicatedJobs:\n"
        "  - {name: s, replicas: two, template: {spec: {parallelism: true, "
        "template: {spec: {containers: []}}}}}\n",
        "x.yaml is not a valid manifest: JobSet a: spec.replicatedJobs[0].replicas must be an integer, "
        "not the string 'two'; JobSet a: spec.replicatedJobs[0].template.spec.parallelism must be an "
        "integer, not a boolean",
    ),
    "selector-list": (
        "kind: JobSet\nmetadata: {name: a}\nspec:\n  replicatedJobs:\n  - name: s\n    template:\n"
        "      spec: {template: {spec: {nodeSelector: [x], containers: [{name: c, resources: {limits: "
        "{google.com/tpu: [4]}}}]}}}\n",
        "x.yaml is not a valid manifest: JobSet a: "
        "spec.replicatedJobs[0].template.spec.template.spec.nodeSelector must be a mapping, not a list; "
        "JobSet a: spec.replicatedJobs[0].template.spec.template.spec.containers[0]"
        ".resources.limits.google.com/tpu must be a quantity (a number or a string), not a list",
    ),
}


@pytest.mark.parametrize(("content", "message"), BAD_MANIFESTS.values(), ids=BAD_MANIFESTS.keys())
def test_plan_bad_files_exit_2_with_the_reason(tmp_path, monkeypatch, content, message, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.yaml").write_text(content)
    assert main(["plan", "-f", "x.yaml"]) == 2
    assert capsys.readouterr() == ("", f"tpuprov plan: {message}\n")


def test_plan_of_an_unreadable_file_says_so(tmp_path, capsys):
    (tmp_path / "x.yaml").write_bytes(b"\xff\xfe")
    assert main(["plan", "-f", str(tmp_path / "x.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_plan_piped_into_head_ends_quietly(tmp_path):
    """The reader closes the pipe after one line, long before the plan is written: no traceback."""
    manifest = (
        (REPO / "examples/jobset-v6e-multislice.yaml").read_text().replace("replicas: 2", "replicas: 3000")
    )
    path = tmp_path / "wide.yaml"
    path.write_text(manifest)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tpuprov", "plan", "-f", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        # Buffered, as a user's shell runs it: unbuffered, a large write ends short instead of failing.
        env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"JOBSET")
    proc.stdout.close()  # what `head -1` does once it has its line
    err = proc.stderr.read()
    proc.stderr.close()
    assert (proc.wait(timeout=60), err) == (141, b"")


def test_status_without_a_cluster_names_the_flags_that_give_one(monkeypatch, capsys):
    for name in ("PROJECT_ID", "LOCATION", "CLUSTER_NAME"):
        monkeypatch.delenv(name, raising=False)
    assert main(["status", "--project", "p"]) == 2
    assert capsys.readouterr().err == (
        "tpuprov status: which cluster? give --location (or $LOCATION), --cluster (or $CLUSTER_NAME)\n"
    )
    assert main(["why", "team-a/pod", "--location", "l"]) == 2
    assert capsys.readouterr().err == (
        "tpuprov why: which cluster? give --project (or $PROJECT_ID), --cluster (or $CLUSTER_NAME)\n"
    )


def test_console_script_help_lists_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "tpuprov", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("plan", "catalog", "decode"):
        assert command in out.stdout


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every leaf command of the CLI by its words, e.g. ("publish", "setup")."""
    found: dict[tuple[str, ...], Any] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                found.update(_commands(sub, (*path, word)))
    return found or {path: parser}


# Commands that print a run's timeline or a benchmark report, not a result to parse.
NO_RESULT = {("demo",), ("sandbox", "up"), ("sandbox", "demo"), ("bench",)}


def test_every_command_that_prints_a_result_takes_o_table_json_yaml():
    commands = _commands(build_parser())
    assert set(commands) > NO_RESULT
    for words, parser in commands.items():
        output = [a for a in parser._actions if a.dest == "output"]
        if words in NO_RESULT:
            assert not output, words
            continue
        [action] = output
        spelled = (action.option_strings, action.choices)
        assert spelled == (["-o", "--output"], ("table", "json", "yaml")), words


def test_a_fleet_cluster_is_named_by_name_or_path_and_an_ambiguous_name_is_refused() -> None:
    from shared.core.errors import InvalidInputError
    from shared.core.settings import Settings
    from tpuprov.cluster import fleet_member

    one, other = (
        "projects/p/locations/us-east5-b/clusters/train",
        "projects/q/locations/us-west4-a/clusters/train",
    )
    settings = Settings(project_id="p", location="us-east5-b", cluster_name="c", fleet_clusters=(one, other))
    assert fleet_member(settings, one).cluster_path == one
    assert fleet_member(settings, "c").cluster_path == settings.cluster_path
    with pytest.raises(InvalidInputError, match=r"names .*train, .*train: give the path"):
        fleet_member(settings, "train")
    with pytest.raises(InvalidInputError, match="is not a cluster of the fleet"):
        fleet_member(settings, "elsewhere")
