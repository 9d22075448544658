"""Config drift: each setting a pool was built under that the current settings would set otherwise."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from shared.core import labels
from shared.core.settings import Settings
from shared.tpu.drift import Drift, config_of, drift, expected_spec, summary
from shared.tpu.nodepools import NodePoolInfo, NodePoolSpec

OWNER = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.OWNER_UID: "u1"}
BUILT = NodePoolSpec(
    name="train-0",
    machine_type="ct5lp-hightpu-4t",
    node_count=4,
    node_locations=("us-east5-b",),
    labels={**OWNER, "team": "ml"},
    resource_labels={},
    service_account="old@p.iam.gserviceaccount.com",
    oauth_scopes=("https://www.googleapis.com/auth/cloud-platform",),
    max_pods_per_node=16,
    disk_size_gb=100,
    disk_type="pd-balanced",
    tags=("tpu",),
)


def pool_built_from(spec: NodePoolSpec, **config: Any) -> NodePoolInfo:
    """The pool GKE reports for a create of ``spec``, its node config changed by ``config``."""
    return NodePoolInfo(
        name=spec.name,
        status="RUNNING",
        machine_type=spec.machine_type,
        node_count=spec.node_count,
        labels=dict(spec.labels),
        config=dataclasses.replace(config_of(spec), **config),
    )


@pytest.mark.parametrize(
    ("pool_config", "now", "expected"),
    [
        pytest.param({}, {}, (), id="unchanged"),
        pytest.param(
            {},
            {"service_account": "new@p.iam.gserviceaccount.com"},
            (
                Drift(
                    "NODE_SERVICE_ACCOUNT", "old@p.iam.gserviceaccount.com", "new@p.iam.gserviceaccount.com"
                ),
            ),
            id="service-account",
        ),
        # GKE reports the Compute Engine default service account as "default" when none was sent.
        pytest.param({"service_account": "default"}, {"service_account": ""}, (), id="default-sa-is-unset"),
        pytest.param(
            {},
            {"oauth_scopes": ("a", "b")},
            (Drift("OAUTH_SCOPES", "https://www.googleapis.com/auth/cloud-platform", "a,b"),),
            id="scopes",
        ),
        pytest.param({"oauth_scopes": ("b", "a")}, {"oauth_scopes": ("a", "b")}, (), id="scope-order"),
        pytest.param({}, {"disk_size_gb": 200}, (Drift("DISK_SIZE_GB", "100", "200"),), id="disk-size"),
        pytest.param({"disk_size_gb": 0}, {"disk_size_gb": 100}, (), id="gke-default-disk-size"),
        pytest.param(
            {},
            {"disk_type": "hyperdisk-balanced"},
            (Drift("DISK_TYPE", "pd-balanced", "hyperdisk-balanced"),),
            id="disk-type",
        ),
        pytest.param(
            {},
            {"boot_disk_kms_key": "projects/p/locations/l/keyRings/r/cryptoKeys/k"},
            (Drift("BOOT_DISK_KMS_KEY", "", "projects/p/locations/l/keyRings/r/cryptoKeys/k"),),
            id="kms-key",
        ),
        pytest.param(
            {},
            {"confidential_storage": True},
            (Drift("CONFIDENTIAL_STORAGE", "false", "true"),),
            id="confidential",
        ),
        pytest.param(
            {},
            {"secondary_boot_disks": (("projects/p/global/images/i", "CONTAINER_IMAGE_CACHE"),)},
            (Drift("SECONDARY_BOOT_DISKS", "", "projects/p/global/images/i=CONTAINER_IMAGE_CACHE"),),
            id="secondary-boot-disk",
        ),
        pytest.param(
            {},
            {"additional_networks": (("dcn", "dcn-sub"),)},
            (Drift("ADDITIONAL_NODE_NETWORKS", "", "dcn:dcn-sub"),),
            id="extra-network",
        ),
        pytest.param(
            {},
            {"secure_boot": True, "integrity_monitoring": False},
            (
                Drift("SHIELDED_SECURE_BOOT", "false", "true"),
                Drift("SHIELDED_INTEGRITY_MONITORING", "true", "false"),
            ),
            id="shielded",
        ),
        pytest.param(
            {},
            {"max_surge": 0, "max_unavailable": 2},
            (Drift("UPGRADE_MAX_SURGE", "1", "0"), Drift("UPGRADE_MAX_UNAVAILABLE", "0", "2")),
            id="surge",
        ),
        # GKE fills in its surge defaults (1 surged, 0 unavailable) when none were sent.
        pytest.param({"max_surge": 1, "max_unavailable": 0}, {}, (), id="gke-default-surge"),
        pytest.param({}, {"tags": ("tpu", "dcn")}, (Drift("NETWORK_TAGS", "tpu", "dcn,tpu"),), id="tags"),
        pytest.param({}, {"max_pods_per_node": 32}, (Drift("MAX_PODS_PER_NODE", "16", "32"),), id="max-pods"),
        # 0 leaves it to the cluster's default, which the pool's value cannot be compared with.
        pytest.param({}, {"max_pods_per_node": 0}, (), id="max-pods-unset"),
        pytest.param(
            {},
            {"labels": {**OWNER, "team": "ml", "cost-center": "42"}},
            (Drift("COPY_POD_LABELS", "team", "cost-center,team"),),
            id="copied-label-keys",
        ),
        # A copied key's value comes from each pod, and the product's own labels change by design.
        pytest.param(
            {},
            {"labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.OWNER_UID: "u2", "team": "x"}},
            (),
            id="label-values-and-ownership",
        ),
        # A pool whose nodes serve the Compute metadata to pods, where the product asks for GKE's.
        pytest.param(
            {"workload_metadata": "GCE_METADATA"},
            {"workload_metadata": "GKE_METADATA"},
            (Drift("WORKLOAD_METADATA", "GCE_METADATA", "GKE_METADATA"),),
            id="workload-metadata",
        ),
        # GKE reported no mode for the pool: nothing to compare with.
        pytest.param({}, {"workload_metadata": "GKE_METADATA"}, (), id="workload-metadata-unreported"),
        pytest.param(
            {},
            {"service_account": "", "disk_size_gb": 50},
            (
                Drift("NODE_SERVICE_ACCOUNT", "old@p.iam.gserviceaccount.com", "default"),
                Drift("DISK_SIZE_GB", "100", "50"),
            ),
            id="several",
        ),
    ],
)
def test_drift(pool_config: dict[str, Any], now: dict[str, Any], expected: tuple[Drift, ...]) -> None:
    pool = pool_built_from(BUILT, **pool_config)
    assert drift(pool, dataclasses.replace(BUILT, **now)) == expected


def test_a_pool_whose_node_config_gke_did_not_report_never_drifts() -> None:
    pool = dataclasses.replace(pool_built_from(BUILT), config=None)
    assert drift(pool, dataclasses.replace(BUILT, disk_size_gb=500)) == ()


def test_expected_spec_takes_the_settings_and_the_machine_family_default_disk() -> None:
    settings = Settings(
        unlimited_spending=True,
        project_id="p",
        location="us-east5-b",
        cluster_name="c",
        node_service_account="new@p.iam.gserviceaccount.com",
        disk_size_gb=300,
        network_tags=("tpu",),
    )
    pool = pool_built_from(BUILT)
    spec = expected_spec(settings, pool)
    assert (spec.name, spec.labels, spec.disk_type) == (pool.name, pool.labels, "pd-balanced")
    # Every pool the settings build runs GKE's metadata server (slices.settings_node_fields).
    assert spec.workload_metadata == "GKE_METADATA"
    assert summary(drift(pool, spec)) == (
        "NODE_SERVICE_ACCOUNT: old@p.iam.gserviceaccount.com -> new@p.iam.gserviceaccount.com; "
        "DISK_SIZE_GB: 100 -> 300"
    )
    # Settings as the pool was built: nothing to report.
    same = settings.with_overrides(node_service_account=BUILT.service_account, disk_size_gb=100)
    assert drift(pool, expected_spec(same, pool)) == ()
