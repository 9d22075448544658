"""Pure derivation tables: which pods qualify, and the exact NodePool each slice gets."""

import copy
import hashlib

import pytest

from sandbox.jobsets import tpu_jobset
from shared.core import labels
from shared.core.errors import NotEligible, Refused
from shared.core.names import SliceId
from shared.core.settings import Settings
from shared.tpu import catalog
from shared.tpu.declared import declaration_problem, replicated_jobs
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import ClusterInfo, NodePoolSpec, Placement, Reservation
from shared.tpu.slices import SliceRequest, build_node_pool, slice_request
from tests.unit.tpu.pods import UID, pod_of

SETTINGS = Settings(
    unlimited_spending=True,
    project_id="p",
    location="us-east5-b",
    cluster_name="c",
    node_service_account="tpu-nodes@p.iam.gserviceaccount.com",
    network_tags=("tpu",),
    max_pods_per_node=32,
    tpu7x_workload_policy="tpu7x-{topology}",
    node_label_keys=("team", "example.com/", "google.com/"),
)


def owner(index=0, rjob="slice"):
    return {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.OWNER_NAMESPACE: "team-a",
        labels.OWNER_NAME: "train",
        labels.OWNER_UID: UID,
        labels.OWNER_REPLICATED_JOB: rjob,
        labels.OWNER_JOB_INDEX: str(index),
    }


RESOURCE_LABELS = {
    labels.RESOURCE_LABEL_MANAGED_BY: labels.MANAGED_BY_VALUE,
    labels.RESOURCE_LABEL_NAMESPACE: "team-a",
    labels.RESOURCE_LABEL_JOBSET: "train",
}
COMMON = {
    "node_locations": ("us-east5-b",),
    "resource_labels": RESOURCE_LABELS,
    "service_account": "tpu-nodes@p.iam.gserviceaccount.com",
    "oauth_scopes": ("https://www.googleapis.com/auth/cloud-platform",),
    "max_pods_per_node": 32,
    "tags": ("tpu",),
    "workload_metadata": "GKE_METADATA",  # tenant pods get GKE's metadata server, not the node's token
}


def expected(name_of, **fields):
    return NodePoolSpec(name=name_of, **{**COMMON, **fields})


def request_name(**kwargs):
    return slice_request(pod_of(**kwargs)).pool_name


