"""The admission check over time: a failed slice recycled once its backoff is over, the Event that
arrives before Kueue wrote the check's entry, and flavors the check does not cover."""

from __future__ import annotations

import dataclasses
import datetime
import time
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.provisioning.admission.check import AdmissionChecker
from shared.provisioning.release.releaser import Releaser
from shared.provisioning.services import Services
from shared.tpu.jobsets import JobSet, expand_pods
from shared.tpu.nodepools import STATUS_ERROR, STATUS_RUNNING, NodePoolInfo, NodePoolSpec
from shared.tpu.slices import build_node_pool, slice_request
from tests.unit.provisioning.test_admission_check import (
    CHECK,
    CLUSTER,
    SETTINGS,
    finish_pools,
    setup,
    state_of,
)


def ago(seconds: float) -> str:
    then = datetime.datetime.now(tz=datetime.UTC) - datetime.timedelta(seconds=seconds)
    return then.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_failed_slice_is_recycled_after_its_backoff_and_requested_again(
    gke: FakeGke, kube: FakeKube
) -> None:
    settings = SETTINGS.with_overrides(stockout_backoff_seconds=60, stockout_backoff_max_seconds=60)
    now = [1000.0]
    _, wl = setup(kube, replicas=2)
    checker = AdmissionChecker(Services(settings, gke, kube, wall_clock=lambda: now[0]))
    checker.handle("team-a", wl["metadata"]["name"])
    first, second = sorted(gke.pools[CLUSTER])
    gke.mark(CLUSTER, first, STATUS_RUNNING)
    kube.add_pool_nodes(gke.pools[CLUSTER][first])
    gke.mark(CLUSTER, second, STATUS_ERROR, "GCE_STOCKOUT")
    assert checker.sweep()[0].state == "Retry"
    # Kueue evicts, waits requeueAfterSeconds, reserves again and resets the check to Pending.
    state_of(kube, wl)["state"] = "Pending"
    now[0] += 61
    result = checker.sweep()[0]
    assert result.state == "Pending"
    assert second not in gke.pools[CLUSTER] and gke.count("delete") == 1  # recycled
    assert first in gke.pools[CLUSTER]  # the slice that landed is kept
    assert checker.sweep()[0].created == (second,)  # and asked for again


def test_an_event_before_kueue_wrote_the_checks_entry_is_acted_on(gke: FakeGke, kube: FakeKube) -> None:
    _, wl = setup(kube, replicas=1)
    wl["status"]["admissionChecks"] = []
    kube.cluster_queues["cluster-queue"] = {
        "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK, "onFlavors": ["vlp"]}]}}
    }
    result = AdmissionChecker(Services(SETTINGS, gke, kube)).handle("team-a", wl["metadata"]["name"])
    assert result.state == "Pending" and gke.count("create") == 1
    assert state_of(kube, wl)["message"] == "pools ready 0/1"


def test_a_queue_whose_check_covers_other_flavors_is_left_to_the_pending_pod_path(
    gke: FakeGke, kube: FakeKube
) -> None:
    _, wl = setup(kube, replicas=1)
    wl["status"]["admissionChecks"] = []
    kube.cluster_queues["cluster-queue"] = {
        "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": CHECK, "onFlavors": ["other"]}]}}
    }
    result = AdmissionChecker(Services(SETTINGS, gke, kube)).handle("team-a", wl["metadata"]["name"])
    assert result.state == "" and gke.count("create") == 0 and kube.check_writes == []


def _finished_jobsets_pool(gke: FakeGke, kube: FakeKube) -> NodePoolSpec:
    """JobSet team-a/old completed a minute ago; its one pool is RUNNING (its Nodes are the test's)."""
    old = tpu_jobset("old", "team-a", replicas=1, uid="old-uid")
    old["status"] = {"conditions": [{"type": "Completed", "status": "True", "lastTransitionTime": ago(60)}]}
    kube.add_jobset(old)
    spec, _ = build_node_pool(SETTINGS, slice_request(expand_pods(old)[0]), gke.get_cluster(CLUSTER))
    gke.create_node_pool(CLUSTER, spec, "test")
    gke.mark(CLUSTER, spec.name, STATUS_RUNNING)
    return spec


