"""One deployment of the functions serving two real clusters at once (``StackConfig.fleet``).

Each cluster is its own control plane (etcd, kube-apiserver, scheduler, controller manager, KWOK)
with its own JobSet and Kueue, installed there by setup_cluster and given the tutorial's queues by
apply_kueue (the message's ``cluster`` attribute names the second). The functions reach the second
through the kubeconfig context ``gcloud container clusters get-credentials`` names it; its sinks'
entries name it in ``resource.labels``. The second cluster is in another region and its
FLEET_OVERRIDES give its pools another disk size, so a pool built with the wrong cluster's
settings, or in the wrong cluster, shows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from sandbox.cli.doctor import StackDeployment
from sandbox.realstack.core import RealStack
from sandbox.realstack.demo import (
    DEFAULT_DISK_GB,
    JOBSETS,
    NAMESPACE,
    WEST_DISK_GB,
    WEST_NAME,
    WEST_ZONE,
    fleet_config,
    queued_jobset,
)
from shared.app.deployment import TOPIC_PREFIX, RetryPolicy, wiring
from shared.core import labels
from shared.events import entries as logentries
from shared.events.fields import ClusterId
from tests.cli.goldens import assert_golden
from tests.paths import REPO
from tpuprov.doctor.run import diagnose, exit_code, render_table
from tpuprov.doctor.views import Expected

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]

CONFIG = fleet_config(
    retry=RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4),
    # infra's policy (10 to 600 s backoff, 10 attempts) keeps a message over an hour-long outage;
    # at this stack's 1 to 4 s backoff, 60 attempts cover the minute-long outage below and more.
    max_delivery_attempts=60,
)
WEST = ClusterId(CONFIG.project, WEST_ZONE, WEST_NAME)
CHECK_CONFIG = (REPO / "examples" / "kueue" / "tpu-slices-check.yaml").read_text()
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    with RealStack(CONFIG) as running:
        for plane in running.planes:
            running.setup(timeout=300, cluster=plane.path)
            running.apply_kueue(CHECK_CONFIG, timeout=120, cluster=plane.path)
        for plane in running.planes:
            api = plane.kube_cluster.client()

            def queue_active(api: Any = api) -> bool:
                queue = api.get(f"{KUEUE}/clusterqueues/cluster-queue") or {}
                conditions = (queue.get("status") or {}).get("conditions") or []
                return any(c["type"] == "Active" and c["status"] == "True" for c in conditions)

            # apply_kueue marks the check Active in the cluster it applied to.
            running.wait_for(queue_active, 120, f"{plane.cluster_id.name}'s ClusterQueue Active")
        yield running


@pytest.fixture(scope="module")
def ready_pools(stack: RealStack) -> list[tuple[str, dict[str, Any]]]:
    """Every pool that reached RUNNING, with its cluster's path, as GKE returned it then."""
    ready: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def seen(cluster: str, pool: dict[str, Any]) -> None:
        with lock:
            ready.append((cluster, pool))

    stack.gke.on_pool_ready(seen)
    return ready


def _unfinished(stack: RealStack) -> list[str]:
    return [
        f"{plane.cluster_id.name}/{name}"
        for plane in stack.planes
        for name, _ in JOBSETS
        if plane.jobset_state(NAMESPACE, name) not in ("Completed", "Failed")
    ]


