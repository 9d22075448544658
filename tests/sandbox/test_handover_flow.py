"""GKE's multislice tutorial with every pool handed on: each pool goes with the JobSet that used it last.

Three JobSets of v5e 2x4 slices under the simulated Kueue's default queue (24 chips, three slices):
the 1- and 2-slice JobSets run together, the 3-slice one waits. When the 1- and 2-slice JobSets
finish, release keeps their idle pools for the queued one (``release.offered``) and its pods bind to
them as soon as Kueue admits it, before any function looks at the pools again. The product must
record that JobSet as the pools' owner (issue 20), so that its own completion releases them: no pool
is left for the reconcile sweep (which this stack never runs by itself), each is deleted by the
release of the JobSet that ran on it last, and ``kubectl describe`` on every JobSet names every
pool it ran on.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import pytest

from sandbox.stack.core import Stack
from sandbox.stack.demo_kueue import NAMESPACE, queued_jobset
from sandbox.stack.kueue import apply_kueue
from sandbox.testing.stack import PoolWatch, admitted, pods_killed, restarts
from shared.core import labels

pytestmark = pytest.mark.integration

# (name, slices, run seconds): the 1-slice JobSet ends first, then the 2-slice one; the 3-slice one,
# queued behind both, runs on their pools.
RUNS = (("multislice-1", 1, 2.0), ("multislice-2", 2, 4.0), ("multislice-3", 3, 2.0))
_POOL = re.compile(r"tpu-[a-z0-9-]+")


def pools_ran_on(stack: Stack) -> dict[str, list[tuple[str, str]]]:
    """Pool -> (pod start time, JobSet) of every pod that ran on one of its nodes, oldest first.

    The simulated nodes are named ``gke-<cluster>-<pool>-<index>`` as GKE's are, and finished pods
    keep their node name, so the pods in the API tell who ran where after the pools are gone.
    """
    created = {str(d.get("pool")) for d in stack.decisions("provision.created")}
    ran: dict[str, list[tuple[str, str]]] = {pool: [] for pool in created}
    for pod in stack.kube.list("v1", "pods", NAMESPACE):
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        jobset = str(((pod.get("metadata") or {}).get("labels") or {}).get(labels.JOBSET_NAME, ""))
        for pool in created:
            if node.startswith("gke-") and f"-{pool}-" in node:
                ran[pool].append((str((pod.get("status") or {}).get("startTime", "")), jobset))
    return {pool: sorted(users) for pool, users in ran.items()}


def pools_named(stack: Stack, jobset: str) -> set[str]:
    """Pools named by the product's Events on the JobSet itself (what ``kubectl describe`` lists)."""
    found: set[str] = set()
    for event in stack.events(namespace=NAMESPACE):
        involved = event.get("involvedObject") or {}
        mine = involved.get("kind") == "JobSet" and involved.get("name") == jobset
        if mine and str(event.get("reason", "")).startswith("TPUSlice"):
            found.update(_POOL.findall(str(event.get("message", ""))))
    return found


def test_every_pool_is_deleted_by_the_release_of_the_jobset_that_ran_on_it_last(
    stack: Stack, timeline_on_failure: None
) -> None:
    updated: list[dict[str, Any]] = []  # each pool as GKE holds it once an UpdateNodePool is done
    stack.gke.on_pool_updated(lambda cluster, pool: updated.append(pool))
    apply_kueue(stack, timeout=30)  # the packaged default: 24 chips of v5e 2x4 in multislice-queue
    with PoolWatch(stack) as watch:
        for name, slices, seconds in RUNS[:2]:
            stack.submit(queued_jobset(name, slices, seconds))
        stack.wait_for(lambda: all(admitted(stack, n) for n, _, _ in RUNS[:2]), 30, "Kueue to admit 1 and 2")
        last, slices, seconds = RUNS[2]
        stack.submit(queued_jobset(last, slices, seconds))
        for name, _, _ in RUNS:
            stack.wait_for(
                lambda n=name: stack.jobset_state(NAMESPACE, n) in ("Completed", "Failed"),  # type: ignore[misc]
                60,
                f"JobSet {name} to finish",
            )
        # No reconcile sweep runs here: a pool nobody adopted would stay until the timeout.
        stack.wait_for(lambda: not stack.managed_pools(), 30, "every pool to be released")

    names = [name for name, _, _ in RUNS]
    assert {n: stack.jobset_state(NAMESPACE, n) for n in names} == dict.fromkeys(names, "Completed")
    assert {n: restarts(stack, n) for n in names} == dict.fromkeys(names, 0)
    assert pods_killed(stack, *names) == []
    assert watch.crowded == [], watch.crowded[:3]

    ran = pools_ran_on(stack)
    assert len(ran) >= 3 and all(ran.values()), ran
    last_user = {pool: users[-1][1] for pool, users in ran.items()}
    # The point of the handover: the queued JobSet ran on pools it did not create.
    handed = [pool for pool, users in ran.items() if len({j for _, j in users}) > 1]
    assert handed and all(last_user[p] == last for p in handed), ran

    deleted: dict[str, list[tuple[str, str]]] = {}
    for line in stack.decisions("release.deleted"):
        deleted.setdefault(str(line.get("pool")), []).append(
            (str(line.get("function")), str(line.get("jobset")))
        )
    assert {pool: deleted.get(pool) for pool in ran} == {
        pool: [("release", f"{NAMESPACE}/{user}")] for pool, user in last_user.items()
    }
    assert [d for d in stack.decisions("release.deleted") if d.get("function") != "release"] == []

    # ``kubectl describe`` on each JobSet names every pool it ran on (Requested, Adopted, Released).
    used: dict[str, set[str]] = {name: set() for name in names}
    for pool, users in ran.items():
        for _, jobset in users:
            used[jobset].add(pool)

    def described() -> dict[str, set[str]]:
        return {name: used[name] - pools_named(stack, name) for name in names}

    # The last Released Event is written after the last delete request, from another process.
    with contextlib.suppress(TimeoutError):
        stack.wait_for(lambda: not any(described().values()), 10, "the Events to name every pool")
    assert described() == {name: set() for name in names}
    adopted = _adopted(stack, last)
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


def _adopted(stack: Stack, jobset: str) -> set[str]:
    found: set[str] = set()
    for event in stack.events(labels.REASON_ADOPTED, NAMESPACE):
        if (event.get("involvedObject") or {}).get("name") == jobset:
            found.update(_POOL.findall(str(event.get("message", ""))))
    return found
