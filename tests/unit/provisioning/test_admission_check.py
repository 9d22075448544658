"""The admission check: the pure decision (whole-object table), the Workload view, and the service
against the stateful fakes (all slices at once, Ready only with Ready nodes, Retry, Rejected)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.admission.check import AdmissionChecker
from shared.provisioning.admission.decide import CheckVerdict, SliceState, decide
from shared.provisioning.outcomes import EXISTS
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_ERROR, STATUS_PROVISIONING, STATUS_RUNNING
from shared.tpu.workloads import CheckState, parse_workload, workload_slices

SETTINGS = Settings(unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c")
CLUSTER = SETTINGS.cluster_path
CHECK = SETTINGS.admission_check_name


# --- the decision ------------------------------------------------------------------------------

RUNNING_READY = SliceState("a", STATUS_RUNNING, nodes=4, nodes_ready=4)


@pytest.mark.parametrize(
    ("slices", "refusal", "expected"),
    [
        ([], "shape refused", CheckVerdict("Rejected", "shape refused")),
        ([], "", CheckVerdict("Ready", "no TPU slices to provision")),
        (
            [SliceState("a"), SliceState("b")],
            "",
            CheckVerdict("Pending", "pools ready 0/2", create=("a", "b")),
        ),
        (
            [RUNNING_READY, SliceState("b", STATUS_PROVISIONING, nodes=4)],
            "",
            CheckVerdict("Pending", "pools ready 1/2"),
        ),
        # RUNNING is not enough: every Node of the slice must be Ready.
        (
            [RUNNING_READY, SliceState("b", STATUS_RUNNING, nodes=4, nodes_ready=3)],
            "",
            CheckVerdict("Pending", "pools ready 1/2", nodes_only=True),
        ),
        (
            [RUNNING_READY, SliceState("b", STATUS_RUNNING, nodes=2, nodes_ready=2)],
            "",
            CheckVerdict("Ready", "pools ready 2/2"),
        ),
        # A stockout of one slice: Retry after its backoff; nothing more is created.
        (
            [
                RUNNING_READY,
                SliceState("b", STATUS_ERROR, nodes=4, failed="stockout", retry_in=299.2),
                SliceState("c"),
            ],
            "",
            CheckVerdict(
                "Retry",
                "pools ready 1/3; could not provision b (stockout); retry in 300s",
                requeue_after=300,
            ),
        ),
        # Its backoff is over: the ERROR pool is being recycled, the check waits.
        (
            [RUNNING_READY, SliceState("b", STATUS_ERROR, nodes=4, failed="", retry_in=0.0)],
            "",
            CheckVerdict("Pending", "pools ready 1/2"),
        ),
        # Refusal wins over everything else.
        ([RUNNING_READY], "guardrail", CheckVerdict("Rejected", "guardrail")),
    ],
)
def test_decide(slices: list[SliceState], refusal: str, expected: CheckVerdict) -> None:
    assert decide(slices, refusal) == expected


# --- the Workload ------------------------------------------------------------------------------


def workload(
    jobset: dict[str, Any], *, checks: tuple[str, ...] = (CHECK,), reserved: bool = True, flavor: str = ""
) -> dict[str, Any]:
    meta = jobset["metadata"]
    rjobs = jobset["spec"]["replicatedJobs"]
    status: dict[str, Any] = {
        "admissionChecks": [
            {"name": name, "state": "Pending", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            for name in checks
        ],
        "conditions": [{"type": "QuotaReserved", "status": "True" if reserved else "False"}],
    }
    if reserved:
        status["admission"] = {
            "clusterQueue": "cluster-queue",
            "podSetAssignments": [
                {"name": r["name"], "flavors": {labels.TPU_RESOURCE: flavor or "vlp"}, "count": 2}
                for r in rjobs
            ],
        }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"jobset-{meta['name']}-abcde",
            "namespace": meta["namespace"],
            "uid": "wl-uid",
            "resourceVersion": "7",
            "ownerReferences": [
                {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"active": True, "podSets": [{"name": r["name"], "count": 2} for r in rjobs]},
        "status": status,
    }


def test_the_workload_view_reads_kueue_v1beta2_fields() -> None:
    jobset = tpu_jobset("train", "team-a", replicas=3, uid="js-uid")
    view = parse_workload(workload(jobset))
    assert (view.key, view.uid, view.owner_kind, view.owner_name, view.owner_uid) == (
        "team-a/jobset-train-abcde",
        "wl-uid",
        "JobSet",
        "train",
        "js-uid",
    )
    assert view.pod_sets == {"slice": 2}
    assert view.cluster_queue == "cluster-queue"
    assert view.assignments[0].flavors == {labels.TPU_RESOURCE: "vlp"}
    assert view.check(CHECK) == CheckState(CHECK, "Pending", "", "2026-01-01T00:00:00Z")
    assert view.has("QuotaReserved") and not view.has("Admitted") and view.done == ""
    evicted = workload(jobset)
    evicted["status"]["conditions"].append({"type": "Evicted", "status": "True"})
    assert parse_workload(evicted).done == "evicted"
    evicted["spec"]["active"] = False
    assert parse_workload(evicted).done == "deactivated"


def test_slices_have_the_pool_names_provision_gives_their_pods() -> None:
    jobset = tpu_jobset("train", "team-a", replicas=3, uid="js-uid")
    found = workload_slices(jobset, {"slice": 8}, {})
    assert [s.request.slice_id.job_index for s in found] == [0, 1, 2]
    # The pending-pod path, on the JobSet's real pods, would name the very same pools.
    from shared.tpu.slices import slice_request

    by_pods = {slice_request(p).pool_name for p in expand_pods(jobset)}
    assert {s.request.pool_name for s in found} == by_pods


def test_flavor_labels_complete_a_template_that_selects_no_shape() -> None:
    jobset = tpu_jobset("train", "team-a", replicas=1, uid="js-uid")
    selector = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]
    shape = dict(selector)
    selector.clear()
    found = workload_slices(jobset, {"slice": 4}, {"slice": shape})
    assert (found[0].request.accelerator, found[0].request.topology) == ("tpu-v6e-slice", "4x4")
    assert found[0].missing_selector == shape
    assert selector == {}  # the JobSet read is not changed


# --- the service -------------------------------------------------------------------------------


def setup(kube: FakeKube, replicas: int = 3, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    jobset = tpu_jobset("train", "team-a", replicas=replicas, uid="js-uid", **kwargs)
    jobset["spec"]["suspend"] = True  # Kueue keeps it suspended until admission
    kube.add_jobset(jobset)
    kube.flavors["vlp"] = {"metadata": {"name": "vlp"}, "spec": {"nodeLabels": {}}}
    wl = workload(jobset)
    kube.add_workload(wl)
    return jobset, wl


def state_of(kube: FakeKube, wl: dict[str, Any]) -> dict[str, Any]:
    stored = kube.workloads[(wl["metadata"]["namespace"], wl["metadata"]["name"])]
    return next(c for c in stored["status"]["admissionChecks"] if c["name"] == CHECK)


def finish_pools(gke: FakeGke, kube: FakeKube) -> None:
    for name in list(gke.pools.get(CLUSTER, {})):
        gke.mark(CLUSTER, name, STATUS_RUNNING)
        kube.add_pool_nodes(gke.pools[CLUSTER][name])


def test_every_slice_is_requested_at_once_and_ready_only_when_nodes_are(gke: FakeGke, kube: FakeKube) -> None:
    jobset, wl = setup(kube, replicas=3)
    checker = AdmissionChecker(Services(SETTINGS, gke, kube))
    result = checker.handle("team-a", wl["metadata"]["name"], "QuotaReserved")
    assert result.state == "Pending" and len(result.created) == 3
    assert gke.count("create") == 3
    assert state_of(kube, wl)["message"] == "pools ready 0/3"
    assert ("Workload", "TPUSlicesPending") in {(e["kind"], e["reason"]) for e in kube.events}
    assert ("JobSet", "TPUSlicesPending") in {(e["kind"], e["reason"]) for e in kube.events}

    # Nothing new: the sweep neither creates again nor rewrites the state.
    writes = len(kube.check_writes)
    assert [r.state for r in checker.sweep()] == ["Pending"]
    assert gke.count("create") == 3 and len(kube.check_writes) == writes

    names = list(gke.pools[CLUSTER])
    gke.mark(CLUSTER, names[0], STATUS_RUNNING)
    kube.add_pool_nodes(gke.pools[CLUSTER][names[0]])
    assert checker.sweep()[0].state == "Pending"
    assert state_of(kube, wl)["message"] == "pools ready 1/3"

    finish_pools(gke, kube)
    for node in kube.nodes.values():  # registered, not Ready yet
        node["status"]["conditions"][0]["status"] = "False"
    assert checker.sweep()[0].state == "Pending"
    # Ready, but the API server's not-ready taint is still on (the node lifecycle controller takes it
    # off a moment later): the scheduler would refuse the pods, so the slices are not ready yet.
    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    for node in kube.nodes.values():
        node["status"]["conditions"][0]["status"] = "True"
        node["spec"]["taints"] = [
            {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"},
            not_ready,
        ]
    assert checker.sweep()[0].state == "Pending"
    assert state_of(kube, wl)["message"] == "pools ready 0/3"
    for node in kube.nodes.values():
        node["spec"]["taints"] = [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}]
    assert checker.sweep()[0].state == "Ready"
    ready = state_of(kube, wl)
    assert ready["message"] == "pools ready 3/3" and "podSetUpdates" not in ready
    assert [e["kind"] for e in kube.events if e["reason"] == "TPUSlicesReady"] == ["Workload", "JobSet"]
    # Ready is final for the check: later looks do nothing.
    assert checker.sweep() == []

    # The pending-pod path finds every pool the check made: a no-op.
    jobset["spec"]["suspend"] = False
    kube.add_jobset(jobset)
    pod = expand_pods(jobset)[4]
    kube.add_pod(pod)
    outcome = Provisioner(Services(SETTINGS, gke, kube)).handle_pending_pod(
        "team-a", pod["metadata"]["name"], None
    )
    assert outcome.result == EXISTS and gke.count("create") == 3


def test_a_template_without_the_shape_gets_the_flavor_selector_as_pod_set_update(gke, kube) -> None:
    jobset, wl = setup(kube, replicas=1)
    spec = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    shape = spec.pop("nodeSelector")
    kube.add_jobset(jobset)
    kube.flavors["vlp"]["spec"]["nodeLabels"] = shape
    checker = AdmissionChecker(Services(SETTINGS, gke, kube))
    checker.handle("team-a", wl["metadata"]["name"])
    finish_pools(gke, kube)
    assert checker.sweep()[0].state == "Ready"
    assert state_of(kube, wl)["podSetUpdates"] == [{"name": "slice", "nodeSelector": shape}]


def test_a_quota_refusal_of_one_slice_is_retry_with_its_backoff(gke, kube) -> None:
    settings = SETTINGS.with_overrides(stockout_backoff_seconds=300)
    _, wl = setup(kube, replicas=4)
    gke.fail("create", "quota", times=1)
    result = AdmissionChecker(Services(settings, gke, kube, wall_clock=lambda: 1000.0)).handle(
        "team-a", wl["metadata"]["name"]
    )
    assert result.state == "Retry"
    entry = state_of(kube, wl)
    assert entry["requeueAfterSeconds"] == 300
    assert "could not provision" in entry["message"] and "retry in 300s" in entry["message"]
    # The slices that landed are kept for the retry (not deleted).
    assert len(gke.pools[CLUSTER]) == 3 and gke.count("delete") == 0
    warnings = [e for e in kube.events if e["reason"] == "TPUSlicesRetry"]
    assert {e["kind"] for e in warnings} == {"Workload", "JobSet"} and warnings[0]["type"] == "Warning"


def test_a_stockout_pool_in_error_is_retry_and_nothing_more_is_created(gke, kube) -> None:
    settings = SETTINGS.with_overrides(stockout_backoff_seconds=600, stockout_backoff_max_seconds=600)
    _, wl = setup(kube, replicas=2)
    checker = AdmissionChecker(Services(settings, gke, kube, wall_clock=lambda: 5000.0))
    checker.handle("team-a", wl["metadata"]["name"])
    first, second = list(gke.pools[CLUSTER])
    gke.mark(CLUSTER, first, STATUS_RUNNING)
    kube.add_pool_nodes(gke.pools[CLUSTER][first])
    gke.mark(CLUSTER, second, STATUS_ERROR, "GCE_STOCKOUT: no more capacity in the zone")
    result = checker.sweep()[0]
    assert result.state == "Retry"
    assert state_of(kube, wl)["requeueAfterSeconds"] == 600
    assert gke.count("create") == 2 and gke.count("delete") == 0


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda s, j: (s, {**j, "topology": "3x3"}), "3x3"),
        (lambda s, j: (s.with_overrides(namespace_allowlist=("other",)), j), "NAMESPACE_ALLOWLIST"),
        (lambda s, j: (s.with_overrides(max_chips_per_slice=8), j), "MAX_CHIPS_PER_SLICE"),
    ],
)
def test_what_can_never_succeed_is_rejected_with_the_reason(gke, kube, change, why) -> None:
    settings, shape = change(SETTINGS, {"topology": "4x4"})
    _, wl = setup(kube, replicas=2, **shape)
    result = AdmissionChecker(Services(settings, gke, kube)).handle("team-a", wl["metadata"]["name"])
    assert result.state == "Rejected"
    assert why in state_of(kube, wl)["message"]
    assert gke.count("create") == 0
    assert {e["kind"] for e in kube.events if e["reason"] == "TPUSlicesRejected"} == {"Workload", "JobSet"}


def test_a_policy_no_pool_can_follow_is_rejected_naming_the_slice_and_buys_nothing(gke, kube) -> None:
    # The group is planned whole before anything is charged or sent (SliceGroupEngine.plan): one
    # slice whose capacity policy cannot be parsed refuses the Workload, with that slice named.
    jobset, wl = setup(kube, replicas=2)
    jobset["metadata"].setdefault("annotations", {})[labels.CAPACITY_POLICY] = "no-such-capacity"
    kube.add_jobset(jobset)
    result = AdmissionChecker(Services(SETTINGS, gke, kube)).handle("team-a", wl["metadata"]["name"])
    assert result.state == "Rejected"
    message = state_of(kube, wl)["message"]
    assert message.startswith("team-a/train slice[0]: ") and labels.CAPACITY_POLICY in message
    assert gke.count("create") == 0


def test_workloads_the_check_does_not_own_are_left_alone(gke, kube) -> None:
    jobset, _ = setup(kube)
    other = workload(jobset, checks=("someone-else",))
    other["metadata"]["name"] = "other"
    kube.add_workload(other)
    waiting = workload(jobset, reserved=False)
    waiting["metadata"]["name"] = "waiting"
    kube.add_workload(waiting)
    evicted = copy.deepcopy(workload(jobset))
    evicted["metadata"]["name"] = "evicted"
    evicted["status"]["conditions"].append({"type": "Evicted", "status": "True"})
    kube.add_workload(evicted)
    checker = AdmissionChecker(Services(SETTINGS, gke, kube))
    assert checker.handle("team-a", "other").state == ""
    assert checker.handle("team-a", "waiting").why == "no quota reserved yet"
    assert checker.handle("team-a", "evicted").why == "Workload is evicted"
    assert checker.handle("team-a", "gone").why == "Workload no longer exists"
    assert gke.count("create") == 0 and kube.check_writes == []


def test_the_check_is_kept_active(gke, kube) -> None:
    checker = AdmissionChecker(Services(SETTINGS, gke, kube))
    assert checker.keep_active() is False  # no such AdmissionCheck in the cluster
    kube.admission_checks[CHECK] = ""
    assert checker.keep_active() is True and kube.admission_checks[CHECK]
