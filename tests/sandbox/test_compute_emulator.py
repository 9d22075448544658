"""The Compute emulator's rules over raw HTTP, and the GKE emulator's placement-policy check wired to it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from google.api_core import exceptions as core

from sandbox.emulators.compute.emulator import ComputeEmulator
from sandbox.emulators.gke.emulator import GkeEmulator
from sandbox.testing.fixtures.gke import GKE_TEST_CLUSTER, GKE_TEST_PROJECT
from sandbox.testing.gke import make_pool, rest_client

REGION = "us-central2"  # the region of the gke_emulator fixture's zone us-central2-b
BASE = f"/compute/v1/projects/{GKE_TEST_PROJECT}/regions/{REGION}/resourcePolicies"


def post(emulator: ComputeEmulator, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(emulator.url + path, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def policy(name: str = "wp-2x2x2", **workload: Any) -> dict[str, Any]:
    return {
        "name": name,
        "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2", **workload},
    }


@pytest.mark.parametrize(
    ("body", "code", "reason", "needle"),
    [
        pytest.param({}, 400, "required", "Required field 'resource.name' not specified", id="no-name"),
        pytest.param(policy("a" * 64), 400, "invalid", "Must be a match of regex", id="name-64-chars"),
        pytest.param(
            policy("2x2x2"), 400, "invalid", "Invalid value for field 'resource.name'", id="digit-first"
        ),
        pytest.param(policy(type="FAST"), 400, "invalid", "workloadPolicy.type", id="unknown-type"),
        pytest.param(
            policy(acceleratorTopology="2by2"), 400, "invalid", "acceleratorTopology", id="bad-topology"
        ),
        pytest.param(
            policy(maxTopologyDistance="BLOCK"),
            400,
            "invalid",
            "cannot both be set",
            id="topology-and-distance",
        ),
    ],
)
def test_insert_refuses_what_compute_refuses(compute_emulator, body, code, reason, needle):
    status, answer = post(compute_emulator, BASE, body)
    assert status == code
    assert needle in answer["error"]["message"]
    assert answer["error"]["errors"][0]["reason"] == reason
    assert compute_emulator.policies() == []


def test_insert_answers_a_done_operation_and_a_second_insert_409(compute_emulator):
    status, operation = post(compute_emulator, BASE, policy())
    assert (status, operation["kind"], operation["status"]) == (200, "compute#operation", "DONE")
    assert operation["targetLink"].endswith(f"{BASE[len('/compute/v1/') :]}/wp-2x2x2")
    status, answer = post(compute_emulator, BASE, policy())
    assert status == 409
    path = f"projects/{GKE_TEST_PROJECT}/regions/{REGION}/resourcePolicies/wp-2x2x2"
    assert answer["error"]["message"] == f"The resource '{path}' already exists"


def test_gke_refuses_a_pool_whose_workload_policy_is_missing_when_wired(
    gke_emulator: GkeEmulator, compute_emulator: ComputeEmulator
):
    client = rest_client(gke_emulator.url)
    pool = make_pool(
        "tpu7x-a", machine_type="tpu7x-standard-4t", nodes=2, topology="", policy_name="wp-2x2x2"
    )
    gke_emulator.set_policy_lookup(compute_emulator.exists)
    with pytest.raises(core.BadRequest, match="Resource policy 'wp-2x2x2' was not found"):
        client.create_node_pool(parent=GKE_TEST_CLUSTER, node_pool=pool, retry=None, timeout=5)
    post(compute_emulator, BASE, policy())
    client.create_node_pool(parent=GKE_TEST_CLUSTER, node_pool=pool, retry=None, timeout=5)
    assert [p["name"] for p in gke_emulator.pools(GKE_TEST_CLUSTER)] == ["tpu7x-a"]
