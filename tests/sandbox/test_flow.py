"""End to end on the sandbox: real functions, real Pub/Sub emulator, JobSets from pending to released.

One stack serves the whole module; every scenario uses its own JobSet names, so they do not
interfere. Delivery faults here are the ones Pub/Sub and Cloud Logging produce (duplicates,
reordering, a lost export, a terminal event overtaking a pending one); GKE and Kubernetes API
faults are in ``test_sandbox_faults.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.cluster.common import FAIL_UNTIL_ATTEMPT_ANNOTATION
from sandbox.jobsets import cpu_jobset
from sandbox.stack.core import Stack
from sandbox.testing.stack import (
    FAST,
    assert_clean_run,
    create_requests,
    events_about,
    exclusive_tpu_jobset,
    owned_pools,
    submit,
    successful_creates,
    wait_finished,
    wait_released,
)
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("timeline_on_failure")]


def _routed_pod_entries(stack: Stack, jobset: str) -> list[dict[str, Any]]:
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


def _acked(stack: Stack, message_id: str) -> bool:
    return any(d.message_id == message_id and d.acked for d in stack.relay.deliveries)


def test_single_slice_and_a_cpu_jobset(stack: Stack) -> None:
    submit(stack, exclusive_tpu_jobset("solo", replicas=1, topology="2x2"))
    submit(stack, cpu_jobset("plain"))

    assert wait_finished(stack, "solo") == "Completed"
    assert wait_finished(stack, "plain") == "Completed"
    wait_released(stack, "solo")

    assert_clean_run(stack, "solo", slices=1)
    # The CPU JobSet never pends, so nothing is requested; its completion still reaches release.
    assert create_requests(stack, "plain") == {}
    assert events_about(stack, labels.REASON_REQUESTED, "plain") == []
    assert any("plain" in d.get("message", "") for d in stack.decisions("release.nothing"))


def test_multislice_gets_one_whole_pool_per_slice(stack: Stack) -> None:
    submit(stack, exclusive_tpu_jobset("multi", replicas=2, topology="4x4"))  # 2 slices x 4 VMs

    assert wait_finished(stack, "multi") == "Completed"
    wait_released(stack, "multi")

    assert_clean_run(stack, "multi", slices=2)
    pods = stack.kube.list("v1", "pods", "default", label_selector=f"{labels.JOBSET_NAME}=multi")
    assert len(pods) == 8 and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    # Exclusive placement: every slice ran whole on one pool, and no two slices shared a pool.
    # (Which of the two same-shape pools a slice got is the scheduler's choice.)
    pools_of_slice: dict[str, set[str]] = {}
    for pod in pods:
        pool = pod["spec"]["nodeName"].removeprefix("gke-sandbox-").rsplit("-", 1)[0]
        pools_of_slice.setdefault(pod["metadata"]["labels"][labels.JOB_INDEX], set()).add(pool)
    assert all(len(pools) == 1 for pools in pools_of_slice.values()), pools_of_slice
    used = {next(iter(pools)) for pools in pools_of_slice.values()}
    assert used == set(successful_creates(stack, "multi"))


def test_tpu7x_multislice_gets_the_products_workload_policy_once(stack: Stack) -> None:
    # No TPU7X_WORKLOAD_POLICY: the product creates the topology's workload policy in the zone's
    # region before the creates, and the stack's GKE refuses any pool naming a missing policy.
    inserts = stack.compute.count("insert")
    submit(stack, exclusive_tpu_jobset("iron", replicas=2, accelerator="tpu7x", topology="2x2x2"))

    assert wait_finished(stack, "iron") == "Completed"
    wait_released(stack, "iron")

    assert_clean_run(stack, "iron", slices=2)
    assert stack.compute.count("insert") == inserts + 1
    region = stack.config.location.rsplit("-", 1)[0]
    assert stack.compute.exists(stack.config.project, region, "tpuprov-tpu7x-2-2-2")
    # Each of the two pools accepted once (counting GKE's accepted creates: racing deliveries may
    # send a create that GKE answers 409).
    assert sorted(successful_creates(stack, "iron").values()) == [1, 1]


def test_restart_recreates_pods_and_reuses_pools(stack: Stack) -> None:
    jobset = exclusive_tpu_jobset("again", replicas=2, topology="2x2")
    jobset["spec"]["failurePolicy"] = {"maxRestarts": 2}
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"]["annotations"][FAIL_UNTIL_ATTEMPT_ANNOTATION] = "1"  # attempt 0 fails
    submit(stack, jobset)

    assert wait_finished(stack, "again") == "Completed"
    wait_released(stack, "again")

    stored = stack.jobset("default", "again")
    assert stored is not None and stored["status"]["restarts"] == 1
    pods = stack.kube.list("v1", "pods", "default", label_selector=f"{labels.JOBSET_NAME}=again")
    assert {p["metadata"]["labels"][labels.RESTART_ATTEMPT] for p in pods} == {"1"}
    assert_clean_run(stack, "again", slices=2)  # one create per slice across both attempts


def test_duplicated_and_reordered_pending_events(stack: Stack) -> None:
    stack.gke.set_op_delay(2.0)  # keep the pods pending while the copies arrive
    try:
        submit(stack, exclusive_tpu_jobset("dup", replicas=2, topology="2x2"))
        stack.wait_for(lambda: len(_routed_pod_entries(stack, "dup")) >= 2, 10, "first pending events of dup")
        entries = _routed_pod_entries(stack, "dup")
        copies = []
        for entry in entries:  # every exported entry twice more
            copies += [stack.publish_entry("provision", entry), stack.publish_entry("provision", entry)]
        copies.append(stack.publish_entry("provision", entries[-1]))  # then newest before oldest
        copies.append(stack.publish_entry("provision", entries[0]))
        stack.wait_for(lambda: all(_acked(stack, m) for m in copies), 15, "the copies to be acked")
    finally:
        stack.gke.set_op_delay(FAST.gke_op_delay)

    assert wait_finished(stack, "dup") == "Completed"
    wait_released(stack, "dup")
    assert_clean_run(stack, "dup", slices=2)


def test_terminal_event_before_the_last_pending_event(stack: Stack) -> None:
    submit(stack, exclusive_tpu_jobset("late", replicas=1, topology="2x2"))
    assert wait_finished(stack, "late") == "Completed"
    wait_released(stack, "late")
    last_pending = _routed_pod_entries(stack, "late")[-1]

    def skipped(why: str) -> bool:
        return any(
            "default/late-" in d.get("message", "") and why in d.get("message", "")
            for d in stack.decisions("provision.skipped")
        )

    # A pending event delayed past the JobSet's end must not bring a pool back.
    message = stack.publish_entry("provision", last_pending)
    stack.wait_for(lambda: _acked(stack, message), 10, "the late pending event to be acked")
    # The ack and the function's log line reach the test by different threads: wait for the line.
    stack.wait_for(lambda: skipped("Succeeded"), 10, "the late pending event to be skipped")

    # Once the JobSet is deleted (its audit entry routed too), the pod is gone: still nothing.
    assert stack.delete_jobset("default", "late")
    stack.wait_for(
        lambda: any("late" in d.get("message", "") for d in stack.decisions("release.nothing", "release")),
        10,
        "the deletion's audit entry to reach release",
    )
    message = stack.publish_entry("provision", last_pending)
    stack.wait_for(lambda: _acked(stack, message), 10, "the late pending event to be acked")
    stack.wait_for(lambda: skipped("no longer exists"), 10, "the late pending event to be skipped")
    assert_clean_run(stack, "late", slices=1)


def test_lost_pending_events_are_recovered_by_reconcile(stack: Stack) -> None:
    assert stack.router is not None

    def is_lost_pod_event(entry: Any) -> bool:
        involved = (entry.get("jsonPayload") or {}).get("involvedObject") or {}
        return str(involved.get("name", "")).startswith("lost-")

    stack.router.drop_next(is_lost_pod_event, times=10_000)
    submit(stack, exclusive_tpu_jobset("lost", replicas=1, topology="2x2"))
    stack.wait_for(
        lambda: len(stack.router.dropped) >= 2 if stack.router else False, 10, "exports to be lost"
    )
    assert create_requests(stack, "lost") == {}  # nobody heard about the pending pod

    stack.trigger_reconcile()
    assert wait_finished(stack, "lost") == "Completed"
    wait_released(stack, "lost")
    assert_clean_run(stack, "lost", slices=1)
    created_by = {
        d["function"] for d in stack.decisions("provision.created") if "default/lost " in d["slice"]
    }
    assert created_by == {"reconcile"}


def test_deleting_a_running_jobset_releases_its_pools(stack: Stack) -> None:
    submit(stack, exclusive_tpu_jobset("gone", replicas=2, topology="2x2", run_seconds=60))
    stack.wait_for(
        lambda: (
            len(
                [
                    p
                    for p in stack.kube.list(
                        "v1", "pods", "default", label_selector=f"{labels.JOBSET_NAME}=gone"
                    )
                    if p["status"].get("phase") == "Running"
                ]
            )
            == 2
        ),
        20,
        "both slices running",
    )
    assert len(owned_pools(stack, "gone")) == 2

    assert stack.delete_jobset("default", "gone")
    wait_released(stack, "gone")
    assert_clean_run(stack, "gone", slices=2, released_event=False)
    assert stack.kube.list("v1", "pods", "default", label_selector=f"{labels.JOBSET_NAME}=gone") == []
    assert any("deleted by" in d.get("message", "") for d in stack.decisions("release.deleted"))
    assert successful_creates(stack, "gone")  # the scenario really provisioned before deleting
