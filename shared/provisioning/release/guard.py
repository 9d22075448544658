"""The Kubernetes side of a guarded pool delete: cordon, look who runs there, uncordon.

Nothing new binds to an unschedulable node, so cordoning a pool's nodes *before* the last occupancy
check closes the race between "nobody runs here" and the delete; without it a pod the scheduler
binds in between dies with the pool. Cordons carry the ``tpuprov.dev/cordoned`` annotation (when
and why), so the product only ever lifts its own cordons, never an operator's.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from shared.cloud.ports import KubeAPI
from shared.core import labels, logs
from shared.core.errors import NotFoundError
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.nodes import Node
from shared.tpu.pods import Pod

log = logs.get("release")

# A cordon of ours older than this was left by an attempt that died between cordon and delete
# (the settle wait plus a delete call take seconds): reconcile lifts it from pools it keeps.
STALE_CORDON_SECONDS = 120
# Up to this many nodes a pool's occupancy is read node by node; beyond, in one cluster-wide list.
PER_NODE_READS = 4
# The Nodes of every pool the product made (GKE puts a pool's node labels on each of its Nodes).
MANAGED_NODES = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"


def cordon_age(node: Node, now: float) -> float:
    """Seconds since the product cordoned the node (inf when the annotation has no time)."""
    value = node.annotations.get(labels.CORDONED, "")
    try:
        return now - float(value.split(" ", 1)[0])
    except ValueError:
        return float("inf")


class PoolGuard:
    """Cordon / occupancy reads / uncordon for one pool's nodes."""

    def __init__(self, kube: KubeAPI, settle_seconds: float, sleep: Callable[[float], None]) -> None:
        self.kube = kube
        self.settle_seconds = settle_seconds
        self.sleep = sleep

    def nodes(self, pool: NodePoolInfo) -> list[Node]:
        """The pool's Kubernetes Nodes (GKE labels each with its pool name)."""
        return self.kube.list_nodes(f"{labels.NODEPOOL}={pool.name}")

    def pods_on(self, nodes: list[Node]) -> list[Pod]:
        """Every non-terminal pod bound to one of ``nodes`` (server-side field selectors).

        A small pool costs one read per node; a large one (a 64-host slice) one paged read of every
        bound, running pod of the cluster, filtered here: field selectors have no set form.
        """
        live = "status.phase!=Succeeded,status.phase!=Failed"
        if len(nodes) <= PER_NODE_READS:
            pods: list[Pod] = []
            for node in nodes:
                pods.extend(self.kube.list_pods(field_selector=f"spec.nodeName={node.name},{live}"))
            return pods
        names = {node.name for node in nodes}
        bound = self.kube.list_pods(field_selector=f"spec.nodeName!=,{live}")
        return [pod for pod in bound if pod.node_name in names]

    def cordon(self, pool: NodePoolInfo, nodes: list[Node], why: str) -> None:
        """Cordon every node of the pool, then wait the settle time.

        The real scheduler may have picked one of these nodes just before the cordon and bind just
        after it; the settle wait lets such a binding land before the occupancy check reads it.
        """
        stamp = f"{time.time():.0f} tpu-provisioner is about to delete node pool {pool.name}: {why}"
        for node in nodes:
            if node.unschedulable:
                continue
            try:
                self.kube.set_unschedulable(node.name, True, stamp)
            except NotFoundError:
                continue  # the node went away: nothing can bind to it either
        if nodes and self.settle_seconds > 0:
            self.sleep(self.settle_seconds)

    def uncordon(self, pool: NodePoolInfo, nodes: list[Node] | None, why: str) -> int:
        """Lift the product's cordons from the pool's nodes (re-reading them when ``nodes`` is None)."""
        lifted = 0
        for node in self.nodes(pool) if nodes is None else nodes:
            if not node.cordoned_by_product:
                continue
            try:
                self.kube.set_unschedulable(node.name, False, why)
            except NotFoundError:
                continue
            lifted += 1
        if lifted:
            logs.decision(
                log,
                "release.uncordoned",
                f"uncordoned {lifted} node(s) of {pool.name}: {why}",
                pool=pool.name,
            )
        return lifted


def stale_cordons(kube: KubeAPI, keep: set[str], now: datetime.datetime) -> dict[str, list[Node]]:
    """Nodes of managed pools in ``keep`` still cordoned by a crashed attempt, by pool name."""
    found: dict[str, list[Node]] = {}
    for node in kube.list_nodes(MANAGED_NODES):
        pool = node.pool
        if (
            pool in keep
            and node.cordoned_by_product
            and cordon_age(node, now.timestamp()) > STALE_CORDON_SECONDS
        ):
            found.setdefault(pool, []).append(node)
    return found
