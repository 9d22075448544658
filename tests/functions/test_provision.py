"""Wire level: real CloudEvents into the provision function, real clients against both emulators."""

from __future__ import annotations

import base64
import json

import pytest

from sandbox.jobsets import cpu_jobset, tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.core import labels
from shared.events import entries as logentries
from shared.events.envelope import ClusterId
from tests.functions.deliveries import pending_event, submit

pytestmark = pytest.mark.integration


@pytest.fixture
def fn(world):
    return FunctionClient("provision")


def events_with(world, reason, namespace="team-a"):
    return [e for e in world.kube.list("v1", "events", namespace) if e.get("reason") == reason]


@pytest.mark.parametrize("mode", ["binary", "structured", "push"])
def test_pending_pod_creates_exactly_the_right_pool(world, fn, mode):
    jobset, pods = submit(world, tpu_jobset("train", "team-a", replicas=1, topology="4x4", chips_per_vm=4))
    response = fn.post_entry(pending_event(pods[0]), mode=mode)
    assert response.status_code == 200, response.data
    assert world.gke.count("create") == 1
    [pool] = world.pools()
    assert pool["config"]["machineType"] == "ct6e-standard-4t"
    assert pool["initialNodeCount"] == 4
    assert pool["placementPolicy"]["type"] == "COMPACT"
    assert pool["placementPolicy"]["tpuTopology"] == "4x4"
    assert pool["config"]["labels"][labels.OWNER_UID] == jobset["metadata"]["uid"]
    assert pool["config"]["labels"][labels.MANAGED_BY] == labels.MANAGED_BY_VALUE
    assert pool.get("autoscaling", {}).get("enabled", False) is False
    # The world's cluster is enrolled in REGULAR (GKE's default), which requires both on.
    assert pool["management"] == {"autoUpgrade": True, "autoRepair": True}
    assert pool["config"]["diskType"] == "hyperdisk-balanced"  # v6e boots from Hyperdisk only
    assert pool["locations"] == ["us-central2-b"]
    # One Event per group, on the JobSet (`kubectl describe jobset`) and on the pod that asked.
    events = events_with(world, labels.REASON_REQUESTED)
    assert sorted((e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events) == [
        ("JobSet", "train"),
        ("Pod", pods[0]["metadata"]["name"]),
    ]
    assert all(pool["name"] in e["message"] for e in events)


def test_duplicates_and_every_pod_of_the_slices_converge_on_one_pool_per_slice(world, fn):
    _, pods = submit(world, tpu_jobset("train", "team-a", replicas=2, topology="4x4", chips_per_vm=4))
    for _ in range(20):
        assert fn.post_entry(pending_event(pods[0])).status_code == 200
    for pod in pods:
        assert fn.post_entry(pending_event(pod)).status_code == 200
    assert world.gke.count("create") == 2
    assert len(world.pool_names()) == 2


def _follower(pod):
    pod["spec"]["nodeSelector"][labels.NODEPOOL] = "tpu-leaders-pool"


def _opt_out(pod):
    pod["metadata"]["labels"][labels.OPT_OUT] = "true"


def _scheduled(pod):
    pod["spec"]["nodeName"] = "gke-node-1"
    pod["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}


def _not_jobset(pod):
    for key in (labels.JOBSET_NAME, labels.REPLICATED_JOB_NAME, labels.JOB_INDEX):
        pod["metadata"]["labels"].pop(key, None)
        pod["metadata"]["annotations"].pop(key, None)


def _deleting(pod):
    pod["metadata"]["finalizers"] = ["example.com/hold"]


@pytest.mark.parametrize(
    ("jobset", "mutate"),
    [
        (tpu_jobset("f", "team-a", replicas=1), _follower),
        (cpu_jobset("cpu", "team-a"), None),
        (tpu_jobset("n", "team-a", replicas=1), _not_jobset),
        (tpu_jobset("o", "team-a", replicas=1), _opt_out),
        (tpu_jobset("s", "team-a", replicas=1), _scheduled),
        (tpu_jobset("d", "team-a", replicas=1), _deleting),
    ],
    ids=["follower", "non-tpu", "non-jobset", "opted-out", "scheduled", "being-deleted"],
)
def test_pods_that_must_not_get_a_pool(world, fn, jobset, mutate):
    _, pods = submit(world, jobset, mutate)
    if mutate is _deleting:
        world.kube.delete("v1", "pods", "team-a", pods[0]["metadata"]["name"])
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert world.gke.count("create") == 0


def test_gone_pod_and_foreign_cluster_make_no_create(world, fn):
    _, pods = submit(world, tpu_jobset("g", "team-a", replicas=1))
    world.kube.delete("v1", "pods", "team-a", pods[0]["metadata"]["name"])
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    other = ClusterId("test-proj", "us-central2-b", "someone-elses")
    assert fn.post_entry(pending_event(pods[1], cluster=other)).status_code == 200
    assert world.gke.count("create") == 0


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"namespace_allowlist": ("ml",)}, "NAMESPACE_ALLOWLIST"),
        ({"max_chips_per_slice": 8}, "MAX_CHIPS_PER_SLICE"),
        ({"chip_budget": 8}, "budget"),
        ({"allowed_accelerators": ("tpu-v5p-slice",)}, "ALLOWED_ACCELERATORS"),
        ({"drain": True}, "drain"),
    ],
    ids=["namespace", "chips-per-slice", "budget", "accelerator", "drain"],
)
def test_guardrail_refusal_creates_nothing_and_records_an_event(world, fn, overrides, why):
    world.configure(**overrides)
    _, pods = submit(world, tpu_jobset("big", "team-a", replicas=1, topology="4x4"))
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert world.gke.count("create") == 0
    refused = events_with(world, labels.REASON_REFUSED)
    assert refused and why in refused[0]["message"] and refused[0]["type"] == "Warning"


