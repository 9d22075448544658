"""A pool kept idle for a queued JobSet becomes that JobSet's as soon as a function sees it there.

The queued JobSet's pods bind to the idle pool at once (no pending-pod event, no release of the
former owner left to look), so the pool is adopted by whichever function sees the new owner's pods
on it first: its own release (for the pools it ran on last), provision (a pending-pod event read
when the pod is bound by then), or release/reconcile looking at the pool. Over the stateful fakes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.errors import TransientError
from shared.provisioning.outcomes import SKIPPED
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.release import occupancy
from shared.provisioning.release.occupancy import ADOPT, DELETE, KEEP, Decision, Occupant, Verdict
from shared.provisioning.release.releaser import Releaser
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.nodes import Node
from shared.tpu.owners import Chain
from shared.tpu.pods import Pod
from shared.tpu.slices import build_node_pool, slice_request
from tests.unit.provisioning.releases import (
    CLUSTER,
    SETTINGS,
    ago,
    events,
    finish,
    now,
    owner,
    queue,
    schedulable,
    with_pools,
)

GONE = Verdict(True, "JobSet team-a/a completed")


def admit_onto(kube: FakeKube, jobset: dict[str, Any], pools: list[NodePoolInfo]) -> list[str]:
    """Kueue admits ``jobset``: its pods are created and bind at once to the idle ``pools``."""
    jobset["spec"]["suspend"] = False
    kube.jobsets[("team-a", jobset["metadata"]["name"])] = jobset
    names = []
    for index, pod in enumerate(submit_pods(kube, jobset)):
        pool = pools[int(pod["metadata"]["labels"][labels.JOB_INDEX]) % len(pools)]
        kube.bind("team-a", pod["metadata"]["name"], f"gke-c-{pool.name}-{index % pool.node_count}")
        names.append(pod["metadata"]["name"])
    return names


def submit_pods(kube: FakeKube, jobset: dict[str, Any]) -> list[dict[str, Any]]:
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    return pods


def release(gke: FakeGke, kube: FakeKube, jobset: dict[str, Any]) -> list[str]:
    meta = jobset["metadata"]
    return Releaser(SETTINGS, gke, kube).release("team-a", meta["name"], meta["uid"], "JobSet completed")


def offered(gke: FakeGke, kube: FakeKube) -> tuple[dict[str, Any], NodePoolInfo, dict[str, Any]]:
    """A finished; its pool kept idle for the queued B, which is then admitted onto it."""
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a", when=ago(1))  # within the handover window
    b = queue(kube, "b")
    assert release(gke, kube, a) == []
    assert owner(gke, pool) == ("a", a["metadata"]["uid"])  # offered, not handed yet: B has no pods
    admit_onto(kube, b, [pool])
    return a, pool, b


@contextlib.contextmanager
def release_lines() -> Iterator[list[str]]:
    """The release's log lines, read on its own logger (``tpuprov`` does not propagate once a
    function's logging is configured, so pytest's root-level capture may miss them)."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("tpuprov.release")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_the_release_of_the_jobset_that_ran_last_adopts_the_offered_pool_and_deletes_it(
    gke: FakeGke, kube: FakeKube
) -> None:
    _, pool, b = offered(gke, kube)
    finish(kube, "b")  # B ran on A's idle pool and is over before any function looked at the pool
    relabels = gke.count("set_labels")

    with release_lines() as lines:
        assert release(gke, kube, b) == [pool.name]  # at once: B's release, not the next reconcile

    # The log tells it in the order it happened: B took the pool over, then it was deleted.
    said = [line for line in lines if pool.name in line]
    assert [m.split(":")[0] for m in said] == [f"team-a/b adopts {pool.name}", f"deleting {pool.name}"]

    # No relabel of a pool deleted in the same delivery: GKE would refuse the delete while it ran.
    assert gke.count("set_labels") == relabels
    [adopted] = events(kube, labels.REASON_ADOPTED, "b")
    assert pool.name in adopted and "ran there" in adopted
    [handed] = events(kube, labels.REASON_RELEASED, "a")
    assert f"handed node pool {pool.name} to team-a/b" in handed
    [released] = events(kube, labels.REASON_RELEASED, "b")
    assert f"released node pools {pool.name}" in released


