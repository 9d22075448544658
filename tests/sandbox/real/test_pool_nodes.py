"""The real cluster's Nodes of a GKE pool are the ones the stand-in cluster registers today.

``sandbox.kube.nodes`` (for the real API server) and ``sandbox.cluster.nodes`` (the stand-in) must
give a pool the same Nodes: names, GKE's labels, provider ID and TPU capacity. Only readiness
differs: the real cluster's Nodes register without conditions and KWOK makes them Ready.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.cluster.nodes import node_objects
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


def _policy_topology(name: str) -> str:
    return {"wp-2x2x2": "2x2x2"}[name]


def _comparable(node: dict[str, Any]) -> dict[str, Any]:
    status = node["status"]
    return {
        "metadata": node["metadata"],
        "spec": node["spec"],
        "capacity": status["capacity"],
        "allocatable": status["allocatable"],
    }


@pytest.mark.parametrize("pool", POOLS.values(), ids=POOLS.keys())
def test_a_pool_gets_the_nodes_the_stand_in_gives_it(pool: dict[str, Any]) -> None:
    real = node_manifests("demo", pool_from_gke(pool, _policy_topology))
    stand_in = node_objects("demo", pool, _policy_topology)
    assert [_comparable(n) for n in real] == [_comparable(n) for n in stand_in]
    assert all("conditions" not in n["status"] for n in real)  # KWOK's node-ready Stage sets them
