"""Node objects of a GKE node pool, registered in the real API server; KWOK then keeps them Ready.

GKE registers one Node per VM of a pool (``gke-<cluster>-<pool>-<i>``) with its labels: the node
pool, the TPU accelerator and topology, the zone, spot/flex-start, and the pool's own node labels,
and ``google.com/tpu`` capacity of the chips on one VM (what ``sandbox/cluster/nodes.py`` gives the
stand-in cluster). Here the Node is created without conditions, as a kubelet registers it: KWOK's
``node-ready`` Stage is what makes it Ready. Deleting a pool deletes its Nodes; what becomes of
the pods bound to them is the real controller manager's pod GC.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox.kube.api import ApiError, KubeClient
from shared.core import labels

FLEX_START = "cloud.google.com/gke-flex-start"
NODES = "/api/v1/nodes"


@dataclass(frozen=True)
class PoolNodes:
    """What GKE would register for one RUNNING pool."""

    pool: str
    machine_type: str
    zones: Mapping[str, int]  # zone -> nodes in it (GKE's node count is per zone)
    accelerator: str = ""  # empty: a CPU pool
    topology: str = ""
    chips_per_node: int = 0
    spot: bool = False
    flex_start: bool = False
    node_labels: Mapping[str, str] = field(default_factory=dict)


def node_manifests(cluster: str, spec: PoolNodes) -> list[dict[str, Any]]:
    """The Node objects of ``spec`` in cluster ``cluster`` (metadata, spec and capacity)."""
    common = {
        labels.NODEPOOL: spec.pool,
        "node.kubernetes.io/instance-type": spec.machine_type,
        **{str(k): str(v) for k, v in spec.node_labels.items()},
    }
    capacity = {"cpu": "4", "memory": "16Gi", "pods": "110"}
    if spec.accelerator:
        common[labels.TPU_ACCELERATOR] = spec.accelerator
        common[labels.TPU_TOPOLOGY] = spec.topology
        capacity = {
            "cpu": "180",
            "memory": "720Gi",
            "pods": "110",
            labels.TPU_RESOURCE: str(spec.chips_per_node),
        }
    if spec.spot:
        common[labels.SPOT] = "true"
    if spec.flex_start:
        common[FLEX_START] = "true"
    manifests = []
    zones = [zone for zone, count in sorted(spec.zones.items()) for _ in range(count)]
    for index, zone in enumerate(zones):
        name = f"gke-{cluster}-{spec.pool}-{index}"
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {**common, labels.ZONE: zone, "kubernetes.io/hostname": name},
                },
                "spec": {"providerID": f"gce://sandbox/{zone}/{name}"},
                "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
            }
        )
    return manifests


def register_pool_nodes(api: KubeClient, cluster: str, spec: PoolNodes) -> list[str]:
    """Create the pool's Nodes (an existing one is left as it is); return their names."""
    names = []
    for manifest in node_manifests(cluster, spec):
        try:
            api.create(NODES, manifest)
        except ApiError as exc:
            if exc.status != 409:  # already registered: a repeated RUNNING hook
                raise
        names.append(str(manifest["metadata"]["name"]))
    return names


def delete_pool_nodes(api: KubeClient, pool: str) -> list[str]:
    """Delete every Node of ``pool`` (by its node-pool label); return the names deleted."""
    gone = []
    for node in api.list(NODES, label_selector=f"{labels.NODEPOOL}={pool}"):
        name = str(node["metadata"]["name"])
        if api.delete(f"{NODES}/{name}"):
            gone.append(name)
    return sorted(gone)


def ready(node: Mapping[str, Any]) -> bool:
    """Whether a Node's Ready condition is True."""
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
