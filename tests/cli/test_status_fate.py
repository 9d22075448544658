"""``tpuprov status``: what happens next to each pool is the release path's own answer, so no false leaks.

Whole-object table tests: one pool as GKE lists it (created through the fake GKE from provision's own
derivation), the cluster around it varied per case, the whole ``PoolRow`` compared.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke
from shared.core import labels
from shared.core.settings import Settings
from shared.tpu.jobsets import JobSet, expand_jobs, expand_pods
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.nodes import Node
from shared.tpu.owners import Job
from shared.tpu.pods import Pod
from shared.tpu.slices import build_node_pool, slice_request
from shared.tpu.workloads import MULTIKUEUE_ORIGIN_LABEL
from tpuprov import status

SETTINGS = Settings(
    unlimited_spending=True,
    project_id="p",
    location="us-east5-b",
    cluster_name="c",
    release_grace_seconds=600,
    suspend_grace_seconds=600,
    idle_pool_seconds=120,
)
NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)
PRICES = status.Prices({"v6e": {"on-demand": 2.5}})
OLD_UID, NEW_UID, NEXT_UID = (f"00000000-0000-4000-8000-00000000000{n}" for n in (1, 2, 3))


def _ago(seconds: int) -> str:
    return (NOW - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _jobset(
    name: str, uid: str, condition: str = "", since: int = 0, suspend: bool = False
) -> dict[str, Any]:
    jobset = tpu_jobset(name, "team-a", replicas=1, topology="2x2", uid=uid)
    if condition:
        jobset["status"] = {
            "conditions": [{"type": condition, "status": "True", "lastTransitionTime": _ago(since)}]
        }
    if suspend:
        jobset["spec"]["suspend"] = True
        jobset["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}  # queued in Kueue
    return jobset


def _pool() -> NodePoolInfo:
    """The pool provision made for JobSet team-a/old, as GKE lists it."""
    gke = FakeGke(release_channel="")
    spec, _ = build_node_pool(SETTINGS, slice_request(expand_pods(_jobset("old", OLD_UID))[0]))
    gke.create_node_pool(SETTINGS.cluster_path, spec, "test")
    [pool] = gke.list_node_pools(SETTINGS.cluster_path)
    return dataclasses.replace(pool, status="RUNNING")


POOL = _pool()
NODE = {"metadata": {"name": "n-0", "labels": {labels.NODEPOOL: POOL.name}, "creationTimestamp": _ago(3600)}}


def _rows(
    pools: list[NodePoolInfo],
    jobsets: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    prices: status.Prices,
    now: datetime.datetime,
    settings: Settings,
    jobs: Sequence[dict[str, Any]] = (),
) -> list[status.PoolRow]:
    """``status.pool_rows`` on the objects as the CLI's ClusterView reads them (parsed views)."""
    return status.pool_rows(
        pools,
        [JobSet.parse(js) for js in jobsets],
        [Pod.parse(p) for p in pods],
        [Node.parse(n) for n in nodes],
        prices,
        now,
        settings,
        jobs=[Job.parse(j) for j in jobs],
    )


def _running_pod(jobset: dict[str, Any]) -> dict[str, Any]:
    pod = expand_pods(jobset, pending=False)[0]
    pod["spec"]["nodeName"] = "n-0"
    pod["status"] = {"phase": "Running"}
    return pod


# Every field once; each case below changes only what differs.
BASE = status.PoolRow(
    name=POOL.name,
    owner="team-a/old",
    owner_state="completed",
    state="RUNNING",
    machine_type="ct6e-standard-4t",
    nodes=1,
    chips=4,
    generation="v6e",
    capacity="on-demand",
    zone="us-east5-b",
    age_seconds=3600.0,
    running=(),
    cost_per_hour=10.0,
    cost_so_far=10.0,
    leak=False,
    next="keep",
    why="",
)
HOLD_WHY = (
    "JobSet team-a/old no longer exists; kept idle for team-a/next slice (1 slice(s) without a pool), "
    "which needs exactly this shape ({idle}s of the 120s handover window used)"
)

