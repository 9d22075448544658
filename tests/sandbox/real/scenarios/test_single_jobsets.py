"""Scenarios of single JobSets on the real components (``RealStack``), on the package's stack.

Ported from the stand-in stack's tests/sandbox/test_flow.py, test_faults.py and test_stockout.py.
The JobSets are not queued (Kueue leaves them alone): the real JobSet controller creates their
Jobs, the real scheduler reports their pods unschedulable, KWOK runs them on the pools' Nodes for
the seconds their template asks (``sandbox.tpuprov.dev/run-seconds``, a KWOK Stage; the stand-in's
simulated scheduler did it there). GKE faults are the GKE emulator's, as they were; the Kubernetes
API outage is a real one: the kube-apiserver process is stopped and started again.
"""

from __future__ import annotations

import datetime
import itertools
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.jobsets import cpu_jobset
from sandbox.realstack.core import RealStack
from sandbox.testing.stack import (
    REAL_FAST,
    assert_clean_run,
    create_requests,
    created_decisions,
    events_about,
    exclusive_tpu_jobset,
    kube,
    mixed_tpu_jobset,
    owned_pools,
    submit,
    successful_creates,
    wait_finished,
    wait_released,
)
from shared.core import labels
from shared.core.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("timeline_on_failure")]

RUN = 2  # seconds a pod runs (KWOK)
FINISH = 180.0  # generous: two cores shared by several stacks
RELEASE = 120.0


@pytest.fixture(autouse=True)
def no_faults_left(stack: RealStack) -> Iterator[None]:
    yield
    stack.gke.clear_faults()
    stack.gke.set_op_delay(REAL_FAST.gke_op_delay)


def _pods(stack: RealStack, name: str) -> list[dict[str, Any]]:
    return kube(stack).list("v1", "pods", "default", f"{labels.JOBSET_NAME}={name}")


def _routed_pod_entries(stack: RealStack, jobset: str) -> list[dict[str, Any]]:
    """FailedScheduling entries the pending-pods sink exported for the JobSet's pods."""
    found = []
    for routed in stack.router.routed if stack.router else []:
        payload = routed.entry.get("jsonPayload") or {}
        involved = payload.get("involvedObject") or {}
        if payload.get("reason") == "FailedScheduling" and str(involved.get("name", "")).startswith(
            f"{jobset}-"
        ):
            found.append(dict(routed.entry))
    return found


def _acked(stack: RealStack, message_id: str) -> bool:
    return any(d.message_id == message_id and d.acked for d in stack.relay.deliveries)


def _refused_then_acked(stack: RealStack, function: str, status: int) -> set[str]:
    """Message ids ``function`` answered ``status`` to; asserts each was redelivered and acked."""
    refused = {d.message_id for d in stack.relay.deliveries if d.function == function and d.status == status}

    def all_acked() -> bool:
        acked = {d.message_id for d in stack.relay.deliveries if d.function == function and d.acked}
        return refused <= acked

    stack.wait_for(all_acked, 60, f"{function} messages answered {status} to be redelivered and acked")
    return refused


# -- deliveries (from test_flow.py) ---------------------------------------------------------------


