"""``tpuprov plan`` shows each node selector's fate (set by GKE / set by the product / refused).

Golden table and JSON; ``UPDATE_GOLDEN=1`` rewrites them after an intended change (review the diff).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.goldens import assert_golden, manifest_file
from tpuprov.main import main


def _jobset(name: str, selectors: dict[str, str], topology: str = "2x2x2") -> dict:
    pod_spec = {
        "restartPolicy": "Never",
        "nodeSelector": {
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
            "cloud.google.com/gke-tpu-topology": topology,
            **selectors,
        },
        "containers": [{"name": "t", "image": "jax", "resources": {"limits": {"google.com/tpu": 4}}}],
    }
    job = {"parallelism": 2, "completions": 2, "template": {"spec": pod_spec}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": "ml", "uid": "0b9a1c3e-1111-4222-8333-444455556666"},
        "spec": {"replicatedJobs": [{"name": "slice", "replicas": 1, "template": {"spec": job}}]},
    }


MANIFEST = [
    _jobset(
        "resilient",
        {
            "cloud.google.com/gke-tpu-ici-resiliency": "false",
            "cloud.google.com/gke-location-hint": "cell-a",
            "cloud.google.com/gke-spot": "true",
            "topology.kubernetes.io/zone": "us-east5-a",
            "team": "research",
        },
    ),
    _jobset("classy", {"cloud.google.com/compute-class": "tpu"}),
    _jobset("notspot", {"cloud.google.com/gke-spot": "false"}),
]


@pytest.fixture
def manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    env = {"NODE_LOCATIONS": "us-east5-b,us-east5-a", "NODE_LABEL_KEYS": "team"}
    return manifest_file(tmp_path, monkeypatch, "selectors.yaml", MANIFEST, env)


def test_plan_table_shows_each_selectors_fate(manifest: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", str(manifest), "--location", "us-east5"]) == 1  # two are refused
    assert_golden("plan-selectors.txt", capsys.readouterr().out)


def test_plan_json_says_where_each_selector_comes_from(
    manifest: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-f", str(manifest), "--location", "us-east5", "-o", "json"]) == 1
    out = capsys.readouterr().out
    assert_golden("plan-selectors.json", out)
    rows = {r["jobset"]: r for r in json.loads(out)}
    assert rows["ml/resilient"]["selectors"] == {
        "cloud.google.com/gke-location-hint": "cell-a: set by the product as a node label",
        "cloud.google.com/gke-spot": "true: set by GKE from config.spot",
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice: set by GKE from config.machineType",
        "cloud.google.com/gke-tpu-ici-resiliency": "false: set by the product as a node label",
        "cloud.google.com/gke-tpu-topology": "2x2x2: set by GKE from placementPolicy.tpuTopology",
        "team": "research: set by the product as a node label",
        "topology.kubernetes.io/zone": "us-east5-a: set by GKE from locations",
    }
    assert rows["ml/resilient"]["refused"] == ""
    assert 'Node labels with key "cloud.google.com/compute-class"' in rows["ml/classy"]["refused"]
    assert "no cloud.google.com/gke-spot label" in rows["ml/notspot"]["refused"]
