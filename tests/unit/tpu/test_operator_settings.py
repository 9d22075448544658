"""Operator settings of issue 20: FORCE_ON_DEMAND, COPY_POD_LABELS and the TPU MAX_PODS_PER_NODE default."""

import re

import pytest

from sandbox.jobsets import tpu_jobset
from shared.core import labels
from shared.core.errors import InvalidInputError, Refused
from shared.core.settings import Settings
from shared.tpu import capacity
from shared.tpu.jobsets import expand_pods
from shared.tpu.slices import build_node_pool, slice_options, slice_request

BASE = {
    "PROJECT_ID": "p",
    "LOCATION": "us-east5-b",
    "CLUSTER_NAME": "c",
    "NODE_LABEL_KEYS": "team",
    "UNLIMITED_SPENDING": "true",
}


def settings(**env: str) -> Settings:
    return Settings.from_env({**BASE, **env})


def pod(selectors=None, pod_labels=None):
    jobset = tpu_jobset("train", "team-a", uid="u-1", replicas=1, topology="2x4", selectors=selectors)
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"].setdefault("labels", {}).update(pod_labels or {})
    return expand_pods(jobset)[0]


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        ({}, "max_pods_per_node", 16),
        ({"MAX_PODS_PER_NODE": "0"}, "max_pods_per_node", 0),
        ({"MAX_PODS_PER_NODE": "32"}, "max_pods_per_node", 32),
        ({}, "force_on_demand", False),
        ({"FORCE_ON_DEMAND": "true"}, "force_on_demand", True),
        ({}, "copy_pod_labels", ()),
        ({"COPY_POD_LABELS": "team, example.com/"}, "copy_pod_labels", ("team", "example.com/")),
    ],
)
def test_settings_parse(env, field, value):
    assert getattr(settings(**env), field) == value


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"MAX_PODS_PER_NODE": "4"}, "MAX_PODS_PER_NODE=4 must be 0 (GKE's default) or 8..256"),
        ({"MAX_PODS_PER_NODE": "300"}, "must be 0 (GKE's default) or 8..256"),
        ({"FORCE_ON_DEMAND": "maybe"}, "FORCE_ON_DEMAND='maybe' is not a boolean"),
        ({"COPY_POD_LABELS": "app.kubernetes.io/"}, "keys under app.kubernetes.io/ cannot be node labels"),
        ({"COPY_POD_LABELS": "cloud.google.com/x"}, "keys under cloud.google.com/ cannot be node labels"),
        ({"COPY_POD_LABELS": "tpuprov.dev/"}, "keys under tpuprov.dev/ cannot be node labels"),
    ],
)
def test_bad_settings_stop_the_service_with_the_reason(env, why):
    with pytest.raises(InvalidInputError, match=re.escape(why)):
        settings(**env)


def test_the_pool_gets_the_tpu_max_pods_default():
    spec, _ = build_node_pool(settings(), slice_request(pod()))
    assert spec.max_pods_per_node == 16


# FORCE_ON_DEMAND: (pod selectors, policy) -> the capacity options, or the refusal.
FORCED = [
    pytest.param({}, "", ("on-demand@us-east5-b",), id="no-selection"),
    pytest.param(
        {}, "spot, on-demand@us-east5-c", ("on-demand@us-east5-c",), id="policy-keeps-on-demand-only"
    ),
    pytest.param({}, "spot, flex-start", ("on-demand@us-east5-b",), id="policy-without-on-demand"),
    pytest.param({labels.SPOT: "true"}, "", "this pod selects spot capacity", id="spot-pod-refused"),
    pytest.param({labels.FLEX_START: "true"}, "", "selects flex-start capacity", id="flex-start-refused"),
    pytest.param(
        {labels.RESERVATION_NAME: "r"}, "", "selects reservation capacity", id="reservation-refused"
    ),
]


