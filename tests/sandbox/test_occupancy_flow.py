"""Never delete a pool under a running workload, on the whole sandbox with Kueue (issue 11).

Real functions under functions-framework, the Pub/Sub emulator, the GKE emulator and the simulated
Kueue, JobSet controller and scheduler. Pools of one shape are interchangeable to the scheduler, so
a preemptor, a recreated JobSet or a neighbour admitted at the same time lands on pools made for
somebody else; each scenario checks what a user would see: how every JobSet ended and how often it
restarted, that no pod died with its node pool, that no slice ever had two pools at once, that
nothing leaked, and the ``TPUSliceAdopted`` / ``TPUSliceReleased`` Events on the right JobSet.

The stack's functions run with ``SUSPEND_GRACE_SECONDS=1`` so a preempted JobSet's pools are up
for release a second after Kueue suspends it; the reconcile sweep (every 5 minutes in infra) is
triggered by hand where a scenario relies on it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.cluster.common import FAIL_UNTIL_ATTEMPT_ANNOTATION
from sandbox.stack.core import Stack
from sandbox.stack.kueue import apply_kueue
from sandbox.testing.stack import (
    FAST,
    PoolWatch,
    admitted,
    events_about,
    exclusive_tpu_jobset,
    gke_requests,
    owned_pools,
    pods_killed,
    queued,
    restarts,
    submit,
    successful_creates,
    wait_finished,
    wait_released,
)
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("timeline_on_failure", "queues")]

V5E = "tpu-v5-lite-podslice"  # a v5e 2x4 slice: 2 VMs of 4 chips, 8 chips of quota
QUEUES = f"""
flavors:
  - {{name: v5e-2x4, accelerator: {V5E}, topology: 2x4}}
clusterQueues:
  - name: preempt-cq
    preemption: {{withinClusterQueue: LowerPriority}}
    quota: {{v5e-2x4: 16}}
  - name: pair-cq
    quota: {{v5e-2x4: 32}}
  - name: reuse-cq
    quota: {{v5e-2x4: 16}}
localQueues:
  - {{name: preempt, namespace: default, clusterQueue: preempt-cq}}
  - {{name: pair, namespace: default, clusterQueue: pair-cq}}
  - {{name: reuse, namespace: default, clusterQueue: reuse-cq}}
priorityClasses:
  - {{name: low, value: 100, kind: WorkloadPriorityClass}}
  - {{name: high, value: 1000, kind: WorkloadPriorityClass}}
"""
SUSPEND_GRACE = 1


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """This module's sandbox: FAST, with a one-second suspend grace in the functions' settings."""
    config = dataclasses.replace(FAST, function_env={"SUSPEND_GRACE_SECONDS": str(SUSPEND_GRACE)})
    with Stack(config) as running:
        yield running


@pytest.fixture(scope="module")
def queues(stack: Stack) -> None:
    """The module's ClusterQueues and LocalQueues, applied once through the product's Kueue path."""
    apply_kueue(stack, QUEUES, timeout=30)


def v5e(name: str, slices: int, run_seconds: float, queue: str, priority: str = "") -> dict[str, Any]:
    """A queued multislice JobSet of v5e 2x4 slices, one slice per node pool."""
    jobset = exclusive_tpu_jobset(
        name, replicas=slices, accelerator=V5E, topology="2x4", chips_per_vm=4, run_seconds=run_seconds
    )
    return queued(jobset, queue, priority)


def pods(stack: Stack, name: str) -> list[dict[str, Any]]:
    return stack.kube.list("v1", "pods", "default", label_selector=f"{labels.JOBSET_NAME}={name}")


def running_pods(stack: Stack, name: str, count: int) -> list[dict[str, Any]]:
    """The JobSet's Running pods once there are ``count`` of them, else an empty list."""
    found = [p for p in pods(stack, name) if (p.get("status") or {}).get("phase") == "Running"]
    return found if len(found) == count else []


def pool_of(stack: Stack, pod: dict[str, Any]) -> str:
    node = stack.kube.get("v1", "nodes", None, pod["spec"]["nodeName"]) or {}
    return str(node["metadata"]["labels"][labels.NODEPOOL])


def messages(events: list[dict[str, Any]]) -> list[str]:
    return [str(e.get("message", "")) for e in events]


def assert_user_view(watch: PoolWatch, stack: Stack, *names: str) -> None:
    """No pod died with its pool, no slice had two pools at once, nothing is left."""
    assert pods_killed(stack, *names) == [], "a pool was deleted under a running pod"
    assert watch.crowded == [], f"one slice had several pools at once: {watch.crowded[:3]}"
    for name in names:
        assert owned_pools(stack, name) == [], f"pools of {name} left behind"
    assert stack.jobsets.errors == [] and stack.scheduler.errors == []
    assert stack.kueue is not None and stack.kueue.errors == []


