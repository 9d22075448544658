"""Trust boundary: what a pod's author controls must never buy a pool the guardrails forbid, or forge labels.

Wire level: pods are stored in the Kubernetes API, their FailedScheduling entries are posted to the
provision function, and the GKE emulator says what was created. Every refusal test has a control
that does create, so "no create" cannot pass by accident.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.kube.api import ApiError
from sandbox.testing.fnclient import FunctionClient
from shared.core import labels
from shared.events import entries as logentries
from tests.conftest import CLUSTER_ID

pytestmark = pytest.mark.integration

Mutate = Callable[[dict[str, Any]], None]
OWNERSHIP_KEYS = {
    labels.MANAGED_BY,
    labels.OWNER_NAMESPACE,
    labels.OWNER_NAME,
    labels.OWNER_UID,
    labels.OWNER_REPLICATED_JOB,
    labels.OWNER_JOB_INDEX,
}


@pytest.fixture
def fn(world):
    return FunctionClient("provision")


def submit(world, jobset: dict[str, Any], mutate: Mutate | None = None) -> tuple[dict[str, Any], list[dict]]:
    """Store the JobSet (the API assigns its uid), its Jobs and their pending pods, optionally altered."""
    return world.kube.submit_jobset(jobset, mutate)


def post_pending(fn: FunctionClient, pod: dict[str, Any]) -> None:
    meta = pod["metadata"]
    entry = logentries.pod_event_entry(CLUSTER_ID, meta["namespace"], meta["name"], meta.get("uid", ""))
    response = fn.post_entry(entry)
    assert response.status_code == 200, response.data


def refusals(world, namespace: str = "team-a") -> list[str]:
    return [
        e["message"]
        for e in world.kube.list("v1", "events", namespace)
        if e.get("reason") == labels.REASON_REFUSED and e.get("type") == "Warning"
    ]


# --- guardrails -------------------------------------------------------------------------------------


def test_namespaces_outside_the_allowlist_never_get_a_pool(world, fn):
    world.configure(namespace_allowlist=("team-a",))
    _, allowed = submit(world, tpu_jobset("ok", "team-a", replicas=1, topology="2x4"))
    _, outside = submit(world, tpu_jobset("sneaky", "team-b", replicas=2, topology="2x4"))
    for pod in outside + allowed:
        post_pending(fn, pod)
    assert world.gke.count("create") == 1
    [pool] = world.pools()
    assert pool["config"]["labels"][labels.OWNER_NAMESPACE] == "team-a"
    assert refusals(world, "team-b") and all("NAMESPACE_ALLOWLIST" in m for m in refusals(world, "team-b"))


@pytest.mark.parametrize(
    ("limit", "topology", "created"),
    [(16, "4x4", True), (15, "4x4", False), (256, "16x16", True), (255, "16x16", False), (4, "2x4", False)],
    ids=["16-of-16", "16-over-15", "256-of-256", "256-over-255", "8-over-4"],
)
def test_slices_above_the_chip_limit_are_refused(world, fn, limit, topology, created):
    world.configure(max_chips_per_slice=limit)
    _, pods = submit(world, tpu_jobset("big", "team-a", replicas=1, topology=topology))
    post_pending(fn, pods[0])
    assert world.gke.count("create") == (1 if created else 0)
    assert bool(refusals(world)) is not created
    if not created:
        assert "MAX_CHIPS_PER_SLICE" in refusals(world)[0]


def test_slices_beyond_the_chip_budget_are_refused_and_the_rest_created(world, fn):
    world.configure(chip_budget=32)  # two 4x4 slices of 16 chips fit; the third does not
    _, pods = submit(world, tpu_jobset("multi", "team-a", replicas=3, topology="4x4"))
    for pod in pods:
        post_pending(fn, pod)
    assert world.gke.count("create") == 2
    created = {p["config"]["labels"][labels.OWNER_JOB_INDEX] for p in world.pools()}
    assert len(created) == 2
    messages = refusals(world)
    assert messages and all("chip budget" in m and "CHIP_BUDGET 32" in m for m in messages)


@pytest.mark.parametrize(
    ("accelerator", "topology", "allowed"),
    [
        ("tpu-v99-slice", "2x2", ()),
        ("nvidia-tesla-a100", "2x2", ()),
        ("TPU-V6E-SLICE", "2x2", ()),
        ("tpu-v6e-slice", "3x3", ()),
        ("tpu-v6e-slice", "2x2x2", ()),
        ("tpu-v6e-slice", "2x2", ("tpu-v5p-slice",)),
    ],
    ids=["unknown-tpu", "gpu", "wrong-case", "bad-topology", "3d-on-2d", "not-allowed"],
)
def test_unknown_or_disallowed_accelerators_are_refused(world, fn, accelerator, topology, allowed):
    world.configure(allowed_accelerators=allowed)
    jobset = tpu_jobset("acc", "team-a", replicas=1, topology="2x2", vms=1)
    pod_spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod_spec["nodeSelector"].update({labels.TPU_ACCELERATOR: accelerator, labels.TPU_TOPOLOGY: topology})
    _, pods = submit(world, jobset)
    post_pending(fn, pods[0])
    assert world.gke.count("create") == 0
    assert refusals(world)


def test_the_accelerator_control_creates(world, fn):
    world.configure(allowed_accelerators=("tpu-v6e-slice",))
    _, pods = submit(world, tpu_jobset("acc", "team-a", replicas=1, topology="2x2"))
    post_pending(fn, pods[0])
    assert world.gke.count("create") == 1


def _strip_jobset_identity(pod: dict[str, Any]) -> None:
    for key in (labels.JOBSET_NAME, labels.REPLICATED_JOB_NAME, labels.JOB_INDEX, labels.JOBSET_UID):
        pod["metadata"]["labels"].pop(key, None)
        pod["metadata"]["annotations"].pop(key, None)


def _deployment_pod(pod: dict[str, Any]) -> None:
    _strip_jobset_identity(pod)
    pod["metadata"]["labels"]["app"] = "web"
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d9", "uid": "u", "controller": True}
    ]


def _name_only(pod: dict[str, Any]) -> None:
    for key in (labels.REPLICATED_JOB_NAME, labels.JOB_INDEX):
        pod["metadata"]["labels"].pop(key, None)
        pod["metadata"]["annotations"].pop(key, None)


def _non_numeric_index(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"][labels.JOB_INDEX] = "zero"
    pod["metadata"]["annotations"].pop(labels.JOB_INDEX, None)


@pytest.mark.parametrize(
    "mutate",
    [_strip_jobset_identity, _deployment_pod, _name_only, _non_numeric_index],
    ids=["bare-tpu-pod", "deployment-pod", "jobset-name-only", "non-numeric-index"],
)
def test_pods_that_are_not_jobset_slices_never_get_a_pool(world, fn, mutate):
    _, pods = submit(world, tpu_jobset("nj", "team-a", replicas=1, topology="2x2"), mutate)
    post_pending(fn, pods[0])
    assert world.gke.count("create") == 0
    assert world.kube.count("POST") == 0  # skipped quietly: not even an Event


# --- labels copied from pods ------------------------------------------------------------------------


def _selector(key: str, value: str) -> Mutate:
    def mutate(pod: dict[str, Any]) -> None:
        pod["spec"]["nodeSelector"][key] = value

    return mutate


def _affinity(key: str, value: str) -> Mutate:
    def mutate(pod: dict[str, Any]) -> None:
        term = {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }

    return mutate


def _identity_annotation(key: str, value: str) -> Mutate:
    # Annotations are free text (the API validates labels, not annotations), and the product falls
    # back to them for the JobSet identity it writes into ownership labels.
    def mutate(pod: dict[str, Any]) -> None:
        pod["metadata"]["labels"].pop(key, None)
        pod["metadata"]["annotations"][key] = value

    return mutate


# Selector material the API server's own validation refuses: such a pod never exists, so no
# FailedScheduling entry can name it (the product's own check of keys and values, its second line,
# is tests/unit/tpu/test_selectors.py's).
REFUSED_BY_THE_API = [
    ("selector-comma", _selector("team", "ml,tpuprov.dev/managed-by=tpu-provisioner")),
    ("selector-equals", _selector("team", "ml=x")),
    ("selector-newline", _selector("team", "ml\ntpuprov.dev/jobset-name=other")),
    ("selector-too-long", _selector("team", "v" * 64)),
    ("selector-bad-key", _selector("team name", "ml")),
    ("selector-bad-prefix", _selector("Example.COM/x", "ml")),
    ("affinity-comma", _affinity("team", "a,b=c")),
]


@pytest.mark.parametrize(
    "mutate", [m for _, m in REFUSED_BY_THE_API], ids=[name for name, _ in REFUSED_BY_THE_API]
)
def test_invalid_selector_material_is_refused_by_the_api_server(world, mutate):
    with pytest.raises(ApiError) as refused:
        submit(world, tpu_jobset("nj", "team-a", replicas=1, topology="2x2"), mutate)
    assert (refused.value.status, refused.value.reason) == (422, "Invalid")
    assert world.kube.list("v1", "pods", "team-a") == []


HOSTILE = [
    ("selector-product-key", _selector("tpuprov.dev/team", "ml")),
    ("selector-managed-by", _selector(labels.MANAGED_BY, labels.MANAGED_BY_VALUE)),
    ("selector-owner-name", _selector(labels.OWNER_NAME, "someone-else")),
    ("selector-owner-uid", _selector(labels.OWNER_UID, "6a3c9c61-0000-4000-8000-000000000000")),
    ("affinity-owner-namespace", _affinity(labels.OWNER_NAMESPACE, "kube-system")),
    ("annotation-jobset-comma", _identity_annotation(labels.JOBSET_NAME, "nj,tpuprov.dev/managed-by=x")),
    ("annotation-jobset-newline", _identity_annotation(labels.JOBSET_NAME, "nj\nevil=1")),
    ("annotation-jobset-too-long", _identity_annotation(labels.JOBSET_NAME, "n" * 64)),
    ("annotation-rjob-equals", _identity_annotation(labels.REPLICATED_JOB_NAME, "slice=evil")),
    ("annotation-uid-comma", _identity_annotation(labels.JOBSET_UID, "x,tpuprov.dev/jobset-name=y")),
    ("annotation-negative-index", _identity_annotation(labels.JOB_INDEX, "-1")),
]


@pytest.mark.parametrize("mutate", [m for _, m in HOSTILE], ids=[name for name, _ in HOSTILE])
def test_hostile_label_material_is_refused_before_any_create(world, fn, mutate):
    _, pods = submit(world, tpu_jobset("nj", "team-a", replicas=1, topology="2x2"), mutate)
    post_pending(fn, pods[0])
    assert world.gke.count("create") == 0
    assert refusals(world), "a refusal must be reported on the pod"


def test_valid_selectors_are_copied_and_ownership_labels_are_exactly_the_products(world, fn):
    world.configure(node_label_keys=("team", "example.com/"))
    extra = {"team": "ml", "example.com/tier": "gold"}
    jobset, pods = submit(
        world, tpu_jobset("copy", "team-a", replicas=1, topology="2x2", selectors=extra), None
    )
    post_pending(fn, pods[0])
    [pool] = world.pools()
    node_labels = pool["config"]["labels"]
    assert set(node_labels) == set(extra) | OWNERSHIP_KEYS
    assert {k: node_labels[k] for k in extra} == extra
    assert node_labels[labels.MANAGED_BY] == labels.MANAGED_BY_VALUE
    assert node_labels[labels.OWNER_NAMESPACE] == "team-a"
    assert node_labels[labels.OWNER_NAME] == "copy"
    assert node_labels[labels.OWNER_UID] == jobset["metadata"]["uid"]
    assert node_labels[labels.OWNER_JOB_INDEX] == "0"
    assert pool["config"]["resourceLabels"] == {
        labels.RESOURCE_LABEL_MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.RESOURCE_LABEL_NAMESPACE: "team-a",
        labels.RESOURCE_LABEL_JOBSET: "copy",
    }


@pytest.mark.parametrize(
    ("key", "allowed", "why"),
    [
        ("team", (), "NODE_LABEL_KEYS does not allow that key"),
        ("example.com/tier", ("team",), "NODE_LABEL_KEYS does not allow that key"),
        ("sandbox.gke.io/runtime", ("sandbox.gke.io/",), "belong to GKE's node features"),
        ("node.gke.io/x", (), "belong to GKE's node features"),
    ],
    ids=["no-allowlist", "other-key-allowed", "gke-io-even-if-listed", "gke-io-subdomain"],
)
def test_a_selector_becomes_a_node_label_only_when_the_operator_allows_its_key(world, fn, key, allowed, why):
    # A tenant's selector would otherwise stamp any label onto a pool: one other workloads select
    # (attracting or breaking them), one GKE's node features read, one a cost report groups by.
    if allowed and not any(a.endswith(".gke.io/") for a in allowed):
        world.configure(node_label_keys=allowed)
    _, pods = submit(world, tpu_jobset("lbl", "team-a", replicas=1, topology="2x2", selectors={key: "v"}))
    post_pending(fn, pods[0])
    assert world.gke.count("create") == 0
    assert any(why in m for m in refusals(world)), refusals(world)


# --- repeated and forged events -----------------------------------------------------------------------


def test_a_storm_of_forged_events_about_one_pod_costs_one_decision(world, fn):
    # Anyone who may write log entries in the project can write what the sinks route here. The pod is
    # real and pending but belongs to no JobSet's Job: the first delivery decides (no Job controls it,
    # so it is refused before any GKE call), the next hundred within EVENT_COALESCE_SECONDS cost
    # nothing at all.
    world.configure(event_coalesce_seconds=60)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "forged",
            "namespace": "team-a",
            "labels": {
                labels.JOBSET_NAME: "ghost",
                labels.REPLICATED_JOB_NAME: "slice",
                labels.JOB_INDEX: "0",
            },
        },
        "spec": {
            "nodeSelector": {labels.TPU_ACCELERATOR: "tpu-v6e-slice", labels.TPU_TOPOLOGY: "2x2"},
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {
                        "requests": {labels.TPU_RESOURCE: "4"},
                        "limits": {labels.TPU_RESOURCE: "4"},
                    },
                }
            ],
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }
    world.kube.put(pod)
    world.kube.clear_requests()
    for _ in range(100):
        post_pending(fn, pod)
    assert world.gke.count("list") == 0 and world.gke.count("create") == 0
    assert world.kube.count("GET", "/pods/forged") == 1  # the pod read once, not a hundred times
    # Entries about pods that do not exist at all cost one read each object, then nothing.
    world.kube.clear_requests()
    for i in range(100):
        post_pending(fn, {"metadata": {"name": f"nobody-{i % 5}", "namespace": "team-a"}})
    assert world.kube.count("GET") == 5 and world.gke.count("create") == 0


def test_a_delivery_that_failed_is_decided_again_on_redelivery(world, fn):
    # Coalescing never swallows a retry: only decisions that were made are remembered.
    world.configure(event_coalesce_seconds=60)
    _, pods = submit(world, tpu_jobset("retry", "team-a", replicas=1, topology="2x2"))
    world.kube.set_down(True)
    meta = pods[0]["metadata"]
    entry = logentries.pod_event_entry(CLUSTER_ID, meta["namespace"], meta["name"], meta.get("uid", ""))
    assert fn.post_entry(entry).status_code == 503
    world.kube.set_down(False)
    assert fn.post_entry(entry).status_code == 200
    assert world.gke.count("create") == 1
