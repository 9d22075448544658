"""The node options of a TPU pool that come from settings, set on the ``container_v1.NodePool``.

Boot disk encryption key, secondary boot disks, Shielded VM options, surge upgrade settings and
additional node networks (docs/settings.md). Kept apart from ``shared.cloud.gke`` so the adapter's
request building stays small; like it, the Google client is imported only when a pool is built.
"""

from __future__ import annotations

from typing import Any

from shared.tpu.nodepools import NodePoolSpec

# GKE's surge default when only UPGRADE_MAX_UNAVAILABLE is set (GKE "Configure node upgrade strategies").
DEFAULT_MAX_SURGE = 1


def apply_node_options(pool: Any, spec: NodePoolSpec) -> None:
    """Set ``spec``'s node options on the ``NodePool`` message ``pool`` (fields left unset stay GKE's)."""
    from google.cloud import container_v1 as gke

    config = pool.config
    config.boot_disk_kms_key = spec.boot_disk_kms_key
    config.enable_confidential_storage = spec.confidential_storage
    modes = gke.SecondaryBootDisk.Mode.__members__
    for image, mode in spec.secondary_boot_disks:
        config.secondary_boot_disks.append(
            gke.SecondaryBootDisk(disk_image=image, mode=modes[mode or "MODE_UNSPECIFIED"])
        )
    config.shielded_instance_config = gke.ShieldedInstanceConfig(
        enable_secure_boot=spec.secure_boot, enable_integrity_monitoring=spec.integrity_monitoring
    )
    if spec.max_surge >= 0 or spec.max_unavailable >= 0:
        pool.upgrade_settings = gke.NodePool.UpgradeSettings(
            max_surge=spec.max_surge if spec.max_surge >= 0 else DEFAULT_MAX_SURGE,
            max_unavailable=max(spec.max_unavailable, 0),
        )
    if spec.additional_networks:
        pool.network_config = gke.NodeNetworkConfig(
            additional_node_network_configs=[
                gke.AdditionalNodeNetworkConfig(network=network, subnetwork=subnetwork)
                for network, subnetwork in spec.additional_networks
            ]
        )
