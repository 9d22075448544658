"""The simulated Kueue against the in-process Kubernetes API, with the JobSet controller running.

Queue configurations go through the product's own path: parsed and validated by
``shared.kueue.config``, rendered by ``shared.kueue.render`` and server-side applied by
``KueueService`` over the official client. JobSets are v5e 2x4 slices (2 VMs x 4 chips = 8 chips).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandbox.cluster.common import JOBSET_API, SimContext, condition, is_true
from sandbox.cluster.controllers import JobSetController
from sandbox.cluster.kueue import KueueController
from sandbox.cluster.kueue_objects import KUEUE_API, PRIORITY_CLASS_LABEL, QUEUE_NAME_LABEL, workload_name
from sandbox.emulators.kube.api import KubeApiServer
from sandbox.jobsets import tpu_jobset
from sandbox.polling import eventually
from sandbox.stack.config import DEFAULT_MANIFESTS_DIR
from sandbox.stack.timeline import Timeline
from shared.cloud.objects import ApiClientObjects, Bounds
from shared.core import labels
from shared.kueue.apply import KueueService
from shared.kueue.config import parse_config

pytestmark = pytest.mark.integration

V5E = "tpu-v5-lite-podslice"


def _config(
    quota: int = 24,
    strategy: str = "BestEffortFIFO",
    preemption: str = "{withinClusterQueue: LowerPriority}",
    extra_label: str = "",
) -> str:
    node_labels = f"\n    nodeLabels: {{{extra_label}}}" if extra_label else ""
    return f"""
flavors:
  - name: v5e-2x4
    accelerator: {V5E}
    topology: 2x4{node_labels}
clusterQueues:
  - name: cq
    queueingStrategy: {strategy}
    preemption: {preemption}
    quota: {{v5e-2x4: {quota}}}
localQueues:
  - {{name: lq, namespace: default, clusterQueue: cq}}
priorityClasses:
  - {{name: low, value: 100, kind: WorkloadPriorityClass}}
  - {{name: high, value: 1000, kind: WorkloadPriorityClass}}
"""


COHORT = f"""
flavors:
  - {{name: v5e-2x4, accelerator: {V5E}, topology: 2x4}}
clusterQueues:
  - name: team-a
    cohort: pool
    preemption: {{reclaimWithinCohort: Any, withinClusterQueue: LowerPriority}}
    quota: {{v5e-2x4: 16}}
  - name: team-b
    cohort: pool
    preemption: {{reclaimWithinCohort: Any, withinClusterQueue: LowerPriority}}
    quota: {{v5e-2x4: 16}}
localQueues:
  - {{name: a, namespace: default, clusterQueue: team-a}}
  - {{name: b, namespace: default, clusterQueue: team-b}}
