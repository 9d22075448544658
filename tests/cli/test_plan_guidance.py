"""``tpuprov plan`` says what a new user needs to hear, in their manifest's words (golden outputs).

Who sets each selected key (not ``key=word``, which reads as a value), a pod pinned to the user's
own pool, xpk's ``--flex`` selector with the way forward, a topology given in GKE's slice
annotation, and a zone that does not offer the generation (the default zone, without a location).
``UPDATE_GOLDEN=1`` rewrites the goldens after an intended change (review the diff).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.goldens import assert_golden, manifest_file
from tpuprov.main import main

UID = "0b9a1c3e-1111-4222-8333-444455556666"


def _jobset(
    name: str,
    selectors: dict[str, str],
    pods: int = 2,
    annotations: dict[str, str] | None = None,
    chips: int = 4,
) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": selectors,
            "containers": [{"name": "t", "image": "jax", "resources": {"limits": {"google.com/tpu": chips}}}],
        }
    }
    if annotations:
        template["metadata"] = {"annotations": annotations}
    job = {"parallelism": pods, "completions": pods, "template": template}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "ml", "uid": UID},
        "spec": {"replicatedJobs": [{"name": "slice", "replicas": 1, "template": {"spec": job}}]},
    }


V6E = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "2x4"}
MANIFEST = [
    _jobset("spotty", {**V6E, "cloud.google.com/gke-spot": "true", "team": "research"}),
    _jobset("pinned", {**V6E, "cloud.google.com/gke-nodepool": "my-v6e-pool"}),
    _jobset("xpk-flex", {**V6E, "cloud.google.com/gke-queued": "true"}),
    _jobset(
        "super",
        {"cloud.google.com/gke-tpu-accelerator": "tpu7x"},
        pods=16,
        annotations={"cloud.google.com/gke-tpu-slice-topology": "4x4x4"},
    ),
]


@pytest.fixture
def manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return manifest_file(tmp_path, monkeypatch, "guidance.yaml", MANIFEST, {"NODE_LABEL_KEYS": "team"})


def test_plan_table_and_what_it_says_after(manifest: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(manifest)]) == 1  # xpk-flex and super are refused
    captured = capsys.readouterr()
    assert_golden("plan-guidance.txt", captured.out + "--- stderr\n" + captured.err)


def test_plan_json_carries_each_reason_and_warning(
    manifest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-f", str(manifest), "-o", "json"]) == 1
    out = capsys.readouterr().out
    assert_golden("plan-guidance.json", out)
    rows = {r["jobset"]: r for r in json.loads(out)}
    assert "Cloud TPU lists v6e (tpu-v6e-slice) only in" in rows["ml/spotty"]["warning"]
    assert "not in us-central2-b" in rows["ml/spotty"]["warning"]
    assert rows["ml/pinned"]["note"].startswith("pinned to your node pool 'my-v6e-pool'")
    assert not rows["ml/pinned"]["refused"]
    assert "select cloud.google.com/gke-flex-start=true instead" in rows["ml/xpk-flex"]["refused"]
    assert "in the annotation cloud.google.com/gke-tpu-slice-topology" in rows["ml/super"]["refused"]
    assert "select cloud.google.com/gke-tpu-topology: 4x4x4" in rows["ml/super"]["refused"]


def test_a_zone_that_offers_the_generation_gets_no_warning(
    manifest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["plan", "-f", str(manifest), "--location", "us-east5-b"])
    err = capsys.readouterr().err
    assert "warning" not in err
    assert "planned for us-central2-b" not in err
