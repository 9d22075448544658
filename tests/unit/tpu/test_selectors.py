"""Every pod selector the product knows: set by GKE, set by the product, or refused (whole objects)."""

import pytest

from sandbox.jobsets import tpu_jobset
from shared.core import labels
from shared.core.errors import Refused
from shared.core.settings import Settings
from shared.tpu import selectors
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.selectors import GKE, PRODUCT, REFUSED, Fate
from shared.tpu.slices import build_node_pool, slice_request

SETTINGS = Settings(
    unlimited_spending=True,
    project_id="p",
    location="us-east5",
    cluster_name="c",
    node_locations=("us-east5-b", "us-east5-c"),
    node_label_keys=("team", "example.com/", "google.com/"),
)
GKE_TEXT = 'Node labels with key "{}" are managed by GKE or Kubernetes and must not be manually specified.'
NOT_SET = "GKE sets no such label on the nodes of a pool the product builds, and refuses it as a node label"

# key, value -> the fate decided from the key alone (before any pool is built).
CLASSIFY = [
    (labels.NODEPOOL, "p", Fate(labels.NODEPOOL, "p", GKE, "the node pool's name")),
    (labels.TPU_ACCELERATOR, "a", Fate(labels.TPU_ACCELERATOR, "a", GKE, "config.machineType")),
    (labels.TPU_TOPOLOGY, "2x2", Fate(labels.TPU_TOPOLOGY, "2x2", GKE, "placementPolicy.tpuTopology")),
    (
        labels.ACCELERATOR_COUNT,
        "4",
        Fate(labels.ACCELERATOR_COUNT, "4", GKE, "config.machineType (chips per VM)"),
    ),
    (labels.SPOT, "true", Fate(labels.SPOT, "true", GKE, "config.spot")),
    (labels.FLEX_START, "true", Fate(labels.FLEX_START, "true", GKE, "config.flexStart")),
    (labels.RESERVATION_NAME, "r", Fate(labels.RESERVATION_NAME, "r", GKE, "config.reservationAffinity")),
    (
        labels.RESERVATION_PROJECT,
        "p",
        Fate(labels.RESERVATION_PROJECT, "p", GKE, "config.reservationAffinity (shared reservation)"),
    ),
    (labels.ZONE, "us-east5-b", Fate(labels.ZONE, "us-east5-b", GKE, "locations")),
    (selectors.REGION, "us-east5", Fate(selectors.REGION, "us-east5", GKE, "locations")),
    (
        selectors.INSTANCE_TYPE,
        "ct6e-standard-4t",
        Fate(selectors.INSTANCE_TYPE, "ct6e-standard-4t", GKE, "config.machineType"),
    ),
    (selectors.OS, "linux", Fate(selectors.OS, "linux", GKE, "every GKE Linux node (linux)")),
    (labels.ICI_RESILIENCY, "false", Fate(labels.ICI_RESILIENCY, "false", PRODUCT, "config.labels")),
    (labels.LOCATION_HINT, "cell-a", Fate(labels.LOCATION_HINT, "cell-a", PRODUCT, "config.labels")),
    ("team", "ml", Fate("team", "ml", PRODUCT, "config.labels")),
    ("google.com/cost-center", "x", Fate("google.com/cost-center", "x", PRODUCT, "config.labels")),
    ("example.com/tier", "gold", Fate("example.com/tier", "gold", PRODUCT, "config.labels")),
    (
        "cloud.google.com/compute-class",
        "tpu",
        Fate(
            "cloud.google.com/compute-class",
            "tpu",
            REFUSED,
            f"{NOT_SET} ({GKE_TEXT.format('cloud.google.com/compute-class')})",
        ),
    ),
    (
        "kubernetes.io/arch",
        "amd64",
        Fate("kubernetes.io/arch", "amd64", REFUSED, f"{NOT_SET} ({GKE_TEXT.format('kubernetes.io/arch')})"),
    ),
    (
        "node-role.kubernetes.io/tpu",
        "",
        Fate(
            "node-role.kubernetes.io/tpu",
            "",
            REFUSED,
            f"{NOT_SET} ({GKE_TEXT.format('node-role.kubernetes.io/tpu')})",
        ),
    ),
    (
        "k8s.io/x",
        "y",
        Fate("k8s.io/x", "y", REFUSED, f"{NOT_SET} ({GKE_TEXT.format('k8s.io/x')})"),
    ),
    (
        labels.MANAGED_BY,
        "x",
        Fate(
            labels.MANAGED_BY,
            "x",
            REFUSED,
            "keys under tpuprov.dev/ are reserved for the product's ownership labels",
        ),
    ),
    (
        "bad key!",
        "x",
        Fate(
            "bad key!",
            "x",
            REFUSED,
            "cannot copy it to the node labels: label key 'bad key!' has an invalid name part",
        ),
    ),
]