CASES = [
    pytest.param(
        {"accelerator": "tpu-v6e-slice", "topology": "4x4", "chips_per_vm": 4},
        {
            "machine_type": "ct6e-standard-4t",
            "node_count": 4,
            "labels": owner(),
            "placement": Placement("COMPACT", "4x4"),
            "disk_type": "hyperdisk-balanced",
        },
        id="v6e-multi-host-compact",
    ),
    pytest.param(
        {"accelerator": "tpu-v5-lite-podslice", "topology": "2x4", "chips_per_vm": 8},
        {"machine_type": "ct5lp-hightpu-8t", "node_count": 1, "labels": owner(), "placement": None},
        id="v5e-2x4-single-host-8-chip-vm-no-placement",
    ),
    pytest.param(
        {"accelerator": "tpu-v5-lite-podslice", "topology": "2x4", "chips_per_vm": 4},
        {
            "machine_type": "ct5lp-hightpu-4t",
            "node_count": 2,
            "labels": owner(),
            "placement": Placement("COMPACT", "2x4"),
        },
        id="v5e-2x4-two-4-chip-vms",
    ),
    pytest.param(
        {
            "accelerator": "tpu-v5-lite-podslice",
            "topology": "2x4",
            "chips_per_vm": 8,
            "selectors": {labels.SPOT: "true"},
        },
        {"machine_type": "ct5lp-hightpu-8t", "node_count": 1, "labels": owner(), "spot": True},
        id="spot",
    ),
    pytest.param(
        {
            "accelerator": "tpu-v5p-slice",
            "topology": "2x2x4",
            "chips_per_vm": 4,
            "selectors": {labels.RESERVATION_NAME: "v5p-res"},
        },
        {
            "machine_type": "ct5p-hightpu-4t",
            "node_count": 4,
            "labels": owner(),
            "placement": Placement("COMPACT", "2x2x4"),
            "reservation": Reservation("v5p-res"),
        },
        id="specific-reservation",
    ),
    pytest.param(
        {
            "accelerator": "tpu-v4-podslice",
            "topology": "2x2x2",
            "chips_per_vm": 4,
            "selectors": {labels.RESERVATION_NAME: "shared-res", labels.RESERVATION_PROJECT: "owner-proj"},
        },
        {
            "machine_type": "ct4p-hightpu-4t",
            "node_count": 2,
            "labels": owner(),
            "placement": Placement("COMPACT", "2x2x2"),
            "reservation": Reservation("shared-res", "owner-proj"),
        },
        id="shared-reservation",
    ),
    pytest.param(
        {
            "accelerator": "tpu-v6e-slice",
            "topology": "2x2",
            "chips_per_vm": 4,
            "selectors": {"team": "research", "example.com/tier": "gold", "kubernetes.io/os": "linux"},
        },
        {
            "machine_type": "ct6e-standard-4t",
            "node_count": 1,
            "labels": {"example.com/tier": "gold", "team": "research", **owner()},
            "disk_type": "hyperdisk-balanced",
        },
        id="copied-selectors-not-reserved-ones",
    ),
    pytest.param(
        {"accelerator": "tpu7x", "topology": "2x2x2", "chips_per_vm": 4},
        {
            "machine_type": "tpu7x-standard-4t",
            "node_count": 2,
            "labels": owner(),
            "placement": Placement("", "", "tpu7x-2-2-2"),
            "disk_type": "hyperdisk-balanced",
        },
        id="tpu7x-multi-host-workload-policy",
    ),
    pytest.param(
        {"accelerator": "tpu7x", "topology": "4x4x4", "chips_per_vm": 4},
        {
            "machine_type": "tpu7x-standard-4t",
            "node_count": 16,
            "labels": owner(),
            "placement": Placement("", "", "tpu7x-4-4-4"),
            "disk_type": "hyperdisk-balanced",
        },
        id="tpu7x-operator-policy-topology-placeholder",
    ),
    pytest.param(
        {"accelerator": "tpu7x", "topology": "2x2x1", "chips_per_vm": 4},
        {
            "machine_type": "tpu7x-standard-4t",
            "node_count": 1,
            "labels": owner(),
            "placement": None,
            "disk_type": "hyperdisk-balanced",
        },
        id="tpu7x-single-host",
    ),
]


@pytest.mark.parametrize(("jobset_args", "fields"), CASES)
def test_build_node_pool_whole_object(jobset_args, fields):
    request = slice_request(pod_of(**jobset_args))
    spec, _ = build_node_pool(SETTINGS, request)
    assert spec == expected(request.pool_name, **fields)


def test_slice_request_whole_object():
    pod = pod_of(selectors={labels.SPOT: "true", "team": "x"})
    assert slice_request(pod) == SliceRequest(
        slice_id=SliceId("team-a", "train", UID, "slice", 0),
        accelerator="tpu-v6e-slice",
        topology="4x4",
        chips_per_vm=4,
        spot=True,
        reservation=None,
        extra_labels={"team": "x"},
        zone="",
        selected={
            labels.TPU_ACCELERATOR: "tpu-v6e-slice",
            labels.TPU_TOPOLOGY: "4x4",
            labels.SPOT: "true",
            "team": "x",
        },
        pod_labels=pod["metadata"]["labels"],
    )


def test_slice_request_reads_the_zone_selector():
    pod = pod_of(selectors={labels.ZONE: " us-east5-c "})
    assert slice_request(pod).zone == "us-east5-c"


def mutate(change):
    pod = copy.deepcopy(pod_of())
    change(pod)
    return pod


def _set(path, value):
    def apply(pod):
        target = pod
        for key in path[:-1]:
            target = target.setdefault(key, {})
        if value is None:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value

    return apply


NOT_ELIGIBLE = [
    pytest.param(
        _set(("metadata", "deletionTimestamp"), "2026-01-01T00:00:00Z"), "being deleted", id="deleting"
    ),
    pytest.param(_set(("spec", "nodeName"), "node-1"), "on node", id="scheduled"),
    pytest.param(_set(("status", "phase"), "Running"), "Running", id="running"),
    pytest.param(_set(("status", "conditions"), []), "Unschedulable", id="no-unschedulable-condition"),
    pytest.param(_set(("spec", "schedulingGates"), [{"name": "x"}]), "gates", id="gated"),
    pytest.param(_set(("metadata", "labels", labels.OPT_OUT), "true"), "opted out", id="opt-out-label"),
    pytest.param(
        _set(("metadata", "annotations", labels.OPT_OUT), "True"), "opted out", id="opt-out-annotation"
    ),
    pytest.param(
        lambda p: [
            p["metadata"]["labels"].pop(labels.JOBSET_NAME),
            p["metadata"]["annotations"].pop(labels.JOBSET_NAME),
        ],
        "JobSet",
        id="not-jobset",
    ),
    pytest.param(lambda p: p["spec"]["containers"][0].update(resources={}), "no google.com/tpu", id="no-tpu"),
    pytest.param(
        _set(("spec", "nodeSelector", labels.NODEPOOL), "tpu-x-0-abc"),
        "pinned to node pool .tpu-x-0-abc.*nothing to create",
        id="follower-pinned",
    ),
]


