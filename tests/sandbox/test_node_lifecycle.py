"""Scheduler placement, cordons, the bind race and pods dying with their node pool.

An in-process Kubernetes API and GKE emulator with the simulated scheduler, node mirror and node
lifecycle loop; pools are created and deleted through the product's GKE adapter from the
product's NodePool builder, as the provision and release functions would.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.cluster.common import SimContext, condition, is_true
from sandbox.cluster.lifecycle import PoolLifecycle
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
from shared.tpu.jobsets import expand_pods
from shared.tpu.slices import build_node_pool, slice_request

pytestmark = pytest.mark.integration

SETTINGS = Settings(project_id="p", location="us-east5-b", cluster_name="c")


class Sim:
    """Scheduler + node mirror + node lifecycle over one Kubernetes API and one GKE emulator."""

    def __init__(self, kube: KubeApiServer, gke: GkeEmulator, bind_delay: float) -> None:
        self.kube, self.gke = kube, gke
        self.ctx = SimContext(kube, Timeline())
        config = SchedulerConfig(initial_backoff=0.1, max_backoff=0.2, interval=0.05, bind_delay=bind_delay)
        self.scheduler = Scheduler(self.ctx, config)
        self.nodes = NodeMirror(self.ctx, SETTINGS.cluster_path)
        self.nodes.attach(gke)
        self.lifecycle = PoolLifecycle(self.ctx, SETTINGS.cluster_path, interval=0.05)
        self.lifecycle.attach(gke)
        self.adapter = GkeNodePoolAPI(endpoint=gke.url, timeout=5.0)
        self.parts = (self.nodes, self.lifecycle, self.scheduler)

    def pod(self, name: str, run_seconds: float = 60) -> dict[str, Any]:
        """The pod of a one-VM v6e 2x2 JobSet, Pending, as the JobSet controller creates it."""
        (pod,) = expand_pods(
            tpu_jobset(name, replicas=1, topology="2x2", run_seconds=run_seconds), 0, pending=False
        )
        pod["metadata"]["name"] = name
        return self.kube.put(pod)

    def get(self, name: str) -> dict[str, Any]:
        found = self.kube.get("v1", "pods", "default", name)
        assert found is not None
        return found

    def node(self, name: str) -> dict[str, Any]:
        found = self.kube.get("v1", "nodes", None, name)
        assert found is not None
        return found

    def provision(self, pod: dict[str, Any]) -> str:
        """Create the pod's slice pool exactly as the provision function would; wait for its Nodes."""
        name = pod["metadata"]["name"]
        pending = eventually(
            lambda: (
                (condition(self.get(name), "PodScheduled") or {}).get("reason") == "Unschedulable"
                and self.get(name)
            )
        )
        spec, _ = build_node_pool(
            SETTINGS, slice_request(pending), self.adapter.get_cluster(SETTINGS.cluster_path)
        )
        self.adapter.create_node_pool(SETTINGS.cluster_path, spec, "test")
        eventually(lambda: self.kube.list("v1", "nodes", label_selector=f"{labels.NODEPOOL}={spec.name}"))
        return spec.name

    def cordon(self, node_name: str) -> None:
        node = self.node(node_name)
        node["spec"]["unschedulable"] = True
        self.kube.put(node)


def _make(bind_delay: float) -> Iterator[Sim]:
    seed = ClusterSeed("p", "us-east5-b", "c", locations=("us-east5-b",))
    with (
        KubeApiServer(crd_files=[DEFAULT_MANIFESTS_DIR / "jobset-v0.10.1.yaml"]) as kube,
        GkeEmulator([seed], op_delay=0) as gke,
    ):
        sim = Sim(kube, gke, bind_delay)
        for part in sim.parts:
            part.start()
        try:
            yield sim
        finally:
            for part in reversed(sim.parts):
                part.stop()
            assert sim.scheduler.errors == [] and sim.lifecycle.errors == []


@pytest.fixture
def sim() -> Iterator[Sim]:
    yield from _make(bind_delay=0.0)


@pytest.fixture
def slow_bind() -> Iterator[Sim]:
    yield from _make(bind_delay=0.6)