def test_no_handover_is_told_for_a_pool_another_release_deleted_first(gke: FakeGke, kube: FakeKube) -> None:
    # B's release inherits the pool B ran on last and would delete it, but the release of its maker
    # (a second delivery, from its own listing) deleted it a moment before: B never took it.
    _, pool, b = offered(gke, kube)
    finish(kube, "b")
    gone = gke.pools[CLUSTER]

    def deleted_by_the_other(name: str) -> None:
        gke.before_delete = None
        del gone[name]

    gke.before_delete = deleted_by_the_other

    assert release(gke, kube, b) == []

    assert not events(kube, labels.REASON_ADOPTED, "b")
    assert not [m for m in events(kube, labels.REASON_RELEASED, "a") if "handed" in m]
    assert not [m for m in events(kube, labels.REASON_RELEASED, "b") if pool.name in m]


def test_a_handover_and_a_delete_of_one_pool_at_once_leave_it_to_the_handover(
    gke: FakeGke, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's late release judges its pool from a listing taken before B's release handed it on (B ran
    # on it last; C, same shape, is queued by then). GKE writes a relabel's labels on the running
    # Nodes; the delete's look after its cordon sees them, and A's release stands back.
    a, pool, b = offered(gke, kube)
    finish(kube, "b", when=ago(1))
    relabel = gke.set_node_pool_labels

    def on_nodes_too(cluster: str, name: str, new: Any, why: str, resource_labels: Any = None) -> str:
        operation = relabel(cluster, name, new, why, resource_labels)
        for node in kube.nodes.values():
            if node["metadata"]["labels"].get(labels.NODEPOOL) == name:
                node["metadata"]["labels"] = {**node["metadata"]["labels"], **new}
        return operation

    monkeypatch.setattr(gke, "set_node_pool_labels", on_nodes_too)
    looks: list[float] = []

    def settle(seconds: float) -> None:  # after A's cordon: B's delivery runs meanwhile
        looks.append(seconds)
        if len(looks) == 1:
            queue(kube, "c")
            assert (
                Releaser(SETTINGS, gke, kube).release("team-a", "b", b["metadata"]["uid"], "JobSet completed")
                == []
            )

    meta = a["metadata"]
    settings = SETTINGS.with_overrides(cordon_settle_seconds=1)
    assert (
        Releaser(settings, gke, kube, sleep=settle).release("team-a", "a", meta["uid"], "JobSet completed")
        == []
    )

    assert looks and gke.count("delete") == 0
    assert owner(gke, pool) == ("b", b["metadata"]["uid"])
    assert not any(n["spec"].get("unschedulable") for n in kube.nodes.values())
    assert [m for m in events(kube, labels.REASON_ADOPTED, "b") if pool.name in m]
    assert [m for m in events(kube, labels.REASON_RELEASED, "a") if f"team-a/b took {pool.name} over" in m]


def test_a_pool_the_last_user_hands_on_again_is_relabelled_for_it(gke: FakeGke, kube: FakeKube) -> None:
    # B took A's idle pool and is over, but C (same shape) is queued: the pool stays, now B's.
    _, pool, b = offered(gke, kube)
    finish(kube, "b", when=ago(1))
    queue(kube, "c")

    assert release(gke, kube, b) == []

    assert owner(gke, pool) == ("b", b["metadata"]["uid"])
    assert gke.billing[pool.name] == labels.billing_labels("team-a", "b")
    current = gke.pools[CLUSTER][pool.name].labels
    assert current[labels.HANDED_OVER_FROM] == "a"
    # The offer is recorded, dated by B's end (a second ago), not by this look.
    assert abs(int(current[labels.IDLE_SINCE]) - (now().timestamp() - 1)) < 30
    assert gke.count("delete") == 0
    assert [m for m in events(kube, labels.REASON_ADOPTED, "b") if pool.name in m]


def test_a_pool_inherited_within_the_release_grace_is_relabelled_and_kept(
    gke: FakeGke, kube: FakeKube
) -> None:
    _, pool, b = offered(gke, kube)
    finish(kube, "a", when=ago(700))  # A is past the grace, B (which ran on A's pool last) within it
    finish(kube, "b", when=ago(1))
    settings = dataclasses.replace(SETTINGS, release_grace_seconds=600)
    meta = b["metadata"]

    assert Releaser(settings, gke, kube).release("team-a", "b", meta["uid"], "JobSet completed") == []

    assert owner(gke, pool) == ("b", meta["uid"])  # its later release (or reconcile) finds it B's
    assert gke.billing[pool.name] == labels.billing_labels("team-a", "b")
    assert gke.count("delete") == 0


def test_a_live_occupant_takes_the_pool_not_the_finished_jobset_that_ran_before_it(
    gke: FakeGke, kube: FakeKube
) -> None:
    _, pool, b = offered(gke, kube)
    finish(kube, "b")
    c = tpu_jobset("c", "team-a", replicas=1)
    kube.add_jobset(c)
    admit_onto(kube, c, [pool])

    assert release(gke, kube, b) == []  # nothing to retry: the pool is C's, C's end releases it
    assert owner(gke, pool) == ("c", c["metadata"]["uid"])
    assert gke.billing[pool.name][labels.RESOURCE_LABEL_JOBSET] == "c"
    assert events(kube, labels.REASON_ADOPTED, "b") == []
    assert gke.count("delete") == 0


def test_the_owner_still_needing_its_pool_keeps_it_whoever_ran_there(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)  # A runs
    b = tpu_jobset("b", "team-a", replicas=1)
    kube.add_jobset(b)
    admit_onto(kube, b, [pool])
    finish(kube, "b")

    with release_lines() as lines:
        assert release(gke, kube, b) == []
    assert owner(gke, pool) == ("a", a["metadata"]["uid"])
    assert gke.count("set_labels") == 0 and gke.count("delete") == 0
    # B's release says nothing about A's pool (no "kept" line: it is A's business).
    assert [line for line in lines if pool.name in line] == []


def test_provision_adopts_the_pool_a_bound_pod_of_the_new_owner_runs_on(gke: FakeGke, kube: FakeKube) -> None:
    _, pool, b = offered(gke, kube)
    pod = next(p for p in kube.pods.values() if p["metadata"]["labels"][labels.JOBSET_NAME] == "b")
    pod["status"]["phase"] = "Running"
    provisioner = Provisioner(Services(SETTINGS, gke, kube))

    outcome = provisioner.handle_pending_pod("team-a", pod["metadata"]["name"], now())

    assert outcome.result == SKIPPED and f"adopted node pool {pool.name}" in outcome.why
    assert owner(gke, pool) == ("b", b["metadata"]["uid"])
    assert gke.billing[pool.name] == labels.billing_labels("team-a", "b")
    [adopted] = events(kube, labels.REASON_ADOPTED, "b")
    assert pool.name in adopted and "it is released when this JobSet ends" in adopted
    # Idempotent: a duplicate delivery finds the pool B's and changes nothing.
    relabels = gke.count("set_labels")
    again = provisioner.handle_pending_pod("team-a", pod["metadata"]["name"], now())
    assert "adopted" not in again.why and gke.count("set_labels") == relabels
    # B's completion releases it at once.
    finish(kube, "b")
    assert release(gke, kube, b) == [pool.name]


def test_provision_redelivers_when_gke_is_busy_with_the_pool(gke: FakeGke, kube: FakeKube) -> None:
    # A concurrent adopter's relabel holds the pool's one operation slot: GKE says "incompatible".
    _, pool, _ = offered(gke, kube)
    pod = next(p for p in kube.pods.values() if p["metadata"]["labels"][labels.JOBSET_NAME] == "b")
    gke.fail("set_labels", "incompatible")

    with pytest.raises(TransientError, match="incompatible operation"):
        Provisioner(Services(SETTINGS, gke, kube)).handle_pending_pod(
            "team-a", pod["metadata"]["name"], now()
        )
    assert owner(gke, pool)[0] == "a"
    assert events(kube, labels.REASON_ADOPTED, "b") == []


def test_provision_reads_nothing_more_for_a_pod_on_its_own_pool(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    with_pools(gke, kube, a)
    pod = next(iter(kube.pods.values()))
    calls = list(gke.calls)

    outcome = Provisioner(Services(SETTINGS, gke, kube)).handle_pending_pod(
        "team-a", pod["metadata"]["name"], now()
    )

    assert outcome.result == SKIPPED and "adopted" not in outcome.why
    assert gke.calls == calls  # no GKE read, no relabel


def occ(name: str, uid: str, pods: int = 1) -> Occupant:
    return Occupant("team-a", name, uid, "slice", "0", pods)


POOL = NodePoolInfo(
    name="tpu-a-0",
    status="RUNNING",
    labels={
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.OWNER_NAMESPACE: "team-a",
        labels.OWNER_NAME: "a",
        labels.OWNER_UID: "u-a",
    },
)


@pytest.mark.parametrize(
    ("verdict", "found", "last", "expected"),
    [
        (
            GONE,
            [],
            occ("b", "u-b", 4),
            Decision(ADOPT, f"{GONE.why}; team-a/b ran 4 pod(s) on it last", occ("b", "u-b", 4)),
        ),
        (
            GONE,
            [occ("c", "u-c")],
            occ("b", "u-b"),
            Decision(ADOPT, f"{GONE.why}; team-a/c runs 1 pod(s) on it", occ("c", "u-c")),
        ),
        (
            Verdict(False, "JobSet team-a/a is still running"),
            [],
            occ("b", "u-b"),
            Decision(KEEP, "JobSet team-a/a is still running"),
        ),
        (GONE, [], occ("a", "u-a"), Decision(DELETE, GONE.why)),
        (GONE, [], occ("b" * 64, "u-b"), Decision(DELETE, GONE.why)),
        (GONE, [], None, Decision(DELETE, GONE.why)),
    ],
    ids=[
        "last-user-adopts",
        "live-occupant-first",
        "owner-keeps",
        "owner-itself",
        "unlabelable-name",
        "nobody",
    ],
)
def test_decide_with_the_last_user(
    verdict: Verdict, found: list[Occupant], last: Occupant | None, expected: Decision
) -> None:
    assert occupancy.decide(POOL, verdict, found, [], 0.0, SETTINGS, last) == expected


def _pod(
    name: str, uid: str, node: str, phase: str = "Succeeded", namespace: str = "team-a"
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{name}-{node}",
            "namespace": namespace,
            "labels": {
                labels.JOBSET_NAME: name,
                labels.JOBSET_UID: uid,
                labels.REPLICATED_JOB_NAME: "slice",
                labels.JOB_INDEX: "1",
            },
        },
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def test_last_runs_groups_the_jobsets_pods_by_pool_of_any_phase() -> None:
    nodes = [
        Node(n, {labels.NODEPOOL: p})
        for n, p in (("n1", "p1"), ("n2", "p1"), ("n3", "p2"), ("n4", "p3"), ("n5", "p4"))
    ]
    pods = [
        _pod("b", "u-b", "n1"),
        _pod("b", "u-b", "n2", "Running"),
        _pod("b", "u-old", "n3"),  # an older JobSet named b
        _pod("b", "u-b", "n4", namespace="team-b"),  # another namespace's b
        _pod("b", "u-b", "unmanaged-node"),
        _pod("b", "u-b", "n5"),  # labelled b, but its Job proves nothing: not b's
    ]

    def chain(pod: dict[str, Any]) -> Chain:
        meta = pod["metadata"]
        uid = meta["labels"][labels.JOBSET_UID]
        return Chain(meta["namespace"], "b", uid, "slice", 1, "b-slice-1")

    chains = {(p["metadata"]["namespace"], p["metadata"]["name"]): chain(p) for p in pods[:5]}
    views = [Pod.parse(p) for p in pods]  # as the adapter lists them
    assert occupancy.last_runs(nodes, views, chains, "team-a", "b", "u-b") == {
        "p1": Occupant("team-a", "b", "u-b", "slice", "1", 2)
    }
    # Without the event's uid (a deletion) every proven pod of that name counts, its uid its Job's.
    assert set(occupancy.last_runs(nodes, views, chains, "team-a", "b", "")) == {"p1", "p2"}


def test_billing_labels_are_the_ones_a_created_pool_gets() -> None:
    jobset = tpu_jobset("train.v2", "team-a", replicas=1)
    pod = submit_pods(FakeKube(), jobset)[0]
    pod["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    }
    spec, _ = build_node_pool(SETTINGS, slice_request(pod))
    assert (
        dict(spec.resource_labels)
        == labels.billing_labels("team-a", "train.v2")
        == {
            labels.RESOURCE_LABEL_MANAGED_BY: labels.MANAGED_BY_VALUE,
            labels.RESOURCE_LABEL_NAMESPACE: "team-a",
            labels.RESOURCE_LABEL_JOBSET: "train-v2",
        }
    )


def test_two_jobsets_that_ran_on_each_others_pools_each_release_the_one_they_ran_on(
    gke: FakeGke, kube: FakeKube
) -> None:
    # GKE's tutorial flow on the real scheduler: A's slice runs on B's pool and B's on A's. Each
    # pool must go at the release of the JobSet that ran on it, and its Events name it (#30).
    a = tpu_jobset("a", "team-a", replicas=1)
    b = tpu_jobset("b", "team-a", replicas=1)
    [pa] = with_pools(gke, kube, a)
    [pb] = with_pools(gke, kube, b)
    for (namespace, name), pod in list(kube.pods.items()):
        index = pod["spec"]["nodeName"].rsplit("-", 1)[1]
        other = pb if name.startswith("a-") else pa
        kube.bind(namespace, name, f"gke-c-{other.name}-{index}")
    finish(kube, "a")

    assert release(gke, kube, a) == [pb.name]

    assert owner(gke, pa) == ("b", b["metadata"]["uid"])  # B runs there: B's now
    assert [m for m in events(kube, labels.REASON_RELEASED, "a") if f"released node pools {pb.name}" in m]
    assert [
        m for m in events(kube, labels.REASON_RELEASED, "b") if f"handed node pool {pb.name} to team-a/a" in m
    ]
    assert [m for m in events(kube, labels.REASON_ADOPTED, "b") if pa.name in m]

    finish(kube, "b")
    assert release(gke, kube, b) == [pa.name]
    assert [m for m in events(kube, labels.REASON_RELEASED, "b") if f"released node pools {pa.name}" in m]


def test_a_pool_another_release_is_stamping_is_held_for_the_queue_not_deleted(
    gke: FakeGke, kube: FakeKube
) -> None:
    # The handover bench's flake (#26): A and B ran on each other's pools and end a moment apart
    # while C and D wait for the same shape. A's release keeps its pool idle for the queue; B's
    # release, a second later, lists that pool RECONCILING (GKE still applies A's idle stamp),
    # inherits it (B ran there last) and must hold it for the queue too. Deleted as if it could not
    # serve, it was cordoned just as Kueue admitted C and D, and C's pods bought a third pool.
    a = tpu_jobset("a", "team-a", replicas=1)
    b = tpu_jobset("b", "team-a", replicas=1)
    [pa] = with_pools(gke, kube, a)
    [pb] = with_pools(gke, kube, b)
    for (namespace, name), pod in list(kube.pods.items()):
        index = pod["spec"]["nodeName"].rsplit("-", 1)[1]
        kube.bind(namespace, name, f"gke-c-{(pb if name.startswith('a-') else pa).name}-{index}")
    queue(kube, "c")
    queue(kube, "d")
    finish(kube, "a", when=ago(1))
    for pod in kube.pods.values():  # B's pods are done; its JobSet's Completed is still to come
        if pod["metadata"]["labels"][labels.JOBSET_NAME] == "b":
            pod["status"]["phase"] = "Succeeded"

    assert release(gke, kube, a) == []
    assert gke.pools[CLUSTER][pa.name].labels.get(labels.IDLE_SINCE)  # offered to the queue
    gke.mark(CLUSTER, pa.name, "RECONCILING")  # GKE is still applying that stamp
    finish(kube, "b", when=ago(1))

    with pytest.raises(TransientError):  # B's takeover relabel must wait for GKE: redelivered
        release(gke, kube, b)
    gke.mark(CLUSTER, pa.name, "RUNNING")
    assert release(gke, kube, b) == []

    assert gke.count("delete") == 0
    assert set(gke.managed_names(CLUSTER)) == {pa.name, pb.name}  # one for C, one for D
    assert all(schedulable(kube, pool) for pool in (pa, pb))  # C's and D's pods can bind at once
    assert owner(gke, pa) == ("b", b["metadata"]["uid"])  # B ran there last: its Events name it
