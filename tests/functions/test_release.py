"""Wire level: JobSet terminal Events and audited deletions into the release function; reconcile sweeps."""

from __future__ import annotations

import json

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.cloud.gke import GkeNodePoolAPI
from shared.core import labels
from shared.events import entries as logentries
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import NodePoolSpec
from shared.tpu.slices import build_node_pool, slice_request
from tests.conftest import CLUSTER_ID

pytestmark = pytest.mark.integration

JOBSET_API = f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"


@pytest.fixture
def fn(world):
    return FunctionClient("release")


def with_pools(world, name, replicas=2, namespace="team-a"):
    """A JobSet in the API whose slices already have their pools (as provision made them)."""
    jobset = tpu_jobset(name, namespace, replicas=replicas)
    jobset["metadata"].pop("uid")
    stored = world.kube.put(jobset)
    api = GkeNodePoolAPI(endpoint=world.gke.url)
    made = set()
    cluster = api.get_cluster(world.cluster_path)
    for pod in expand_pods(stored):
        spec, _ = build_node_pool(world.settings, slice_request(pod), cluster)
        if spec.name not in made:
            api.create_node_pool(world.cluster_path, spec, "test setup")
            made.add(spec.name)
    world.gke.finish_operations()
    return stored, sorted(made)


def unmanaged_pool(world):
    spec = NodePoolSpec(
        name="default-pool",
        machine_type="e2-standard-4",
        node_count=3,
        node_locations=("us-central2-b",),
        labels={},
        resource_labels={},
        auto_upgrade=True,  # the world's cluster is in a release channel
    )
    GkeNodePoolAPI(endpoint=world.gke.url).create_node_pool(world.cluster_path, spec, "test setup")
    world.gke.finish_operations()


def set_condition(world, jobset, kind):
    meta = jobset["metadata"]
    world.kube.patch_status(
        JOBSET_API,
        "jobsets",
        meta["namespace"],
        meta["name"],
        {
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "reason": "AllJobsCompleted" if kind == "Completed" else "FailedJobs",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "terminalState": kind,
        },
    )


def finished_entry(jobset, reason="AllJobsCompleted", shape="core"):
    meta = jobset["metadata"]
    return logentries.jobset_event_entry(
        CLUSTER_ID, meta["namespace"], meta["name"], meta["uid"], reason=reason, shape=shape
    )


@pytest.mark.parametrize("shape", ["core", "events.k8s.io"])
def test_completed_jobset_deletes_exactly_its_pools(world, fn, shape):
    a, a_pools = with_pools(world, "a")
    _, b_pools = with_pools(world, "b")
    unmanaged_pool(world)
    set_condition(world, a, "Completed")
    assert fn.post_entry(finished_entry(a, shape=shape)).status_code == 200
    assert world.gke.count("delete") == 2
    world.gke.finish_operations()
    assert world.pool_names() == sorted([*b_pools, "default-pool"])
    released = [
        e for e in world.kube.list("v1", "events", "team-a") if e.get("reason") == labels.REASON_RELEASED
    ]
    assert released and all(p in released[0]["message"] for p in a_pools)


def test_running_jobset_and_forged_finished_event_deletes_nothing(world, fn):
    a, pools = with_pools(world, "a")
    assert fn.post_entry(finished_entry(a)).status_code == 200
    assert fn.post_entry(finished_entry(a, reason="FailedJobs")).status_code == 200
    assert world.gke.count("delete") == 0 and world.pool_names() == pools


@pytest.mark.parametrize(
    "principal",
    ["alice@example.com", "system:serviceaccount:jobset-system:jobset-controller-manager"],
    ids=["user", "ttl-controller"],
)
def test_deleted_jobset_releases_pools_and_redeliveries_are_harmless(world, fn, principal):
    _a, _ = with_pools(world, "a")
    world.kube.delete(JOBSET_API, "jobsets", "team-a", "a")
    entry = logentries.jobset_delete_audit_entry(CLUSTER_ID, "team-a", "a", principal=principal)
    for _ in range(3):
        assert fn.post_entry(entry, message_id="42").status_code == 200
        world.gke.finish_operations()
    assert world.gke.count("delete") == 2
    assert world.pool_names() == []


