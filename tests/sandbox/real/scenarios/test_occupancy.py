"""Never delete a pool under a running workload, on the real components (``RealStack``) with Kueue.

Ported from the stand-in stack's tests/sandbox/test_occupancy_flow.py and test_handover_flow.py
(deleted; the preemption and same-name scenarios were already ported to
test_realstack.py). The queues are applied by the product's ``apply_kueue`` and enforced by the
real Kueue; the real JobSet controller restarts, suspends and resumes JobSets; the real scheduler
places pods on whichever pool of the right shape it finds. Each scenario checks what a user sees:
how every JobSet ended and how often it restarted, that no pod died with its node pool (from the
real pods: ``PodFates``), that no slice had two pools at once, that nothing leaked, and the
``TPUSliceAdopted`` / ``TPUSliceReleased`` Events on the right JobSet.

The package's stack (``conftest``) runs the functions with ``SUSPEND_GRACE_SECONDS=1``, the queues
applied by ``apply_kueue``; the reconcile sweep (every 5 minutes in infra) is triggered by hand.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Any

import pytest

from sandbox.kube.kwok import FAIL_UNTIL_ATTEMPT
from sandbox.realstack import demo
from sandbox.realstack.core import RealStack
from sandbox.realstack.kubestate import follow
from sandbox.testing.stack import (
    PoolWatch,
    admitted,
    events_about,
    exclusive_tpu_jobset,
    gke_requests,
    kube,
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

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("timeline_on_failure")]

FINISH = 180.0
RELEASE = 120.0
V5E = demo.ACCELERATOR  # a v5e 2x4 slice: 2 VMs of 4 chips, 8 chips of quota


def v5e(name: str, slices: int, run_seconds: float, queue: str = "") -> dict[str, Any]:
    """A multislice JobSet of v5e 2x4 slices, one slice per node pool (queued when ``queue``)."""
    jobset = exclusive_tpu_jobset(
        name, replicas=slices, accelerator=V5E, topology="2x4", chips_per_vm=4, run_seconds=run_seconds
    )
    return queued(jobset, queue) if queue else jobset


def pods(stack: RealStack, name: str) -> list[dict[str, Any]]:
    return kube(stack).list("v1", "pods", "default", f"{labels.JOBSET_NAME}={name}")


def running_pods(stack: RealStack, name: str, count: int) -> list[dict[str, Any]]:
    """The JobSet's Running pods once there are ``count`` of them, else an empty list."""
    found = [p for p in pods(stack, name) if (p.get("status") or {}).get("phase") == "Running"]
    return found if len(found) == count else []


def messages(events: list[dict[str, Any]]) -> list[str]:
    return [str(e.get("message", "")) for e in events]


_POOL = re.compile(r"tpu-[a-z0-9-]+")


def assert_never_provisioned_twice(watch: PoolWatch, stack: RealStack) -> None:
    """No slice ever had two pools made for it. The real scheduler places a slice's pods on any free
    pool of its shape: a pool the slice's pods run on (or ran on last) can be handed to it while the
    pool made for it is still there (its own JobSet still runs, or it is held for a queued JobSet),
    so two pools may carry one slice's labels for seconds; the second is always one handed over."""
    adoptions = stack.decisions("release.adopted")
    handed_over = {p for d in adoptions for p in _POOL.findall(str(d.get("message")))}
    for sample in watch.crowded:
        for key, crowd in sample.items():
            # The pool made for this slice is the one whose first owner labels were the slice's (a
            # pool is created with them); its name cannot tell, since long JobSet names are cut.
            own = [p for p in crowd if watch.owners.get(p, [()])[0] == tuple(key.split("/"))]
            assert len(own) <= 1 and set(crowd) - set(own) <= handed_over, (sample, handed_over)


def assert_user_view(watch: PoolWatch, stack: RealStack, *names: str) -> None:
    """No pod died with its pool, no slice was provisioned twice, nothing is left."""
    assert pods_killed(stack, *names) == [], "a pool was deleted under a running pod"
    assert_never_provisioned_twice(watch, stack)
    for name in names:
        assert owned_pools(stack, name) == [], f"pools of {name} left behind"