@pytest.mark.parametrize(("selectors", "policy", "result"), FORCED)
def test_force_on_demand(selectors, policy, result):
    forced = settings(FORCE_ON_DEMAND="true", NODE_LOCATIONS="us-east5-b,us-east5-c")
    request = slice_request(pod(selectors))
    if isinstance(result, str):
        with pytest.raises(Refused, match=result):
            slice_options(forced, request.demand, capacity.parse_policy(policy))
        with pytest.raises(Refused, match="FORCE_ON_DEMAND is on"):
            build_node_pool(forced, request)
        return
    options = slice_options(forced, request.demand, capacity.parse_policy(policy))
    assert tuple(o.key for o in options) == result
    spec, _ = build_node_pool(forced, request, option=options[0])
    assert (spec.spot, spec.flex_start, spec.reservation) == (False, False, None)


def test_without_the_switch_the_policy_is_untouched():
    request = slice_request(pod())
    options = slice_options(settings(), request.demand, capacity.parse_policy("spot, on-demand"))
    assert [o.key for o in options] == ["spot@us-east5-b", "on-demand@us-east5-b"]


# COPY_POD_LABELS: pod labels + selectors -> the pool's node labels other than ownership.
COPIED = [
    pytest.param("team", {"team": "ml", "other": "x"}, {}, {"team": "ml"}, id="exact-key"),
    pytest.param(
        "example.com/",
        {"example.com/cost": "c1", "example.com/owner": "o", "examplexcom/x": "n"},
        {},
        {"example.com/cost": "c1", "example.com/owner": "o"},
        id="prefix",
    ),
    pytest.param("team", {"team": "ml"}, {"team": "infra"}, {"team": "infra"}, id="selector-wins"),
    pytest.param("", {"team": "ml"}, {}, {}, id="unset-copies-nothing"),
]


@pytest.mark.parametrize(("setting", "pod_labels", "selectors", "node_labels"), COPIED)
def test_copy_pod_labels(setting, pod_labels, selectors, node_labels):
    spec, _ = build_node_pool(settings(COPY_POD_LABELS=setting), slice_request(pod(selectors, pod_labels)))
    assert {k: v for k, v in spec.labels.items() if not k.startswith("tpuprov.dev/")} == node_labels


KEY = "projects/p/locations/us-east5/keyRings/tpu/cryptoKeys/boot"


def test_boot_disk_kms_key_reaches_the_pool_and_the_request():
    from shared.cloud.gke_messages import spec_to_node_pool

    spec, _ = build_node_pool(settings(BOOT_DISK_KMS_KEY=KEY), slice_request(pod()))
    assert spec.boot_disk_kms_key == KEY
    assert spec_to_node_pool(spec).config.boot_disk_kms_key == KEY
    unset, _ = build_node_pool(settings(), slice_request(pod()))
    assert unset.boot_disk_kms_key == "" and spec_to_node_pool(unset).config.boot_disk_kms_key == ""


def test_a_malformed_boot_disk_kms_key_stops_the_service():
    with pytest.raises(InvalidInputError, match="BOOT_DISK_KMS_KEY='tpu-key' is not a Cloud KMS key name"):
        settings(BOOT_DISK_KMS_KEY="tpu-key")


IMAGE = "projects/p/global/images/jax-cache"


def test_secondary_boot_disks_and_additional_networks_reach_the_request():
    from shared.cloud.gke_messages import spec_to_node_pool

    configured = settings(
        SECONDARY_BOOT_DISKS=f"{IMAGE}=CONTAINER_IMAGE_CACHE, projects/p/global/images/weights",
        ADDITIONAL_NODE_NETWORKS="dcn-1:dcn-1-sub, dcn-2 : dcn-2-sub",
    )
    spec, _ = build_node_pool(configured, slice_request(pod()))
    assert spec.secondary_boot_disks == (
        (IMAGE, "CONTAINER_IMAGE_CACHE"),
        ("projects/p/global/images/weights", ""),
    )
    assert spec.additional_networks == (("dcn-1", "dcn-1-sub"), ("dcn-2", "dcn-2-sub"))
    message = spec_to_node_pool(spec)
    assert [(d.disk_image, d.mode.name) for d in message.config.secondary_boot_disks] == [
        (IMAGE, "CONTAINER_IMAGE_CACHE"),
        ("projects/p/global/images/weights", "MODE_UNSPECIFIED"),
    ]
    assert [(n.network, n.subnetwork) for n in message.network_config.additional_node_network_configs] == [
        ("dcn-1", "dcn-1-sub"),
        ("dcn-2", "dcn-2-sub"),
    ]
    plain = spec_to_node_pool(build_node_pool(settings(), slice_request(pod()))[0])
    assert "network_config" not in plain and not plain.config.secondary_boot_disks


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"SECONDARY_BOOT_DISKS": "jax-cache"}, "SECONDARY_BOOT_DISKS entry 'jax-cache' must be"),
        ({"SECONDARY_BOOT_DISKS": f"{IMAGE}=FAST"}, "optionally followed by =CONTAINER_IMAGE_CACHE"),
        (
            {"ADDITIONAL_NODE_NETWORKS": "dcn-1"},
            "ADDITIONAL_NODE_NETWORKS entry 'dcn-1' must be NETWORK:SUBNETWORK",
        ),
    ],
)
def test_malformed_node_extras_stop_the_service(env, why):
    with pytest.raises(InvalidInputError, match=re.escape(why)):
        settings(**env)