@pytest.mark.timeout(900)
def test_the_tutorial_runs_in_both_clusters_at_once_each_on_its_own_pools(
    stack: RealStack, ready_pools: list[tuple[str, dict[str, Any]]]
) -> None:
    started = time.monotonic()
    # The same JobSets, same namespace and names, in both clusters at the same time.
    for name, slices in JOBSETS:
        for plane in stack.planes:
            plane.submit(queued_jobset(name, slices, run_seconds=5))
    stack.wait_for(lambda: not _unfinished(stack), 480, "every JobSet of both clusters to finish")
    for plane in stack.planes:
        stack.wait_pools_gone(240, cluster=plane.path)
    home = stack.home
    for plane in stack.planes:
        assert {n: plane.jobset_state(NAMESPACE, n) for n, _ in JOBSETS} == {
            n: "Completed" for n, _ in JOBSETS
        }
        # No pod ever waited for a slice and no pool was deleted under a running pod, in either.
        assert [e for e in plane.events("FailedScheduling") if e["involvedObject"]["kind"] == "Pod"] == []
        assert plane.killed_pods() == []
    ready = list(ready_pools)
    by_cluster = {p.path: [pool for cluster, pool in ready if cluster == p.path] for p in stack.planes}
    for plane in stack.planes:
        pools = by_cluster[plane.path]
        assert pools, f"no pool was created in {plane.path}"
        # Each cluster's pools are in its own zone and built with its own settings.
        assert {tuple(pool["locations"]) for pool in pools} == {(plane.cluster_id.location,)}
        disk = WEST_DISK_GB if plane is not home else DEFAULT_DISK_GB
        assert {pool["config"]["diskSizeGb"] for pool in pools} == {disk}
        # A release in one cluster deleted only that cluster's pools: every pool GKE deleted there
        # was one created there.
        assert set(plane.deleted_pools) <= {pool["name"] for pool in pools}
        assert set(plane.deleted_pools) == {pool["name"] for pool in pools}  # nothing leaked
    # Every decision line names the cluster it was about; both clusters had their Workloads admitted.
    ready_lines = stack.decisions("admission.ready")
    assert {line["cluster"] for line in ready_lines} == {p.path for p in stack.planes}
    print(
        f"\nfleet tutorial: {time.monotonic() - started:.0f}s for {len(JOBSETS)} JobSets in each of "
        f"{len(stack.planes)} clusters; pools created "
        + ", ".join(f"{p.cluster_id.name} {len(by_cluster[p.path])}" for p in stack.planes)
    )


def test_an_event_of_a_cluster_outside_the_fleet_is_dropped_without_a_gke_call(stack: RealStack) -> None:
    outsider = ClusterId("someone-elses-project", "us-west4-a", "theirs")
    before = len(stack.gke.calls)
    ignored = len(stack.decisions("provision.ignored", "provision"))
    entry = logentries.pod_event_entry(outsider, NAMESPACE, "train-0", "", controller=("JobSet", "train"))
    stack.publish_entry("provision", entry)
    stack.wait_for(
        lambda: len(stack.decisions("provision.ignored", "provision")) > ignored, 60, "provision to drop it"
    )
    [said] = stack.decisions("provision.ignored", "provision")[ignored:]
    assert outsider.path in said["message"]
    assert [c for c in stack.gke.calls[before:] if outsider.project in c.path] == []


def _doctor(stack: RealStack, only: str = "") -> tuple[str, int]:
    deployment = StackDeployment(stack, Expected(stack.config.project, TOPIC_PREFIX))
    checks = diagnose(deployment, deployment.expected, deployment.settings, only=only)
    return render_table(checks), exit_code(checks)


def test_doctor_checks_every_fleet_cluster_and_names_the_one_whose_sink_cannot_publish(
    stack: RealStack,
) -> None:
    west = stack.plane(WEST.path)
    assert west.router is not None
    topic, writer = wiring("release").topic(TOPIC_PREFIX), west.router.writer_identity
    west.router.revoke_publisher(topic, writer)
    try:
        text, code = _doctor(stack)
        narrowed, _ = _doctor(stack, only=WEST.name)
    finally:
        west.router.grant_publisher(topic, writer)
    assert_golden("doctor-fleet-missing-sink-grant.txt", text)
    assert code == 1
    failed = [line for line in text.splitlines() if " FAIL " in line]
    assert len(failed) == 1 and failed[0].startswith("sink tpuprov-jobset-lifecycle (west)"), text
    # Each cluster's own checks, both clusters' lines; narrowed, the managed cluster's are left out.
    assert "cluster reachable (sandbox)" in text and "cluster reachable (west)" in text
    assert "(sandbox)" not in narrowed and "kueue (west)" in narrowed
    healthy, code = _doctor(stack)
    assert code == 0, healthy


OUTAGE = "outage"
OUTAGE_SECONDS = 60.0  # how long the scenario keeps the second cluster's API server down


