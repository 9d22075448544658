"""The Nodes a GKE pool registers in the real API server: names, GKE's labels, provider ID, capacity.

Readiness is not here: the Nodes register without conditions and KWOK makes them Ready.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.emulators.gke.hooks import NODES_KEY
from sandbox.kube.nodes import node_manifests, pool_from_gke

POOLS: dict[str, dict[str, Any]] = {
    "multi-host v6e slice, spot, own node labels": {
        "name": "np-a",
        "config": {"machineType": "ct6e-standard-4t", "spot": True, "labels": {"team": "research"}},
        "initialNodeCount": 4,
        "locations": ["us-east5-b"],
        "placementPolicy": {"type": "COMPACT", "tpuTopology": "4x4"},
    },
    "single-host v5e pool from a shared reservation, 32 pods per node": {
        "name": "np-b",
        "config": {
            "machineType": "ct5lp-hightpu-4t",
            "reservationAffinity": {
                "consumeReservationType": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": ["projects/owner-project/reservations/v5e-res"],
            },
        },
        "maxPodsConstraint": {"maxPodsPerNode": "32"},
        "initialNodeCount": 1,
        "locations": ["us-west4-a"],
    },
    "flex-start pool granted capacity in two zones (the emulator's per-zone counts)": {
        "name": "np-c",
        "config": {"machineType": "ct6e-standard-4t", "flexStart": True},
        "initialNodeCount": 2,
        "locations": ["us-east5-b", "us-east5-c"],
        "placementPolicy": {"tpuTopology": "2x4"},
        NODES_KEY: {"us-east5-c": 2, "us-east5-b": 0},
    },
    "flex-start pool still waiting: no nodes": {
        "name": "np-d",
        "config": {"machineType": "ct6e-standard-4t", "flexStart": True},
        "initialNodeCount": 2,
        "locations": ["us-east5-b"],
        NODES_KEY: {"us-east5-b": 0},
    },
    "tpu7x pool placed by a workload policy": {
        "name": "np-e",
        "config": {"machineType": "tpu7x-standard-4t"},
        "initialNodeCount": 2,
        "locations": ["us-central1-c"],
        "placementPolicy": {"policyName": "wp-2x2x2"},
    },
    "CPU pool": {"name": "default-pool", "config": {"machineType": "e2-standard-4"}, "initialNodeCount": 2},
}


SPOT_TEAM = {"cloud.google.com/gke-spot": "true", "team": "research"}
RESERVATION = {
    "cloud.google.com/reservation-name": "v5e-res",
    "cloud.google.com/reservation-project": "owner-project",
}
FLEX = {"cloud.google.com/gke-flex-start": "true"}
SPECIFIC_KEYS = {*SPOT_TEAM, *RESERVATION, *FLEX}


def _policy_topology(name: str) -> str:
    return {"wp-2x2x2": "2x2x2"}[name]


ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY = "cloud.google.com/gke-tpu-topology"
ZONE = "topology.kubernetes.io/zone"

# What GKE gives each pool's Nodes: (name, zone, accelerator, topology, google.com/tpu, max pods,
# the pool-specific labels). A CPU Node has no TPU labels and no google.com/tpu capacity.
EXPECTED: dict[str, list[tuple[str, str, str, str, str, str, dict[str, str]]]] = {
    "np-a": [
        (f"gke-demo-np-a-{i}", "us-east5-b", "tpu-v6e-slice", "4x4", "4", "110", SPOT_TEAM) for i in range(4)
    ],
    "np-b": [("gke-demo-np-b-0", "us-west4-a", "tpu-v5-lite-podslice", "2x2", "4", "32", RESERVATION)],
    "np-c": [
        (f"gke-demo-np-c-{i}", "us-east5-c", "tpu-v6e-slice", "2x4", "4", "110", FLEX) for i in range(2)
    ],
    "np-d": [],
    "np-e": [(f"gke-demo-np-e-{i}", "us-central1-c", "tpu7x", "2x2x2", "4", "110", {}) for i in range(2)],
    "default-pool": [(f"gke-demo-default-pool-{i}", "", "", "", "", "110", {}) for i in range(2)],
}


def _view(node: dict[str, Any]) -> tuple[str, str, str, str, str, str, dict[str, str]]:
    labels = dict(node["metadata"]["labels"])
    specific = {k: labels[k] for k in labels if k in SPECIFIC_KEYS}
    return (
        node["metadata"]["name"],
        labels.get(ZONE, ""),
        labels.get(ACCELERATOR, ""),
        labels.get(TOPOLOGY, ""),
        node["status"]["capacity"].get("google.com/tpu", ""),
        node["status"]["capacity"]["pods"],
        specific,
    )


@pytest.mark.parametrize("pool", POOLS.values(), ids=POOLS.keys())
def test_a_pool_gets_the_nodes_gke_gives_it(pool: dict[str, Any]) -> None:
    real = node_manifests("demo", pool_from_gke(pool, _policy_topology))
    assert [_view(n) for n in real] == EXPECTED[pool["name"]]
    for node in real:
        labels = node["metadata"]["labels"]
        assert labels["cloud.google.com/gke-nodepool"] == pool["name"]
        assert labels["node.kubernetes.io/instance-type"] == pool["config"]["machineType"]
        assert labels["kubernetes.io/hostname"] == node["metadata"]["name"]
        assert node["status"]["allocatable"] == node["status"]["capacity"]
        zone = labels.get(ZONE)
        assert node["spec"]["providerID"] == f"gce://sandbox/{zone or 'zone'}/{node['metadata']['name']}"
        if zone:
            assert labels["topology.kubernetes.io/region"] == zone.rsplit("-", 1)[0]
        if ACCELERATOR in labels:
            assert (
                labels["cloud.google.com/gke-accelerator-count"]
                == node["status"]["capacity"]["google.com/tpu"]
            )
    assert all("conditions" not in n["status"] for n in real)  # KWOK's node-ready Stage sets them