def test_an_idle_pool_of_the_shape_is_handed_over_before_anything_is_created(
    gke: FakeGke, kube: FakeKube
) -> None:
    # A finished JobSet's pool that release keeps idle for a queued JobSet of its shape.
    spec = _finished_jobsets_pool(gke, kube)
    idle = gke.pools[CLUSTER][spec.name]
    gke.pools[CLUSTER][spec.name] = dataclasses.replace(
        idle, labels={**idle.labels, labels.IDLE_SINCE: str(int(time.time()) - 30)}
    )
    kube.add_pool_nodes(gke.pools[CLUSTER][spec.name])

    _, wl = setup(kube, replicas=2)
    checker = AdmissionChecker(Services(SETTINGS, gke, kube))
    result = checker.handle("team-a", wl["metadata"]["name"])
    assert result.state == "Pending" and len(result.created) == 1  # one slice taken over, one created
    assert gke.count("create") == 2  # the old JobSet's own create and this one
    adopted = gke.pools[CLUSTER][spec.name].labels
    assert (adopted[labels.OWNER_NAME], adopted[labels.OWNER_UID]) == ("train", "js-uid")
    assert adopted[labels.HANDED_OVER_FROM] == "old" and labels.IDLE_SINCE not in adopted
    assert labels.REASON_ADOPTED in kube.reasons()
    assert state_of(kube, wl)["message"] == "pools ready 1/2"

    new = result.created[0]
    gke.mark(CLUSTER, new, STATUS_RUNNING)
    kube.add_pool_nodes(gke.pools[CLUSTER][new])
    assert checker.sweep()[0].state == "Ready"
    assert state_of(kube, wl)["message"] == "pools ready 2/2"
    assert gke.count("create") == 2 and gke.count("delete") == 0


def test_a_pool_stamped_idle_for_the_jobset_while_its_pools_are_bought_goes(
    gke: FakeGke, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check listed the pools (the old JobSet's was not stamped yet), then the old JobSet's
    # release stamped it idle for this Workload's JobSet, then the check created its own. The check
    # reads the pools again after its creates and judges the stamped one: nobody else waits for it.
    spec = _finished_jobsets_pool(gke, kube)
    kube.add_pool_nodes(gke.pools[CLUSTER][spec.name])
    create = gke.create_node_pool

    def release_stamps_first(*args: Any, **kwargs: Any) -> Any:
        idle = gke.pools[CLUSTER][spec.name]
        stamp = {**idle.labels, labels.IDLE_SINCE: str(int(time.time()))}
        gke.pools[CLUSTER][spec.name] = dataclasses.replace(idle, labels=stamp)
        return create(*args, **kwargs)

    monkeypatch.setattr(gke, "create_node_pool", release_stamps_first)
    _, wl = setup(kube, replicas=1)
    result = AdmissionChecker(Services(SETTINGS, gke, kube)).handle("team-a", wl["metadata"]["name"])

    assert result.state == "Pending" and len(result.created) == 1
    assert spec.name not in gke.pools[CLUSTER] and gke.count("delete") == 1
    released = [e["message"] for e in kube.events if e["reason"] == labels.REASON_RELEASED]
    assert any(spec.name in m and "which bought its own" in m for m in released), released


NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def _workload(check: str | None, conditions: tuple[str, ...], requeue_in: float | None, active: bool = True):
    """The Workload Kueue made for JobSet team-a/train (uid js-uid), as Kueue writes its status."""
    status: dict = {
        "conditions": [{"type": c, "status": "True"} for c in conditions],
        "admissionChecks": [{"name": CHECK, "state": check}] if check else [],
    }
    if requeue_in is not None:
        at = datetime.datetime.fromtimestamp(NOW.timestamp() + requeue_in, tz=datetime.UTC)
        status["requeueState"] = {"requeueAt": at.strftime("%Y-%m-%dT%H:%M:%SZ")}
    owner = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train", "uid": "js-uid"}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "jobset-train",
            "namespace": "team-a",
            "ownerReferences": [{**owner, "controller": True}],
        },
        "spec": {"active": active, "podSets": [{"name": "slice", "count": 4}]},
        "status": status,
    }