def test_single_slice_and_a_cpu_jobset(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_flow.py. The CPU JobSet's pod runs on the cluster's default
    pool (CPU Nodes KWOK keeps Ready) where the real scheduler places it at once."""
    submit(stack, exclusive_tpu_jobset("solo", replicas=1, topology="2x2", run_seconds=RUN))
    plain = cpu_jobset("plain")
    plain["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["annotations"] = {
        "sandbox.tpuprov.dev/run-seconds": str(RUN)
    }
    submit(stack, plain)

    assert wait_finished(stack, "solo", FINISH) == "Completed"
    assert wait_finished(stack, "plain", FINISH) == "Completed"
    wait_released(stack, "solo", RELEASE)

    assert_clean_run(stack, "solo", slices=1)
    # The CPU JobSet never pends, so nothing is requested; its completion still reaches release.
    assert create_requests(stack, "plain") == {}
    assert events_about(stack, labels.REASON_REQUESTED, "plain") == []
    stack.wait_for(
        lambda: any("plain" in d.get("message", "") for d in stack.decisions("release.nothing")),
        60,
        "release to hear of plain's completion",
    )


def test_multislice_gets_one_whole_pool_per_slice(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_flow.py. Exclusive placement is the real JobSet webhook's
    (pod affinity per node pool), enforced by the real scheduler."""
    submit(stack, exclusive_tpu_jobset("multi", replicas=2, topology="4x4", run_seconds=RUN))  # 2 x 4 VMs

    assert wait_finished(stack, "multi", FINISH) == "Completed"
    pods = _pods(stack, "multi")  # read before the pools (and then the finished pods) go
    node_pool = {
        str(n["metadata"]["name"]): str(n["metadata"]["labels"][labels.NODEPOOL])
        for n in kube(stack).list("v1", "nodes", None, f"{labels.OWNER_NAME}=multi")
    }
    wait_released(stack, "multi", RELEASE)

    assert_clean_run(stack, "multi", slices=2)
    assert len(pods) == 8 and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    # Every slice ran whole on one pool, and no two slices shared a pool.
    pools_of_slice: dict[str, set[str]] = {}
    for pod in pods:
        pool = node_pool[pod["spec"]["nodeName"]]
        pools_of_slice.setdefault(pod["metadata"]["labels"][labels.JOB_INDEX], set()).add(pool)
    assert all(len(pools) == 1 for pools in pools_of_slice.values()), pools_of_slice
    used = {next(iter(pools)) for pools in pools_of_slice.values()}
    assert len(used) == 2 and used == set(successful_creates(stack, "multi"))


def test_duplicated_and_reordered_pending_events(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_flow.py: copies of the real scheduler's exported
    FailedScheduling entries, published again while GKE still creates the pools."""
    stack.gke.set_op_delay(3.0)  # keep the pods pending while the copies arrive
    submit(stack, exclusive_tpu_jobset("dup", replicas=2, topology="2x2", run_seconds=RUN))
    stack.wait_for(lambda: len(_routed_pod_entries(stack, "dup")) >= 2, 60, "first pending events of dup")
    entries = _routed_pod_entries(stack, "dup")
    copies = []
    for entry in entries:  # every exported entry twice more
        copies += [stack.publish_entry("provision", entry), stack.publish_entry("provision", entry)]
    copies.append(stack.publish_entry("provision", entries[-1]))  # then newest before oldest
    copies.append(stack.publish_entry("provision", entries[0]))
    stack.wait_for(lambda: all(_acked(stack, m) for m in copies), 60, "the copies to be acked")
    stack.gke.set_op_delay(REAL_FAST.gke_op_delay)

    assert wait_finished(stack, "dup", FINISH) == "Completed"
    wait_released(stack, "dup", RELEASE)
    assert_clean_run(stack, "dup", slices=2)


def test_terminal_event_before_the_last_pending_event(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_flow.py. The JobSet's deletion reaches release through the
    real API server's audit log; its pods go through the real garbage collector."""
    submit(stack, exclusive_tpu_jobset("tardy", replicas=1, topology="2x2", run_seconds=RUN))
    assert wait_finished(stack, "tardy", FINISH) == "Completed"
    wait_released(stack, "tardy", RELEASE)
    last_pending = _routed_pod_entries(stack, "tardy")[-1]

    def skipped(why: str) -> bool:
        return any(
            "default/tardy-" in d.get("message", "") and why in d.get("message", "")
            for d in stack.decisions("provision.skipped")
        )

    # A pending event delayed past the JobSet's end must not bring a pool back.
    message = stack.publish_entry("provision", last_pending)
    stack.wait_for(lambda: _acked(stack, message), 60, "the late pending event to be acked")
    stack.wait_for(lambda: skipped("Succeeded"), 30, "the late pending event to be skipped")
    decided = time.monotonic()

    # Once the JobSet is deleted (its audit entry routed too) and its pods collected: still nothing.
    assert stack.delete_jobset("default", "tardy")
    stack.wait_for(
        lambda: any("tardy" in d.get("message", "") for d in stack.decisions("release.nothing", "release")),
        60,
        "the deletion's audit entry to reach release",
    )
    stack.wait_for(lambda: not _pods(stack, "tardy"), 120, "the garbage collector to delete tardy's pods")
    # The function answers the same pod's events from its last decision for a few seconds
    # (shared.app.coalesce); this delivery must be decided afresh, on the pod now gone.
    configured = dict(stack.config.function_env).get("EVENT_COALESCE_SECONDS")
    window = float(configured or Settings.event_coalesce_seconds)
    stack.wait_for(lambda: time.monotonic() - decided > window, window + 1, "the coalescing window to pass")
    message = stack.publish_entry("provision", last_pending)
    stack.wait_for(lambda: _acked(stack, message), 60, "the late pending event to be acked")
    stack.wait_for(lambda: skipped("no longer exists"), 30, "the late pending event to be skipped")
    assert_clean_run(stack, "tardy", slices=1)


# -- GKE faults (from test_faults.py) -------------------------------------------------------------


def test_rate_limit_and_incompatible_operation_bursts(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_faults.py: the faults are the GKE emulator's, as there."""
    fired = {kind: stack.gke.faults_fired(f"error:{kind}") for kind in ("create", "delete")}
    stack.gke.fail_next("create", 429, "Quota exceeded for quota metric 'Write requests'.", times=3)
    stack.gke.fail_next(
        "delete", 400, "Cluster is running incompatible operation operation-1700000000000-abcd.", times=2
    )
    # Creates fail unevenly: the slices (of two shapes) must not swap pools.
    submit(stack, mixed_tpu_jobset("bursty", run_seconds=RUN))

    assert wait_finished(stack, "bursty", FINISH) == "Completed"
    wait_released(stack, "bursty", RELEASE)

    assert stack.gke.faults_fired("error:create") == fired["create"] + 3
    assert stack.gke.faults_fired("error:delete") == fired["delete"] + 2
    assert _refused_then_acked(stack, "release", 503)  # release retried the refused deletes
    assert_clean_run(stack, "bursty", slices=2)


def test_stockout_is_recycled_by_reconcile_and_requested_again(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_faults.py: the stockout is the GKE emulator's, as there."""
    stack.gke.stockout("ct6e-standard-4t", times=1)
    submit(stack, exclusive_tpu_jobset("stock", replicas=1, topology="2x2", run_seconds=RUN))
    stack.wait_for(
        lambda: [p for p in owned_pools(stack, "stock") if p.get("status") == "ERROR"],
        60,
        "the pool to fail with a stockout",
    )
    assert stack.jobset_state("default", "stock") == "Running"  # pods still pending
    # The JobSet hears at once, with the attempt and its backoff (2 s); reconcile recycles after.
    stack.wait_for(lambda: events_about(stack, labels.REASON_FAILED, "stock"), 30, "the TPUSliceFailed Event")
    time.sleep(2.5)  # the announced backoff, which the sweep must respect

    stack.trigger_reconcile()
    assert wait_finished(stack, "stock", FINISH) == "Completed"
    wait_released(stack, "stock", RELEASE)

    failed = events_about(stack, labels.REASON_FAILED, "stock")
    assert len(failed) == 1 and "does not have enough resources" in failed[0]["message"]
    assert "attempt 1, retrying in 2 s" in failed[0]["message"]
    assert failed[0]["involvedObject"]["kind"] == "JobSet"
    assert_clean_run(stack, "stock", slices=1, creates_per_pool=2)  # the failed pool and its replacement


def test_slow_operations(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_faults.py. There the simulated scheduler retried the pending
    pods every few seconds, so pending events kept coming while GKE worked; the real scheduler
    retries an unschedulable pod only when the cluster changes (a Node appears), so how many come
    is not fixed. What holds either way: one create per slice, nothing left."""
    stack.gke.set_op_delay(4.0)
    submit(stack, exclusive_tpu_jobset("slow", replicas=2, topology="2x2", run_seconds=RUN))

    assert wait_finished(stack, "slow", FINISH) == "Completed"
    wait_released(stack, "slow", RELEASE)
    assert_clean_run(stack, "slow", slices=2)


# -- a real Kubernetes API outage (from test_faults.py) -------------------------------------------


def test_kubernetes_api_outage_loses_no_work(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_faults.py. There the stand-in API answered 503 on request;
    here the kube-apiserver process is stopped while provision handles the pending pod's entry
    (the connection is refused), then started again on the same port with the same flags over
    the same etcd. Pub/Sub redelivers and the work gets done once."""
    assert stack.router is not None

    def is_outage_pod_event(entry: dict[str, Any]) -> bool:
        payload = entry.get("jsonPayload") or {}
        involved = payload.get("involvedObject") or {}
        return payload.get("reason") == "FailedScheduling" and str(involved.get("name", "")).startswith(
            "outage-"
        )

    # Hold the sink's exports of the pending pod, so the test delivers one during the outage.
    stack.router.drop_next(is_outage_pod_event, times=10_000)
    submit(stack, exclusive_tpu_jobset("outage", replicas=1, topology="2x2", run_seconds=RUN))
    pending = stack.wait_for(
        lambda: [e for e in (stack.router.dropped if stack.router else []) if is_outage_pod_event(e)],
        60,
        "the pending pod's entry",
    )
    stack.kube_cluster.stop_apiserver()
    try:
        message = stack.publish_entry("provision", pending[0])
        stack.wait_for(
            lambda: any(
                d.message_id == message and d.function == "provision" and not d.acked
                for d in stack.relay.deliveries
            ),
            90,
            "provision to meet the outage",
        )
        assert create_requests(stack, "outage") == {}  # nothing decided without the cluster's state
    finally:
        stack.kube_cluster.start_apiserver()

    assert wait_finished(stack, "outage", FINISH) == "Completed"
    wait_released(stack, "outage", RELEASE)
    refused = {d.status for d in stack.relay.deliveries if d.message_id == message and not d.acked}
    assert refused == {503}, refused
    stack.wait_for(lambda: _acked(stack, message), 60, "the refused message to be redelivered and acked")
    assert_clean_run(stack, "outage", slices=1)
    assert stack.summary().pods_killed == 0


# -- a lasting stockout (from test_stockout.py) ---------------------------------------------------


def _attempts(stack: RealStack, name: str) -> dict[int, str]:
    """Failed attempts the JobSet was told about: attempt number -> the wait it announced."""
    found: dict[int, str] = {}
    for event in events_about(stack, labels.REASON_FAILED, name):
        match = re.search(r"attempt (\d+), retrying in (\d+ s)", str(event.get("message", "")))
        if match and (event.get("involvedObject") or {}).get("kind") == "JobSet":
            found[int(match.group(1))] = match.group(2)
    return found


def _create_times(stack: RealStack, name: str) -> list[datetime.datetime]:
    """When each create GKE accepted for the JobSet's pools was logged, oldest first."""
    return sorted(datetime.datetime.fromisoformat(str(d["time"])) for d in created_decisions(stack, name))


def test_a_lasting_stockout_is_retried_with_backoff_and_the_jobset_lands_when_capacity_returns(
    stack: RealStack,
) -> None:
    """Ported from tests/sandbox/test_stockout.py: the stockout is the GKE emulator's, as there.
    Reconcile is triggered every half second (a cron far faster than the 2, 4, 8 s backoff)."""
    stack.gke.stockout("ct6e-standard-4t", "GCE_STOCKOUT: ZONE_RESOURCE_POOL_EXHAUSTED", times=None)
    submit(stack, exclusive_tpu_jobset("scarce", replicas=1, topology="2x2", run_seconds=RUN))

    most_pools = 0

    def three_attempts() -> bool:
        nonlocal most_pools
        stack.trigger_reconcile()
        most_pools = max(most_pools, len(owned_pools(stack, "scarce")))
        return len(_attempts(stack, "scarce")) >= 3

    stack.wait_for(three_attempts, 120, "three failed attempts", interval=0.5)

    attempts = _attempts(stack, "scarce")
    assert sorted(attempts) == list(range(1, len(attempts) + 1))
    assert [attempts[k] for k in (1, 2, 3)] == ["2 s", "4 s", "8 s"]  # the backoff, in the Events
    # Each attempt is one accepted create, and the waits lie between them: recycling at every
    # sweep would have created again a second or so after each failure. (Load only adds delay.)
    created = _create_times(stack, "scarce")
    assert len(attempts) <= len(created) <= len(attempts) + 1, (attempts, created)
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(created[:3])]
    assert gaps[0] >= 2 and gaps[1] >= 4, gaps
    assert most_pools == 1  # one pool of the slice at a time, never a second one beside it
    assert stack.jobset_state("default", "scarce") == "Running"  # still waiting for its slice

    stack.gke.clear_faults()  # capacity returns
    end = time.monotonic() + FINISH
    while stack.jobset_state("default", "scarce") not in ("Completed", "Failed") and time.monotonic() < end:
        stack.trigger_reconcile()
        time.sleep(0.5)
    assert wait_finished(stack, "scarce", 5) == "Completed"
    wait_released(stack, "scarce", RELEASE)
    # Every accepted create was a failed attempt, but the one that landed.
    final_attempts = len(_attempts(stack, "scarce"))
    [(_, accepted)] = successful_creates(stack, "scarce").items()
    assert accepted <= final_attempts + 1, (accepted, final_attempts)
    assert_clean_run(stack, "scarce", slices=1, creates_per_pool=accepted)
