"""Config drift: which settings a pool was built under that the current settings would build otherwise.

A node pool's node config is fixed at creation, so a pool made before an operator changed, say,
NODE_SERVICE_ACCOUNT or DISK_SIZE_GB keeps the old values for as long as it lives. ``drift`` names
each such setting by its environment name; ``tpuprov status`` reports them, and provision replaces
an idle drifted pool when REPLACE_DRIFTED_POOLS is on (``shared.provisioning.release.refit``). Pure: table
tests cover every field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from shared.core import labels
from shared.core.settings import Settings
from shared.tpu import catalog, slices
from shared.tpu.nodepools import NodeConfig, NodePoolInfo, NodePoolSpec

# GKE's answers when a create left these unset (NodeConfig reference: the "default" service account,
# a 100 GB disk), so an unset setting and GKE's reported default are the same setting.
DEFAULT_SERVICE_ACCOUNT = "default"
DEFAULT_DISK_SIZE_GB = 100
# Surge settings GKE applies when none are sent (shared.cloud.node_options sends the same).
DEFAULT_MAX_SURGE = 1
DEFAULT_MAX_UNAVAILABLE = 0
# How the workloadMetadataConfig mode is named in a drift report (it has no setting of its own).
WORKLOAD_METADATA = "WORKLOAD_METADATA"


@dataclasses.dataclass(frozen=True)
class Drift:
    """One setting the pool was built under that the current settings would set otherwise."""

    setting: str  # the environment name, e.g. NODE_SERVICE_ACCOUNT (or WORKLOAD_METADATA)
    pool: str  # what the pool has
    now: str  # what the current settings would give it

    def describe(self) -> str:
        """``SETTING: pool -> now``, for Events, decision lines and status notes."""
        return f"{self.setting}: {self.pool or '-'} -> {self.now or '-'}"


def _text(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(_text(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _surge(config: NodeConfig) -> tuple[int, int]:
    if config.max_surge < 0 and config.max_unavailable < 0:
        return DEFAULT_MAX_SURGE, DEFAULT_MAX_UNAVAILABLE
    surge = config.max_surge if config.max_surge >= 0 else DEFAULT_MAX_SURGE
    return surge, max(config.max_unavailable, 0)


# (setting, how to read a comparable value off a NodeConfig); order is the report's order.
_FIELDS: tuple[tuple[str, Callable[[NodeConfig], object]], ...] = (
    ("NODE_SERVICE_ACCOUNT", lambda c: c.service_account or DEFAULT_SERVICE_ACCOUNT),
    ("OAUTH_SCOPES", lambda c: tuple(sorted(set(c.oauth_scopes)))),
    ("DISK_SIZE_GB", lambda c: c.disk_size_gb or DEFAULT_DISK_SIZE_GB),
    ("DISK_TYPE", lambda c: c.disk_type),
    ("BOOT_DISK_KMS_KEY", lambda c: c.boot_disk_kms_key),
    ("CONFIDENTIAL_STORAGE", lambda c: c.confidential_storage),
    ("SECONDARY_BOOT_DISKS", lambda c: tuple(f"{i}={m}" if m else i for i, m in c.secondary_boot_disks)),
    ("ADDITIONAL_NODE_NETWORKS", lambda c: tuple(f"{n}:{s}" for n, s in c.additional_networks)),
    ("SHIELDED_SECURE_BOOT", lambda c: c.secure_boot),
    ("SHIELDED_INTEGRITY_MONITORING", lambda c: c.integrity_monitoring),
    ("UPGRADE_MAX_SURGE", lambda c: _surge(c)[0]),
    ("UPGRADE_MAX_UNAVAILABLE", lambda c: _surge(c)[1]),
    ("NETWORK_TAGS", lambda c: tuple(sorted(set(c.tags)))),
)


def config_of(spec: NodePoolSpec) -> NodeConfig:
    """The node config a create of ``spec`` gives a pool."""
    return NodeConfig(
        service_account=spec.service_account,
        oauth_scopes=tuple(spec.oauth_scopes),
        disk_size_gb=spec.disk_size_gb,
        disk_type=spec.disk_type,
        boot_disk_kms_key=spec.boot_disk_kms_key,
        confidential_storage=spec.confidential_storage,
        secondary_boot_disks=tuple(spec.secondary_boot_disks),
        additional_networks=tuple(spec.additional_networks),
        secure_boot=spec.secure_boot,
        integrity_monitoring=spec.integrity_monitoring,
        max_pods_per_node=spec.max_pods_per_node,
        max_surge=spec.max_surge,
        max_unavailable=spec.max_unavailable,
        tags=tuple(spec.tags),
        workload_metadata=spec.workload_metadata,
    )


def _copied_keys(node_labels: Mapping[str, str]) -> tuple[str, ...]:
    # The product's own labels (ownership, handover, idle-since) change over a pool's life by design.
    return tuple(sorted(k for k in node_labels if not k.startswith(f"{labels.PRODUCT_DOMAIN}/")))


def drift(pool: NodePoolInfo, spec: NodePoolSpec) -> tuple[Drift, ...]:
    """Each setting ``pool`` was built under that differs in ``spec`` (what current settings build).

    Nothing when GKE's answer did not include the node config (``pool.config`` None). Node labels
    are compared by key (COPY_POD_LABELS decides which keys; values come from each pod, so a new
    value is not a changed setting). MAX_PODS_PER_NODE=0 leaves the choice to the cluster's default,
    which the pool cannot be compared with, so it is compared only when set; the workload metadata
    mode only when GKE reported one for the pool.
    """
    if pool.config is None:
        return ()
    have, want = pool.config, config_of(spec)
    found = []
    for setting, read in _FIELDS:
        if read(have) != read(want):
            found.append(Drift(setting, _text(read(have)), _text(read(want))))
    if want.max_pods_per_node and have.max_pods_per_node != want.max_pods_per_node:
        found.append(Drift("MAX_PODS_PER_NODE", _text(have.max_pods_per_node), _text(want.max_pods_per_node)))
    if have.workload_metadata and want.workload_metadata and have.workload_metadata != want.workload_metadata:
        # Not a setting: the product asks every pool for GKE's metadata server. A pool whose nodes
        # still serve the Compute metadata (built before, or changed by hand) hands pods the node
        # service account's token; reported, and replaced when idle with REPLACE_DRIFTED_POOLS.
        found.append(Drift(WORKLOAD_METADATA, have.workload_metadata, want.workload_metadata))
    pool_keys, spec_keys = _copied_keys(pool.labels), _copied_keys(spec.labels)
    if pool_keys != spec_keys:
        found.append(Drift("COPY_POD_LABELS", _text(pool_keys), _text(spec_keys)))
    return tuple(found)


def expected_spec(settings: Settings, pool: NodePoolInfo) -> NodePoolSpec:
    """The spec current settings would build for ``pool``'s slice, without its pods at hand.

    For the reports made without a pod (``tpuprov status``): the pool's own identity and labels (its
    pods' labels are unknown, so COPY_POD_LABELS cannot be judged there) with the settings' node
    config; the boot disk default is the machine family's, as ``slices.boot_disk`` picks it.
    """
    # A machine type the catalog does not know: its default is unknown, so the pool's own is taken.
    known = catalog.boot_disk_types(pool.machine_type)
    default_disk = known[0] if known else (pool.config.disk_type if pool.config else "")
    return NodePoolSpec(
        name=pool.name,
        machine_type=pool.machine_type,
        node_count=pool.node_count,
        node_locations=pool.node_locations,
        labels=dict(pool.labels),
        resource_labels={},
        **slices.settings_node_fields(settings, settings.disk_type or default_disk),
    )


def summary(found: tuple[Drift, ...]) -> str:
    """One line naming each drifted setting with the pool's and the current value."""
    return "; ".join(d.describe() for d in found)
