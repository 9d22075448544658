"""Node lifecycle around a node-pool deletion: cordon and drain while STOPPING, pod GC afterwards.

* While GKE deletes a pool (status ``STOPPING``) its Nodes are cordoned (``spec.unschedulable``
  and the ``node.kubernetes.io/unschedulable:NoSchedule`` taint) and report ``Ready=False``, so
  the scheduler puts nothing new there, and drained: GKE deletes the pods on them (with their
  termination grace period, an hour at most), which the Job controller records as failed pods.
  The sandbox fails such a pod in place at once (``phase: Failed``, a message naming the pool)
  instead of deleting it after a grace period, so the JobSet controller sees the failure.
* A Pending/Running pod bound to a Node that no longer exists is failed as Kubernetes' pod GC
  controller fails orphans: ``phase: Failed`` plus a ``DisruptionTarget`` condition with reason
  ``DeletionByPodGC`` and message "PodGC: node no longer exists". Real pod GC then force-deletes the
  pod after its 40 s quarantine; here the Failed pod stays, standing in for the Job controller's
  tracking finalizer, so the JobSet controller counts the failure. Every such pod is recorded in
  ``SimContext.pods_killed``: work lost to a pool deletion, which the product must never cause.
"""

from __future__ import annotations

from typing import Any

from sandbox.cluster.common import Loop, SimContext, ref, with_condition
from shared.core import labels

UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
_ACTIVE = ("Pending", "Running")


def collect_orphans(ctx: SimContext) -> list[str]:
    """Fail every active pod bound to a Node that does not exist; returns their references.

    Call with ``ctx.lock`` held.
    """
    api = ctx.api
    existing = {str(n["metadata"]["name"]) for n in api.list("v1", "nodes")}
    failed = []
    for pod in api.list("v1", "pods"):
        node = (pod.get("spec") or {}).get("nodeName")
        status = dict(pod.get("status") or {})
        if not node or node in existing or status.get("phase") not in _ACTIVE:
            continue
        if pod["metadata"].get("deletionTimestamp"):
            continue
        status["phase"] = "Failed"
        status["conditions"] = with_condition(
            status, "DisruptionTarget", True, "DeletionByPodGC", "PodGC: node no longer exists"
        )
        status["conditions"] = with_condition(
            {"conditions": status["conditions"]}, "Ready", False, "PodFailed", ""
        )
        meta = pod["metadata"]
        api.patch_status("v1", "pods", meta.get("namespace"), meta["name"], status)
        failed.append(ref(pod))
        ctx.timeline.add(
            "podgc", f"pod {ref(pod)} Failed: its node {node} no longer exists (DeletionByPodGC)"
        )
    ctx.pods_killed.extend(failed)
    return failed


def drain(ctx: SimContext, pool: str, nodes: set[str]) -> list[str]:
    """Fail every active pod bound to one of ``nodes`` of a pool being deleted; call under the lock."""
    api = ctx.api
    failed = []
    for pod in api.list("v1", "pods"):
        status = dict(pod.get("status") or {})
        if (pod.get("spec") or {}).get("nodeName") not in nodes or status.get("phase") not in _ACTIVE:
            continue
        if pod["metadata"].get("deletionTimestamp"):
            continue
        status.update(phase="Failed", message=f"node pool {pool} was deleted: GKE drained the pod's node")
        status["conditions"] = with_condition(status, "Ready", False, "PodFailed", "")
        meta = pod["metadata"]
        api.patch_status("v1", "pods", meta.get("namespace"), meta["name"], status)
        failed.append(ref(pod))
        ctx.timeline.add("nodes", f"pod {ref(pod)} Failed: node pool {pool} is being deleted (drain)")
    ctx.pods_killed.extend(failed)
    return failed


def cordon(node: dict[str, Any], why: str) -> bool:
    """Mark ``node`` unschedulable and NotReady in place; False when it already was."""
    spec = node.setdefault("spec", {})
    status = node.setdefault("status", {})
    ready: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    if spec.get("unschedulable") and ready.get("status") == "False":
        return False
    spec["unschedulable"] = True
    taints = list(spec.get("taints") or [])
    if not any(t.get("key") == UNSCHEDULABLE_TAINT["key"] for t in taints):
        taints.append(dict(UNSCHEDULABLE_TAINT))
    spec["taints"] = taints
    status["conditions"] = with_condition(status, "Ready", False, "KubeletNotReady", why)
    return True


class PoolLifecycle(Loop):
    """Polls the GKE emulator's pools: cordons and drains STOPPING ones' Nodes, collects orphans."""

    name = "node-lifecycle"

    def __init__(self, ctx: SimContext, cluster_path: str, interval: float = 0.1) -> None:
        super().__init__(interval)
        self.ctx = ctx
        self.cluster_path = cluster_path
        self._gke: Any = None

    def attach(self, gke: Any) -> None:
        """Watch this ``GkeEmulator``'s pools."""
        self._gke = gke

    def step(self) -> None:
        """Cordon and drain the Nodes of pools being deleted; fail pods whose Node vanished."""
        stopping = []
        if self._gke is not None:
            stopping = [
                str(p.get("name"))
                for p in self._gke.pools(self.cluster_path)
                if str(p.get("status", "")) == "STOPPING"
            ]
        with self.ctx.lock:
            api = self.ctx.api
            for pool in stopping:
                cordoned = 0
                nodes = api.list("v1", "nodes", label_selector=f"{labels.NODEPOOL}={pool}")
                for node in nodes:
                    if cordon(node, f"node pool {pool} is being deleted"):
                        api.put(node)
                        cordoned += 1
                if cordoned:
                    self.ctx.timeline.add(
                        "nodes", f"pool {pool} STOPPING: {cordoned} node(s) cordoned and NotReady"
                    )
                drain(self.ctx, pool, {str(n["metadata"]["name"]) for n in nodes})
            collect_orphans(self.ctx)