@pytest.mark.parametrize(("change", "why"), NOT_ELIGIBLE)
def test_not_eligible(change, why):
    with pytest.raises(NotEligible, match=why):
        slice_request(mutate(change))


REFUSED = [
    pytest.param(
        lambda p: p["spec"]["nodeSelector"].pop(labels.TPU_TOPOLOGY), "does not select", id="no-topology"
    ),
    pytest.param(_set(("spec", "nodeSelector", "team"), "has space"), "label value", id="bad-label-value"),
    pytest.param(_set(("spec", "nodeSelector", "bad key!"), "x"), "label key", id="bad-label-key"),
    pytest.param(
        _set(("spec", "nodeSelector", labels.MANAGED_BY), "someone"),
        "reserved for the product's ownership labels",
        id="ownership-inject",
    ),
    pytest.param(
        lambda p: p["spec"]["containers"][0]["resources"]["requests"].update({labels.TPU_RESOURCE: "four"}),
        "requests google.com/tpu",
        id="non-numeric-tpu",
    ),
    pytest.param(
        lambda p: p["spec"]["nodeSelector"].update({labels.SPOT: "true", labels.RESERVATION_NAME: "res-1"}),
        "Spot VMs cannot consume reservations",
        id="spot-and-reservation",
    ),
    pytest.param(
        lambda p: p["spec"].update(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": labels.SPOT, "operator": "In", "values": ["true"]}]}
                        ]
                    }
                }
            },
            nodeSelector={**p["spec"]["nodeSelector"], labels.RESERVATION_NAME: "res-1"},
        ),
        "cloud.google.com/gke-spot=true and cloud.google.com/reservation-name=res-1",
        id="spot-by-affinity-and-reservation",
    ),
]


@pytest.mark.parametrize(("change", "why"), REFUSED)
def test_refused(change, why):
    with pytest.raises(Refused, match=why):
        slice_request(mutate(change))


@pytest.mark.parametrize(
    ("jobset_args", "settings", "why"),
    [
        ({"accelerator": "tpu-v6e-slice", "topology": "4x4", "chips_per_vm": 2}, SETTINGS, "2 chips per VM"),
        (
            {"accelerator": "tpu-v9-slice", "topology": "4x4", "chips_per_vm": 4},
            SETTINGS,
            "unknown TPU accelerator",
        ),
        (
            {"accelerator": "tpu-v6e-slice", "topology": "4x4", "chips_per_vm": 4},
            SETTINGS.with_overrides(location="us-east5"),
            "NODE_LOCATIONS",
        ),
        (
            {"accelerator": "tpu-v6e-slice", "topology": "4x4", "chips_per_vm": 4},
            SETTINGS.with_overrides(disk_type="pd-balanced"),
            "DISK_TYPE=pd-balanced is not supported by ct6e-standard-4t .v6e. VMs, which boot from "
            "hyperdisk-balanced",
        ),
        (
            {"accelerator": "tpu-v5p-slice", "topology": "2x2x2", "chips_per_vm": 4},
            SETTINGS.with_overrides(disk_type="hyperdisk-balanced"),
            "not supported by ct5p-hightpu-4t .v5p. VMs, which boot from pd-balanced",
        ),
        (
            {"accelerator": "tpu-v5-lite-podslice", "topology": "2x2", "chips_per_vm": 4},
            SETTINGS.with_overrides(disk_type="pd-ssd"),
            "DISK_TYPE=pd-ssd is not supported by ct5lp-hightpu-4t",
        ),
        (
            {
                "accelerator": "tpu-v6e-slice",
                "topology": "4x4",
                "chips_per_vm": 4,
                "selectors": {labels.ZONE: "us-west4-a"},
            },
            SETTINGS,
            "topology.kubernetes.io/zone=us-west4-a, which is not a zone of this cluster .zones: us-east5-b.",
        ),
    ],
    ids=[
        "chips-not-a-machine-type",
        "unknown-accelerator",
        "regional-without-zone",
        "pd-disk-on-v6e",
        "hyperdisk-on-v5p",
        "pd-ssd-on-v5e",
        "pod-zone-not-in-cluster",
    ],
)
def test_build_refuses_what_gke_would_reject(jobset_args, settings, why):
    with pytest.raises(Refused, match=why):
        build_node_pool(settings, slice_request(pod_of(**jobset_args)), REGULAR)


