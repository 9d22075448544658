"""Node-pool domain types: the spec of a pool the product asks GKE for, and views of what GKE reports.

They travel through the ``NodePoolAPI`` and ``WorkloadPolicyAPI`` ports (``shared.cloud.ports``),
which ``shared.cloud.gke`` and ``shared.cloud.compute`` implement over the Google clients and the
sandbox's fakes over dicts. The dataclasses are plain Python so that building and comparing specs
never imports the (slow to import) Google client.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from shared.core import labels

# Node pool statuses as GKE reports them (google.container.v1.NodePool.Status).
STATUS_PROVISIONING = "PROVISIONING"
STATUS_RUNNING = "RUNNING"
STATUS_RUNNING_WITH_ERROR = "RUNNING_WITH_ERROR"
STATUS_RECONCILING = "RECONCILING"
STATUS_STOPPING = "STOPPING"
STATUS_ERROR = "ERROR"
# The statuses under which a pool's nodes run pods: RUNNING is "fully usable", and RECONCILING is a
# change being carried out on a pool that serves meanwhile. The product's own change, a node-label
# update (an offer's idle stamp, a handover), is applied "without re-creating the node pool and
# disrupting running workloads" (GKE, "Update Kubernetes node labels and taints for node pools").
# A pool two releases look at together is RECONCILING in the second one's listing while the first
# one's relabel runs; it is as worth holding for a queued JobSet as a RUNNING one.
SERVING = (STATUS_RUNNING, STATUS_RECONCILING)

# WorkloadMetadataConfig.Mode (google.container.v1): GKE_METADATA runs GKE's metadata server on the
# nodes, which answers pods with their own Workload Identity instead of the node's service account.
WORKLOAD_METADATA_GKE = "GKE_METADATA"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Placement policy of a multi-host slice: COMPACT with a TPU topology, or a named policy.

    ``managed_topology`` is set when ``policy_name`` is a workload policy the product itself creates
    (``shared.provisioning.create.policies``) for that accelerator topology; "" when the operator named it.
    """

    type: str = "COMPACT"
    tpu_topology: str = ""
    policy_name: str = ""
    managed_topology: str = ""


@dataclasses.dataclass(frozen=True)
class Reservation:
    """A specific Compute Engine reservation to consume (shared when ``project`` is set)."""

    name: str
    project: str = ""
    # A block of a dense reservation, and a sub-block of that block, the pool is placed in ("": the
    # reservation as a whole). Chosen at send time from what Compute Engine reports of them
    # (shared.provisioning.create.reservations); a capacity option never names one.
    block: str = ""
    sub_block: str = ""

    @property
    def base(self) -> str:
        """The reservation itself as GKE names it: a bare name or a shared-reservation path."""
        if self.project:
            return f"projects/{self.project}/reservations/{self.name}"
        return self.name

    @property
    def value(self) -> str:
        """The reservation affinity value GKE expects: the reservation, then its block and sub-block,
        ``NAME/reservationBlocks/BLOCK/reservationSubBlocks/SUB_BLOCK`` (gcloud container node-pools
        create ``--reservation``, as the AI Hypercomputer GKE guides give it for a reservation's
        blocks and sub-blocks)."""
        value = self.base
        if self.block:
            value += f"/reservationBlocks/{self.block}"
            if self.sub_block:
                value += f"/reservationSubBlocks/{self.sub_block}"
        return value

    @property
    def place(self) -> str:
        """Where in the reservation the pool goes: "BLOCK", "BLOCK/SUB_BLOCK", or "" (anywhere)."""
        return f"{self.block}/{self.sub_block}" if self.block and self.sub_block else self.block


def parse_reservation(value: str) -> Reservation:
    """A reservation affinity value as GKE lists it back: ``[projects/P/reservations/]NAME`` followed
    by ``/reservationBlocks/B`` and ``/reservationSubBlocks/S`` when the pool targets them."""
    project = ""
    rest = value
    if rest.startswith("projects/"):
        parts = rest.split("/", 4)
        if len(parts) >= 4 and parts[2] == "reservations":
            project, rest = parts[1], "/".join(parts[3:])
    name, _, after = rest.partition("/reservationBlocks/")
    block, _, sub_block = after.partition("/reservationSubBlocks/")
    return Reservation(name, project, block, sub_block)


