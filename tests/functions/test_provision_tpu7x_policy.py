"""Wire level: a multi-host tpu7x JobSet gets the product's workload policy, then its pools (real clients,
GKE and Compute emulators, GKE refusing a pool whose placement policy does not exist)."""

from __future__ import annotations

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from tests.functions.deliveries import pending_event, submit

pytestmark = pytest.mark.integration

REGION = "us-central2"  # the world's cluster is in us-central2-b
POLICY = "tpuprov-tpu7x-2-2-2"


@pytest.fixture
def fn(world, compute_emulator):
    world.configure(compute_api_endpoint=compute_emulator.url)
    world.gke.set_policy_lookup(compute_emulator.exists)  # GKE needs the policy to exist
    return FunctionClient("provision")


def tpu7x(name, replicas=2):
    return tpu_jobset(
        name, "team-a", replicas=replicas, accelerator="tpu7x", topology="2x2x2", chips_per_vm=4
    )


def test_multi_host_tpu7x_gets_its_policy_once_and_pools_that_name_it(world, fn, compute_emulator):
    _, pods = submit(world, tpu7x("train"))
    response = fn.post_entry(pending_event(pods[0]))
    assert response.status_code == 200, response.data

    [policy] = compute_emulator.policies()
    assert policy["name"] == POLICY
    assert policy["region"].endswith(f"/regions/{REGION}")
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}
    assert compute_emulator.count("insert") == 1
    pools = world.pools()
    assert len(pools) == 2  # both slices of the replicated job share the one policy
    for pool in pools:
        assert pool["placementPolicy"] == {"policyName": POLICY}
        assert pool["config"]["machineType"] == "tpu7x-standard-4t"
        assert int(pool["initialNodeCount"]) == 2


def test_a_second_jobset_of_the_same_shape_reuses_the_policy(world, fn, compute_emulator):
    for name in ("first", "second"):
        _, pods = submit(world, tpu7x(name, replicas=1))
        assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert compute_emulator.count("insert") == 1
    assert len(world.pools()) == 2


def test_operator_policy_means_the_product_creates_none(world, fn, compute_emulator):
    world.configure(compute_api_endpoint=compute_emulator.url, tpu7x_workload_policy="ops-{topology}")
    world.gke.set_policy_lookup(None)  # the operator's policy lives outside this test's Compute
    _, pods = submit(world, tpu7x("train", replicas=1))
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert compute_emulator.count("get") + compute_emulator.count("insert") == 0
    [pool] = world.pools()
    assert pool["placementPolicy"] == {"policyName": "ops-2-2-2"}


def test_permission_denied_is_redelivered_without_a_pool_until_the_role_holds_it(world, fn, compute_emulator):
    compute_emulator.deny("compute.resourcePolicies.create")
    _, pods = submit(world, tpu7x("train", replicas=1))
    response = fn.post_entry(pending_event(pods[0]))
    # A missing grant is a deployment error: kept for redelivery, so nothing is lost once it is fixed.
    assert response.status_code == 503, response.data
    assert "compute.resourcePolicies.create" in response.get_data(as_text=True)
    assert world.gke.count("create") == 0
    compute_emulator.state.allow_all()
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert len(world.pools()) == 1


def test_compute_unavailable_redelivers_without_a_pool(world, fn, compute_emulator):
    compute_emulator.fail_next("get", 503, "Internal error. Please try again.")
    _, pods = submit(world, tpu7x("train", replicas=1))
    assert fn.post_entry(pending_event(pods[0])).status_code == 503
    assert world.gke.count("create") == 0
    assert fn.post_entry(pending_event(pods[0])).status_code == 200  # the redelivery succeeds
    assert len(world.pools()) == 1
