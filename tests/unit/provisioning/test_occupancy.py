"""Whole-object table tests for the pure occupancy decisions (who runs on a pool, what happens to it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.occupancy import (
    ADOPT,
    DELETE,
    KEEP,
    OFFER,
    Decision,
    Demand,
    Occupant,
    Verdict,
    adopted_labels,
    decide,
    demand,
    occupants,
    pool_shape,
    spec_shape,
)
from shared.tpu.capacity import CapacityOption
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.slices import build_node_pool, slice_request

SETTINGS = Settings(project_id="p", location="us-east5-b", cluster_name="c", idle_pool_seconds=120)
OWNER = {labels.OWNER_NAMESPACE: "team-a", labels.OWNER_NAME: "old", labels.OWNER_UID: "u-old"}
POOL = NodePoolInfo(
    name="pool-1",
    status="RUNNING",
    machine_type="ct6e-standard-4t",
    node_count=1,
    labels={labels.MANAGED_BY: labels.MANAGED_BY_VALUE, **OWNER, "team": "ml"},
)
NODES = [{"metadata": {"name": "n-0", "labels": {labels.NODEPOOL: "pool-1"}}}]
GONE = Verdict(True, "JobSet team-a/old completed")


def js(name: str, uid: str, **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": uid}
    if status.pop("deleting", False):
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    conditions = [{"type": t, "status": "True"} for t in status.pop("conditions", [])]
    return {"metadata": meta, "spec": {}, "status": {"conditions": conditions}}


def pod(
    jobset: str, uid: str | None, node: str = "n-0", phase: str = "Running", rjob: str = "w", idx: str = "1"
):
    pod_labels = {labels.JOBSET_NAME: jobset, labels.REPLICATED_JOB_NAME: rjob, labels.JOB_INDEX: idx}
    if uid is not None:
        pod_labels[labels.JOBSET_UID] = uid
    return {
        "metadata": {"namespace": "team-a", "labels": pod_labels},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


def occ(name: str, uid: str, pods: int = 1, rjob: str = "w", idx: str = "1") -> Occupant:
    return Occupant("team-a", name, uid, rjob, idx, pods)


LIVE = {
    ("team-a", "new"): js("new", "u-new"),
    ("team-a", "old"): js("old", "u-old", conditions=["Completed"]),
}


@pytest.mark.parametrize(
    ("pods", "jobsets", "expected"),
    [
        ([], LIVE, []),
        ([pod("new", "u-new")], LIVE, [occ("new", "u-new")]),
        ([pod("new", "u-new"), pod("new", "u-new", idx="1")], LIVE, [occ("new", "u-new", pods=2)]),
        ([pod("new", "u-new", phase="Succeeded"), pod("new", "u-new", phase="Failed")], LIVE, []),
        ([pod("new", "u-new", node="elsewhere")], LIVE, []),
        ([pod("old", "u-old")], LIVE, []),
        ([pod("new", "u-stale")], LIVE, []),
        ([pod("new", None)], LIVE, [occ("new", "u-new")]),
        ([pod("new", "u-new")], {("team-a", "new"): js("new", "u-new", deleting=True)}, []),
        ([pod("new", "u-new")], {("team-a", "new"): js("new", "u-new", conditions=["Failed"])}, []),
        ([pod("new", "u-new")], {}, []),
        (
            [
                {
                    "metadata": {"namespace": "kube-system"},
                    "spec": {"nodeName": "n-0"},
                    "status": {"phase": "Running"},
                }
            ],
            LIVE,
            [],
        ),
        (
            [pod("new", "u-new"), pod("b", "u-b"), pod("b", "u-b")],
            {**LIVE, ("team-a", "b"): js("b", "u-b")},
            [occ("b", "u-b", pods=2), occ("new", "u-new")],
        ),
    ],
    ids=[
        "no-pods",
        "live-jobset",
        "counts-pods",
        "terminal-pods-do-not-count",
        "other-node",
        "terminal-jobset",
        "old-incarnation-uid",
        "no-uid-label",
        "jobset-being-deleted",
        "jobset-failed",
        "jobset-gone",
        "not-a-jobset-pod",
        "busiest-first",
    ],
)
def test_occupants(pods: list[dict[str, Any]], jobsets: dict[Any, Any], expected: list[Occupant]) -> None:
    assert occupants(POOL, NODES, pods, jobsets) == expected


def test_a_pool_without_nodes_has_no_occupant() -> None:
    assert occupants(POOL, [], [pod("new", "u-new")], LIVE) == []


SAME_SHAPE = Demand((pool_shape(POOL),), "team-a", "queued", "u-q", "team-a/queued w[0]")
OTHER_SHAPE = Demand(
    (pool_shape(NodePoolInfo(name="x", status="RUNNING", machine_type="ct6e-standard-8t")),),
    "team-a",
    "q",
    "u",
    "q",
)
OWN_DEMAND = Demand((pool_shape(POOL),), "team-a", "old", "u-old", "team-a/old w[0]")


@pytest.mark.parametrize(
    ("pool", "verdict", "found", "waiting", "idle", "expected"),
    [
        (POOL, Verdict(False, "running"), [occ("new", "u-new")], [], 0, Decision(KEEP, "running")),
        (POOL, GONE, [], [], 0, Decision(DELETE, GONE.why)),
        (
            POOL,
            GONE,
            [occ("old", "u-old")],
            [],
            0,
            Decision(KEEP, f"{GONE.why}, but its own pods still run on pool-1"),
        ),
        (
            POOL,
            GONE,
            [occ("old", "u-other")],
            [],
            0,
            Decision(ADOPT, f"{GONE.why}; team-a/old runs 1 pod(s) on it", occ("old", "u-other")),
        ),
        (
            POOL,
            GONE,
            [occ("b", "u-b", pods=2), occ("new", "u-new")],
            [SAME_SHAPE],
            0,
            Decision(
                ADOPT,
                f"{GONE.why}; team-a/b runs 2 pod(s) on it (and 1 more JobSet(s))",
                occ("b", "u-b", pods=2),
            ),
        ),
        (
            POOL,
            GONE,
            [occ("x" * 70, "u-x")],
            [],
            0,
            Decision(
                KEEP,
                f"team-a/{'x' * 70} runs on pool-1 but cannot own it: "
                f"label value {'x' * 70!r} is not a valid Kubernetes label value",
            ),
        ),
        (
            POOL,
            GONE,
            [],
            [SAME_SHAPE],
            30,
            Decision(
                OFFER,
                f"{GONE.why}; kept idle for team-a/queued w[0], which needs exactly this shape "
                "(30s of the 120s handover window used)",
            ),
        ),
        (POOL, GONE, [], [SAME_SHAPE], 120, Decision(DELETE, f"{GONE.why}; idle for 120s, nobody took it")),
        (POOL, GONE, [], [OTHER_SHAPE], 0, Decision(DELETE, GONE.why)),
        (POOL, GONE, [], [OWN_DEMAND], 0, Decision(DELETE, GONE.why)),
        (
            NodePoolInfo(**{**POOL.__dict__, "status": "ERROR"}),
            GONE,
            [],
            [SAME_SHAPE],
            0,
            Decision(DELETE, GONE.why),
        ),
    ],
    ids=[
        "owner-needs-it",
        "idle-no-demand",
        "owner-pods-still-there",
        "recreated-same-name-adopts",
        "busiest-occupant-adopts",
        "unlabellable-occupant-keeps",
        "offer-within-window",
        "window-over",
        "other-shape-is-no-demand",
        "owner-is-not-its-own-taker",
        "error-pool-never-offered",
    ],
)
def test_decide(
    pool: NodePoolInfo,
    verdict: Verdict,
    found: list[Occupant],
    waiting: list[Demand],
    idle: float,
    expected: Decision,
) -> None:
    assert decide(pool, verdict, found, waiting, idle, SETTINGS) == expected


def test_adopted_labels_move_ownership_and_keep_selectors() -> None:
    stamped = NodePoolInfo(name="p", status="RUNNING", labels={**POOL.labels, labels.IDLE_SINCE: "100"})
    assert adopted_labels(stamped, occ("b", "u-b", rjob="workers", idx="3")) == {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.OWNER_NAMESPACE: "team-a",
        labels.OWNER_NAME: "b",
        labels.OWNER_UID: "u-b",
        labels.OWNER_REPLICATED_JOB: "workers",
        labels.OWNER_JOB_INDEX: "3",
        labels.HANDED_OVER_FROM: POOL.labels[labels.OWNER_NAME],  # `tpuprov status` shows where it came from
        "team": "ml",
    }


def _slices(jobset: dict[str, Any]) -> list[tuple[str, Any]]:
    specs = [build_node_pool(SETTINGS, slice_request(p))[0] for p in expand_pods(jobset)]
    return sorted({(s.name, spec_shape(s)) for s in specs})


def _queued(name: str, **changes: Any) -> dict[str, Any]:
    jobset = tpu_jobset(name, "team-a", replicas=2)
    jobset["spec"]["suspend"] = True
    jobset.update(changes)
    return jobset


QUEUED = _queued("queued")


@pytest.mark.parametrize(
    ("jobsets", "existing", "expected"),
    [
        ([QUEUED], [], [(s,) for _, s in _slices(QUEUED)]),
        ([QUEUED], [n for n, _ in _slices(QUEUED)][:1], [(s,) for _, s in _slices(QUEUED)][1:]),
        ([tpu_jobset("running", "team-a")], [], []),
        ([_queued("done", status={"conditions": [{"type": "Completed", "status": "True"}]})], [], []),
        (
            [_queued("bye", metadata={**QUEUED["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"})],
            [],
            [],
        ),
    ],
    ids=["suspended", "own-pool-exists", "running", "terminal", "being-deleted"],
)
def test_demand(jobsets: list[dict[str, Any]], existing: list[str], expected: list[Any]) -> None:
    assert [d.shapes for d in demand(jobsets, existing, SETTINGS)] == expected


ZONES = SETTINGS.with_overrides(node_locations=("us-east5-a", "us-east5-b"))


def _idle_pool(settings: Settings, kind: str, zone: str) -> NodePoolInfo:
    """The pool another JobSet of the same shape got on capacity ``kind`` in ``zone``, as GKE lists it."""
    gke = FakeGke(release_channel="")
    request = slice_request(expand_pods(tpu_jobset("old", "team-a", replicas=1))[0])
    spec, _ = build_node_pool(settings, request, option=CapacityOption(kind, zone))
    gke.create_node_pool(settings.cluster_path, spec, "test")
    [pool] = gke.list_node_pools(settings.cluster_path)
    return dataclasses.replace(pool, status="RUNNING")


def _waiting(policy: str | None = None, zone: str = "") -> dict[str, Any]:
    jobset = _queued("queued")
    if policy is not None:
        jobset["metadata"]["annotations"] = {labels.CAPACITY_POLICY: policy}
    if zone:
        template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        template.setdefault("nodeSelector", {})[labels.ZONE] = zone
    return jobset


@pytest.mark.parametrize(
    ("settings", "pool", "waiting", "action"),
    [
        (SETTINGS, ("spot", "us-east5-b"), _waiting("spot, on-demand"), OFFER),
        (SETTINGS, ("on-demand", "us-east5-b"), _waiting("spot, on-demand"), OFFER),
        (SETTINGS, ("spot", "us-east5-b"), _waiting(), DELETE),
        (SETTINGS, ("on-demand", "us-east5-b"), _waiting(), OFFER),
        (ZONES, ("on-demand", "us-east5-a"), _waiting(zone="us-east5-b"), DELETE),
        (ZONES, ("on-demand", "us-east5-b"), _waiting(zone="us-east5-b"), OFFER),
        (ZONES, ("on-demand", "us-east5-b"), _waiting("on-demand@us-east5-a, on-demand@us-east5-b"), OFFER),
        (ZONES, ("spot", "us-east5-b"), _waiting("on-demand@us-east5-a, on-demand@us-east5-b"), DELETE),
        (SETTINGS, ("flex-start", "us-east5-b"), _waiting(), DELETE),
        (SETTINGS, ("flex-start", "us-east5-b"), _waiting("flex-start"), OFFER),
        (SETTINGS, ("spot", "us-east5-b"), _waiting("spot, bogus"), DELETE),
    ],
    ids=[
        "spot-pool-policy-spot-first",
        "on-demand-pool-policy-falls-back-to-it",
        "spot-pool-no-policy-pods-choose-on-demand",
        "on-demand-pool-no-policy",
        "pool-in-a-zone-the-pods-do-not-select",
        "pool-in-the-zone-the-pods-select",
        "pool-in-the-policys-second-zone",
        "spot-pool-policy-on-demand-only",
        "flex-start-pool-is-not-on-demand",
        "flex-start-pool-policy-flex-start",
        "malformed-policy-holds-only-the-pods-own-choice",
    ],
)
def test_an_idle_pool_is_held_for_a_queued_jobset_whose_policy_allows_its_capacity(
    settings: Settings, pool: tuple[str, str], waiting: dict[str, Any], action: str
) -> None:
    # The pool of a finished JobSet, made on one option of its policy; a queued JobSet of the same
    # TPU shape whose own policy (or pods' choice) decides whether it could run there.
    idle = _idle_pool(settings, *pool)
    found = demand([waiting], [idle.name], settings)
    assert decide(idle, GONE, [], found, 0, settings).action == action
