"""Mirror GKE node pools into Kubernetes Nodes, as GKE's node registration does.

When the GKE emulator finishes creating a pool, one Node per VM appears (``gke-<cluster>-<pool>-<i>``)
with the labels GKE puts on TPU nodes (node pool, accelerator, topology, chip count, Spot / flex-start,
reservation, zone and region, the pool's own node labels)
and ``google.com/tpu`` capacity equal to the chips of one VM. The count is the nodes the pool has
(the emulator's per-zone counts): a flex-start pool is RUNNING with none, and its whole slice
appears when the emulator grants it capacity (the ready hook fires again then). When a pool is
deleted its Nodes go, and pods still bound to them fail as pod GC fails them
(``sandbox.cluster.lifecycle``), which the JobSet controller then sees. When a pool's node labels
are updated, its Nodes' labels follow.

The GKE hooks fire on the emulator's request or ticker threads; the work is queued to a worker so
a slow Kubernetes write never holds a GKE request.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from sandbox.cluster.common import SimContext, with_condition
from sandbox.cluster.lifecycle import collect_orphans
from sandbox.emulators.gke.hooks import nodes_per_zone
from sandbox.emulators.worker import QueueWorker
from shared.core import labels
from shared.tpu import catalog

CPU_POOL = "default-pool"
# The label GKE's autoscaler puts on flex-start nodes (k8s.io/gke-autoscaling labels, FlexStartLabel).
FLEX_START = "cloud.google.com/gke-flex-start"
_Work = tuple[str, str, Any]
REGION = "topology.kubernetes.io/region"


def _reservation_labels(affinity: Mapping[str, Any]) -> dict[str, str]:
    """The reservation a node consumes, as GKE labels it (name, and project for a shared one)."""
    values = [str(v) for v in affinity.get("values") or []]
    if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION" or not values:
        return {}
    if values[0].startswith("projects/"):
        parts = values[0].split("/")
        return {labels.RESERVATION_NAME: parts[-1], labels.RESERVATION_PROJECT: parts[1]}
    return {labels.RESERVATION_NAME: values[0]}


def single_host_topology(accelerator: str, chips: int) -> str:
    """The topology label GKE gives a one-VM slice of ``chips`` chips (e.g. 4 v6e chips -> ``2x2``)."""
    for info in catalog.accelerators():
        if info.accelerator != accelerator:
            continue
        for topology in info.topologies:
            dims = [int(d) for d in topology.split("x")]
            if math.prod(dims) == chips:
                return topology
    return ""


def node_objects(
    cluster_name: str, pool: Mapping[str, Any], policy_topology: Callable[[str], str] | None = None
) -> list[dict[str, Any]]:
    """The Nodes GKE registers for a RUNNING pool given as GKE JSON (camelCase).

    ``policy_topology(name)`` is the accelerator topology of a named workload policy: a tpu7x pool
    placed by one carries no TPU topology of its own, its nodes get the policy's.
    """
    name = str(pool.get("name", ""))
    config = pool.get("config") or {}
    machine_type = str(config.get("machineType", ""))
    per_zone = nodes_per_zone(pool)
    node_labels: dict[str, str] = {
        labels.NODEPOOL: name,
        "node.kubernetes.io/instance-type": machine_type,
        "kubernetes.io/os": "linux",
        **_reservation_labels(config.get("reservationAffinity") or {}),
        **{str(k): str(v) for k, v in (config.get("labels") or {}).items()},
    }
    # The kubelet's pod capacity is the pool's max pods per node (GKE's default: 110).
    max_pods = str((pool.get("maxPodsConstraint") or {}).get("maxPodsPerNode") or 110)
    capacity = {"cpu": "4", "memory": "16Gi", "pods": max_pods}
    accelerator = catalog.accelerator_for_machine_type(machine_type)
    chips = catalog.machine_type_chips(machine_type) or 0
    if accelerator:
        placement = pool.get("placementPolicy") or {}
        topology = str(placement.get("tpuTopology", ""))
        if not topology and placement.get("policyName") and policy_topology is not None:
            topology = policy_topology(str(placement["policyName"]))
        node_labels[labels.TPU_ACCELERATOR] = accelerator
        node_labels[labels.ACCELERATOR_COUNT] = str(chips)
        node_labels[labels.TPU_TOPOLOGY] = topology or single_host_topology(accelerator, chips)
        capacity = {"cpu": "180", "memory": "720Gi", "pods": max_pods, labels.TPU_RESOURCE: str(chips)}
        if config.get("spot"):
            node_labels[labels.SPOT] = "true"
        if config.get("flexStart"):
            node_labels[FLEX_START] = "true"
    nodes = []
    for index, zone in enumerate(z for z, n in per_zone.items() for _ in range(int(n))):
        node_name = f"gke-{cluster_name}-{name}-{index}"
        zone_label = {labels.ZONE: zone, REGION: zone.rsplit("-", 1)[0]} if zone else {}
        status: dict[str, Any] = {"capacity": dict(capacity), "allocatable": dict(capacity)}
        status["conditions"] = with_condition(
            status, "Ready", True, "KubeletReady", "kubelet is posting ready status"
        )
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node_name,
                    "labels": {**node_labels, **zone_label, "kubernetes.io/hostname": node_name},
                },
                "spec": {"providerID": f"gce://sandbox/{zone or 'zone'}/{node_name}"},
                "status": status,
            }
        )
    return nodes


class NodeMirror:
    """Keeps the Kubernetes Nodes in step with the GKE emulator's pools."""

    def __init__(self, ctx: SimContext, cluster_path: str) -> None:
        self.ctx = ctx
        self.cluster_path = cluster_path
        self.cluster_name = cluster_path.rsplit("/", 1)[-1]
        # Accelerator topology of a named workload policy (the Compute emulator's), None: unknown.
        self.policy_topology: Callable[[str], str] | None = None
        self._worker = QueueWorker(
            "node-mirror",
            self._apply,
            # keep mirroring the next pools; the timeline shows the failure
            lambda work, exc: self.ctx.timeline.add(
                "nodes", f"mirroring {work[0]} {work[2]!r} failed: {exc!r}"
            ),
        )

    def attach(self, gke: Any) -> None:
        """Register on a ``GkeEmulator`` (``on_pool_ready`` / ``on_pool_deleted``)."""
        gke.on_pool_ready(lambda cluster, pool: self._enqueue(("ready", cluster, pool)))
        gke.on_pool_deleted(lambda cluster, name: self._enqueue(("deleted", cluster, name)))
        if hasattr(gke, "on_pool_updated"):
            gke.on_pool_updated(lambda cluster, pool: self._enqueue(("updated", cluster, pool)))

    def start(self) -> None:
        """Start the worker thread."""
        self._worker.start()

    def stop(self) -> None:
        """Finish queued work and stop the worker."""
        self._worker.stop()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every queued pool change is applied."""
        return self._worker.wait_idle(timeout)

    def add_cpu_nodes(self, count: int) -> None:
        """Register ``count`` ordinary (non-TPU) nodes, the cluster's default pool."""
        pool = {
            "name": CPU_POOL,
            "config": {"machineType": "e2-standard-4"},
            "initialNodeCount": count,
        }
        with self.ctx.lock:
            for node in node_objects(self.cluster_name, pool, self.policy_topology):
                self.ctx.api.put(node)

    def _enqueue(self, work: _Work) -> None:
        self._worker.submit(work)

    def _apply(self, work: _Work) -> None:
        kind, cluster, payload = work
        if cluster != self.cluster_path:
            return
        if kind == "ready":
            self._pool_ready(payload)
        elif kind == "updated":
            self._pool_updated(payload)
        else:
            self._pool_deleted(str(payload))

    def _pool_ready(self, pool: Mapping[str, Any]) -> None:
        nodes = node_objects(self.cluster_name, pool, self.policy_topology)
        topology = nodes[0]["metadata"]["labels"].get(labels.TPU_TOPOLOGY, "") if nodes else ""
        with self.ctx.lock:  # logged under the lock, so it reads before any pod bound to these nodes
            for node in nodes:
                self.ctx.api.put(node)
            waiting = not nodes and (pool.get("config") or {}).get("flexStart")
            self.ctx.timeline.add(
                "nodes",
                f"pool {pool.get('name')} RUNNING with no nodes: waiting for flex-start capacity"
                if waiting
                else f"pool {pool.get('name')} RUNNING: {len(nodes)} node(s) Ready {topology}".rstrip(),
            )

    def _pool_updated(self, pool: Mapping[str, Any]) -> None:
        # GKE applies a pool's new node labels to its running nodes (no recreation): the Node keeps
        # its spec (a cordon stays) and annotations, only the labels follow the pool.
        nodes = node_objects(self.cluster_name, pool, self.policy_topology)
        wanted = {str(n["metadata"]["name"]): n["metadata"]["labels"] for n in nodes}
        with self.ctx.lock:
            for node in self.ctx.api.list(
                "v1", "nodes", label_selector=f"{labels.NODEPOOL}={pool.get('name')}"
            ):
                name = str(node["metadata"]["name"])
                if name in wanted:
                    node["metadata"]["labels"] = dict(wanted[name])
                    self.ctx.api.put(node)
            self.ctx.timeline.add("nodes", f"pool {pool.get('name')} updated: node labels follow the pool")

    def _pool_deleted(self, pool: str) -> None:
        api = self.ctx.api
        with self.ctx.lock:
            gone = api.list("v1", "nodes", label_selector=f"{labels.NODEPOOL}={pool}")
            names = {str(n["metadata"]["name"]) for n in gone}
            for name in sorted(names):
                api.delete("v1", "nodes", None, name)
            lost = collect_orphans(self.ctx)
        suffix = f"; {len(lost)} running pod(s) failed" if lost else ""
        self.ctx.timeline.add("nodes", f"pool {pool} deleted: {len(names)} node(s) removed{suffix}")
