"""GKE's node-pool, cluster and operation messages <-> the product's node-pool types.

``spec_to_node_pool`` builds the ``NodePool`` a create sends; the ``*_to_info`` functions read
GKE's answers into ``shared.tpu.nodepools`` values. The Google client's types are imported on
first use, as in ``shared.cloud.gke``.
"""

from __future__ import annotations

import re
from typing import Any

from shared.cloud.endpoint import endpoints_of
from shared.cloud.node_options import apply_node_options
from shared.core.errors import InvalidInputError
from shared.tpu.nodepools import (
    ClusterInfo,
    ClusterListing,
    ListedCluster,
    NodeConfig,
    NodePoolInfo,
    NodePoolSpec,
    OperationInfo,
    parse_reservation,
)

RESERVATION_KEY = "compute.googleapis.com/reservation-name"
# GKE reports links as full URLs (https://container.googleapis.com/v1/projects/...); keep the path.
_LINK_PREFIX = re.compile(r"^https?://[^/]+/v1[a-z0-9]*/")


def _enum_name(value: Any) -> str:
    # proto-plus hands back IntEnum members for known values and bare ints for unknown ones.
    return str(getattr(value, "name", value))


def _strip_link(link: str) -> str:
    return _LINK_PREFIX.sub("", link)


def spec_to_node_pool(spec: NodePoolSpec) -> Any:
    """Build the ``container_v1.NodePool`` message the product sends for ``spec``."""
    from google.cloud import container_v1 as gke

    config = gke.NodeConfig(
        machine_type=spec.machine_type,
        labels=dict(spec.labels),
        resource_labels=dict(spec.resource_labels),
        service_account=spec.service_account,
        oauth_scopes=list(spec.oauth_scopes),
        disk_size_gb=spec.disk_size_gb,
        disk_type=spec.disk_type,
        tags=list(spec.tags),
        spot=spec.spot,
        flex_start=spec.flex_start,
    )
    if spec.workload_metadata:
        # The mode by name (GKE_METADATA); an unknown name is a bug here, not something to send.
        mode = gke.WorkloadMetadataConfig.Mode.__members__.get(spec.workload_metadata)
        if mode is None:
            raise InvalidInputError(f"unknown workload metadata mode {spec.workload_metadata!r}")
        config.workload_metadata_config = gke.WorkloadMetadataConfig(mode=mode)
    if spec.reservation is not None:
        config.reservation_affinity = gke.ReservationAffinity(
            consume_reservation_type=gke.ReservationAffinity.Type.SPECIFIC_RESERVATION,
            key=RESERVATION_KEY,
            values=[spec.reservation.value],
        )
    elif spec.flex_start:
        # Flex-start VMs never consume a reservation; GKE expects the affinity stated as none.
        config.reservation_affinity = gke.ReservationAffinity(
            consume_reservation_type=gke.ReservationAffinity.Type.NO_RESERVATION
        )
    autoscaling = gke.NodePoolAutoscaling(enabled=False)
    if spec.flex_start:
        # Created empty: the autoscaler adds the slice's VMs when flex-start obtains them (all of a
        # multi-host slice at once), and removes them when the pool is idle.
        autoscaling = gke.NodePoolAutoscaling(
            enabled=True,
            total_min_node_count=0,
            total_max_node_count=spec.node_count,
            location_policy=gke.NodePoolAutoscaling.LocationPolicy.ANY,
        )
    pool = gke.NodePool(
        name=spec.name,
        initial_node_count=0 if spec.flex_start else spec.node_count,
        locations=list(spec.node_locations),
        config=config,
        management=gke.NodeManagement(auto_upgrade=spec.auto_upgrade, auto_repair=spec.auto_repair),
        autoscaling=autoscaling,
    )
    apply_node_options(pool, spec)
    if spec.max_pods_per_node > 0:
        pool.max_pods_constraint = gke.MaxPodsConstraint(max_pods_per_node=spec.max_pods_per_node)
    if spec.placement is not None:
        placement = gke.NodePool.PlacementPolicy()
        if spec.placement.tpu_topology or not spec.placement.policy_name:
            kind = gke.NodePool.PlacementPolicy.Type.__members__.get(spec.placement.type or "COMPACT")
            if kind is None:
                raise InvalidInputError(f"unknown placement policy type {spec.placement.type!r}")
            placement.type_ = kind
            placement.tpu_topology = spec.placement.tpu_topology
        if spec.placement.policy_name:
            placement.policy_name = spec.placement.policy_name
        pool.placement_policy = placement
    return pool