@pytest.mark.parametrize(
    ("workload", "kept"),
    [
        (None, False),
        (_workload("Pending", ("QuotaReserved",), None), True),
        (_workload("Ready", ("QuotaReserved",), None), True),
        # Pending without quota (queued again): nothing provisions it now.
        (_workload("Pending", (), None), False),
        # After a Retry Kueue evicts it and requeues it at requeueAt: kept until then plus IDLE_POOL_SECONDS.
        (_workload("Pending", ("Evicted",), 200), True),
        (_workload("Pending", ("Evicted",), -119), True),
        (_workload("Pending", ("Evicted",), -121), False),
        # A requeue further off than any backoff of the product's is not waited for.
        (_workload("Pending", ("Evicted",), 7 * 3600), False),
        (_workload("Rejected", ("QuotaReserved",), None), False),
        (_workload("Pending", ("QuotaReserved",), None, active=False), False),
        (_workload("Pending", ("QuotaReserved", "Finished"), None), False),
        (_workload(None, ("QuotaReserved",), None), False),  # a queue without the product's check
    ],
    ids=[
        "no-workload",
        "pending-with-quota",
        "ready-with-quota",
        "pending-without-quota",
        "retry-before-requeue",
        "retry-within-idle-window",
        "retry-window-over",
        "retry-too-far-off",
        "rejected",
        "deactivated",
        "finished",
        "not-this-check",
    ],
)
def test_a_suspended_jobsets_pools_are_kept_while_its_workload_needs_them(
    gke: FakeGke, kube: FakeKube, workload: dict | None, kept: bool
) -> None:
    settings = SETTINGS.with_overrides(suspend_grace_seconds=600, idle_pool_seconds=120)
    jobset = tpu_jobset("train", "team-a", replicas=1, uid="js-uid")
    jobset["spec"]["suspend"] = True
    # Suspended since it was created, long ago: without its Workload its pools would go.
    jobset["status"] = {
        "conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }
    kube.add_jobset(jobset)
    if workload is not None:
        kube.add_workload(workload)
    pool = NodePoolInfo(
        name="p",
        status=STATUS_RUNNING,
        machine_type="ct6e-standard-4t",
        node_count=4,
        labels={labels.OWNER_NAMESPACE: "team-a", labels.OWNER_NAME: "train", labels.OWNER_UID: "js-uid"},
    )
    verdict = Releaser(settings, gke, kube).judge(pool, JobSet.parse(jobset), NOW)
    assert verdict.delete is (not kept), verdict.why


def test_a_record_a_tenant_writes_on_its_jobset_keeps_nothing(gke: FakeGke, kube: FakeKube) -> None:
    # The annotation earlier versions read: a tenant could write a stamp far in the future and keep a
    # suspended JobSet's pools forever after Kueue gave its quota to others.
    jobset = tpu_jobset("train", "team-a", replicas=1, uid="js-uid")
    jobset["spec"]["suspend"] = True
    jobset["metadata"]["annotations"]["tpuprov.dev/admission-check"] = "Pending@9999999999"
    jobset["status"] = {
        "conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
    }
    kube.add_jobset(jobset)
    pool = NodePoolInfo(
        name="p",
        status=STATUS_RUNNING,
        labels={labels.OWNER_NAMESPACE: "team-a", labels.OWNER_NAME: "train", labels.OWNER_UID: "js-uid"},
    )
    assert Releaser(SETTINGS, gke, kube).judge(pool, JobSet.parse(jobset), NOW).delete


def test_the_check_writes_nothing_on_the_jobset(gke: FakeGke, kube: FakeKube) -> None:
    # Its state lives in the Workload's status (Kueue's and the check's to write), not on the JobSet.
    _, wl = setup(kube, replicas=1)
    checker = AdmissionChecker(Services(SETTINGS, gke, kube))
    checker.handle("team-a", wl["metadata"]["name"])
    finish_pools(gke, kube)
    checker.sweep()
    assert kube.annotations == []
    assert state_of(kube, wl)["state"] == "Ready"


def test_a_lost_quota_reserved_event_is_made_up_for_by_the_sweep(gke: FakeGke, kube: FakeKube) -> None:
    _, wl = setup(kube, replicas=3)
    # No QuotaReserved delivery ever came: reconcile's sweep alone requests every slice.
    [result] = AdmissionChecker(Services(SETTINGS, gke, kube)).sweep()
    assert result.state == "Pending" and len(result.created) == 3
    assert state_of(kube, wl)["message"] == "pools ready 0/3"