# Shielded VM and surge upgrade settings -> what the create request carries.
NODE_OPTIONS = [
    pytest.param({}, (False, True), None, id="gke-defaults"),
    pytest.param({"SHIELDED_SECURE_BOOT": "true"}, (True, True), None, id="secure-boot"),
    pytest.param(
        {"SHIELDED_INTEGRITY_MONITORING": "false"}, (False, False), None, id="no-integrity-monitoring"
    ),
    pytest.param({"UPGRADE_MAX_SURGE": "2"}, (False, True), (2, 0), id="surge-2"),
    pytest.param({"UPGRADE_MAX_UNAVAILABLE": "1"}, (False, True), (1, 1), id="unavailable-1-keeps-surge-1"),
    pytest.param(
        {"UPGRADE_MAX_SURGE": "0", "UPGRADE_MAX_UNAVAILABLE": "4"}, (False, True), (0, 4), id="in-place-4"
    ),
]


@pytest.mark.parametrize(("env", "shielded", "upgrade"), NODE_OPTIONS)
def test_shielded_and_upgrade_settings(env, shielded, upgrade):
    from shared.cloud.gke_messages import spec_to_node_pool

    message = spec_to_node_pool(build_node_pool(settings(**env), slice_request(pod()))[0])
    config = message.config.shielded_instance_config
    assert (config.enable_secure_boot, config.enable_integrity_monitoring) == shielded
    got = message.upgrade_settings
    assert ((got.max_surge, got.max_unavailable) if "upgrade_settings" in message else None) == upgrade


def test_no_surge_and_no_unavailable_node_stops_the_service():
    with pytest.raises(InvalidInputError, match="UPGRADE_MAX_SURGE=0 needs UPGRADE_MAX_UNAVAILABLE >= 1"):
        settings(UPGRADE_MAX_SURGE="0")


def _shaped(accelerator: str, topology: str):
    jobset = tpu_jobset("train", "team-a", uid="u-1", replicas=1, accelerator=accelerator, topology=topology)
    return slice_request(expand_pods(jobset)[0])


def test_confidential_storage_on_a_hyperdisk_generation():
    from shared.cloud.gke_messages import spec_to_node_pool

    spec, _ = build_node_pool(
        settings(CONFIDENTIAL_STORAGE="true", BOOT_DISK_KMS_KEY=KEY), _shaped("tpu-v6e-slice", "2x4")
    )
    assert (spec.disk_type, spec.confidential_storage) == ("hyperdisk-balanced", True)
    assert spec_to_node_pool(spec).config.enable_confidential_storage


def test_confidential_storage_refuses_a_slice_that_boots_from_persistent_disk():
    confidential = settings(CONFIDENTIAL_STORAGE="true", BOOT_DISK_KMS_KEY=KEY)
    with pytest.raises(Refused, match="CONFIDENTIAL_STORAGE needs a hyperdisk-balanced boot disk, and "):
        build_node_pool(confidential, _shaped("tpu-v5p-slice", "2x2x2"))


def test_confidential_storage_without_a_kms_key_stops_the_service():
    with pytest.raises(InvalidInputError, match="CONFIDENTIAL_STORAGE=true needs BOOT_DISK_KMS_KEY"):
        settings(CONFIDENTIAL_STORAGE="true")