@pytest.mark.parametrize(("key", "value", "fate"), CLASSIFY, ids=[c[0] for c in CLASSIFY])
def test_classify(key, value, fate):
    assert selectors.classify(key, value) == fate


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("cloud.google.com/gke-nodepool", GKE_TEXT.format("cloud.google.com/gke-nodepool")),
        ("topology.kubernetes.io/zone", GKE_TEXT.format("topology.kubernetes.io/zone")),
        (labels.ICI_RESILIENCY, ""),
        (labels.LOCATION_HINT, ""),
        ("node.example.com/kubernetes.io", ""),  # the domain is what counts, not a substring
        ("google.com/tpu-provisioner-owner", ""),
        ("team", ""),
    ],
)
def test_gke_refusal(key, text):
    assert selectors.gke_refusal(key) == text


def _pod(**kwargs):
    return expand_pods(tpu_jobset("train", "team-a", uid="u-1", **kwargs))[0]


def _built(**kwargs):
    request = slice_request(_pod(**kwargs))
    spec, shape = build_node_pool(SETTINGS, request)
    return request, spec, shape


def test_node_labels_of_a_spot_multi_host_pool():
    _, spec, shape = _built(
        accelerator="tpu-v5p-slice", topology="2x2x2", selectors={labels.SPOT: "true", "team": "ml"}
    )
    assert selectors.spec_node_labels(spec, shape.topology) == {
        labels.NODEPOOL: spec.name,
        selectors.INSTANCE_TYPE: "ct5p-hightpu-4t",
        selectors.OS: "linux",
        labels.TPU_ACCELERATOR: "tpu-v5p-slice",
        labels.ACCELERATOR_COUNT: "4",
        labels.TPU_TOPOLOGY: "2x2x2",
        labels.SPOT: "true",
        labels.ZONE: "us-east5-b",
        selectors.REGION: "us-east5",
        "team": "ml",
        **spec.labels,
    }


def test_node_labels_of_a_shared_reservation_pool():
    request, spec, shape = _built(
        selectors={labels.RESERVATION_NAME: "res-1", labels.RESERVATION_PROJECT: "other-proj"}
    )
    found = selectors.spec_node_labels(spec, shape.topology)
    assert (found[labels.RESERVATION_NAME], found[labels.RESERVATION_PROJECT]) == ("res-1", "other-proj")
    assert selectors.fates(request.selected, found) == (
        Fate(labels.TPU_ACCELERATOR, "tpu-v6e-slice", GKE, "config.machineType"),
        Fate(labels.TPU_TOPOLOGY, "4x4", GKE, "placementPolicy.tpuTopology"),
        Fate(labels.RESERVATION_NAME, "res-1", GKE, "config.reservationAffinity"),
        Fate(
            labels.RESERVATION_PROJECT, "other-proj", GKE, "config.reservationAffinity (shared reservation)"
        ),
    )


# Selectors beside the TPU pair -> the refusal (naming the key) or the node labels the pool gets.
BUILD = [
    pytest.param({labels.ICI_RESILIENCY: "false"}, {labels.ICI_RESILIENCY: "false"}, id="ici-resiliency"),
    pytest.param({labels.LOCATION_HINT: "cell-a"}, {labels.LOCATION_HINT: "cell-a"}, id="location-hint"),
    pytest.param({"google.com/team": "x"}, {"google.com/team": "x"}, id="google-com-copied"),
    pytest.param({labels.ZONE: "us-east5-c"}, {}, id="zone-set-by-gke"),
    pytest.param({labels.ACCELERATOR_COUNT: "4"}, {}, id="chip-count-set-by-gke"),
    pytest.param({selectors.INSTANCE_TYPE: "ct6e-standard-4t"}, {}, id="instance-type-set-by-gke"),
    pytest.param({selectors.REGION: "us-east5"}, {}, id="region-set-by-gke"),
    pytest.param({selectors.OS: "linux"}, {}, id="os-set-by-gke"),
    pytest.param(
        {labels.SPOT: "false"},
        "cloud.google.com/gke-spot=false, which no node of pool .* could match: the pool's nodes carry no "
        "cloud.google.com/gke-spot label",
        id="spot-false-never-matches",
    ),
    pytest.param(
        {labels.FLEX_START: "false"},
        "cloud.google.com/gke-flex-start=false, which no node",
        id="flex-start-false",
    ),
    pytest.param(
        {labels.ACCELERATOR_COUNT: "8"},
        "carry cloud.google.com/gke-accelerator-count=4",
        id="chip-count-mismatch",
    ),
    pytest.param(
        {selectors.INSTANCE_TYPE: "ct6e-standard-8t"},
        "carry node.kubernetes.io/instance-type=ct6e-standard-4t",
        id="instance-type-mismatch",
    ),
    pytest.param(
        {selectors.REGION: "us-west1"}, "carry topology.kubernetes.io/region=us-east5", id="region-mismatch"
    ),
    pytest.param(
        {"cloud.google.com/compute-class": "tpu"},
        'pod selects cloud.google.com/compute-class=tpu: .*Node labels with key "cloud.google.com/',
        id="gke-reserved-key",
    ),
    pytest.param(
        {"kubernetes.io/arch": "amd64"}, "pod selects kubernetes.io/arch=amd64", id="kubernetes-key"
    ),
]