"""


class Cluster:
    """The Kubernetes API with the JobSet controller and the Kueue simulation."""

    def __init__(self, kube: KubeApiServer) -> None:
        self.kube = kube
        self.ctx = SimContext(kube, Timeline())
        self.jobsets = JobSetController(self.ctx, interval=0.05)
        self.kueue = KueueController(self.ctx, interval=0.05)

    def apply(self, text: str) -> None:
        client = self.kube.api_client()
        try:
            KueueService(ApiClientObjects(client), Bounds(total=10, webhook_retry=5, poll=0.1)).apply(
                parse_config(text)
            )
        finally:
            client.close()

    def submit(self, name: str, slices: int, queue: str = "lq", priority: str = "") -> dict[str, Any]:
        jobset = tpu_jobset(name, replicas=slices, accelerator=V5E, topology="2x4", chips_per_vm=4)
        jobset["metadata"].pop("uid")
        jobset["metadata"]["labels"] = {QUEUE_NAME_LABEL: queue}
        if priority:
            jobset["metadata"]["labels"][PRIORITY_CLASS_LABEL] = priority
        stored = self.kube.put(jobset)
        time.sleep(0.01)  # distinct arrival order even within one creationTimestamp second
        return stored

    def jobset(self, name: str) -> dict[str, Any]:
        found = self.kube.get(JOBSET_API, labels.JOBSET_PLURAL, "default", name)
        assert found is not None
        return found

    def workload(self, name: str) -> dict[str, Any]:
        found = self.kube.get(KUEUE_API, "workloads", "default", workload_name(self.jobset(name)))
        assert found is not None
        return found

    def running(self, name: str) -> bool:
        return (self.jobset(name).get("spec") or {}).get("suspend") is False

    def pods(self, name: str) -> list[dict[str, Any]]:
        return self.kube.list("v1", "pods", "default", label_selector=f"{labels.JOBSET_NAME}={name}")

    def finish(self, name: str, kind: str = "Completed") -> None:
        """End a JobSet as the JobSet controller would once its pods are done."""
        jobset = self.jobset(name)
        status = dict(jobset.get("status") or {})
        status["conditions"] = [
            *(status.get("conditions") or []),
            {"type": kind, "status": "True", "reason": "AllJobsCompleted", "message": "done"},
        ]
        self.kube.patch_status(JOBSET_API, labels.JOBSET_PLURAL, "default", name, status)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.list("v1", "events", "default") if e.get("reason") == reason]


def steady(check: Callable[[], Any], seconds: float = 0.4) -> None:
    """``check`` holds for a while (the simulation had several passes to change it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check()
        time.sleep(0.05)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    manifests = [DEFAULT_MANIFESTS_DIR / "jobset-v0.10.1.yaml", DEFAULT_MANIFESTS_DIR / "kueue-v0.19.2.yaml"]
    with KubeApiServer(crd_files=manifests) as kube:
        sim = Cluster(kube)
        sim.jobsets.start()
        sim.kueue.start()
        try:
            yield sim
        finally:
            sim.kueue.stop()
            sim.jobsets.stop()
            assert sim.kueue.errors == [] and sim.jobsets.errors == []


def test_queued_jobset_is_created_suspended_with_a_workload_and_admitted_with_flavor_labels(
    cluster: Cluster,
) -> None:
    cluster.apply(_config(extra_label="pool-tier: gold"))
    stored = cluster.submit("train", slices=2)
    assert stored["spec"]["suspend"] is True  # the webhook, before any controller ran

    eventually(lambda: cluster.running("train"))
    workload = cluster.workload("train")
    assert workload["metadata"]["ownerReferences"][0]["uid"] == stored["metadata"]["uid"]
    assert [(p["name"], p["count"]) for p in workload["spec"]["podSets"]] == [("slice", 4)]
    assert is_true(workload, "QuotaReserved") and is_true(workload, "Admitted")
    (assignment,) = workload["status"]["admission"]["podSetAssignments"]
    assert assignment["flavors"] == {labels.TPU_RESOURCE: "v5e-2x4"}
    assert assignment["resourceUsage"] == {labels.TPU_RESOURCE: "16"}
    selector = cluster.jobset("train")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "nodeSelector"
    ]
    assert selector == {labels.TPU_ACCELERATOR: V5E, labels.TPU_TOPOLOGY: "2x4", "pool-tier": "gold"}
    pods = eventually(lambda: len(cluster.pods("train")) == 4 and cluster.pods("train"))
    assert {p["spec"]["nodeSelector"].get("pool-tier") for p in pods} == {"gold"}
    (created,) = cluster.events("CreatedWorkload")
    assert created["message"] == f"Created Workload: default/{workload['metadata']['name']}"
    (started,) = cluster.events("Started")
    assert started["message"] == "Admitted by clusterQueue cq"


@pytest.mark.parametrize(
    ("strategy", "small_runs"),
    [("BestEffortFIFO", True), ("StrictFIFO", False)],
    ids=["best-effort-lets-a-later-fit-go", "strict-blocks-behind-the-head"],
)
def test_admission_follows_quota_and_queue_order(cluster: Cluster, strategy: str, small_runs: bool) -> None:
    cluster.apply(_config(quota=24, strategy=strategy))
    cluster.submit("first", slices=2)  # 16 of 24 chips
    eventually(lambda: cluster.running("first"))
    cluster.submit("big", slices=2)  # 16 more: does not fit
    cluster.submit("small", slices=1)  # 8: fits the 8 left
    message = eventually(
        lambda: str((condition(cluster.workload("big"), "QuotaReserved") or {}).get("message"))
    )
    assert message.startswith(
        "couldn't assign flavors to pod set slice: "
        "insufficient unused quota for google.com/tpu in flavor v5e-2x4"
    )
    if small_runs:
        eventually(lambda: cluster.running("small"))
    else:
        steady(lambda: not cluster.running("small"))
    assert not cluster.running("big") and not cluster.pods("big")

    cluster.finish("first")  # its quota comes back at once
    eventually(lambda: cluster.running("big"))
    if not small_runs:
        eventually(lambda: cluster.running("small"))
    assert cluster.kueue.admitted() == {"default/big": "v5e-2x4", "default/small": "v5e-2x4"}


def test_a_workload_larger_than_the_queue_never_fits(cluster: Cluster) -> None:
    cluster.apply(_config(quota=16))
    cluster.submit("huge", slices=3)
    message = eventually(lambda: (condition(cluster.workload("huge"), "QuotaReserved") or {}).get("message"))
    assert "request > maximum capacity (24 > 16)" in message
    steady(lambda: not cluster.running("huge"))