class PodPlaces:
    """Where every pod of the namespace ran (its Node) and when it started, from a watch of the real
    pods: they outlive neither their JobSet's end for long nor the pod GC once their Node is gone."""

    def __init__(self, stack: RealStack) -> None:
        self.api = stack.kube_cluster.client()
        self.places: dict[str, tuple[str, str, str]] = {}  # pod -> (node, start time, JobSet)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-places", daemon=True)

    def __enter__(self) -> PodPlaces:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        follow(self.api, "/api/v1/namespaces/default/pods", self._seen, self._stop, self.errors, timeout=2)

    def _seen(self, event_type: str, pod: dict[str, Any]) -> None:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        started = str((pod.get("status") or {}).get("startTime") or "")
        jobset = str(((pod.get("metadata") or {}).get("labels") or {}).get(labels.JOBSET_NAME, ""))
        if node and started:
            self.places.setdefault(str(pod["metadata"]["name"]), (node, started, jobset))


# -- occupancy (from test_occupancy_flow.py) ------------------------------------------------------


def hold_queue(stack: RealStack, queue: str, policy: str) -> None:
    """Set LocalQueue ``default/queue``'s ``spec.stopPolicy`` and wait until Kueue reports it
    (its ``Active`` condition False under a hold, True without one)."""
    path = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/default/localqueues/{queue}"
    api = stack.kube_cluster.client()
    api.patch(path, {"spec": {"stopPolicy": policy}})
    active = "True" if policy == "None" else "False"

    def reported() -> bool:
        conditions = ((api.get(path) or {}).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Active" and c.get("status") == active for c in conditions)

    stack.wait_for(reported, 30, f"LocalQueue {queue} to be {'active' if active == 'True' else 'held'}")


def test_an_idle_spot_pool_is_held_for_a_waiting_jobset_whose_capacity_policy_allows_spot(
    stack: RealStack,
) -> None:
    """Ported from tests/sandbox/test_occupancy_flow.py. The second JobSet waits in Kueue (only a
    JobSet queued there is demand, shared.provisioning.release.occupancy.demand): its LocalQueue is
    held (``spec.stopPolicy: Hold``, which lets admitted Workloads finish) until the first JobSet's
    pools are held for it, then released as an admin would; the real Kueue admits it, the real
    JobSet controller creates its Jobs and the real scheduler binds the pods to the held pools."""
    policy = {labels.CAPACITY_POLICY: "spot, on-demand"}
    first = v5e("spot-a", 2, run_seconds=8, queue="reuse")  # long enough to be seen running
    first["metadata"]["annotations"].update(policy)
    second = v5e("spot-b", 2, run_seconds=5, queue="reuse")
    second["metadata"]["annotations"].update(policy)
    with PoolWatch(stack) as watch:
        submit(stack, first)
        stack.wait_for(lambda: running_pods(stack, "spot-a", 4), FINISH, "the first JobSet to run")
        first_pools = sorted(p["name"] for p in owned_pools(stack, "spot-a"))
        assert len(first_pools) == 2
        assert all(p["config"].get("spot") for p in owned_pools(stack, "spot-a"))
        hold_queue(stack, "reuse", "Hold")
        try:
            submit(stack, second)
            assert wait_finished(stack, "spot-a", FINISH) == "Completed"
            stack.wait_for(
                lambda: {d.get("pool") for d in stack.decisions("release.offered")} >= set(first_pools),
                60,
                "the idle Spot pools to be held for the waiting JobSet",
            )
            assert not admitted(stack, "spot-b")  # still waiting: the pools were held, not taken
        finally:
            hold_queue(stack, "reuse", "None")
        stack.wait_for(lambda: running_pods(stack, "spot-b", 4), FINISH, "the second JobSet to run")
        # The pods bound to the held pools without a pending event: the sweep records the new owner.
        stack.trigger_reconcile()
        stack.wait_for(lambda: len(owned_pools(stack, "spot-b")) == 2, 60, "the pools to be adopted")
        assert wait_finished(stack, "spot-b", FINISH) == "Completed"
        wait_released(stack, "spot-a", RELEASE)
        wait_released(stack, "spot-b", RELEASE)

    assert successful_creates(stack, "spot-b") == {}  # it ran on the first JobSet's Spot pools
    for pool in first_pools:
        assert watch.carried_by(pool)[:2] == ["spot-a", "spot-b"], watch.owners[pool]
    assert restarts(stack, "spot-b") == 0
    assert_user_view(watch, stack, "spot-a", "spot-b")


def test_two_same_shape_jobsets_admitted_together_get_one_pool_per_slice(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_occupancy_flow.py. There the simulation lock made the
    simulated Kueue see both JobSets in one pass; here both are submitted back to back and the real
    Kueue admits both (the ClusterQueue holds 32 chips, both need 16) before either's pods run."""
    with PoolWatch(stack) as watch:
        submit(stack, v5e("pair-a", 2, run_seconds=2, queue="pair"))
        submit(stack, v5e("pair-b", 2, run_seconds=3, queue="pair"))
        stack.wait_for(lambda: admitted(stack, "pair-a") and admitted(stack, "pair-b"), 60, "admission")

        assert wait_finished(stack, "pair-a", FINISH) == "Completed"
        assert wait_finished(stack, "pair-b", FINISH) == "Completed"
        finished = {name: pods(stack, name) for name in ("pair-a", "pair-b")}
        wait_released(stack, "pair-a", RELEASE)
        wait_released(stack, "pair-b", RELEASE)

    created = successful_creates(stack, "pair-a") + successful_creates(stack, "pair-b")
    assert len(created) == 4 and set(created.values()) == {1}, dict(created)  # pools == slices
    assert len(watch.owners) == 4  # no pool beyond the slices ever existed
    for name in ("pair-a", "pair-b"):
        assert restarts(stack, name) == 0
        assert len([p for p in finished[name] if p["status"]["phase"] == "Succeeded"]) == 4
    assert_user_view(watch, stack, "pair-a", "pair-b")


def test_a_restart_under_the_failure_policy_keeps_the_pools_through_a_sweep(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_occupancy_flow.py. The failure was the simulated scheduler's
    (FAIL_UNTIL_ATTEMPT_ANNOTATION); here KWOK's pod-failed Stage fails attempt 0's pods and the
    real JobSet controller restarts the JobSet (maxRestarts)."""
    jobset = exclusive_tpu_jobset("retry", replicas=2, topology="2x2", run_seconds=3)
    jobset["spec"]["failurePolicy"] = {"maxRestarts": 2}
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"]["annotations"][FAIL_UNTIL_ATTEMPT] = "1"  # attempt 0 fails
    with PoolWatch(stack) as watch:
        submit(stack, jobset)
        stack.wait_for(lambda: restarts(stack, "retry") == 1, FINISH, "the restart")
        pools = {p["name"] for p in owned_pools(stack, "retry")}
        # The safety net runs during the restart too: a restarting JobSet is not over.
        sweeps = len(stack.decisions("reconcile.summary"))
        stack.trigger_reconcile()
        stack.wait_for(lambda: len(stack.decisions("reconcile.summary")) > sweeps, 60, "the sweep")
        assert {p["name"] for p in owned_pools(stack, "retry")} == pools
        assert all(gke_requests(stack, "delete", pool) == 0 for pool in pools)

        assert wait_finished(stack, "retry", FINISH) == "Completed"
        attempts = {p["metadata"]["labels"][labels.RESTART_ATTEMPT] for p in pods(stack, "retry")}
        wait_released(stack, "retry", RELEASE)

    assert restarts(stack, "retry") == 1
    assert attempts == {"1"}  # the real JobSet controller deleted attempt 0's Jobs and pods
    assert len(pools) == 2
    # The same two pools served both attempts: each accepted by GKE once and deleted once.
    assert successful_creates(stack, "retry") == {pool: 1 for pool in pools}
    assert all(gke_requests(stack, "delete", pool) == 1 for pool in pools)
    assert set(watch.owners) == pools
    assert_user_view(watch, stack, "retry")
    released = messages(events_about(stack, labels.REASON_RELEASED, "retry"))
    assert len(released) == 1 and all(pool in released[0] for pool in pools), released


# -- the tutorial's JobSets handed on (from test_handover_flow.py) --------------------------------

# (name, slices, run seconds): the 1-slice JobSet ends first, then the 2-slice one; the 3-slice one,
# queued behind both, runs on their pools.
RUNS = (("multislice-1", 1, 2.0), ("multislice-2", 2, 4.0), ("multislice-3", 3, 2.0))


def _pools_named(stack: RealStack, jobset: str) -> set[str]:
    """Pools named by the product's Events on the JobSet itself (what ``kubectl describe`` lists)."""
    found: set[str] = set()
    for event in stack.events(namespace="default"):
        involved = event.get("involvedObject") or {}
        mine = involved.get("kind") == "JobSet" and involved.get("name") == jobset
        if mine and str(event.get("reason", "")).startswith("TPUSlice"):
            found.update(_POOL.findall(str(event.get("message", ""))))
    return found


def test_every_pool_is_deleted_by_the_release_of_the_jobset_that_ran_on_it_last(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_handover_flow.py. The queue is the packaged default's, applied
    by apply_kueue and enforced by the real Kueue (24 chips: the 3-slice JobSet waits for the 1- and
    2-slice ones); where each pod ran is read from the real pods as they run (the pod GC removes
    them once their Node is gone)."""
    updated: list[dict[str, Any]] = []  # each pool as GKE holds it once an UpdateNodePool is done
    stack.gke.on_pool_updated(lambda cluster, pool: updated.append(pool))
    with PoolWatch(stack) as watch, PodPlaces(stack) as places:
        for name, slices, seconds in RUNS[:2]:
            stack.submit(demo.queued_jobset(name, slices, seconds))
        stack.wait_for(lambda: all(admitted(stack, n) for n, _, _ in RUNS[:2]), 60, "Kueue to admit 1 and 2")
        last, slices, seconds = RUNS[2]
        stack.submit(demo.queued_jobset(last, slices, seconds))
        for name, _, _ in RUNS:
            stack.wait_for(
                lambda n=name: stack.jobset_state("default", n) in ("Completed", "Failed"),  # type: ignore[misc]
                FINISH,
                f"JobSet {name} to finish",
            )
        # No reconcile sweep runs here: a pool nobody adopted would stay until the timeout.
        stack.wait_for(
            lambda: not [p for n, _, _ in RUNS for p in owned_pools(stack, n)], RELEASE, "every pool released"
        )

    names = [name for name, _, _ in RUNS]
    assert {n: stack.jobset_state("default", n) for n in names} == dict.fromkeys(names, "Completed")
    assert {n: restarts(stack, n) for n in names} == dict.fromkeys(names, 0)
    assert pods_killed(stack, *names) == []
    assert_never_provisioned_twice(watch, stack)

    created = {str(d.get("pool")) for d in stack.decisions("provision.created")}
    node_pool = {f"gke-{stack.config.cluster_name}-{pool}-": pool for pool in created}
    ran: dict[str, list[tuple[str, str]]] = {}
    for node, started, jobset in places.places.values():
        if jobset not in names:
            continue
        pool = next((p for prefix, p in node_pool.items() if node.startswith(prefix)), "")
        if pool:
            ran.setdefault(pool, []).append((started, jobset))
    ran = {pool: sorted(users) for pool, users in ran.items()}
    assert len(ran) >= 3, ran
    last_user = {pool: users[-1][1] for pool, users in ran.items()}
    # The point of the handover: the queued JobSet ran on pools it did not create.
    handed = [pool for pool, users in ran.items() if len({j for _, j in users}) > 1]
    assert handed and all(last_user[p] == last for p in handed), ran

    deleted: dict[str, list[tuple[str, str]]] = {}
    for line in stack.decisions("release.deleted"):
        if str(line.get("pool")) in ran:
            deleted.setdefault(str(line.get("pool")), []).append(
                (str(line.get("function")), str(line.get("jobset")))
            )
    assert {pool: deleted.get(pool) for pool in ran} == {
        pool: [("release", f"default/{user}")] for pool, user in last_user.items()
    }

    # ``kubectl describe`` on each JobSet names every pool made for it and every pool it ran on last
    # (Requested, Adopted, Released). A JobSet whose pods finished on a same-shape pool that then
    # went on to another JobSet is not told of that pool: which one the real scheduler picks is its
    # choice, and nothing of the product's changed hands.
    used: dict[str, set[str]] = {name: set() for name in names}
    for pool in ran:
        used[last_user[pool]].add(pool)
        used.update({n: used[n] | {pool} for n in names if watch.carried_by(pool)[:1] == [n]})

    def described() -> dict[str, set[str]]:
        return {name: used[name] - _pools_named(stack, name) for name in names}

    # The last Released Event is written after the last delete request, from another process.
    with contextlib.suppress(TimeoutError):
        stack.wait_for(lambda: not any(described().values()), 30, "the Events to name every pool")
    assert described() == {name: set() for name in names}
    adopted: set[str] = set()
    for event in stack.events(labels.REASON_ADOPTED, "default"):
        if (event.get("involvedObject") or {}).get("name") == last:
            adopted.update(_POOL.findall(str(event.get("message", ""))))
    assert set(handed) <= adopted, (handed, adopted)
    # Every relabel that named a new owner moved the billing label to it in the same operation.
    owners = [
        (
            pool["config"]["labels"].get(labels.OWNER_NAME),
            (pool["config"].get("resourceLabels") or {}).get(labels.RESOURCE_LABEL_JOBSET),
        )
        for pool in updated
        if labels.HANDED_OVER_FROM in pool["config"]["labels"]
    ]
    assert all(node == billing for node, billing in owners), owners