@dataclasses.dataclass(frozen=True)
class NodePoolSpec:
    """Everything the product sets on a TPU node pool it creates."""

    name: str
    machine_type: str
    node_count: int
    node_locations: tuple[str, ...]
    labels: Mapping[str, str]
    resource_labels: Mapping[str, str]
    placement: Placement | None = None
    spot: bool = False
    reservation: Reservation | None = None
    service_account: str = ""
    oauth_scopes: tuple[str, ...] = ()
    max_pods_per_node: int = 0
    disk_size_gb: int = 100
    disk_type: str = "pd-balanced"  # build_node_pool picks the machine family's default
    boot_disk_kms_key: str = ""  # Cloud KMS key of the boot disks ("" = Google-managed encryption)
    confidential_storage: bool = False  # boot disks in confidential mode (Hyperdisk Balanced)
    # (disk image, mode) of each secondary boot disk: mode "CONTAINER_IMAGE_CACHE" or "" (data).
    secondary_boot_disks: tuple[tuple[str, str], ...] = ()
    additional_networks: tuple[tuple[str, str], ...] = ()  # (network, subnetwork) of each extra NIC
    secure_boot: bool = False  # Shielded VM options (GKE's defaults)
    integrity_monitoring: bool = True
    max_surge: int = -1  # surge upgrade settings; -1 = not sent (GKE's default)
    max_unavailable: int = -1
    tags: tuple[str, ...] = ()
    auto_upgrade: bool = False
    auto_repair: bool = True
    # workloadMetadataConfig.mode of the nodes ("" = not sent: GKE's default for the cluster).
    workload_metadata: str = ""
    # Flex-start (Dynamic Workload Scheduler) capacity: the pool is created empty and autoscales up
    # to ``node_count`` nodes once GKE obtains the whole slice.
    flex_start: bool = False


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """The settings-made part of a pool's node config as GKE reports it (config drift compares it)."""

    service_account: str = ""
    oauth_scopes: tuple[str, ...] = ()
    disk_size_gb: int = 0
    disk_type: str = ""
    boot_disk_kms_key: str = ""
    confidential_storage: bool = False
    secondary_boot_disks: tuple[tuple[str, str], ...] = ()
    additional_networks: tuple[tuple[str, str], ...] = ()
    secure_boot: bool = False
    integrity_monitoring: bool = True
    max_pods_per_node: int = 0  # 0: GKE reported no per-pool constraint
    max_surge: int = -1  # -1: no upgrade settings reported
    max_unavailable: int = -1
    tags: tuple[str, ...] = ()
    workload_metadata: str = ""  # workloadMetadataConfig.mode; "" when GKE reported none