def test_higher_priority_preempts_lower_which_is_requeued(cluster: Cluster) -> None:
    cluster.apply(_config(quota=24))
    cluster.submit("low", slices=3, priority="low")
    eventually(lambda: len(cluster.pods("low")) == 6)
    cluster.submit("high", slices=2, priority="high")

    eventually(lambda: cluster.running("high"))
    low = cluster.jobset("low")
    assert low["spec"]["suspend"] is True and is_true(low, "Suspended")
    assert not cluster.pods("low")  # the JobSet controller deleted them on suspend
    workload = cluster.workload("low")
    evicted = condition(workload, "Evicted") or {}
    assert evicted.get("reason") == "Preempted" and evicted.get("status") == "True"
    assert (condition(workload, "Preempted") or {}).get("reason") == "InClusterQueue"
    assert "due to prioritization in the ClusterQueue" in str(evicted.get("message"))
    # Kueue gave the quota back only once low had stopped; that is what let high in.
    assert not is_true(workload, "QuotaReserved") and is_true(workload, "Requeued")
    (stopped,) = cluster.events("Stopped")
    assert stopped["involvedObject"]["name"] == "low"
    assert stopped["message"].startswith("Preempted to accommodate a workload (UID: ")

    cluster.finish("high")
    eventually(lambda: cluster.running("low"))  # requeued, admitted again once quota is back
    assert is_true(cluster.workload("low"), "Admitted")


def test_lower_priority_does_not_preempt(cluster: Cluster) -> None:
    cluster.apply(_config(quota=16))
    cluster.submit("high", slices=2, priority="high")
    eventually(lambda: cluster.running("high"))
    cluster.submit("low", slices=1, priority="low")
    steady(lambda: cluster.running("high") and not cluster.running("low"))


def test_cohort_borrowing_and_reclaim(cluster: Cluster) -> None:
    cluster.apply(COHORT)
    cluster.submit("a1", slices=2, queue="a")  # team-a's own 16
    cluster.submit("a2", slices=2, queue="a")  # borrowed from team-b's idle 16
    eventually(lambda: cluster.running("a1") and cluster.running("a2"))

    cluster.submit("b1", slices=2, queue="b")  # team-b wants its nominal quota back
    eventually(lambda: cluster.running("b1"))
    assert not cluster.running("a2") and cluster.running("a1")
    preempted = condition(cluster.workload("a2"), "Preempted") or {}
    assert preempted.get("reason") == "InCohortReclamation"
    assert "preemptor path: /pool/team-b; preemptee path: /pool/team-a" in str(preempted.get("message"))


@pytest.mark.parametrize("end", ["finish", "delete"])
def test_quota_is_released_when_a_jobset_ends(cluster: Cluster, end: str) -> None:
    cluster.apply(_config(quota=16))
    cluster.submit("one", slices=2)
    eventually(lambda: cluster.running("one"))
    cluster.submit("two", slices=2)
    steady(lambda: not cluster.running("two"))
    if end == "finish":
        cluster.finish("one", "Failed")
        eventually(lambda: is_true(cluster.workload("one"), "Finished"))
    else:
        cluster.kube.delete(JOBSET_API, labels.JOBSET_PLURAL, "default", "one")
    eventually(lambda: cluster.running("two"))


def test_unadmitted_jobset_unsuspended_by_hand_is_suspended_again(cluster: Cluster) -> None:
    cluster.submit("sneaky", slices=1, queue="missing")
    message = eventually(
        lambda: (condition(cluster.workload("sneaky"), "QuotaReserved") or {}).get("message")
    )
    assert message == "LocalQueue missing doesn't exist"
    jobset = cluster.jobset("sneaky")
    jobset["spec"]["suspend"] = False
    cluster.kube.put(jobset)
    # The JobSet controller may start pods before Kueue suspends it again; it then deletes them.
    eventually(lambda: cluster.jobset("sneaky")["spec"]["suspend"] is True and not cluster.pods("sneaky"))
    steady(lambda: cluster.jobset("sneaky")["spec"]["suspend"] is True and not cluster.pods("sneaky"))


def test_jobsets_without_a_queue_are_left_alone(cluster: Cluster) -> None:
    cluster.apply(_config())
    jobset = tpu_jobset("plain", replicas=1, accelerator=V5E, topology="2x4", chips_per_vm=4)
    jobset["metadata"].pop("uid")
    assert "suspend" not in cluster.kube.put(jobset)["spec"]
    eventually(lambda: len(cluster.pods("plain")) == 2)
    assert cluster.kube.list(KUEUE_API, "workloads") == []