# The cluster kinds a pool must be accepted on: enrolled in a release channel (the default for new
# clusters) or not, zonal or regional with two TPU zones configured.
REGULAR = ClusterInfo("c", "us-east5-b", "10.0.0.1", "", locations=("us-east5-b",), release_channel="REGULAR")
NO_CHANNEL = ClusterInfo("c", "us-east5-b", "10.0.0.1", "", locations=("us-east5-b",))
REGIONAL = ClusterInfo(
    "c",
    "us-east5",
    "10.0.0.1",
    "",
    locations=("us-east5-a", "us-east5-b", "us-east5-c"),
    release_channel="STABLE",
)
TWO_ZONES = SETTINGS.with_overrides(location="us-east5", node_locations=("us-east5-b", "us-east5-c"))
V6E_4X4 = {"accelerator": "tpu-v6e-slice", "topology": "4x4", "chips_per_vm": 4}
V6E_4X4_POOL = {
    "machine_type": "ct6e-standard-4t",
    "node_count": 4,
    "labels": owner(),
    "placement": Placement("COMPACT", "4x4"),
    "disk_type": "hyperdisk-balanced",
}
V5E_2X2 = {"accelerator": "tpu-v5-lite-podslice", "topology": "2x2", "chips_per_vm": 4}
V5E_2X2_POOL = {"machine_type": "ct5lp-hightpu-4t", "node_count": 1, "labels": owner()}

CLUSTER_CASES = [
    pytest.param(
        SETTINGS,
        REGULAR,
        V6E_4X4,
        {**V6E_4X4_POOL, "auto_upgrade": True},
        id="release-channel-auto-upgrade-on",
    ),
    pytest.param(SETTINGS, NO_CHANNEL, V6E_4X4, V6E_4X4_POOL, id="no-channel-auto-upgrade-off"),
    pytest.param(SETTINGS, None, V6E_4X4, V6E_4X4_POOL, id="cluster-unknown-treated-as-no-channel"),
    pytest.param(
        TWO_ZONES,
        REGIONAL,
        V6E_4X4,
        {**V6E_4X4_POOL, "auto_upgrade": True, "node_locations": ("us-east5-b",)},
        id="two-zones-multi-host-gets-first-zone-only",
    ),
    pytest.param(
        TWO_ZONES,
        REGIONAL,
        V5E_2X2,
        {**V5E_2X2_POOL, "auto_upgrade": True, "node_locations": ("us-east5-b",)},
        id="two-zones-single-host-one-node-in-one-zone",
    ),
    pytest.param(
        TWO_ZONES,
        REGIONAL,
        {**V5E_2X2, "selectors": {labels.ZONE: "us-east5-c"}},
        {**V5E_2X2_POOL, "auto_upgrade": True, "node_locations": ("us-east5-c",)},
        id="pod-zone-selector-wins",
    ),
    pytest.param(
        TWO_ZONES,
        REGIONAL,
        {**V5E_2X2, "selectors": {labels.ZONE: "us-east5-a"}},
        {**V5E_2X2_POOL, "auto_upgrade": True, "node_locations": ("us-east5-a",)},
        id="pod-zone-selector-any-cluster-zone",
    ),
    pytest.param(
        TWO_ZONES,
        REGIONAL,
        {
            "accelerator": "tpu-v5p-slice",
            "topology": "2x2x2",
            "chips_per_vm": 4,
            "selectors": {labels.RESERVATION_NAME: "res-c", labels.ZONE: "us-east5-c"},
        },
        {
            "machine_type": "ct5p-hightpu-4t",
            "node_count": 2,
            "labels": owner(),
            "placement": Placement("COMPACT", "2x2x2"),
            "reservation": Reservation("res-c"),
            "auto_upgrade": True,
            "node_locations": ("us-east5-c",),
        },
        id="reservation-zone-pinned-by-selector",
    ),
    pytest.param(
        SETTINGS.with_overrides(disk_type="hyperdisk-balanced"),
        NO_CHANNEL,
        V6E_4X4,
        V6E_4X4_POOL,
        id="explicit-disk-type-the-family-supports",
    ),
]


