"""Kueue v0.19.2's real MultiKueue over three real clusters served by one deployment.

The managed cluster is the MultiKueue manager (JobSet and Kueue installed by setup_cluster, its
Kueue limited to the JobSet and Job frameworks, a ``multikueue`` AdmissionCheck on its
ClusterQueue); ``west`` and ``central``, in two regions, are its workers, each with the tutorial's
queues and the product's admission check (``sandbox.realstack.multikueue``). JobSets are
submitted to the manager only. What is asserted is Kueue's real behaviour with the product in the
workers, read through the three API servers and GKE.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandbox.realstack import multikueue as mk
from sandbox.realstack.core import RealStack
from sandbox.realstack.demo import NAMESPACE, queued_jobset
from sandbox.realstack.plane import ClusterPlane
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from shared.app.deployment import RetryPolicy
from shared.provisioning.placement.outlook import CAPACITY_SHORT
from tests.paths import REPO
from tpuprov.commands import why
from tpuprov.main import build_parser

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKERS = (("us-west4-a", "west"), ("us-central1-a", "central"))
CONFIG = dataclasses.replace(
    StackConfig(functions=ALL_FUNCTIONS, gke_op_delay=1.0),
    cluster_name="manager",
    fleet=WORKERS,
    retry=RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4),
    max_delivery_attempts=60,
    function_env={"MULTIKUEUE_MANAGER": "projects/tpuprov-sandbox/locations/us-east5-b/clusters/manager"},
)
CHECK_CONFIG = (REPO / "examples" / "kueue" / "tpu-slices-check.yaml").read_text()
MK_CHECK = "multikueue"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    with RealStack(CONFIG) as running:
        mk.connect(running, CHECK_CONFIG, MK_CHECK)
        yield running


def _workload_of(plane: ClusterPlane, jobset: str) -> dict[str, Any] | None:
    for workload in plane.kube_cluster.client().list(f"{KUEUE}/namespaces/{NAMESPACE}/workloads"):
        owners = workload["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "JobSet" and o.get("name") == jobset for o in owners):
            return workload
    return None


def workloads_now(stack: RealStack) -> str:
    """Every cluster's Workloads: checks, conditions and MultiKueue's fields (a timeout's detail)."""
    lines = []
    for plane in stack.planes:
        for w in plane.kube_cluster.client().list(f"{KUEUE}/workloads"):
            status = w.get("status") or {}
            conditions = ",".join(f"{c['type']}={c['status']}" for c in status.get("conditions") or [])
            checks = "; ".join(
                f"{c['name']}={c.get('state')} {c.get('message', '')[:120]}"
                for c in status.get("admissionChecks") or []
            )
            mk_fields = (
                f"clusterName={status.get('clusterName')} nominated={status.get('nominatedClusterNames')}"
            )
            lines.append(
                f"{plane.cluster_id.name}: {w['metadata']['name']} {conditions} {mk_fields} [{checks}]"
            )
    return "\n".join(lines)


def _no_pools_in(stack: RealStack, path: str) -> Callable[[], bool]:
    return lambda: not stack.managed_pools(path)


def _creates_in(stack: RealStack, plane: ClusterPlane) -> int:
    return sum(
        1 for c in stack.gke.calls if c.method == "create" and f"/clusters/{plane.cluster_id.name}/" in c.path
    )


@pytest.mark.timeout(600)
def test_multikueue_runs_the_jobset_in_one_worker_and_the_product_buys_only_there(stack: RealStack) -> None:
    manager = stack.home
    name = "mk-two"
    stack.submit(queued_jobset(name, 2, run_seconds=5))
    # Kueue's JobSet webhook hands the manager's JobSet to MultiKueue.
    assert (manager.jobset(NAMESPACE, name) or {})["spec"].get("managedBy") == mk.MANAGED_BY

    def chosen() -> str:
        workload = _workload_of(manager, name) or {}
        return str((workload.get("status") or {}).get("clusterName") or "")

    stack.wait_for(chosen, 180, "MultiKueue to name the worker that admitted the Workload")
    # The product's check was Ready only in the first worker of the fleet's order: it admitted first.
    assert chosen() == "west"
    winner, loser = (stack.plane(p.path) for p in stack.fleet)
    told = [e for e in stack.events("TPUWorkerChosen", NAMESPACE) if e["involvedObject"]["name"] == name]
    assert told and "runs in west (us-west4-a)" in told[0]["message"]
    workload_name = (_workload_of(manager, name) or {})["metadata"]["name"]
    copy = winner.kube_cluster.client().get(f"{KUEUE}/namespaces/{NAMESPACE}/workloads/{workload_name}")
    assert copy is not None and copy["metadata"]["labels"][mk.ORIGIN_LABEL] == mk.ORIGIN
    stack.wait_for(
        lambda: (
            loser.kube_cluster.client().get(f"{KUEUE}/namespaces/{NAMESPACE}/workloads/{workload_name}")
            is None
        ),
        120,
        f"MultiKueue to remove the copy in {loser.cluster_id.name}",
    )
    stack.wait_for(
        lambda: stack.jobset_state(NAMESPACE, name) == "Completed", 300, "the manager's JobSet to complete"
    )
    stack.wait_for(
        lambda: not stack.managed_pools(winner.path), 240, f"{winner.cluster_id.name}'s pools to go"
    )
    assert _creates_in(stack, winner) == 2
    assert _creates_in(stack, loser) == 0
    assert stack.managed_pools(loser.path) == []
    assert winner.killed_pods() == [] and loser.killed_pods() == []


@pytest.mark.timeout(900)
def test_a_stockout_in_the_first_worker_moves_the_job_to_the_other_and_leaves_nothing(
    stack: RealStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    west, central = (stack.plane(p.path) for p in stack.fleet)
    name, again = "mk-short", "mk-short-again"
    api = stack.home.kube_cluster.client()
    # The first worker of the fleet's order has no on-demand v5e now.
    stack.gke.set_capacity(west.cluster_id.location, "on-demand", 0)
    west_before, central_before = _creates_in(stack, west), _creates_in(stack, central)
    try:
        stack.submit(queued_jobset(name, 2, run_seconds=5))
        try:
            stack.wait_for(
                lambda: central.jobset_state(NAMESPACE, name) == "Completed",
                420,
                "the JobSet to run to the end in central",
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{workloads_now(stack)}") from None
        stack.wait_for(_no_pools_in(stack, west.path), 240, "west's failed pools to go")
        # The fleet remembers the shape short in west, on the manager's MultiKueueCluster of it: the
        # next job of the shape goes to central first, without a create of its own in west.
        record = (api.get(f"{KUEUE}/multikueueclusters/west") or {})["metadata"].get("annotations") or {}
        assert "tpu-v5-lite-podslice 2x4" in record.get(CAPACITY_SHORT, ""), record
        west_between = _creates_in(stack, west)
        stack.submit(queued_jobset(again, 2, run_seconds=5))
        stack.wait_for(
            lambda: central.jobset_state(NAMESPACE, again) == "Completed",
            300,
            "the next job to run in central",
        )
        assert _creates_in(stack, west) == west_between
    finally:
        stack.gke.set_capacity(west.cluster_id.location, "on-demand", None)
        # What an administrator does once capacity is back before the record expires (docs/multikueue.md).
        api.patch(f"{KUEUE}/multikueueclusters/west", {"metadata": {"annotations": {CAPACITY_SHORT: None}}})
    told = [
        e["message"]
        for e in stack.events("TPUWorkerChosen", NAMESPACE)
        if e["involvedObject"]["name"] == again
    ]
    assert told and "not west: tpu-v5-lite-podslice 2x4 was short there" in told[0], told
    for job in (name, again):
        stack.wait_for(
            lambda j=job: stack.jobset_state(NAMESPACE, j) == "Completed",  # type: ignore[misc]
            120,
            f"the manager's JobSet {job} to complete",
        )
    for plane in (west, central):
        stack.wait_for(_no_pools_in(stack, plane.path), 240, f"{plane.cluster_id.name}'s pools to go")
    # West was tried once per slice at most, and nothing of the job is left there.
    assert _creates_in(stack, west) - west_before <= 2
    assert _creates_in(stack, central) - central_before == 4
    assert west.jobset(NAMESPACE, name) is None
    assert _workload_of(stack.home, name) is not None
    short = [
        e for e in stack.events("TPUWorkerShort", NAMESPACE) if e["involvedObject"]["kind"] == "Workload"
    ]
    assert short and "capacity short in west" in short[0]["message"]
    assert west.killed_pods() == [] and central.killed_pods() == []
    # tpuprov why on the manager's JobSet says where it ran and why not in west.
    for key, value in stack.env().items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert (
        why.run(
            build_parser().parse_args(
                ["why", "--jobset", f"{NAMESPACE}/{name}", "--fleet-cluster", "manager"]
            )
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "is run by Kueue's MultiKueue" in out and "runs in central" in out, out
    assert "capacity short in west" in out, out


@pytest.mark.timeout(600)
def test_the_managers_jobset_deleted_while_provisioning_releases_every_pool(stack: RealStack) -> None:
    west, central = (stack.plane(p.path) for p in stack.fleet)
    name = "mk-deleted"
    stack.gke.set_op_delay(20)  # the pools are still PROVISIONING when the JobSet goes
    try:
        stack.submit(queued_jobset(name, 2, run_seconds=300))
        stack.wait_for(
            lambda: len([p for p in stack.managed_pools(west.path) if name in p["name"]]) == 2,
            180,
            "west's two pools to be requested",
        )
        stack.delete_jobset(NAMESPACE, name)
        for plane in (west, central):
            stack.wait_for(
                lambda p=plane: not [x for x in stack.managed_pools(p.path) if name in x["name"]],  # type: ignore[misc]
                240,
                f"{plane.cluster_id.name}'s pools of {name} to be deleted",
            )
    finally:
        stack.gke.set_op_delay(1.0)
    stack.wait_for(lambda: west.jobset(NAMESPACE, name) is None, 120, "MultiKueue to delete west's JobSet")
    assert central.jobset(NAMESPACE, name) is None
    assert west.killed_pods() == [] and central.killed_pods() == []


@pytest.mark.timeout(600)
def test_a_worker_whose_api_server_is_down_is_passed_over(stack: RealStack) -> None:
    west, central = (stack.plane(p.path) for p in stack.fleet)
    api = stack.home.kube_cluster.client()
    name = "mk-outage"
    west.kube_cluster.stop_apiserver()
    try:
        stack.wait_for(
            lambda: not mk.active(api, "multikueueclusters", "west"),
            180,
            "the manager's Kueue to see west disconnected",
        )
        stack.submit(queued_jobset(name, 1, run_seconds=5))
        stack.wait_for(
            lambda: central.jobset_state(NAMESPACE, name) == "Completed", 300, "the JobSet to run in central"
        )
    finally:
        west.kube_cluster.start_apiserver()
    stack.wait_for(lambda: mk.active(api, "multikueueclusters", "west"), 180, "west to be connected again")
    stack.wait_for(
        lambda: stack.jobset_state(NAMESPACE, name) == "Completed", 120, "the manager's JobSet to complete"
    )
    stack.wait_for(lambda: not stack.managed_pools(central.path), 240, "central's pool to go")
    assert west.jobset(NAMESPACE, name) is None
    assert [p for p in stack.managed_pools(west.path) if name in p["name"]] == []


@pytest.mark.timeout(600)
def test_capacity_back_in_west_while_central_provisions_does_not_move_the_job(stack: RealStack) -> None:
    west, central = (stack.plane(p.path) for p in stack.fleet)
    name = "mk-back"
    stack.gke.set_capacity(west.cluster_id.location, "on-demand", 0)
    west_before, central_before = _creates_in(stack, west), _creates_in(stack, central)
    stack.gke.set_op_delay(8)  # central's creates are still running when west has capacity again
    try:
        stack.submit(queued_jobset(name, 2, run_seconds=5))
        stack.wait_for(
            lambda: len([p for p in stack.managed_pools(central.path) if name in p["name"]]) == 2,
            240,
            "the job to move to central and its two pools to be requested there",
        )
        stack.gke.set_capacity(west.cluster_id.location, "on-demand", None)
        stack.wait_for(
            lambda: stack.jobset_state(NAMESPACE, name) == "Completed",
            300,
            "the manager's JobSet to complete",
        )
    finally:
        stack.gke.set_op_delay(1.0)
        stack.gke.set_capacity(west.cluster_id.location, "on-demand", None)
    for plane in (west, central):
        stack.wait_for(_no_pools_in(stack, plane.path), 240, f"{plane.cluster_id.name}'s pools to go")
    # It ran where it was placed; west saw only its one failed attempt.
    assert central.jobset_state(NAMESPACE, name) in ("Completed", "Gone")
    assert _creates_in(stack, central) - central_before == 2
    assert _creates_in(stack, west) - west_before <= 2
    assert west.jobset(NAMESPACE, name) is None
    told = [
        e["message"]
        for e in stack.events("TPUWorkerChosen", NAMESPACE)
        if e["involvedObject"]["name"] == name
    ]
    assert any(m.startswith("runs in central") for m in told), told
    assert west.killed_pods() == [] and central.killed_pods() == []
