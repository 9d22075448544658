"""Validation rules the GKE emulator applies to node-pool create requests.

This is deliberately a second, independent oracle: the TPU table below is written from the public GKE
documentation and does not import ``shared.tpu.catalog``, so a mistake in the product's catalog shows up as
a 400 from the emulator instead of being mirrored by it.

Rules operate on the raw protobuf ``google.container.v1.NodePool`` message that the HTTP layer parsed
from the request body, and raise ``ApiError`` carrying the HTTP code, the canonical status name and a
message phrased the way GKE phrases its own refusals.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

MAX_POOL_NAME_LEN = 40
_POOL_NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]*[a-z0-9])?$")
_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
_TOPOLOGY_RE = re.compile(r"^[1-9]\d*(?:x[1-9]\d*){1,2}$")
# General-purpose and accelerator-optimised Compute Engine families GKE accepts for ordinary pools.
_NON_TPU_RE = re.compile(
    r"^(?:e2|n1|n2|n2d|n4|c2|c2d|c3|c3d|c4|c4a|c4d|t2a|t2d|m1|m2|m3|a2|a3|g2|h3)-[a-z0-9-]+$"
)

RESERVATION_KEY = "compute.googleapis.com/reservation-name"
# The node boot disk types, by the machine families that can boot from them: Cloud TPU "Attach durable
# block storage to a TPU VM" (v4, v5e, v5p: Balanced Persistent Disk; v6e: Hyperdisk) and, for
# Ironwood, this project's issue 12 (Hyperdisk only; not found in the docs). Written independently of
# shared.tpu.catalog on purpose.
PD_ONLY = ("pd-balanced",)
HYPERDISK_ONLY = ("hyperdisk-balanced",)
# google.container.v1 enum numbers used below (stable parts of the public proto).
RESERVATION_SPECIFIC = 3
PLACEMENT_COMPACT = 1
WORKLOAD_METADATA_GKE = 2  # WorkloadMetadataConfig.Mode.GKE_METADATA


class ApiError(Exception):
    """A refusal the emulator sends back as ``{"error": {"code", "message", "status"}}``."""

    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message


def invalid(message: str) -> ApiError:
    """A 400 INVALID_ARGUMENT refusal."""
    return ApiError(400, "INVALID_ARGUMENT", message)


@dataclasses.dataclass(frozen=True)
class TpuMachine:
    """What GKE knows about one TPU machine type."""

    generation: str
    chips_per_vm: int
    topology_dims: int  # 2 for the 2D-torus generations, 3 for the 3D ones
    multi_host: bool  # whether slices larger than one VM can be built from this type
    boot_disks: tuple[str, ...] = PD_ONLY  # boot disk types the family supports


TPU_MACHINES: dict[str, TpuMachine] = {
    "ct4p-hightpu-4t": TpuMachine("v4", 4, 3, True),
    "ct5lp-hightpu-1t": TpuMachine("v5e", 1, 2, False),
    "ct5lp-hightpu-4t": TpuMachine("v5e", 4, 2, True),
    "ct5lp-hightpu-8t": TpuMachine("v5e", 8, 2, False),
    "ct5p-hightpu-4t": TpuMachine("v5p", 4, 3, True),
    "ct6e-standard-1t": TpuMachine("v6e", 1, 2, False, HYPERDISK_ONLY),
    "ct6e-standard-4t": TpuMachine("v6e", 4, 2, True, HYPERDISK_ONLY),
    "ct6e-standard-8t": TpuMachine("v6e", 8, 2, False, HYPERDISK_ONLY),
    # Ironwood: four chips per VM, 3D torus; multi-host slices may name a workload policy instead.
    "tpu7x-standard-1t": TpuMachine("tpu7x", 1, 3, False, HYPERDISK_ONLY),
    "tpu7x-standard-4t": TpuMachine("tpu7x", 4, 3, True, HYPERDISK_ONLY),
}


def region_of(location: str) -> str:
    """``us-central2-b`` -> ``us-central2``; a region is returned unchanged."""
    return location.rsplit("-", 1)[0] if _ZONE_RE.match(location) else location


def check_pool_name(name: str) -> None:
    """GKE node-pool names are RFC 1035 labels of at most 40 characters."""
    if not name:
        raise invalid("Node pool name must be specified.")
    if len(name) > MAX_POOL_NAME_LEN:
        raise invalid(f"Node pool name {name!r} is {len(name)} characters long; the limit is 40.")
    if not _POOL_NAME_RE.match(name):
        raise invalid(
            f"Node pool name {name!r} is invalid: use lowercase letters, digits and hyphens, "
            "start with a letter and end with a letter or digit."
        )


def parse_topology(topology: str) -> tuple[int, ...]:
    """``"2x2x4"`` -> ``(2, 2, 4)``; raises a 400 for anything else."""
    if not _TOPOLOGY_RE.match(topology):
        raise invalid(f"TPU topology {topology!r} is malformed; expected AxB or AxBxC.")
    return tuple(int(part) for part in topology.split("x"))


def tpu_machine(machine_type: str) -> TpuMachine | None:
    """The TPU entry for ``machine_type``, None for an ordinary type; 400 for an unknown type."""
    if machine_type in TPU_MACHINES:
        return TPU_MACHINES[machine_type]
    if machine_type.startswith(("ct", "tpu")):
        raise invalid(f"Machine type {machine_type!r} is not a supported TPU machine type.")
    if machine_type and not _NON_TPU_RE.match(machine_type):
        raise invalid(f"Invalid machine type {machine_type!r}.")
    return None


def _check_locations(pool: Any, cluster_location: str) -> None:
    region = region_of(cluster_location)
    for zone in pool.locations:
        if not _ZONE_RE.match(zone) or region_of(zone) != region:
            raise invalid(f"Node location {zone!r} is not a zone of the cluster's region {region!r}.")


# A reservation, optionally another project's, optionally one of its blocks and a sub-block of it.
_RESERVATION_VALUE = re.compile(
    r"^(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
    r"(/reservationBlocks/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
    r"(/reservationSubBlocks/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?)?$"
)


def _check_reservation(config: Any) -> None:
    affinity = config.reservation_affinity
    if affinity.consume_reservation_type != RESERVATION_SPECIFIC:
        return
    if affinity.key != RESERVATION_KEY:
        raise invalid(f"Specific reservation affinity needs key {RESERVATION_KEY!r}, got {affinity.key!r}.")
    if not list(affinity.values) or not all(affinity.values):
        raise invalid("Specific reservation affinity needs exactly one reservation name in values.")
    for value in affinity.values:
        if not _RESERVATION_VALUE.match(value):
            # The forms gcloud's --reservation takes (AI Hypercomputer GKE guides); the refusal's
            # real text was not found, so it is worded in GKE's style.
            raise invalid(
                f"Reservation affinity value {value!r} is not a reservation: use NAME, "
                "NAME/reservationBlocks/BLOCK[/reservationSubBlocks/SUB_BLOCK], or the same after "
                "projects/PROJECT/reservations/."
            )


def _check_tpu(pool: Any, machine_type: str, tpu: TpuMachine) -> None:
    flex_start = pool.config.flex_start
    # A flex-start slice is made empty and autoscales to its size, all VMs at once.
    count = _max_nodes(pool) if flex_start else pool.initial_node_count
    if count <= 0 and flex_start:
        raise invalid(f"Flex-start TPU node pool {pool.name!r} needs a positive maximum node count.")
    if count <= 0:
        raise invalid(f"TPU node pool {pool.name!r} needs a positive initial_node_count.")
    placement = pool.placement_policy
    topology = placement.tpu_topology
    if topology:
        dims = parse_topology(topology)
        if len(dims) != tpu.topology_dims:
            raise invalid(
                f"TPU topology {topology!r} is not valid for {machine_type}: "
                f"{tpu.generation} slices use a {tpu.topology_dims}D topology."
            )
        chips = math.prod(dims)
        if chips <= tpu.chips_per_vm:
            # GKE's wording, typo included (quoted in AI-Hypercomputer/xpk PR #825).
            raise invalid(
                "TPU topology can't be specified with single-host TPU slice pool; please remove the "
                "tpu_topology from the node pool creation request if the node pool is intented to run "
                "with single-host TPU slice nodes."
            )
        if not tpu.multi_host:
            raise invalid(f"Machine type {machine_type} does not support multi-host TPU slices.")
        if chips != tpu.chips_per_vm * count:
            raise invalid(
                f"TPU topology {topology!r} has {chips} chips but {count} x {machine_type} nodes have "
                f"{tpu.chips_per_vm * count}; set initial_node_count to {chips // tpu.chips_per_vm}."
            )
    multi_host = count > 1
    # Stricter than GKE on purpose: the product creates one pool per slice, so a TPU pool with several
    # nodes and no topology is always a bug (a forgotten placement) that the emulator should surface.
    if multi_host and not (topology or placement.policy_name):
        raise invalid(
            f"Multi-host TPU node pool {pool.name!r} ({count} x {machine_type}) needs a placement "
            "policy with tpu_topology (or a named workload policy)."
        )
    if multi_host and not tpu.multi_host:
        raise invalid(f"Machine type {machine_type} does not support multi-host TPU slices.")
    if multi_host and pool.autoscaling.enabled and not flex_start:
        raise invalid("Autoscaling is not supported on multi-host TPU slice node pools.")
    if multi_host and len(pool.locations) > 1:
        # GKE's exact text for this refusal was not found; the rule (a slice lives in one zone, and
        # the node count is per zone) is from GKE "About TPUs in GKE".
        raise invalid("A multi-host TPU slice node pool must be placed in exactly one zone.")
    _check_boot_disk(pool.config.disk_type, machine_type, tpu)


def _check_boot_disk(disk_type: str, machine_type: str, tpu: TpuMachine) -> None:
    # Unset: GKE picks the boot disk, so only an explicit choice can be wrong. The wording is Compute
    # Engine's for a disk type the machine family does not support (quoted for pd-balanced on c4 in
    # astronomer/astronomer issue #2463), which GKE passes back for a node pool's instances.
    if disk_type and disk_type not in tpu.boot_disks:
        raise invalid(f"[{disk_type}, {machine_type}] features are not compatible for creating instance.")


_KMS_KEY_RE = re.compile(r"^projects/[^/]+/locations/[^/]+/keyRings/[^/]+/cryptoKeys/[^/]+$")


def _check_boot_disk_kms_key(config: Any) -> None:
    # NodeConfig.boot_disk_kms_key is a full Cloud KMS CryptoKey name (container_v1 reference). GKE's
    # refusal text for a malformed one was not found; this says the same in its style.
    key = config.boot_disk_kms_key
    if config.enable_confidential_storage and (not key or config.disk_type != "hyperdisk-balanced"):
        # Confidential mode exists for Hyperdisk Balanced only and needs a Cloud KMS key; GKE's
        # refusal text was not found.
        raise invalid(
            "Confidential storage needs a hyperdisk-balanced boot disk encrypted with a boot_disk_kms_key."
        )
    if key and not _KMS_KEY_RE.match(key):
        raise invalid(
            f"Invalid value for field 'node_pool.config.boot_disk_kms_key': {key!r}. Expected "
            "projects/PROJECT/locations/LOCATION/keyRings/RING/cryptoKeys/KEY."
        )


_DISK_IMAGE_RE = re.compile(r"^projects/[^/]+/global/images/[^/]+$")


def _check_node_extras(pool: Any) -> None:
    # container_v1 SecondaryBootDisk.disk_image is a Compute Engine image name (GKE "Use secondary
    # boot disks to preload data or container images"); AdditionalNodeNetworkConfig names a network
    # and a subnetwork. GKE's refusal texts for malformed ones were not found; these are in its style.
    for disk in pool.config.secondary_boot_disks:
        if not _DISK_IMAGE_RE.match(disk.disk_image):
            raise invalid(
                f"Invalid value for field 'node_pool.config.secondary_boot_disks.disk_image': "
                f"{disk.disk_image!r}. Expected projects/PROJECT/global/images/IMAGE."
            )
    for extra in pool.network_config.additional_node_network_configs:
        if not extra.network or not extra.subnetwork:
            raise invalid(
                "Each additional node network config needs both a network and a subnetwork; "
                f"got network={extra.network!r}, subnetwork={extra.subnetwork!r}."
            )


def _check_management(pool: Any, release_channel: str) -> None:
    """GKE REST reference, ReleaseChannel: on an enrolled cluster node auto-upgrade cannot be disabled.

    Auto-repair is not restricted there (GKE's own flex-start examples turn it off)."""
    if release_channel and not pool.management.auto_upgrade:
        # GKE's exact text (quoted in terraform-google-modules/terraform-google-kubernetes-engine PR #682).
        raise invalid(f"Auto_upgrade cannot be false when release_channel {release_channel} is set.")


def check_workload_metadata(config: Any, workload_pool: str) -> None:
    """container_v1 reference, WorkloadMetadataConfig.Mode: GKE_METADATA (GKE's metadata server on the
    nodes) can only be enabled when Workload Identity is enabled at the cluster level.

    GKE's exact refusal text for a pool asking for it on a cluster without a workload pool was not
    found in the docs or public issues; the wording below states that rule in GKE's style.
    """
    mode = config.workload_metadata_config.mode
    if mode == WORKLOAD_METADATA_GKE and not workload_pool:
        raise invalid(
            "Workload metadata mode GKE_METADATA requires Workload Identity to be enabled on the "
            "cluster (workloadIdentityConfig.workloadPool is not set)."
        )


def _max_nodes(pool: Any) -> int:
    autoscaling = pool.autoscaling
    return int(autoscaling.total_max_node_count or autoscaling.max_node_count)


def _check_autoscaling(autoscaling: Any) -> None:
    """container_v1 NodePoolAutoscaling: the per-zone and total_* bounds are mutually exclusive."""
    if not autoscaling.enabled:
        return
    for bound in ("max", "min"):
        per_zone, total = (
            getattr(autoscaling, f"{bound}_node_count"),
            getattr(autoscaling, f"total_{bound}_node_count"),
        )
        if per_zone > 0 and total > 0:
            # GKE's text for the max pair (quoted in a public write-up of a GKE update refusal); the
            # min pair's wording was not found and follows it.
            raise invalid(
                f"node_pool_autoscaling.{bound}_node_count and "
                f"node_pool_autoscaling.total_{bound}_node_count cannot be both greater than zero."
            )
    if autoscaling.max_node_count == 0 and autoscaling.total_max_node_count == 0:
        # GKE's text (quoted in terraform-google-modules/terraform-google-kubernetes-engine PR #1554).
        raise invalid(
            "Node_pool_autoscaling.max_node_count and node_pool_autoscaling.total_max_node_count cannot be "
            "both set to zero."
        )


def _check_flex_start(pool: Any) -> None:
    """Flex-start pools (GKE "About flex-start"; XPK's and GKE's examples): autoscaled from zero, on
    flex-start VMs only (not Spot), never consuming a reservation. GKE's refusal texts for these
    were not found in the docs; the wording below is the emulator's."""
    config = pool.config
    if not config.flex_start:
        return
    if config.spot or config.preemptible:
        raise invalid("Flex-start cannot be used together with Spot or preemptible VMs.")
    if config.reservation_affinity.consume_reservation_type == RESERVATION_SPECIFIC:
        raise invalid("Flex-start node pools cannot consume a reservation; use reservation affinity none.")
    if not pool.autoscaling.enabled:
        raise invalid("Flex-start node pools need autoscaling enabled (they are created with no nodes).")


def _check_spot_reservation(config: Any) -> None:
    # Compute Engine: Spot VMs never consume reserved capacity. GKE's exact refusal text for a Spot
    # pool with a specific reservation affinity was not found; this is the closest documented wording.
    if config.spot and config.reservation_affinity.consume_reservation_type == RESERVATION_SPECIFIC:
        raise invalid("Spot VMs cannot consume reservations: remove spot or the reservation affinity.")


# Node-label keys GKE keeps for itself: its own domain and the ones Kubernetes core reserves, with
# their subdomains (node-role.kubernetes.io/...). GKE's 400 for one of them is quoted in
# hashicorp/terraform-provider-google PR 19677 (for cloud.google.com/compute-class); an older
# wording for kubernetes.io keys ("Applying kubernetes label is not allowed: ...") is in
# bitpoke/stack issue 86. The two cloud.google.com/ keys GKE takes on a TPU pool are the ones
# Google's tpu-provisioner (ai-on-gke) copies from pods: ICI resiliency and the location hint.
_KUBERNETES_LABEL_DOMAINS = ("kubernetes.io", "k8s.io")
_ACCEPTED_GKE_LABELS = frozenset(
    {"cloud.google.com/gke-tpu-ici-resiliency", "cloud.google.com/gke-location-hint"}
)


def check_node_labels(node_labels: Any) -> None:
    """A pool's Kubernetes node labels (create or update) must stay out of the reserved domains."""
    for key in sorted(node_labels):
        prefix = key.split("/", 1)[0] if "/" in key else ""
        reserved = prefix == "cloud.google.com" or any(
            prefix == domain or prefix.endswith("." + domain) for domain in _KUBERNETES_LABEL_DOMAINS
        )
        if reserved and key not in _ACCEPTED_GKE_LABELS:
            raise invalid(
                f'Node labels with key "{key}" are managed by GKE or Kubernetes and must not be '
                "manually specified."
            )


# Answers whether a Compute Engine resource policy exists: (project, region, name) -> bool.
PolicyLookup = Callable[[str, str, str], bool]


def check_placement_policy(pool: Any, project: str, cluster_location: str, exists: PolicyLookup) -> None:
    """The named placement (workload) policy must exist in the pool's project and region.

    container_v1 ``NodePool.PlacementPolicy.policy_name``: the resource policy must be in the same
    project and region as the node pool, and GKE answers InvalidArgument when it is not found. GKE's
    exact message was not found in the docs; this one says the same in GKE's style.
    """
    name = pool.placement_policy.policy_name
    if not name:
        return
    zone = pool.locations[0] if pool.locations else cluster_location
    region = region_of(zone)
    if not exists(project, region, name.rsplit("/", 1)[-1]):
        raise invalid(
            f"Resource policy {name!r} was not found in project {project!r} and region {region!r}; "
            "a node pool's placement policy must exist in the node pool's project and region."
        )


def validate_create(
    pool: Any, cluster_location: str, release_channel: str = "", workload_pool: str = ""
) -> None:
    """Apply GKE's create-time checks to a parsed ``NodePool`` message; raises ``ApiError``.

    ``release_channel`` is the cluster's channel name ("" when it is not enrolled in one);
    ``workload_pool`` its Workload Identity pool ("" when Workload Identity is off).
    """
    check_pool_name(pool.name)
    if pool.initial_node_count < 0:
        raise invalid("initial_node_count must not be negative.")
    _check_locations(pool, cluster_location)
    check_node_labels(pool.config.labels)
    _check_boot_disk_kms_key(pool.config)
    _check_node_extras(pool)
    _check_management(pool, release_channel)
    check_workload_metadata(pool.config, workload_pool)
    _check_autoscaling(pool.autoscaling)
    _check_flex_start(pool)
    _check_reservation(pool.config)
    _check_spot_reservation(pool.config)
    machine_type = pool.config.machine_type
    tpu = tpu_machine(machine_type)
    if tpu is not None:
        _check_tpu(pool, machine_type, tpu)
    elif pool.placement_policy.tpu_topology:
        raise invalid(f"tpu_topology is only for TPU machine types, not {machine_type or 'e2-medium'}.")