@pytest.mark.parametrize(("settings", "cluster", "jobset_args", "fields"), CLUSTER_CASES)
def test_build_node_pool_per_cluster_kind(settings, cluster, jobset_args, fields):
    request = slice_request(pod_of(**jobset_args))
    spec, _ = build_node_pool(settings, request, cluster)
    assert spec == expected(request.pool_name, **fields)


def test_every_pod_of_a_slice_maps_to_the_same_pool_and_slices_differ():
    pods = expand_pods(tpu_jobset("train", "team-a", uid=UID, replicas=3, topology="4x4", chips_per_vm=4))
    names = [slice_request(p).pool_name for p in pods]
    assert len(pods) == 12
    assert len(set(names)) == 3
    for index in range(3):
        assert (
            len(
                {
                    n
                    for p, n in zip(pods, names, strict=True)
                    if p["metadata"]["labels"][labels.JOB_INDEX] == str(index)
                }
            )
            == 1
        )


def test_restart_attempt_keeps_pool_names():
    jobset = tpu_jobset("train", "team-a", uid=UID)
    first = {slice_request(p).pool_name for p in expand_pods(jobset, restart_attempt=0)}
    again = {slice_request(p).pool_name for p in expand_pods(jobset, restart_attempt=1)}
    assert first == again


def test_tpu7x_without_operator_policy_names_the_products_own_per_topology():
    # No TPU7X_WORKLOAD_POLICY: the pool names the product's policy for its topology, marked managed
    # so the provisioner makes it exist before the create is sent.
    request = slice_request(pod_of(accelerator="tpu7x", topology="2x2x2", chips_per_vm=4))
    spec, _ = build_node_pool(SETTINGS.with_overrides(tpu7x_workload_policy=""), request)
    assert spec == expected(
        request.pool_name,
        machine_type="tpu7x-standard-4t",
        node_count=2,
        labels=owner(),
        placement=Placement("", "", "tpuprov-tpu7x-2-2-2", "2x2x2"),
        disk_type="hyperdisk-balanced",
    )


def test_expanded_pods_carry_the_jobset_controllers_job_key() -> None:
    # SHA-1 of "<namespace>/<job name>" as the JobSet controller computes it; a label value holds at
    # most 63 characters, so a longer digest would be refused by the API server.
    [pod] = expand_pods(tpu_jobset("train", "team-a", uid=UID, replicas=1, topology="2x2", chips_per_vm=4))
    key = pod["metadata"]["labels"][labels.JOB_KEY]
    assert key == hashlib.sha1(b"team-a/train-slice-0").hexdigest()
    assert len(key) == 40


@pytest.mark.parametrize(
    ("replicas", "vms", "reason"),
    [
        # One Job of one pod on a 4-VM slice: three VMs nobody asked for.
        (
            1,
            1,
            "runs 1 pod(s) per Job, but a tpu-v6e-slice 4x4 slice is 4 VMs (16 chips, one pod per VM): "
            "set parallelism and completions to 4",
        ),
        # Four one-pod workers that together fill one slice: say how to declare them as one Job.
        (
            4,
            1,
            "runs 4 Jobs of 1 pod(s), but a tpu-v6e-slice 4x4 slice is 4 VMs (16 chips, one pod per "
            "VM); pods of separate Jobs cannot share a slice (GKE gives each Indexed Job its own TPU worker "
            "ids): declare replicas: 1 with parallelism and completions 4 (4 pods on 1 slice(s))",
        ),
        (4, 2, "declare replicas: 2 with parallelism and completions 4 (8 pods on 2 slice(s))"),
        # Three pods of two Jobs fill no whole slice: the plain reason.
        (3, 1, "runs 1 pod(s) per Job"),
    ],
)
def test_jobs_with_fewer_pods_than_their_slice_has_vms_are_refused_with_the_way_out(
    replicas: int, vms: int, reason: str
) -> None:
    jobset = tpu_jobset("tf", replicas=replicas, topology="4x4", vms=vms)
    (rjob,) = replicated_jobs(jobset)
    problem = declaration_problem(rjob, catalog.resolve("tpu-v6e-slice", "4x4", 4))
    assert reason in problem
    assert "select a topology of" in problem