def test_same_shape_preemptor_adopts_the_victims_pools_and_never_restarts(stack: Stack) -> None:
    with PoolWatch(stack) as watch:
        submit(stack, v5e("victim", 2, run_seconds=6, queue="preempt", priority="low"))
        victim_pods = stack.wait_for(lambda: running_pods(stack, "victim", 4), 30, "the victim to run")
        victim_pools = {pool_of(stack, p) for p in victim_pods}
        assert len(victim_pools) == 2

        # Long enough to be still running when the sweep after the grace adopts its pools.
        submit(stack, v5e("preemptor", 2, run_seconds=12, queue="preempt", priority="high"))
        stack.wait_for(lambda: stack.jobset_state("default", "victim") == "Suspended", 10, "preemption")
        landed = stack.wait_for(lambda: running_pods(stack, "preemptor", 4), 10, "the preemptor to run")
        assert {pool_of(stack, p) for p in landed} == victim_pools  # straight onto the victim's pools

        time.sleep(SUSPEND_GRACE + 0.5)  # the victim is now suspended past its grace
        stack.trigger_reconcile()
        stack.wait_for(
            lambda: len(events_about(stack, labels.REASON_ADOPTED, "preemptor")) >= 2,
            15,
            "the preemptor to adopt both pools",
        )
        assert {p["name"] for p in owned_pools(stack, "preemptor")} == victim_pools
        assert stack.jobset_state("default", "preemptor") == "Running"

        assert wait_finished(stack, "preemptor", 30) == "Completed"
        assert wait_finished(stack, "victim", 40) == "Completed"  # readmitted once the preemptor is done
        wait_released(stack, "preemptor", 20)
        wait_released(stack, "victim", 20)

    assert restarts(stack, "preemptor") == 0
    assert successful_creates(stack, "preemptor") == {}  # it never needed a pool of its own
    assert_user_view(watch, stack, "victim", "preemptor")
    handed = messages(events_about(stack, labels.REASON_RELEASED, "victim"))
    assert any("handed node pool" in m and "default/preemptor" in m for m in handed), handed
    on_preemptor = events_about(stack, labels.REASON_ADOPTED, "preemptor")
    assert {e["involvedObject"]["kind"] for e in on_preemptor} == {"JobSet"}
    assert all("default/victim" in m for m in messages(on_preemptor))
    for pool in victim_pools:
        assert watch.carried_by(pool)[:2] == ["victim", "preemptor"], watch.owners[pool]
        assert successful_creates(stack, "victim")[pool] == 1


def test_recreated_jobset_of_the_same_name_never_loses_a_pod(stack: Stack) -> None:
    with PoolWatch(stack) as watch:
        first = submit(stack, v5e("reborn", 2, run_seconds=30, queue="reuse"))
        stack.wait_for(lambda: running_pods(stack, "reborn", 4), 30, "the first incarnation to run")
        old_pools = {p["name"] for p in owned_pools(stack, "reborn")}
        assert len(old_pools) == 2

        assert stack.delete_jobset("default", "reborn")
        stack.wait_for(lambda: stack.jobset("default", "reborn") is None, 10, "the JobSet to be gone")
        second = submit(stack, v5e("reborn", 2, run_seconds=4, queue="reuse"))
        new_uid = second["metadata"]["uid"]
        assert new_uid != first["metadata"]["uid"]

        assert wait_finished(stack, "reborn", 40) == "Completed"
        wait_released(stack, "reborn", 20)
        stack.wait_for(
            lambda: not {p["name"] for p in stack.managed_pools()} & old_pools, 20, "the old pools to go"
        )

    assert restarts(stack, "reborn") == 0
    assert all(p["metadata"]["labels"][labels.JOBSET_UID] == new_uid for p in pods(stack, "reborn"))
    assert_user_view(watch, stack, "reborn")
    for pool in old_pools:  # deleted, or handed to the new incarnation and deleted when it ended
        # Accepted once by GKE (a second create request, racing it or resent after GKE refused it for
        # another running operation, is not a second pool: assert_user_view checks that).
        assert successful_creates(stack, "reborn")[pool] == 1
        assert gke_requests(stack, "delete", pool) >= 1