def test_name_reused_with_new_uid_only_old_pools_go(world, fn):
    old, old_pools = with_pools(world, "a", replicas=1)
    world.kube.delete(JOBSET_API, "jobsets", "team-a", "a")
    new, new_pools = with_pools(world, "a", replicas=1)
    assert old["metadata"]["uid"] != new["metadata"]["uid"] and old_pools != new_pools
    assert fn.post_entry(finished_entry(old)).status_code == 200
    world.gke.finish_operations()
    assert world.pool_names() == new_pools


@pytest.mark.parametrize(
    ("status", "message"),
    [(429, "Too many operations"), (400, "Cluster is running incompatible operation operation-9")],
    ids=["429", "incompatible-operation"],
)
def test_transient_delete_errors_redeliver_then_succeed(world, fn, status, message):
    a, _ = with_pools(world, "a", replicas=1)
    set_condition(world, a, "Failed")
    world.gke.fail_next("delete", status, message, times=1)
    assert fn.post_entry(finished_entry(a, reason="FailedJobs")).status_code >= 500
    assert fn.post_entry(finished_entry(a, reason="FailedJobs")).status_code == 200
    world.gke.finish_operations()
    assert world.pool_names() == []


def test_failed_audit_call_is_not_a_deletion(world, fn):
    with_pools(world, "a", replicas=1)
    entry = logentries.jobset_delete_audit_entry(CLUSTER_ID, "team-a", "a", status_code=7)
    assert fn.post_entry(entry).status_code == 200
    assert world.gke.count("delete") == 0 and world.gke.count("list") == 0


# --- reconcile through its function -----------------------------------------------------------


def test_reconcile_function_sweeps_orphans_and_heals_missed_creations(world):
    reconcile = FunctionClient("reconcile")
    _, orphan_pools = with_pools(world, "orphan", replicas=1)
    world.kube.delete(JOBSET_API, "jobsets", "team-a", "orphan")
    world.kube.submit_jobset(tpu_jobset("lost", "team-a", replicas=1))
    unmanaged_pool(world)
    tick = {"data": "", "attributes": {}, "messageId": "tick-1", "publishTime": "2026-11-21T00:00:00Z"}
    assert reconcile.post_message(tick).status_code == 200
    world.gke.finish_operations()
    names = world.pool_names()
    assert "default-pool" in names and not set(orphan_pools) & set(names)
    assert len(names) == 2 and world.gke.count("create") == 3  # 1 orphan setup + 1 unmanaged + 1 healed


def test_reconcile_deletes_stockout_pool_and_reports_on_the_jobset(world):
    reconcile = FunctionClient("reconcile")
    world.gke.stockout(None, "ZONE_RESOURCE_POOL_EXHAUSTED: not enough TPU capacity", times=1)
    _js, _pools = with_pools(world, "s", replicas=1)
    assert world.pools()[0]["status"] == "ERROR"
    tick = {"data": "", "attributes": {}, "messageId": "tick-2", "publishTime": "2026-11-21T00:00:00Z"}
    assert reconcile.post_message(tick).status_code == 200
    world.gke.finish_operations()
    # First sighting: the JobSet hears it at once; the pool stays (no nodes) while the backoff runs.
    assert world.pool_names() == _pools
    failed = [e for e in world.kube.list("v1", "events", "team-a") if e.get("reason") == labels.REASON_FAILED]
    assert failed and "ZONE_RESOURCE_POOL_EXHAUSTED" in failed[0]["message"]
    assert "attempt 1, retrying in 5 min" in failed[0]["message"]
    assert failed[0]["involvedObject"]["kind"] == "JobSet"
    jobset = world.kube.get(JOBSET_API, "jobsets", "team-a", "s")
    assert jobset is not None
    record = json.loads(jobset["metadata"]["annotations"][labels.SLICE_FAILURES])
    assert record[_pools[0]]["attempts"] == 1 and record[_pools[0]]["recycled"] is False

    # The backoff is over (the record says the failure is older than it): the next sweep recycles.
    record[_pools[0]]["failedAt"] -= 300
    jobset["metadata"]["annotations"][labels.SLICE_FAILURES] = json.dumps(record)
    world.kube.put(jobset)
    tick = {**tick, "messageId": "tick-3"}
    assert reconcile.post_message(tick).status_code == 200
    world.gke.finish_operations()
    assert world.pool_names() == []
    jobset = world.kube.get(JOBSET_API, "jobsets", "team-a", "s")
    assert jobset is not None
    assert json.loads(jobset["metadata"]["annotations"][labels.SLICE_FAILURES])[_pools[0]]["recycled"] is True