CASES = [
    pytest.param(
        POOL,
        [_jobset("old", OLD_UID, "Completed", since=900)],
        [],
        dataclasses.replace(BASE, leak=True, next="delete", why="JobSet team-a/old completed"),
        id="completed-past-grace-is-a-leak",
    ),
    pytest.param(
        POOL,
        [_jobset("old", OLD_UID, "Completed", since=60)],
        [],
        dataclasses.replace(BASE, why="JobSet team-a/old completed 60s ago; grace is 600s"),
        id="inside-release-grace",
    ),
    pytest.param(
        dataclasses.replace(POOL, status="STOPPING"),
        [],
        [],
        dataclasses.replace(
            BASE, owner_state="gone", state="STOPPING", next="deleting", why=f"GKE is deleting {POOL.name}"
        ),
        id="stopping-is-being-deleted",
    ),
    pytest.param(
        dataclasses.replace(POOL, labels={**POOL.labels, labels.IDLE_SINCE: str(int(NOW.timestamp()) - 30)}),
        [_jobset("next", NEXT_UID, suspend=True)],
        [],
        dataclasses.replace(BASE, owner_state="gone", next="hold", why=HOLD_WHY.format(idle=30)),
        id="held-for-a-queued-jobset",
    ),
    pytest.param(
        POOL,
        [_jobset("next", NEXT_UID, suspend=True)],
        [],
        dataclasses.replace(BASE, owner_state="gone", next="hold", why=HOLD_WHY.format(idle=0)),
        id="held-before-the-idle-stamp",
    ),
    pytest.param(
        dataclasses.replace(POOL, labels={**POOL.labels, labels.IDLE_SINCE: str(int(NOW.timestamp()) - 300)}),
        [_jobset("next", NEXT_UID, suspend=True)],
        [],
        dataclasses.replace(
            BASE,
            owner_state="gone",
            leak=True,
            next="delete",
            why="JobSet team-a/old no longer exists; idle for 300s, nobody took it",
        ),
        id="handover-window-over-is-a-leak",
    ),
    pytest.param(
        POOL,
        [_jobset("new", NEW_UID)],
        [_running_pod(_jobset("new", NEW_UID))],
        dataclasses.replace(
            BASE,
            owner_state="gone",
            running=("team-a/new",),
            next="adopt",
            why="JobSet team-a/old no longer exists; team-a/new runs 1 pod(s) on it",
        ),
        id="another-jobset-runs-there",
    ),
    pytest.param(
        POOL,
        [_jobset("old", OLD_UID)],
        [_running_pod(_jobset("old", OLD_UID))],
        dataclasses.replace(
            BASE, owner_state="running", running=("team-a/old",), why="JobSet team-a/old is still running"
        ),
        id="owner-running",
    ),
    pytest.param(
        POOL,
        [_jobset("old", OLD_UID, "Suspended", since=60, suspend=True)],
        [],
        dataclasses.replace(
            BASE, owner_state="suspended", why="JobSet team-a/old is suspended, within the 600s grace"
        ),
        id="suspended-inside-grace",
    ),
]


@pytest.mark.parametrize(("pool", "jobsets", "pods", "expected"), CASES)
def test_status_row_says_what_the_release_path_does_next(
    pool: NodePoolInfo, jobsets: list[dict[str, Any]], pods: list[dict[str, Any]], expected: status.PoolRow
) -> None:
    # The Jobs the JobSet controller made: through them a pod on the pool is proven its JobSet's own.
    jobs = [job for js in jobsets for job in expand_jobs(js)]
    assert _rows([pool], jobsets, pods, [NODE], PRICES, NOW, SETTINGS, jobs=jobs) == [expected]


def test_a_pod_that_only_names_a_jobset_holds_nothing() -> None:
    # Labels are the pod's own word: without its Job proving it the JobSet's, it does not occupy the pool.
    [row] = _rows(
        [POOL],
        [_jobset("new", NEW_UID)],
        [_running_pod(_jobset("new", NEW_UID))],
        [NODE],
        PRICES,
        NOW,
        SETTINGS,
    )
    assert (row.next, row.running) == ("delete", ())


def test_drain_mode_holds_nothing_for_queued_jobsets() -> None:
    [row] = _rows(
        [POOL],
        [_jobset("next", NEXT_UID, suspend=True)],
        [],
        [NODE],
        PRICES,
        NOW,
        SETTINGS.with_overrides(drain=True),
    )
    assert (row.next, row.leak, row.why) == ("delete", True, "JobSet team-a/old no longer exists")


def test_the_table_explains_every_pool_not_simply_in_use() -> None:
    rows = _rows([POOL], [_jobset("old", OLD_UID, "Completed", since=60)], [], [NODE], PRICES, NOW, SETTINGS)
    text = status.render_table(rows, PRICES)
    assert text.splitlines()[0].split()[:5] == ["POOL", "OWNER", "OWNER-STATE", "STATE", "NEXT"]
    assert text.endswith(f"\n{POOL.name}: keep: JobSet team-a/old completed 60s ago; grace is 600s\n")
    assert "0 leaks" in text


def test_a_reservation_pool_names_the_block_and_sub_block_it_was_placed_in() -> None:
    placed = NodePoolInfo(name="tpu-a", status="RUNNING", reservation="res-dense", reservation_place="b1/s2")
    assert status.capacity_of(placed, []) == "reservation:res-dense/b1/s2"
    whole = NodePoolInfo(name="tpu-b", status="RUNNING", reservation="res-dense")
    assert status.capacity_of(whole, []) == "reservation:res-dense"


def test_a_pool_of_a_jobset_multikueue_created_names_the_managers_jobset() -> None:
    owner = _jobset("old", OLD_UID)
    owner["metadata"]["labels"] = {MULTIKUEUE_ORIGIN_LABEL: "multikueue"}
    settings = SETTINGS.with_overrides(multikueue_manager="projects/p/locations/us-east5-b/clusters/manager")
    [row] = _rows([POOL], [owner], [_running_pod(owner)], [NODE], PRICES, NOW, settings)
    assert row.dispatched_from == "manager/team-a/old"
    assert "team-a/old (MultiKueue: manager/team-a/old)" in status.render_table([row], PRICES)
    # A JobSet the tenant submitted here is its own.
    [plain] = _rows([POOL], [_jobset("old", OLD_UID)], [], [NODE], PRICES, NOW, SETTINGS)
    assert plain.dispatched_from == ""