def test_an_idle_spot_pool_is_held_for_a_waiting_jobset_whose_capacity_policy_allows_spot(
    stack: Stack,
) -> None:
    # Neither JobSet's pods select capacity; their policy puts Spot first, so the first one's pools
    # are Spot. The second waits suspended when the first completes: its policy allows Spot, so the
    # idle pools are held for it (not deleted) and it runs on them once resumed.
    policy = {labels.CAPACITY_POLICY: "spot, on-demand"}
    first = v5e("spot-a", 2, run_seconds=2, queue="reuse")
    first["metadata"]["annotations"] = policy
    second = exclusive_tpu_jobset(
        "spot-b", replicas=2, accelerator=V5E, topology="2x4", chips_per_vm=4, run_seconds=5
    )
    second["metadata"]["annotations"] = policy
    second["spec"]["suspend"] = True  # waiting (as a Kueue-queued JobSet waits), not yet admitted
    with PoolWatch(stack) as watch:
        submit(stack, first)
        stack.wait_for(lambda: running_pods(stack, "spot-a", 4), 30, "the first JobSet to run")
        first_pools = sorted(p["name"] for p in owned_pools(stack, "spot-a"))
        assert len(first_pools) == 2
        assert all(p["config"].get("spot") for p in owned_pools(stack, "spot-a"))
        submit(stack, second)

        assert wait_finished(stack, "spot-a", 30) == "Completed"
        stack.wait_for(
            lambda: {d.get("pool") for d in stack.decisions("release.offered")} >= set(first_pools),
            20,
            "the idle Spot pools to be held for the waiting JobSet",
        )
        waiting = stack.jobset("default", "spot-b")
        assert waiting is not None
        waiting["spec"]["suspend"] = False
        stack.kube.put(waiting)
        stack.wait_for(lambda: running_pods(stack, "spot-b", 4), 20, "the second JobSet to run")
        # The pods bound to the held pools without a pending event: the sweep records the new owner.
        stack.trigger_reconcile()
        stack.wait_for(lambda: len(owned_pools(stack, "spot-b")) == 2, 15, "the pools to be adopted")
        assert wait_finished(stack, "spot-b", 40) == "Completed"
        wait_released(stack, "spot-a", 20)
        wait_released(stack, "spot-b", 20)

    assert successful_creates(stack, "spot-b") == {}  # it ran on the first JobSet's Spot pools
    for pool in first_pools:
        assert watch.carried_by(pool)[:2] == ["spot-a", "spot-b"], watch.owners[pool]
    assert restarts(stack, "spot-b") == 0
    assert_user_view(watch, stack, "spot-a", "spot-b")


def test_two_same_shape_jobsets_admitted_together_get_one_pool_per_slice(stack: Stack) -> None:
    with PoolWatch(stack) as watch:
        # Holding the simulation lock makes Kueue see both JobSets in the same pass.
        with stack.ctx.lock:
            submit(stack, v5e("pair-a", 2, run_seconds=2, queue="pair"))
            submit(stack, v5e("pair-b", 2, run_seconds=3, queue="pair"))
        stack.wait_for(lambda: admitted(stack, "pair-a") and admitted(stack, "pair-b"), 10, "admission")

        assert wait_finished(stack, "pair-a", 40) == "Completed"
        assert wait_finished(stack, "pair-b", 40) == "Completed"
        wait_released(stack, "pair-a", 20)
        wait_released(stack, "pair-b", 20)

    created = successful_creates(stack, "pair-a") + successful_creates(stack, "pair-b")
    assert len(created) == 4 and set(created.values()) == {1}, dict(created)  # pools == slices
    assert len(watch.owners) == 4  # no pool beyond the slices ever existed
    for name in ("pair-a", "pair-b"):
        assert restarts(stack, name) == 0
        finished = [p for p in pods(stack, name) if p["status"]["phase"] == "Succeeded"]
        assert len(finished) == 4
    assert_user_view(watch, stack, "pair-a", "pair-b")


def test_a_restart_under_the_failure_policy_keeps_the_pools(stack: Stack) -> None:
    jobset = exclusive_tpu_jobset("retry", replicas=2, topology="2x2", run_seconds=2)
    jobset["spec"]["failurePolicy"] = {"maxRestarts": 2}
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"]["annotations"][FAIL_UNTIL_ATTEMPT_ANNOTATION] = "1"  # attempt 0 fails
    with PoolWatch(stack) as watch:
        submit(stack, jobset)
        stack.wait_for(lambda: restarts(stack, "retry") == 1, 30, "the restart")
        pools = {p["name"] for p in owned_pools(stack, "retry")}
        # The safety net runs during the restart too: a restarting JobSet is not over.
        sweeps = len(stack.decisions("reconcile.summary"))
        stack.trigger_reconcile()
        stack.wait_for(lambda: len(stack.decisions("reconcile.summary")) > sweeps, 15, "the sweep")
        assert {p["name"] for p in owned_pools(stack, "retry")} == pools
        assert all(gke_requests(stack, "delete", pool) == 0 for pool in pools)

        assert wait_finished(stack, "retry") == "Completed"
        wait_released(stack, "retry")

    assert restarts(stack, "retry") == 1
    assert {p["metadata"]["labels"][labels.RESTART_ATTEMPT] for p in pods(stack, "retry")} == {"1"}
    assert len(pools) == 2
    # The same two pools served both attempts: each created once and deleted once. A create request
    # may be sent twice (a delivery and a resume racing in one instance: the second gets 409), so
    # count the creates GKE accepted, not the requests.
    assert successful_creates(stack, "retry") == {pool: 1 for pool in pools}
    assert all(gke_requests(stack, "delete", pool) == 1 for pool in pools)
    assert set(watch.owners) == pools
    assert_user_view(watch, stack, "retry")
    released = messages(events_about(stack, labels.REASON_RELEASED, "retry"))
    assert len(released) == 1 and all(pool in released[0] for pool in pools), released
