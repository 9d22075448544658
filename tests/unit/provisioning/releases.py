"""What the release tests share (test_release_paths, test_adoption): a cluster, JobSets finished or
suspended at a chosen time, pools and the pods that land on them."""

from __future__ import annotations

import datetime
from typing import Any

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_RUNNING, NodePoolInfo

SETTINGS = Settings(
    unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c", cordon_settle_seconds=0
)
CLUSTER = SETTINGS.cluster_path


def now() -> datetime.datetime:
    """The time now: the releaser reads the real clock, so times are taken when a test runs, not at
    import (a session that runs minutes of sandbox tests first would push them past every window)."""
    return datetime.datetime.now(tz=datetime.UTC)


def ago(seconds: float) -> str:
    return (now() - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def submit(kube: FakeKube, jobset: dict[str, Any]) -> list[dict[str, Any]]:
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    return pods


def with_pools(gke: FakeGke, kube: FakeKube, jobset: dict[str, Any]) -> list[NodePoolInfo]:
    """Submit ``jobset``, provision its pools, make them RUNNING with Nodes, and run its pods there."""
    pods = submit(kube, jobset)
    Provisioner(Services(SETTINGS, gke, kube)).handle_pending_pod(
        "team-a", pods[0]["metadata"]["name"], now()
    )
    mine = [p for p in gke.pools[CLUSTER].values() if p.labels[labels.OWNER_UID] == jobset["metadata"]["uid"]]
    for pool in mine:
        gke.mark(CLUSTER, pool.name, STATUS_RUNNING)
        kube.add_pool_nodes(gke.pools[CLUSTER][pool.name])
    for pod in pods:
        node = _node_of(kube, pod, mine)
        kube.bind("team-a", pod["metadata"]["name"], node)
    return [gke.pools[CLUSTER][p.name] for p in mine]


def _node_of(kube: FakeKube, pod: dict[str, Any], pools: list[NodePoolInfo]) -> str:
    index = pod["metadata"]["labels"][labels.JOB_INDEX]
    pool = next(p for p in pools if p.labels[labels.OWNER_JOB_INDEX] == index)
    return f"gke-c-{pool.name}-0"


def finish(kube: FakeKube, name: str, kind: str = "Completed", when: str | None = None) -> None:
    jobset = kube.jobsets[("team-a", name)]
    jobset["status"] = {
        "conditions": [
            {"type": kind, "status": "True", "reason": "x", "lastTransitionTime": when or ago(600)}
        ]
    }
    for pod in kube.pods.values():
        if pod["metadata"]["labels"][labels.JOBSET_NAME] == name:
            pod["status"]["phase"] = "Succeeded" if kind == "Completed" else "Failed"


def suspend(kube: FakeKube, name: str, since: float) -> None:
    jobset = kube.jobsets[("team-a", name)]
    jobset["spec"]["suspend"] = True
    jobset["status"] = {
        "conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": ago(since)}]
    }
    for key in [k for k, p in kube.pods.items() if p["metadata"]["labels"][labels.JOBSET_NAME] == name]:
        del kube.pods[key]


def land(kube: FakeKube, jobset: dict[str, Any], pool: NodePoolInfo) -> str:
    """``jobset`` (same shape) is admitted and its first pod binds to ``pool``'s node at once."""
    pods = submit(kube, jobset)
    name = pods[0]["metadata"]["name"]
    kube.bind("team-a", name, f"gke-c-{pool.name}-0")
    return name


def owner(gke: FakeGke, pool: NodePoolInfo) -> tuple[str, str]:
    current = gke.pools[CLUSTER][pool.name].labels
    return current[labels.OWNER_NAME], current[labels.OWNER_UID]


def schedulable(kube: FakeKube, pool: NodePoolInfo) -> bool:
    return not any(n.unschedulable for n in kube.list_nodes(f"{labels.NODEPOOL}={pool.name}"))


def events(kube: FakeKube, reason: str, name: str) -> list[str]:
    return [e["message"] for e in kube.events if e["reason"] == reason and e["name"] == name]


def queue(kube: FakeKube, name: str, replicas: int = 1) -> dict[str, Any]:
    """A JobSet Kueue holds suspended (no pods yet)."""
    jobset = tpu_jobset(name, "team-a", replicas=replicas)
    jobset["spec"]["suspend"] = True
    jobset["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "q"}  # queued in Kueue
    kube.add_jobset(jobset)
    return jobset


HANDOVER_WINDOW = 120


def finished_beside_queued(
    gke: FakeGke, kube: FakeKube, finished_ago: float
) -> tuple[NodePoolInfo, dict[str, Any], Settings]:
    """Team-a's one-slice JobSet "a" finished ``finished_ago`` seconds ago on its pool while JobSet
    "queued" of its shape waits in Kueue: the pool, the queued JobSet and settings with a
    ``HANDOVER_WINDOW``-second handover window (the release keeps the pool idle for "queued")."""
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a", when=ago(finished_ago))
    queued = queue(kube, "queued")
    return pool, queued, SETTINGS.with_overrides(idle_pool_seconds=HANDOVER_WINDOW)
