"""The simulated cluster on its own: JobSet controller, scheduler and node mirror, no functions.

An in-process Kubernetes API and GKE emulator; pools are created through the product's own GKE
adapter from the product's own NodePool builder, so the nodes the scheduler sees are the ones the
provision function would get.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.cluster.common import JOBSET_API, SimContext, is_true
from sandbox.cluster.controllers import JobSetController
from sandbox.cluster.nodes import NodeMirror
from sandbox.cluster.scheduler import Scheduler, SchedulerConfig
from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.emulators.kube.api import KubeApiServer
from sandbox.jobsets import tpu_jobset
from sandbox.polling import eventually
from sandbox.stack.config import DEFAULT_MANIFESTS_DIR
from sandbox.stack.timeline import Timeline
from shared.cloud.gke import GkeNodePoolAPI
from shared.core import labels
from shared.core.settings import Settings
from shared.tpu.slices import build_node_pool, slice_request

pytestmark = pytest.mark.integration

SETTINGS = Settings(project_id="p", location="us-east5-b", cluster_name="c")


class Cluster:
    """The simulated cluster plus the helpers the tests drive it with."""

    def __init__(self, kube: KubeApiServer, gke: GkeEmulator) -> None:
        self.kube, self.gke = kube, gke
        self.ctx = SimContext(kube, Timeline())
        self.jobsets = JobSetController(self.ctx, interval=0.05)
        self.scheduler = Scheduler(
            self.ctx, SchedulerConfig(initial_backoff=0.2, max_backoff=0.5, interval=0.05)
        )
        self.nodes = NodeMirror(self.ctx, SETTINGS.cluster_path)
        self.nodes.attach(gke)
        self.adapter = GkeNodePoolAPI(endpoint=gke.url, timeout=5.0)

    def start(self) -> None:
        for part in (self.nodes, self.jobsets, self.scheduler):
            part.start()

    def stop(self) -> None:
        for part in (self.scheduler, self.jobsets, self.nodes):
            part.stop()

    def pods(self, jobset: str) -> list[dict[str, Any]]:
        return self.kube.list("v1", "pods", "default", label_selector=f"{labels.JOBSET_NAME}={jobset}")

    def jobset(self, name: str) -> dict[str, Any]:
        found = self.kube.get(JOBSET_API, labels.JOBSET_PLURAL, "default", name)
        assert found is not None
        return found

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.list("v1", "events", "default") if e.get("reason") == reason]

    def provision(self, pod: dict[str, Any]) -> str:
        """Create the pod's slice pool exactly as the provision function would."""
        cluster = self.adapter.get_cluster(SETTINGS.cluster_path)
        spec, _ = build_node_pool(SETTINGS, slice_request(pod), cluster)
        self.adapter.create_node_pool(SETTINGS.cluster_path, spec, "test")
        return spec.name


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    seed = ClusterSeed("p", "us-east5-b", "c", locations=("us-east5-b",))
    with (
        KubeApiServer(crd_files=[DEFAULT_MANIFESTS_DIR / "jobset-v0.10.1.yaml"]) as kube,
        GkeEmulator([seed], op_delay=0) as gke,
    ):
        sim = Cluster(kube, gke)
        sim.start()
        try:
            yield sim
        finally:
            sim.stop()


def _submit(cluster: Cluster, jobset: dict[str, Any]) -> dict[str, Any]:
    jobset["metadata"].pop("uid", None)
    return cluster.kube.put(jobset)


def _pending(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


def _all_pending(cluster: Cluster, jobset: str) -> bool:
    pods = cluster.pods(jobset)
    return bool(pods) and all(_pending(p) for p in pods)


def test_pods_pend_get_their_pool_run_and_complete(cluster: Cluster) -> None:
    stored = _submit(cluster, tpu_jobset("train", replicas=1, topology="4x4", run_seconds=0.2))
    pods = eventually(lambda: len(cluster.pods("train")) == 4 and cluster.pods("train"))
    for pod in pods:
        assert pod["metadata"]["labels"][labels.JOBSET_UID] == stored["metadata"]["uid"]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]
    pods = eventually(lambda: all(_pending(p) for p in cluster.pods("train")) and cluster.pods("train"))
    failed = eventually(lambda: cluster.events("FailedScheduling"))
    assert "0/0 nodes are available" in failed[0]["message"]  # no nodes yet at all
    assert failed[0]["source"]["component"] == "default-scheduler"

    pool = cluster.provision(pods[0])

    def pool_nodes() -> list[dict[str, Any]]:
        return cluster.kube.list("v1", "nodes", label_selector=f"{labels.NODEPOOL}={pool}")

    nodes = eventually(lambda: len(pool_nodes()) == 4 and pool_nodes())  # mirrored one by one
    assert sorted(n["metadata"]["name"] for n in nodes) == [f"gke-c-{pool}-{i}" for i in range(4)]
    assert nodes[0]["metadata"]["labels"][labels.OWNER_NAME] == "train"  # the pool's node labels

    eventually(lambda: cluster.jobset("train").get("status", {}).get("terminalState") == "Completed")
    assert {p["spec"]["nodeName"].rsplit("-", 1)[0] for p in cluster.pods("train")} == {f"gke-c-{pool}"}
    assert is_true(cluster.jobset("train"), "Completed")
    (done,) = eventually(lambda: cluster.events("AllJobsCompleted"))  # written just after the condition
    assert done["involvedObject"]["kind"] == "JobSet" and done["source"]["component"] == "jobset"