@pytest.mark.parametrize(
    ("status", "message"),
    [(429, "Too many operations"), (400, "Cluster is running incompatible operation operation-17")],
    ids=["429", "incompatible-operation"],
)
def test_transient_gke_errors_answer_non_2xx_then_succeed_on_redelivery(world, fn, status, message):
    _, pods = submit(world, tpu_jobset("t", "team-a", replicas=1))
    world.gke.fail_next("create", status, message, times=1)
    first = fn.post_entry(pending_event(pods[0]))
    assert first.status_code >= 500
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert len(world.pool_names()) == 1


def test_kubernetes_api_down_answers_non_2xx(world, fn):
    _, pods = submit(world, tpu_jobset("k", "team-a", replicas=1))
    world.kube.set_down(True)
    try:
        assert fn.post_entry(pending_event(pods[0])).status_code >= 500
    finally:
        world.kube.set_down(False)
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert world.gke.count("create") == 1


GARBAGE = [
    (
        {
            "ce-id": "1",
            "ce-source": "//x",
            "ce-specversion": "1.0",
            "ce-type": logentries.PUBSUB_EVENT_TYPE,
            "content-type": "application/json",
        },
        b'{"message": {"data": "!!!not-base64"}}',
    ),
    (
        {
            "ce-id": "2",
            "ce-source": "//x",
            "ce-specversion": "1.0",
            "ce-type": logentries.PUBSUB_EVENT_TYPE,
            "content-type": "application/json",
        },
        json.dumps({"message": {"data": base64.b64encode(b"{nope").decode()}}),
    ),
    (
        {
            "ce-id": "3",
            "ce-source": "//x",
            "ce-specversion": "1.0",
            "ce-type": logentries.PUBSUB_EVENT_TYPE,
            "content-type": "application/json",
        },
        b"[1, 2, 3]",
    ),
    (
        {
            "ce-id": "4",
            "ce-source": "//x",
            "ce-specversion": "1.0",
            "ce-type": "com.example.other",
            "content-type": "application/json",
        },
        b"{}",
    ),
    (
        {
            "ce-id": "5",
            "ce-source": "//x",
            "ce-specversion": "1.0",
            "ce-type": logentries.PUBSUB_EVENT_TYPE,
            "content-type": "application/json",
        },
        json.dumps(
            {"message": {"data": base64.b64encode(json.dumps({"textPayload": "marker"}).encode()).decode()}}
        ),
    ),
]


@pytest.mark.parametrize(
    ("headers", "body"), GARBAGE, ids=["bad-base64", "bad-json", "not-object", "wrong-type", "text-marker"]
)
def test_garbage_is_acked_without_any_api_call(world, fn, headers, body):
    response = fn.post_raw(headers, body)
    assert response.status_code == 200
    assert world.gke.calls == []
    assert world.kube.count() == 0


def _refused_on(world):
    return sorted(
        (e["involvedObject"]["kind"], e["involvedObject"]["name"].split("-slice-")[0])
        for e in events_with(world, labels.REASON_REFUSED)
    )


@pytest.mark.parametrize(
    ("jobset", "why"),
    [
        # GKE's dynamic-slicing sample: an exclusive topology only GKE's slice controller sets.
        (
            tpu_jobset(
                "dyn",
                "team-a",
                replicas=1,
                topology="2x2",
                annotations={labels.EXCLUSIVE_TOPOLOGY: labels.TPU_SLICE},
            ),
            "only GKE's slice controller sets",
        ),
        # One-pod Jobs on a 4-VM slice: the JobSet declares less than its pools would cost.
        (tpu_jobset("dyn", "team-a", replicas=4, topology="4x4", vms=1), "declare replicas: 1"),
    ],
    ids=["gke-tpu-slice", "one-pod-jobs"],
)
def test_a_refusal_of_what_the_jobset_declares_is_on_the_jobset_too(world, fn, jobset, why):
    _, pods = submit(world, jobset)
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert world.gke.count("create") == 0
    assert _refused_on(world) == [("JobSet", "dyn"), ("Pod", "dyn")]
    assert all(why in e["message"] for e in events_with(world, labels.REASON_REFUSED))


def test_a_pod_refused_for_its_own_selector_leaves_a_sound_jobset_alone(world, fn):
    """The pod's word never writes on its JobSet: its template declares a slice that can be built."""

    def own_selector(pod):
        pod["spec"]["nodeSelector"][labels.TPU_SLICE] = "test-slice"

    _, pods = submit(world, tpu_jobset("sound", "team-a", replicas=1, topology="2x2"), own_selector)
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    assert world.gke.count("create") == 0
    assert [k for k, _ in _refused_on(world)] == ["Pod"]