@pytest.mark.parametrize(("extra", "result"), BUILD)
def test_pool_nodes_match_the_pod_or_the_pod_is_refused(extra, result):
    if isinstance(result, str):
        with pytest.raises(Refused, match=result):
            _built(selectors=extra)
        return
    request, spec, shape = _built(selectors=extra)
    node_labels = selectors.spec_node_labels(spec, shape.topology)
    assert all(node_labels.get(k) == v for k, v in request.selected.items())  # the pod can land
    assert {k: v for k, v in spec.labels.items() if not k.startswith("tpuprov.dev/")} == result


def _pool(**fields):
    base = {
        "name": "slice-pool",
        "status": "RUNNING",
        "machine_type": "ct6e-standard-4t",
        "node_count": 4,
        "node_locations": ("us-east5-b",),
        "tpu_topology": "4x4",
    }
    return NodePoolInfo(**{**base, **fields})


MISFIT = [
    pytest.param({}, {}, "", id="fits"),
    pytest.param({}, {"spot": True}, "", id="spot-pool-for-a-pod-that-selects-nothing"),
    pytest.param(
        {labels.SPOT: "true"},
        {},
        "the pod selects cloud.google.com/gke-spot=true but the pool's nodes carry no "
        "cloud.google.com/gke-spot label (GKE sets it from config.spot)",
        id="on-demand-pool-spot-pod",
    ),
    pytest.param(
        {labels.RESERVATION_NAME: "res-2"},
        {"reservation": "res-1"},
        "the pod selects cloud.google.com/reservation-name=res-2 but the pool's nodes carry "
        "cloud.google.com/reservation-name=res-1 (GKE sets it from config.reservationAffinity)",
        id="other-reservation",
    ),
    pytest.param(
        {labels.FLEX_START: "true"},
        {"spot": True},
        "the pod selects cloud.google.com/gke-flex-start=true but the pool's nodes carry no "
        "cloud.google.com/gke-flex-start label (GKE sets it from config.flexStart)",
        id="flex-start-pod-spot-pool",
    ),
    pytest.param(
        {labels.ZONE: "us-east5-c"},
        {},
        "the pod selects topology.kubernetes.io/zone=us-east5-c but the pool's nodes carry "
        "topology.kubernetes.io/zone=us-east5-b (GKE sets it from locations)",
        id="other-zone",
    ),
    pytest.param(
        {"team": "b"},
        {"labels": {"team": "a"}},
        "the pod selects team=b but the pool's node labels do not carry it",
        id="other-label",
    ),
    pytest.param(
        {},
        {"machine_type": "ct6e-standard-8t"},
        "pool slice-pool has ct6e-standard-8t VMs, the pod's slice needs ct6e-standard-4t",
        id="other-machine-type",
    ),
]


@pytest.mark.parametrize(("extra", "pool_fields", "why"), MISFIT)
def test_misfit(extra, pool_fields, why):
    request, spec, _ = _built(selectors=extra)
    assert selectors.misfit(request.selected, _pool(**pool_fields), spec) == why


def test_a_single_host_pool_lists_no_topology_and_is_not_a_misfit_for_it():
    request, spec, _ = _built(topology="2x2", selectors={})
    pool = _pool(machine_type=spec.machine_type, node_count=1, tpu_topology="")
    assert selectors.misfit(request.selected, pool, spec) == ""


