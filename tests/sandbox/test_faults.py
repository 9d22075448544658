"""End to end on the sandbox with GKE and Kubernetes API faults: the work still gets done, once.

A fault makes a function answer non-2xx, the Pub/Sub emulator redelivers with the subscription's
backoff, and the product converges: exactly one pool per slice (or one more after a failed one is
recycled), every message eventually acknowledged, nothing left behind.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sandbox.stack.core import Stack
from sandbox.testing.stack import (
    FAST,
    assert_clean_run,
    create_requests,
    events_about,
    exclusive_tpu_jobset,
    mixed_tpu_jobset,
    owned_pools,
    submit,
    wait_finished,
    wait_released,
)
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("timeline_on_failure")]


@pytest.fixture(autouse=True)
def no_faults_left(stack: Stack) -> Iterator[None]:
    yield
    stack.gke.clear_faults()
    stack.gke.set_op_delay(FAST.gke_op_delay)
    stack.kube.set_down(False)


def _refused_then_acked(stack: Stack, function: str, status: int) -> set[str]:
    """Message ids ``function`` answered ``status`` to; asserts each was redelivered and acked."""
    refused = {d.message_id for d in stack.relay.deliveries if d.function == function and d.status == status}

    def all_acked() -> bool:
        acked = {d.message_id for d in stack.relay.deliveries if d.function == function and d.acked}
        return refused <= acked

    stack.wait_for(all_acked, 20, f"{function} messages answered {status} to be redelivered and acked")
    return refused


def test_create_fails_once_and_the_redelivery_succeeds(stack: Stack) -> None:
    fired = stack.gke.faults_fired("error:create")
    stack.gke.fail_next("create", 503, "The service is currently unavailable.")
    submit(stack, exclusive_tpu_jobset("flaky", replicas=1, topology="2x2"))

    assert wait_finished(stack, "flaky") == "Completed"
    wait_released(stack, "flaky")

    assert stack.gke.faults_fired("error:create") == fired + 1
    assert _refused_then_acked(stack, "provision", 503)
    assert sum(create_requests(stack, "flaky").values()) == 2  # the refused one and the real one
    assert_clean_run(stack, "flaky", slices=1)


def test_rate_limit_and_incompatible_operation_bursts(stack: Stack) -> None:
    fired = {kind: stack.gke.faults_fired(f"error:{kind}") for kind in ("create", "delete")}
    stack.gke.fail_next("create", 429, "Quota exceeded for quota metric 'Write requests'.", times=3)
    stack.gke.fail_next(
        "delete", 400, "Cluster is running incompatible operation operation-1700000000000-abcd.", times=2
    )
    submit(stack, mixed_tpu_jobset("bursty"))  # creates fail unevenly: the slices must not swap pools

    assert wait_finished(stack, "bursty") == "Completed"
    wait_released(stack, "bursty", timeout=30)

    assert stack.gke.faults_fired("error:create") == fired["create"] + 3
    assert stack.gke.faults_fired("error:delete") == fired["delete"] + 2
    assert _refused_then_acked(stack, "release", 503)  # release retried the refused deletes
    assert_clean_run(stack, "bursty", slices=2)


def test_stockout_is_recycled_by_reconcile_and_requested_again(stack: Stack) -> None:
    stack.gke.stockout("ct6e-standard-4t", times=1)
    submit(stack, exclusive_tpu_jobset("stock", replicas=1, topology="2x2"))
    stack.wait_for(
        lambda: [p for p in owned_pools(stack, "stock") if p.get("status") == "ERROR"],
        15,
        "the pool to fail with a stockout",
    )
    assert stack.jobset_state("default", "stock") == "Running"  # pods still pending
    # The JobSet hears at once, with the attempt and its backoff (FAST: 2 s); reconcile recycles after.
    stack.wait_for(lambda: events_about(stack, labels.REASON_FAILED, "stock"), 10, "the TPUSliceFailed Event")
    time.sleep(2.5)

    stack.trigger_reconcile()
    assert wait_finished(stack, "stock", timeout=40) == "Completed"
    wait_released(stack, "stock")

    failed = events_about(stack, labels.REASON_FAILED, "stock")
    assert len(failed) == 1 and "does not have enough resources" in failed[0]["message"]
    assert "attempt 1, retrying in 2 s" in failed[0]["message"]
    assert failed[0]["involvedObject"]["kind"] == "JobSet"
    assert_clean_run(stack, "stock", slices=1, creates_per_pool=2)  # the failed pool and its replacement


def test_slow_operations(stack: Stack) -> None:
    stack.gke.set_op_delay(4.0)
    submit(stack, exclusive_tpu_jobset("slow", replicas=2, topology="2x2"))

    assert wait_finished(stack, "slow", timeout=40) == "Completed"
    wait_released(stack, "slow", timeout=30)

    # Pending events kept coming while GKE worked; each was answered "exists", none created twice.
    assert len(stack.decisions("provision.exists")) >= 2
    assert_clean_run(stack, "slow", slices=2)


def test_kubernetes_api_outage_loses_no_work(stack: Stack) -> None:
    assert stack.router is not None
    submit(stack, exclusive_tpu_jobset("outage", replicas=1, topology="2x2"))
    stack.kube.set_down(True)  # the functions' reads now answer 503; the cluster itself runs on
    try:
        stack.wait_for(
            lambda: any(d.function == "provision" and d.status == 503 for d in stack.relay.deliveries),
            15,
            "provision to meet the outage",
        )
        assert create_requests(stack, "outage") == {}
    finally:
        stack.kube.set_down(False)

    assert wait_finished(stack, "outage", timeout=40) == "Completed"
    wait_released(stack, "outage")
    assert _refused_then_acked(stack, "provision", 503)
    assert_clean_run(stack, "outage", slices=1)