def test_pod_binds_to_any_matching_node_whatever_pool_but_never_a_cordoned_one(sim: Sim) -> None:
    first = sim.provision(sim.pod("owner"))
    second = sim.provision(sim.pod("owner-2"))  # two pools of the same shape
    eventually(
        lambda: sim.get("owner")["spec"].get("nodeName") and sim.get("owner-2")["spec"].get("nodeName")
    )
    sim.kube.delete("v1", "pods", "default", "owner")  # frees a node of one pool
    freed = next(
        n for n in (f"gke-c-{first}-0", f"gke-c-{second}-0") if n != sim.get("owner-2")["spec"]["nodeName"]
    )

    sim.cordon(freed)
    sim.pod("newcomer")
    message = eventually(lambda: (condition(sim.get("newcomer"), "PodScheduled") or {}).get("message"))
    assert "1 node(s) were unschedulable" in message and "1 Insufficient google.com/tpu" in message
    assert not sim.get("newcomer")["spec"].get("nodeName")

    node = sim.node(freed)
    node["spec"]["unschedulable"] = False  # uncordon: the pod takes it, whichever JobSet's pool it was
    sim.kube.put(node)
    eventually(lambda: sim.get("newcomer")["spec"].get("nodeName") == freed, timeout=3)
    assert sim.get("newcomer")["status"]["phase"] == "Running"


def test_deleting_a_pool_cordons_and_drains_its_nodes_killing_the_pods_on_them(sim: Sim) -> None:
    pool = sim.provision(sim.pod("victim"))
    node_name = eventually(lambda: sim.get("victim")["spec"].get("nodeName"))
    sim.gke.set_op_delay(1.0)

    sim.adapter.delete_node_pool(SETTINGS.cluster_path, pool, "test")
    node = eventually(lambda: sim.node(node_name)["spec"].get("unschedulable") and sim.node(node_name))
    assert not is_true(node, "Ready")
    assert {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"} in node["spec"]["taints"]
    pod = eventually(lambda: sim.get("victim")["status"]["phase"] == "Failed" and sim.get("victim"))
    assert pod["status"]["message"] == f"node pool {pool} was deleted: GKE drained the pod's node"
    assert sim.kube.get("v1", "nodes", None, node_name) is not None  # failed while the pool was STOPPING
    assert sim.ctx.pods_killed == ["default/victim"]
    eventually(lambda: sim.kube.get("v1", "nodes", None, node_name) is None)
    assert sim.ctx.pods_killed == ["default/victim"]  # counted once


def test_a_pod_finished_before_its_pool_goes_is_not_counted_as_killed(sim: Sim) -> None:
    pool = sim.provision(sim.pod("done", run_seconds=0.1))
    eventually(lambda: sim.get("done")["status"]["phase"] == "Succeeded")
    sim.adapter.delete_node_pool(SETTINGS.cluster_path, pool, "test")
    eventually(lambda: not sim.kube.list("v1", "nodes", label_selector=f"{labels.NODEPOOL}={pool}"))
    time.sleep(0.2)
    assert sim.get("done")["status"]["phase"] == "Succeeded"
    assert sim.ctx.pods_killed == []


def test_bind_delay_lets_a_pod_land_on_a_node_cordoned_after_the_decision(slow_bind: Sim) -> None:
    sim = slow_bind
    pool = sim.provision(sim.pod("first", run_seconds=0.1))
    eventually(lambda: sim.get("first")["status"]["phase"] == "Succeeded", timeout=5)
    sim.pod("racer")
    eventually(lambda: any("racer assumed on" in e.text for e in sim.ctx.timeline.entries()))
    assert not sim.get("racer")["spec"].get("nodeName")  # decided, not bound yet

    node_name = f"gke-c-{pool}-0"
    sim.cordon(node_name)  # what a release that cordons, checks, then deletes would do here
    eventually(lambda: sim.get("racer")["spec"].get("nodeName") == node_name, timeout=3)
    assert sim.node(node_name)["spec"]["unschedulable"] is True

    sim.adapter.delete_node_pool(SETTINGS.cluster_path, pool, "test")
    eventually(lambda: sim.get("racer")["status"]["phase"] == "Failed")
    assert sim.ctx.pods_killed == ["default/racer"]


def test_a_pod_bound_to_a_node_that_no_longer_exists_is_failed_by_pod_gc(slow_bind: Sim) -> None:
    sim = slow_bind
    pool = sim.provision(sim.pod("first", run_seconds=0.1))
    eventually(lambda: sim.get("first")["status"]["phase"] == "Succeeded", timeout=5)
    sim.pod("late")
    eventually(lambda: any("late assumed on" in e.text for e in sim.ctx.timeline.entries()))
    sim.adapter.delete_node_pool(SETTINGS.cluster_path, pool, "test")  # gone before the bind lands
    eventually(lambda: not sim.kube.list("v1", "nodes", label_selector=f"{labels.NODEPOOL}={pool}"))

    pod = eventually(lambda: sim.get("late")["status"]["phase"] == "Failed" and sim.get("late"), timeout=3)
    assert pod["spec"]["nodeName"] == f"gke-c-{pool}-0"  # the binding names the pod, not the node
    disruption = condition(pod, "DisruptionTarget") or {}
    assert (disruption.get("reason"), disruption.get("message")) == (
        "DeletionByPodGC",
        "PodGC: node no longer exists",
    )
    assert sim.ctx.pods_killed == ["default/late"]