@dataclasses.dataclass(frozen=True)
class PoolOwner:
    """The slice a managed pool is labelled for: the product's ownership labels ("" where absent).
    Only the product writes them (through GKE), so they are the record of whose a pool is."""

    namespace: str = ""
    name: str = ""
    uid: str = ""
    replicated_job: str = ""
    job_index: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, JobSet name): how its JobSet is looked up."""
        return (self.namespace, self.name)

    @property
    def identity(self) -> tuple[str, str, str, str, str]:
        """The whole slice: namespace, JobSet, uid, replicated job, index."""
        return (self.namespace, self.name, self.uid, self.replicated_job, self.job_index)

    def describe(self) -> str:
        """``namespace/name`` for logs and Events."""
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class NodePoolInfo:
    """What listing or getting a node pool tells us."""

    name: str
    status: str
    machine_type: str = ""
    node_count: int = 0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    node_locations: tuple[str, ...] = ()
    status_message: str = ""
    tpu_topology: str = ""
    spot: bool = False
    reservation: str = ""  # the specific reservation it consumes (Reservation.base), "" for none
    reservation_place: str = ""  # where in it: "BLOCK" or "BLOCK/SUB_BLOCK" (Reservation.place), "" whole
    flex_start: bool = False
    current_nodes: int | None = None  # nodes a flex-start pool has now (None: not reported)
    placement_policy: str = ""  # placementPolicy.policyName: the named (workload) policy placing it
    # What its nodes were built with; None when the source does not say (no drift is then reported).
    config: NodeConfig | None = None

    @property
    def managed(self) -> bool:
        """Whether the product made it (it carries the product's managed-by marker)."""
        return self.labels.get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE

    @property
    def owner(self) -> PoolOwner:
        """The slice it is labelled for (read from its node labels, one place)."""
        get = self.labels.get
        return PoolOwner(
            get(labels.OWNER_NAMESPACE, ""),
            get(labels.OWNER_NAME, ""),
            get(labels.OWNER_UID, ""),
            get(labels.OWNER_REPLICATED_JOB, ""),
            get(labels.OWNER_JOB_INDEX, ""),
        )


@dataclasses.dataclass(frozen=True)
class ControlPlaneEndpoints:
    """The cluster's ``controlPlaneEndpointsConfig``: the addresses its API server answers on."""

    dns: str = ""  # dnsEndpointConfig.endpoint, e.g. gke-<uid>.<region>.gke.goog
    dns_external_traffic: bool = False  # dnsEndpointConfig.allowExternalTraffic
    ip_enabled: bool = False  # ipEndpointsConfig.enabled
    public_ip_enabled: bool = False  # ipEndpointsConfig.enablePublicEndpoint
    public_ip: str = ""  # ipEndpointsConfig.publicEndpoint
    private_ip: str = ""  # ipEndpointsConfig.privateEndpoint


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """The parts of a GKE cluster the product needs: how to reach it and what its pools must obey."""

    name: str
    location: str
    endpoint: str
    ca_certificate: str  # base64 PEM, as GKE returns it
    locations: tuple[str, ...] = ()  # the cluster's zones
    status: str = ""
    # RAPID / REGULAR / STABLE / EXTENDED, or "" when the cluster is not enrolled in a release
    # channel. Enrolled clusters refuse node pools with auto-upgrade (or auto-repair) turned off.
    release_channel: str = ""
    # None when GKE sent no controlPlaneEndpointsConfig: ``endpoint`` is then the only address.
    endpoints: ControlPlaneEndpoints | None = None
    # workloadIdentityConfig.workloadPool (PROJECT.svc.id.goog), "" when Workload Identity is off:
    # GKE_METADATA node pools need it.
    workload_pool: str = ""


@dataclasses.dataclass(frozen=True)
class ListedCluster:
    """One cluster of a project as GKE lists it: what the fleet's discovery decides on."""

    path: str  # projects/P/locations/L/clusters/C
    resource_labels: tuple[tuple[str, str], ...] = ()  # GKE resource labels, sorted by key


@dataclasses.dataclass(frozen=True)
class ClusterListing:
    """Every cluster of one project (``projects/P/locations/-``). ``missing_zones``: zones GKE could
    not answer for, whose clusters the list may lack (ListClustersResponse.missingZones)."""

    clusters: tuple[ListedCluster, ...] = ()
    missing_zones: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class WorkloadPolicyInfo:
    """A Compute Engine workload policy (a regional resource policy) as the product reads it."""

    name: str
    region: str
    type: str = ""  # HIGH_THROUGHPUT or HIGH_AVAILABILITY
    accelerator_topology: str = ""  # e.g. "2x2x2"
    status: str = ""  # CREATING, READY, DELETING, ... ("" when Compute did not say)


@dataclasses.dataclass(frozen=True)
class OperationInfo:
    """A GKE long-running operation."""

    name: str
    status: str  # PENDING, RUNNING, DONE, ABORTING
    operation_type: str = ""
    target: str = ""
    error: str = ""
