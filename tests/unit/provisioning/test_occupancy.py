"""Whole-object table tests for the pure occupancy decisions (who runs on a pool, what happens to it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.release import occupancy
from shared.provisioning.release.occupancy import (
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
    pool_shape,
    spec_shape,
)
from shared.tpu.capacity import CapacityOption
from shared.tpu.jobsets import JobSet, expand_pods
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.nodes import Node
from shared.tpu.owners import Chain
from shared.tpu.pods import Pod
from shared.tpu.slices import build_node_pool, slice_request

SETTINGS = Settings(
    unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c", idle_pool_seconds=120
)
OWNER = {labels.OWNER_NAMESPACE: "team-a", labels.OWNER_NAME: "old", labels.OWNER_UID: "u-old"}
POOL = NodePoolInfo(
    name="pool-1",
    status="RUNNING",
    machine_type="ct6e-standard-4t",
    node_count=1,
    labels={labels.MANAGED_BY: labels.MANAGED_BY_VALUE, **OWNER, "team": "ml"},
)
NODES = [Node("n-0", {labels.NODEPOOL: "pool-1"})]
GONE = Verdict(True, "JobSet team-a/old completed")


def js(name: str, uid: str, suspend: bool = False, **status: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": uid}
    if status.pop("deleting", False):
        meta["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    conditions = [{"type": t, "status": "True"} for t in status.pop("conditions", [])]
    return {"metadata": meta, "spec": {"suspend": suspend}, "status": {"conditions": conditions}}


_NAMES = iter(range(10**6))


def pod(
    jobset: str,
    uid: str | None,
    node: str = "n-0",
    phase: str = "Running",
    rjob: str = "w",
    idx: str = "1",
    tpu: bool = True,
    proven: bool = True,
) -> tuple[dict[str, Any], Chain | None]:
    """A pod and the chain its Job proves (None when it has none: labels alone prove nothing)."""
    pod_labels = {labels.JOBSET_NAME: jobset, labels.REPLICATED_JOB_NAME: rjob, labels.JOB_INDEX: idx}
    if uid is not None:
        pod_labels[labels.JOBSET_UID] = uid
    requests = {labels.TPU_RESOURCE: "4"} if tpu else {"cpu": "1"}
    obj = {
        "metadata": {"name": f"p{next(_NAMES)}", "namespace": "team-a", "labels": pod_labels},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": requests}}]},
        "status": {"phase": phase},
    }
    chain = Chain("team-a", jobset, uid or "", rjob, int(idx), f"{jobset}-{rjob}-{idx}") if proven else None
    return obj, chain


def demand(jobsets: list[dict[str, Any]], pools: list[NodePoolInfo], settings: Settings) -> list[Demand]:
    """``occupancy.demand`` on JobSets as the adapter parses them."""
    return occupancy.demand([JobSet.parse(j) for j in jobsets], pools, settings)


def occupants(
    pool: NodePoolInfo, nodes: list[Node], pods: list[dict[str, Any]], jobsets: dict[Any, Any], chains: Any
) -> list[Occupant]:
    """``occupancy.occupants`` with the pods listed and the JobSets read parsed as the adapter does."""
    views = {k: JobSet.parse(v) if v is not None else None for k, v in jobsets.items()}
    return occupancy.occupants(pool, nodes, [Pod.parse(p) for p in pods], views, chains)


def run(pods: list[tuple[dict[str, Any], Chain | None]], jobsets: dict[Any, Any]) -> list[Occupant]:
    chains = {(p["metadata"]["namespace"], p["metadata"]["name"]): c for p, c in pods if c is not None}
    return occupants(POOL, NODES, [p for p, _ in pods], jobsets, chains)


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
        ([pod("new", "u-new", proven=False)], LIVE, []),
        ([pod("new", "u-new", tpu=False)], LIVE, []),
        ([pod("hold", "u-hold")], {**LIVE, ("team-a", "hold"): js("hold", "u-hold", suspend=True)}, []),
        ([pod("new", "u-new")], {("team-a", "new"): js("new", "u-new", deleting=True)}, []),
        ([pod("new", "u-new")], {("team-a", "new"): js("new", "u-new", conditions=["Failed"])}, []),
        ([pod("new", "u-new")], {}, []),
        (
            [
                (
                    {
                        "metadata": {"name": "ds", "namespace": "kube-system"},
                        "spec": {"nodeName": "n-0"},
                        "status": {"phase": "Running"},
                    },
                    None,
                )
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
        "labels-without-a-job-chain-prove-nothing",
        "a-pod-without-tpus-holds-nothing",
        "a-suspended-jobset-never-holds-a-pool",
        "jobset-being-deleted",
        "jobset-failed",
        "jobset-gone",
        "not-a-jobset-pod",
        "busiest-first",
    ],
)
def test_occupants(
    pods: list[tuple[dict[str, Any], Chain | None]], jobsets: dict[Any, Any], expected: list[Occupant]
) -> None:
    assert run(pods, jobsets) == expected


def test_a_pool_without_nodes_has_no_occupant() -> None:
    found, chain = pod("new", "u-new")
    assert occupants(POOL, [], [found], LIVE, {("team-a", found["metadata"]["name"]): chain}) == []


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
        (
            # Another delivery's relabel runs on it: its nodes still serve, so it is held the same.
            NodePoolInfo(**{**POOL.__dict__, "status": "RECONCILING"}),
            GONE,
            [],
            [SAME_SHAPE],
            0,
            Decision(
                OFFER,
                f"{GONE.why}; kept idle for team-a/queued w[0], which needs exactly this shape "
                "(0s of the 120s handover window used)",
            ),
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
        "reconciling-pool-offered",
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
    jobset["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}
    jobset.update(changes)
    return jobset


QUEUED = _queued("queued")


@pytest.mark.parametrize(
    ("jobsets", "existing", "expected"),
    [
        ([QUEUED], 0, [(_slices(QUEUED)[0][1],)]),
        ([QUEUED], 1, [(_slices(QUEUED)[0][1],)]),
        ([QUEUED], 2, []),
        ([tpu_jobset("running", "team-a")], 0, []),
        ([_queued("done", status={"conditions": [{"type": "Completed", "status": "True"}]})], 0, []),
        (
            [_queued("bye", metadata={**QUEUED["metadata"], "deletionTimestamp": "2024-01-01T00:00:00Z"})],
            0,
            [],
        ),
    ],
    ids=[
        "suspended",
        "one-slice-has-its-pool",
        "every-slice-has-its-pool",
        "running",
        "terminal",
        "being-deleted",
    ],
)
def test_demand(jobsets: list[dict[str, Any]], existing: int, expected: list[Any]) -> None:
    # ``existing`` of the queued JobSet's slices already have a pool of their own (its owner labels).
    sid = slice_request(expand_pods(QUEUED)[0]).slice_id
    owned = {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.OWNER_NAMESPACE: sid.namespace,
        labels.OWNER_NAME: sid.jobset,
        labels.OWNER_UID: sid.jobset_uid,
        labels.OWNER_REPLICATED_JOB: sid.replicated_job,
    }
    pools = [NodePoolInfo(name=f"own-{i}", status="RUNNING", labels=owned) for i in range(existing)]
    assert [d.shapes for d in demand(jobsets, pools, SETTINGS)] == expected


def test_demand_is_one_entry_per_replicated_job_however_many_pods_it_declares() -> None:
    # A free suspended JobSet of a million declared pods costs what its one replicated job costs.
    huge = _queued("huge")
    huge["spec"]["replicatedJobs"][0]["replicas"] = 1000
    huge["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 1000
    huge["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = 1000
    [entry] = demand([huge], [], SETTINGS)
    assert "1000 slice(s) without a pool" in entry.who


def test_a_jobset_its_owner_suspended_outside_kueue_is_no_demand() -> None:
    # No admission will ever bring its pods: holding a pool for it would only keep another team's.
    held = _queued("held")
    del held["metadata"]["labels"]
    assert demand([held], [], SETTINGS) == []


def test_a_jobset_provision_would_refuse_is_no_demand() -> None:
    # One pod per Job of a 4-VM slice: provision refuses its slices, so no idle pool is held for it.
    thin = _queued("thin")
    thin["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 1
    thin["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = 1
    assert demand([thin], [], SETTINGS) == []
    assert demand([_queued("big")], [], SETTINGS.with_overrides(max_vms_per_jobset=4)) == []


def test_a_jobset_the_guardrails_refuse_is_no_demand() -> None:
    allowlisted = SETTINGS.with_overrides(namespace_allowlist=("team-b",))
    assert demand([QUEUED], [], allowlisted) == []
    accelerators = SETTINGS.with_overrides(allowed_accelerators=("tpu-v5p-slice",))
    assert demand([QUEUED], [], accelerators) == []


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
    found = demand([waiting], [idle], settings)
    assert decide(idle, GONE, [], found, 0, settings).action == action