def test_suspend_deletes_pods_and_resume_recreates_them(cluster: Cluster) -> None:
    _submit(cluster, tpu_jobset("nap", replicas=1, topology="2x2"))
    eventually(lambda: cluster.pods("nap"))
    jobset = cluster.jobset("nap")
    jobset["spec"]["suspend"] = True
    cluster.kube.put(jobset)

    eventually(lambda: is_true(cluster.jobset("nap"), "Suspended") and not cluster.pods("nap"))
    eventually(lambda: cluster.events("SuspendedJobs"))  # written just after the condition
    jobset = cluster.jobset("nap")
    jobset["spec"]["suspend"] = False
    cluster.kube.put(jobset)
    eventually(lambda: cluster.pods("nap") and not is_true(cluster.jobset("nap"), "Suspended"))
    eventually(lambda: cluster.events("ResumeJobs"))


@pytest.mark.parametrize(
    ("failure_policy", "restarts", "reason"),
    [(None, 0, "FailedJobs"), ({"maxRestarts": 1}, 1, "ReachedMaxRestarts")],
    ids=["no-policy", "restarts-exhausted"],
)
def test_losing_the_nodes_fails_running_pods_and_the_jobset(
    cluster: Cluster, failure_policy: dict[str, int] | None, restarts: int, reason: str
) -> None:
    jobset = tpu_jobset("lose", replicas=1, topology="2x2", run_seconds=60)
    if failure_policy:
        jobset["spec"]["failurePolicy"] = failure_policy
    _submit(cluster, jobset)
    for attempt in range(restarts + 1):
        eventually(lambda: _all_pending(cluster, "lose"))
        pool = cluster.provision(cluster.pods("lose")[0])
        eventually(lambda: [p for p in cluster.pods("lose") if p["status"].get("phase") == "Running"])
        cluster.adapter.delete_node_pool(SETTINGS.cluster_path, pool, "test")
        expected = attempt + 1
        if attempt < restarts:
            eventually(lambda: cluster.jobset("lose").get("status", {}).get("restarts") == expected)  # noqa: B023

    eventually(lambda: is_true(cluster.jobset("lose"), "Failed"))
    (event,) = eventually(lambda: cluster.events(reason))  # written just after the condition
    assert event["type"] == "Warning"
    assert cluster.jobset("lose")["status"].get("restarts", 0) == restarts


def test_deleting_a_jobset_collects_its_pods(cluster: Cluster) -> None:
    _submit(cluster, tpu_jobset("bye", replicas=2, topology="2x2"))
    eventually(lambda: len(cluster.pods("bye")) == 2)
    assert cluster.kube.delete(JOBSET_API, labels.JOBSET_PLURAL, "default", "bye")
    eventually(lambda: not cluster.pods("bye"))
    time.sleep(0.3)
    assert not cluster.pods("bye")  # and the controller does not bring them back


def test_node_labels_follow_a_pool_relabelled_through_gke(cluster: Cluster) -> None:
    jobset = tpu_jobset("relabel", replicas=1, topology="2x2", run_seconds=60)
    _submit(cluster, jobset)
    eventually(lambda: _all_pending(cluster, "relabel"))
    pool = cluster.provision(cluster.pods("relabel")[0])
    selector = f"{labels.NODEPOOL}={pool}"
    eventually(lambda: cluster.kube.list("v1", "nodes", label_selector=selector))
    [node] = cluster.kube.list("v1", "nodes", label_selector=selector)
    node["spec"]["unschedulable"] = True  # a cordon survives the relabel
    cluster.kube.put(node)
    new = {**node["metadata"]["labels"], labels.OWNER_NAME: "adopter"}
    new = {k: v for k, v in new.items() if k.startswith("tpuprov.dev/")}
    cluster.adapter.set_node_pool_labels(SETTINGS.cluster_path, pool, new, "adopted")

    def relabelled() -> bool:
        [current] = cluster.kube.list("v1", "nodes", label_selector=selector)
        return current["metadata"]["labels"].get(labels.OWNER_NAME) == "adopter" and bool(
            current["spec"].get("unschedulable")
        )

    eventually(relabelled)