def _is_outage_reservation(entry: Mapping[str, Any]) -> bool:
    """Kueue's QuotaReserved Event for the outage JobSet's Workload (what reaches provision)."""
    payload = entry.get("jsonPayload") or {}
    involved = payload.get("involvedObject") or {}
    return payload.get("reason") == "QuotaReserved" and OUTAGE in str(involved.get("name", ""))


def _outage_jobset() -> dict[str, Any]:
    """One slice, without JobSet's exclusive placement. Its Job's pods are created as soon as the
    API server is back, while JobSet's controller may still be re-listing Nodes: its pod webhook
    (v0.10.1) then gives a follower an empty node-pool selector for good (kubernetes-sigs/jobset
    issue 1088; the product refuses such a pod with what to do). This scenario is about the
    product's convergence, not that race."""
    jobset = queued_jobset(OUTAGE, 1, run_seconds=5)
    jobset["metadata"]["annotations"].pop(labels.EXCLUSIVE_TOPOLOGY)
    return jobset


@pytest.mark.timeout(900)
def test_a_cluster_whose_api_server_is_down_delays_no_other_and_converges_when_back(
    stack: RealStack,
) -> None:
    west, home = stack.plane(WEST.path), stack.home
    assert west.router is not None
    # West's Workload has its quota reserved; the sink's export of that is held, to reach provision
    # while west's API server is down.
    west.router.drop_next(_is_outage_reservation, times=10_000)
    west.submit(_outage_jobset())
    held = stack.wait_for(
        lambda: [e for e in west.router.dropped if _is_outage_reservation(e)] if west.router else [],
        120,
        "west's QuotaReserved entry",
    )
    deleted_before = list(west.deleted_pools)
    west.kube_cluster.stop_apiserver()
    down_at = time.monotonic()
    try:
        message = west.router.publish(wiring("provision").topic(TOPIC_PREFIX), held[0])
        stack.wait_for(
            lambda: any(d.message_id == message and not d.acked for d in stack.relay.deliveries),
            60,
            "provision to meet west's outage",
        )
        tick = stack.trigger_reconcile()
        # Meanwhile the managed cluster runs a JobSet of the same name and shape from start to end.
        home.submit(_outage_jobset())
        stack.wait_for(
            lambda: home.jobset_state(NAMESPACE, OUTAGE) == "Completed" and not stack.managed_pools(),
            180,
            "the managed cluster's JobSet to finish and its pool to go while west is down",
        )
        home_seconds = time.monotonic() - down_at
        failed = stack.wait_for(
            lambda: [d for d in stack.decisions("reconcile.failed") if d.get("cluster") == WEST.path],
            60,
            "the reconcile tick to fail west's sweep",
        )
        # The scenario's outage lasts a minute whatever the managed cluster's pace; nothing here
        # waits on it for a condition.
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
        assert (
            west.deleted_pools == deleted_before
        )  # nothing of west's was touched by the managed cluster's release
    finally:
        west.kube_cluster.start_apiserver()

    # West converges: the held message's redelivery is acknowledged, its slice created, the JobSet
    # admitted and completed, and its pool released. Nothing lost, nothing leaked.
    stack.wait_for(
        lambda: any(d.message_id == message and d.acked for d in stack.relay.deliveries),
        120,
        "west's held message to be redelivered and acknowledged",
    )
    stack.wait_for(
        lambda: west.jobset_state(NAMESPACE, OUTAGE) == "Completed", 240, "west's JobSet to finish"
    )
    stack.wait_for(lambda: not stack.managed_pools(WEST.path), 180, "west's pool to be released")
    refused = {d.status for d in stack.relay.deliveries if d.message_id == message and not d.acked}
    assert refused and refused <= {503}, refused  # redelivered, never dropped or crashed
    assert {d.status for d in stack.relay.deliveries if d.message_id == tick and not d.acked} <= {503}
    assert failed and "west" in failed[0]["message"]
    for plane in stack.planes:
        assert plane.killed_pods() == []
    print(f"\nfleet outage: managed cluster's JobSet done {home_seconds:.0f}s into west's outage")
