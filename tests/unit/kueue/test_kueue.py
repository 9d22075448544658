"""Rendering Kueue queue configurations: whole manifests (tutorial and multi-flavor setups) and the CLI."""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.testing.fixtures import kube as fixtures_kube
from shared.kueue import config as kueue
from shared.kueue.render import render, to_yaml
from tests.paths import REPO
from tests.unit.kueue.examples import TUTORIAL
from tpuprov.commands import kueue as cli_kueue

MANAGED = {"tpuprov.dev/managed-by": "tpu-provisioner"}

SEED_CONFIG = TUTORIAL

SEED_OBJECTS: list[dict[str, Any]] = [
    {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "low-priority", "labels": MANAGED},
        "value": 100,
        "globalDefault": False,
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "vlp-24", "labels": MANAGED},
        "spec": {
            "nodeLabels": {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                "cloud.google.com/gke-tpu-topology": "2x4",
            }
        },
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "cluster-queue", "labels": MANAGED},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": ["google.com/tpu"],
                    "flavors": [
                        {"name": "vlp-24", "resources": [{"name": "google.com/tpu", "nominalQuota": 24}]}
                    ],
                }
            ],
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
        },
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "multislice-queue", "namespace": "default", "labels": MANAGED},
        "spec": {"clusterQueue": "cluster-queue"},
    },
]


def _cq_flavor(name: str, chips: int, cpu: int, memory: str) -> dict[str, Any]:
    return {
        "name": name,
        "resources": [
            {"name": "google.com/tpu", "nominalQuota": chips},
            {"name": "cpu", "nominalQuota": cpu},
            {"name": "memory", "nominalQuota": memory},
        ],
    }


MULTI_FLAVOR_OBJECTS: list[dict[str, Any]] = [
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": "batch-low", "labels": MANAGED},
        "value": 100,
        "description": "Preemptible batch work.",
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": "prod-high", "labels": MANAGED},
        "value": 10000,
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "v6e-4x4", "labels": MANAGED},
        "spec": {
            "nodeLabels": {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                "cloud.google.com/gke-tpu-topology": "4x4",
            }
        },
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "v5e-2x4-spot", "labels": MANAGED},
        "spec": {
            "nodeLabels": {
                "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                "cloud.google.com/gke-tpu-topology": "2x4",
                "team-pool": "shared",
                "cloud.google.com/gke-spot": "true",
            },
            "tolerations": [
                {
                    "key": "cloud.google.com/gke-spot",
                    "operator": "Equal",
                    "value": "true",
                    "effect": "NoSchedule",
                }
            ],
        },
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "research", "labels": MANAGED},
        "spec": {
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["research"]}
                ]
            },
            "queueingStrategy": "StrictFIFO",
            "cohortName": "tpu-pool",
            "resourceGroups": [
                {
                    "coveredResources": ["google.com/tpu", "cpu", "memory"],
                    "flavors": [
                        _cq_flavor("v6e-4x4", 32, 360, "1440Gi"),
                        _cq_flavor("v5e-2x4-spot", 16, 192, "768Gi"),
                    ],
                }
            ],
            "preemption": {
                "reclaimWithinCohort": "LowerPriority",
                "withinClusterQueue": "LowerPriority",
                "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
            },
        },
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "production", "labels": MANAGED},
        "spec": {
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "cohortName": "tpu-pool",
            "resourceGroups": [
                {
                    "coveredResources": ["google.com/tpu", "cpu", "memory"],
                    "flavors": [_cq_flavor("v6e-4x4", 64, 720, "2880Gi")],
                }
            ],
        },
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "research-queue", "namespace": "research", "labels": MANAGED},
        "spec": {"clusterQueue": "research"},
    },
    {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "serving-queue", "namespace": "prod", "labels": MANAGED},
        "spec": {"clusterQueue": "production"},
    },
]


# ----------------------------------------------------------------------------- rendering


def test_seed_tutorial_setup_renders_exactly() -> None:
    assert render(kueue.parse_config(SEED_CONFIG)) == SEED_OBJECTS


def test_packaged_default_is_the_seed_setup_with_a_description() -> None:
    objects = render(kueue.load_config())
    expected = [dict(obj) for obj in SEED_OBJECTS]
    expected[0] = {**expected[0], "description": "Low priority for jobs that may be preempted."}
    assert objects == expected


def test_multi_flavor_example_renders_exactly() -> None:
    config = kueue.load_config(REPO / "examples" / "kueue" / "multi-flavor.yaml")
    assert render(config) == MULTI_FLAVOR_OBJECTS


def test_json_configuration_renders_like_yaml() -> None:
    as_json = yaml.safe_load(SEED_CONFIG)
    import json

    assert render(kueue.parse_config(json.dumps(as_json))) == SEED_OBJECTS


def test_rendered_fields_exist_in_the_pinned_kueue_crds() -> None:
    """Every rendered spec path is in the v1beta2 schema of the release manifest (catches renames)."""
    manifest = fixtures_kube.require_manifest(fixtures_kube.KUEUE_MANIFEST)
    schemas = {}
    for doc in yaml.load_all(manifest.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if doc["kind"] == "CustomResourceDefinition" and doc["spec"]["group"] == "kueue.x-k8s.io":
            version = next(v for v in doc["spec"]["versions"] if v["name"] == "v1beta2")
            assert version["served"] and version["storage"]
            schemas[doc["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]

    def check(value: Any, schema: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and "properties" in schema:
            for key, item in value.items():
                assert key in schema["properties"], f"{path}.{key} is not in the CRD schema"
                check(item, schema["properties"][key], f"{path}.{key}")
        elif isinstance(value, list) and "items" in schema:
            for item in value:
                check(item, schema["items"], f"{path}[]")

    objects = render(kueue.load_config(REPO / "examples" / "kueue" / "multi-flavor.yaml")) + SEED_OBJECTS
    kinds_seen = set()
    for obj in objects:
        if obj["apiVersion"].startswith("kueue.x-k8s.io/"):
            kinds_seen.add(obj["kind"])
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            check(body, schemas[obj["kind"]], obj["kind"])
    assert kinds_seen == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}


def test_cli_render_prints_the_manifests(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli_kueue.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["kueue", "render", "-f", str(REPO / "examples" / "kueue" / "multi-flavor.yaml")]
    )
    assert args.func(args) == 0
    printed = list(yaml.safe_load_all(capsys.readouterr().out))
    assert printed == MULTI_FLAVOR_OBJECTS


def test_cli_render_lists_problems_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("flavors:\n  - {name: Bad_Name, accelerator: tpu-v9, topology: 2x4}\n")
    out, err = io.StringIO(), io.StringIO()
    code = cli_kueue.run(argparse.Namespace(file=str(bad)), out=out, err=err)
    assert code == 2
    assert out.getvalue() == ""
    assert "Bad_Name" in err.getvalue() and "tpu-v9" in err.getvalue()


def test_to_yaml_round_trips() -> None:
    assert list(yaml.safe_load_all(to_yaml(SEED_OBJECTS))) == SEED_OBJECTS
