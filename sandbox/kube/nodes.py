"""Node objects of a GKE node pool, registered in the real API server; KWOK then keeps them Ready.

GKE registers one Node per VM of a pool (``gke-<cluster>-<pool>-<i>``) with its labels: the node
pool, the TPU accelerator, chip count and topology, zone and region, Spot/flex-start, the
reservation it consumes and the pool's own node labels, and ``google.com/tpu`` capacity of the
chips on one VM (``tests/sandbox/real/test_pool_nodes.py`` states them per pool). A Node is
created without conditions, as a kubelet registers it: KWOK's ``node-ready`` Stage makes it Ready.
Deleting a pool deletes its Nodes; what becomes of the pods bound to them is the real controller
manager's pod GC.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sandbox.emulators.gke.hooks import nodes_per_zone
from sandbox.emulators.reservations import parse_value
from sandbox.kube.api import ApiError, KubeClient
from shared.core import labels
from shared.tpu import catalog

FLEX_START = "cloud.google.com/gke-flex-start"
REGION = "topology.kubernetes.io/region"
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
    node_labels: Mapping[str, str] = field(default_factory=dict)  # the pool's own, and reservation's
    max_pods: int = 110  # the kubelet's pod capacity: the pool's max pods per node


def _reservation_labels(affinity: Mapping[str, Any]) -> dict[str, str]:
    # The reservation a node consumes: its name, and its project when given as a shared one's path.
    values = [str(v) for v in affinity.get("values") or []]
    if affinity.get("consumeReservationType") != "SPECIFIC_RESERVATION" or not values:
        return {}
    # A pool placed in a block or sub-block (NAME/reservationBlocks/B/...) consumes NAME all the same.
    project, name, _, _ = parse_value(values[0], "")
    if project:
        return {labels.RESERVATION_NAME: name, labels.RESERVATION_PROJECT: project}
    return {labels.RESERVATION_NAME: name}


def _single_host_topology(accelerator: str, chips: int) -> str:
    # The topology GKE labels a one-VM slice with: the accelerator's topology of that many chips.
    for info in catalog.accelerators():
        if info.accelerator == accelerator:
            for topology in info.topologies:
                if math.prod(int(d) for d in topology.split("x")) == chips:
                    return topology
    return ""


def pool_from_gke(pool: Mapping[str, Any], policy_topology: Callable[[str], str] | None = None) -> PoolNodes:
    """What GKE registers for a RUNNING pool given as the GKE emulator's JSON (camelCase).

    The node count is the emulator's per-zone count when it has one (a flex-start pool is RUNNING
    with none until capacity is granted), else ``initialNodeCount`` in each location. A pool placed
    by a named workload policy takes its topology from ``policy_topology(name)``.
    """
    config = pool.get("config") or {}
    machine_type = str(config.get("machineType", ""))
    zones = nodes_per_zone(pool)
    accelerator = catalog.accelerator_for_machine_type(machine_type) or ""
    chips = catalog.machine_type_chips(machine_type) or 0
    placement = pool.get("placementPolicy") or {}
    topology = str(placement.get("tpuTopology", ""))
    if accelerator and not topology and placement.get("policyName") and policy_topology is not None:
        topology = policy_topology(str(placement["policyName"]))
    if accelerator and not topology:
        topology = _single_host_topology(accelerator, chips)
    own_labels = {str(k): str(v) for k, v in (config.get("labels") or {}).items()}
    return PoolNodes(
        pool=str(pool.get("name", "")),
        machine_type=machine_type,
        zones={str(z): int(n) for z, n in zones.items()},
        accelerator=accelerator,
        topology=topology,
        chips_per_node=chips if accelerator else 0,
        spot=bool(config.get("spot")) and bool(accelerator),
        flex_start=bool(config.get("flexStart")) and bool(accelerator),
        node_labels={
            **_reservation_labels(config.get("reservationAffinity") or {}),
            **_placement_labels(placement),
            **own_labels,
        },
        max_pods=int((pool.get("maxPodsConstraint") or {}).get("maxPodsPerNode") or 110),
    )


def _placement_labels(placement: Mapping[str, Any]) -> dict[str, str]:
    # GKE labels the nodes of a pool placed by a named (workload) policy with that name, which
    # xpk's tpu7x workloads select (xpk src/xpk/core/scheduling.py).
    name = str(placement.get("policyName") or "")
    return {labels.PLACEMENT_POLICY_NAME: name} if name else {}


def _zone_labels(zone: str) -> dict[str, str]:
    return {labels.ZONE: zone, REGION: zone.rsplit("-", 1)[0]} if zone else {}


def node_manifests(cluster: str, spec: PoolNodes) -> list[dict[str, Any]]:
    """The Node objects of ``spec`` in cluster ``cluster`` (metadata, spec and capacity)."""
    common = {
        labels.NODEPOOL: spec.pool,
        "node.kubernetes.io/instance-type": spec.machine_type,
        "kubernetes.io/os": "linux",
        **{str(k): str(v) for k, v in spec.node_labels.items()},
    }
    capacity = {"cpu": "4", "memory": "16Gi", "pods": str(spec.max_pods)}
    if spec.accelerator:
        common[labels.TPU_ACCELERATOR] = spec.accelerator
        common[labels.ACCELERATOR_COUNT] = str(spec.chips_per_node)
        common[labels.TPU_TOPOLOGY] = spec.topology
        capacity = {
            "cpu": "180",
            "memory": "720Gi",
            "pods": str(spec.max_pods),
            labels.TPU_RESOURCE: str(spec.chips_per_node),
        }
    if spec.spot:
        common[labels.SPOT] = "true"
    if spec.flex_start:
        common[FLEX_START] = "true"
    manifests = []
    zones = [zone for zone, count in spec.zones.items() for _ in range(count)]
    for index, zone in enumerate(zones):
        name = f"gke-{cluster}-{spec.pool}-{index}"
        manifests.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        **common,
                        **_zone_labels(zone),
                        "kubernetes.io/hostname": name,
                    },
                },
                "spec": {"providerID": f"gce://sandbox/{zone or 'zone'}/{name}"},
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


# The taints Kubernetes itself keeps on a Node that cannot take pods yet (well-known labels,
# annotations and taints: node.kubernetes.io/*): the API server's NodeTaint admission puts
# not-ready on every new Node, and the node lifecycle controller lifts it only on one of its
# monitor passes after the kubelet (KWOK here) reports Ready.
_LIFECYCLE_TAINT_PREFIX = "node.kubernetes.io/"


def takes_pods(node: Mapping[str, Any]) -> bool:
    """Ready, and none of Kubernetes' own lifecycle taints left: what the scheduler needs."""
    taints = (node.get("spec") or {}).get("taints") or []
    return ready(node) and not any(str(t.get("key", "")).startswith(_LIFECYCLE_TAINT_PREFIX) for t in taints)