def node_pool_to_info(pool: Any) -> NodePoolInfo:
    """Read the fields the product cares about off a ``container_v1.NodePool``."""
    affinity = next(iter(pool.config.reservation_affinity.values), "")
    reserved = parse_reservation(affinity) if affinity else None
    return NodePoolInfo(
        name=pool.name,
        status=_enum_name(pool.status),
        machine_type=pool.config.machine_type,
        # A flex-start pool is made empty; its size is the autoscaler's maximum (the slice's VMs).
        node_count=(
            pool.autoscaling.total_max_node_count or pool.autoscaling.max_node_count
            if pool.config.flex_start
            else pool.initial_node_count
        ),
        labels=dict(pool.config.labels),
        node_locations=tuple(pool.locations),
        status_message=pool.status_message,
        tpu_topology=pool.placement_policy.tpu_topology,
        placement_policy=pool.placement_policy.policy_name,
        spot=bool(pool.config.spot),
        reservation=reserved.base if reserved else "",
        reservation_place=reserved.place if reserved else "",
        flex_start=bool(pool.config.flex_start),
        config=_node_config(pool),
    )


def _node_config(pool: Any) -> NodeConfig:
    # The settings-made fields, read back as GKE reports them, for config drift (shared.tpu.drift).
    config = pool.config
    upgrade = pool.upgrade_settings
    has_upgrade = "upgrade_settings" in pool
    return NodeConfig(
        service_account=config.service_account,
        oauth_scopes=tuple(config.oauth_scopes),
        disk_size_gb=int(config.disk_size_gb),
        disk_type=config.disk_type,
        boot_disk_kms_key=config.boot_disk_kms_key,
        confidential_storage=bool(config.enable_confidential_storage),
        secondary_boot_disks=tuple(
            (d.disk_image, "" if int(d.mode) == 0 else _enum_name(d.mode))
            for d in config.secondary_boot_disks
        ),
        additional_networks=tuple(
            (n.network, n.subnetwork) for n in pool.network_config.additional_node_network_configs
        ),
        secure_boot=bool(config.shielded_instance_config.enable_secure_boot),
        integrity_monitoring=(
            bool(config.shielded_instance_config.enable_integrity_monitoring)
            if "shielded_instance_config" in config
            else True
        ),
        max_pods_per_node=int(pool.max_pods_constraint.max_pods_per_node),
        max_surge=int(upgrade.max_surge) if has_upgrade else -1,
        max_unavailable=int(upgrade.max_unavailable) if has_upgrade else -1,
        tags=tuple(config.tags),
        workload_metadata=_workload_metadata(config),
    )


def _workload_metadata(config: Any) -> str:
    # MODE_UNSPECIFIED (0), or no workloadMetadataConfig at all: GKE did not say.
    if "workload_metadata_config" not in config:
        return ""
    mode = config.workload_metadata_config.mode
    return "" if not int(mode) else _enum_name(mode)


def cluster_to_info(cluster: Any) -> ClusterInfo:
    """Read how to reach the cluster, its zones, release channel and Workload Identity pool off a
    ``container_v1.Cluster``."""
    return ClusterInfo(
        name=cluster.name,
        location=cluster.location,
        endpoint=cluster.endpoint,
        ca_certificate=cluster.master_auth.cluster_ca_certificate,
        locations=tuple(cluster.locations),
        status=_enum_name(cluster.status),
        release_channel=_release_channel(cluster),
        endpoints=endpoints_of(cluster),
        workload_pool=cluster.workload_identity_config.workload_pool,
    )


def listing_of(response: Any, project: str) -> ClusterListing:
    """A ``ListClustersResponse`` of ``project`` as the clusters' paths and resource labels (the
    path is built from the project asked for: a selfLink may name the project by number)."""
    clusters = tuple(
        ListedCluster(
            path=f"projects/{project}/locations/{cluster.location}/clusters/{cluster.name}",
            resource_labels=tuple(sorted(dict(cluster.resource_labels).items())),
        )
        for cluster in response.clusters
    )
    return ClusterListing(clusters, tuple(response.missing_zones))


def _release_channel(cluster: Any) -> str:
    # An unenrolled cluster reports no release_channel or channel UNSPECIFIED (enum value 0).
    channel = cluster.release_channel.channel
    return "" if not int(channel) else _enum_name(channel)


def operation_to_info(operation: Any, fallback_parent: str = "") -> OperationInfo:
    """Convert an Operation; its short id is expanded to ``projects/P/locations/L/operations/O``."""
    name = operation.name
    if not name.startswith("projects/"):
        # GKE returns the bare id; its selfLink may use the zonal form and a project number, so build
        # the path from the cluster's project and location instead.
        name = f"{fallback_parent}/operations/{name}"
    error = operation.error.message
    if not error and operation.error.code:
        error = operation.status_message or f"operation failed with code {operation.error.code}"
    return OperationInfo(
        name=name,
        status=_enum_name(operation.status),
        operation_type=_enum_name(operation.operation_type),
        target=_strip_link(operation.target_link),
        error=error,
    )