@pytest.mark.parametrize(
    "extra",
    [
        {labels.SPOT: "true", labels.ICI_RESILIENCY: "false"},
        {labels.RESERVATION_NAME: "res-1", labels.RESERVATION_PROJECT: "other-proj"},
        {labels.LOCATION_HINT: "cell-a", labels.ZONE: "us-east5-c"},
    ],
    ids=["spot", "shared-reservation", "hint-and-zone"],
)
def test_predicted_node_labels_are_the_registered_nodes_labels(extra):
    # The sandbox registers Nodes from the pool GKE reports (sandbox.kube.nodes); what the
    # product predicts for the pool it sends must be exactly that, or a pod could pend on it.
    from google.cloud import container_v1
    from google.protobuf import json_format

    from sandbox.kube.nodes import node_manifests, pool_from_gke
    from shared.cloud.gke_messages import spec_to_node_pool

    _, spec, shape = _built(accelerator="tpu-v5p-slice", topology="2x2x2", selectors=extra)
    sent = json_format.MessageToDict(container_v1.NodePool.pb(spec_to_node_pool(spec)))
    for node in node_manifests("c", pool_from_gke(sent)):
        found = dict(node["metadata"]["labels"])
        found.pop("kubernetes.io/hostname")
        assert found == selectors.spec_node_labels(spec, shape.topology)


# --- Topology keys a pod requires of its nodes (exclusive placement, required pod affinity).

TPU7X = {"accelerator": "tpu7x", "topology": "4x4x4", "chips_per_vm": 4}


@pytest.mark.parametrize(
    ("annotations", "affinity_key", "refused"),
    [
        pytest.param({labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL}, None, "", id="exclusive-per-pool"),
        pytest.param({labels.EXCLUSIVE_TOPOLOGY: labels.HOSTNAME}, None, "", id="exclusive-per-host"),
        pytest.param({labels.EXCLUSIVE_TOPOLOGY: labels.ZONE}, None, "", id="exclusive-per-zone"),
        pytest.param(
            {labels.EXCLUSIVE_TOPOLOGY: labels.TPU_SLICE},
            None,
            "only GKE's slice controller",
            id="gke-tpu-slice",
        ),
        pytest.param(
            {labels.EXCLUSIVE_TOPOLOGY: "example.com/rack"}, None, "example.com/rack", id="unknown-key"
        ),
        pytest.param(
            {labels.EXCLUSIVE_TOPOLOGY: labels.TPU_SLICE, labels.NODE_SELECTOR_STRATEGY: "true"},
            None,
            "",
            id="node-selector-strategy-adds-no-affinity",
        ),
        pytest.param({}, labels.TPU_SLICE, "only GKE's slice controller", id="users-own-affinity-term"),
        pytest.param({}, labels.NODEPOOL, "", id="users-affinity-on-the-pool"),
    ],
)
def test_a_pool_is_built_only_when_its_nodes_carry_every_topology_key_the_pods_require(
    annotations, affinity_key, refused
):
    jobset = tpu_jobset("train", "team-a", uid="u-1", annotations=annotations, **TPU7X)
    if affinity_key:
        pod_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        term = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": affinity_key}
        pod_spec["affinity"] = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    request = slice_request(expand_pods(jobset)[0])
    if not refused:
        build_node_pool(SETTINGS, request)
        return
    with pytest.raises(Refused, match=refused):
        build_node_pool(SETTINGS, request)


def test_a_replicated_jobs_own_exclusive_topology_overrides_the_jobsets():
    # The JobSet controller copies the JobSet's annotation, then the replicated job template's, onto
    # each Job and its pods (JobSet v0.10.1 labelAndAnnotateObjects).
    jobset = tpu_jobset(
        "train", "team-a", uid="u-1", annotations={labels.EXCLUSIVE_TOPOLOGY: labels.TPU_SLICE}, **TPU7X
    )
    template = jobset["spec"]["replicatedJobs"][0]["template"]
    template.setdefault("metadata", {})["annotations"] = {labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL}
    pod = expand_pods(jobset)[0]
    assert pod["metadata"]["annotations"][labels.EXCLUSIVE_TOPOLOGY] == labels.NODEPOOL
    build_node_pool(SETTINGS, slice_request(pod))


def test_the_jobset_template_is_refused_as_its_pods_are():
    # The admission check and reconcile derive slices from the template (declared_request).
    from shared.tpu.declared import declared_request

    jobset = tpu_jobset(
        "train", "team-a", uid="u-1", annotations={labels.EXCLUSIVE_TOPOLOGY: labels.TPU_SLICE}, **TPU7X
    )
    request = declared_request(jobset, "slice", 0)
    with pytest.raises(Refused, match="only GKE's slice controller"):
        build_node_pool(SETTINGS, request)
