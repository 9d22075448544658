"""A slice's pool built under settings that have since changed: reported, and with
REPLACE_DRIFTED_POOLS replaced through refit's guarded delete when idle, never under a workload."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import logging
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.outcomes import CREATED, EXISTS, REPLACED, Outcome
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_RUNNING

BUILT_UNDER = Settings(
    unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c", cordon_settle_seconds=0
)
CLUSTER = BUILT_UNDER.cluster_path
NEW_SA = "tpu-nodes@p.iam.gserviceaccount.com"
# The operator has since moved the nodes to their own service account and bigger disks.
CHANGED = BUILT_UNDER.with_overrides(node_service_account=NEW_SA, disk_size_gb=200)
DRIFT = f"NODE_SERVICE_ACCOUNT: default -> {NEW_SA}; DISK_SIZE_GB: 100 -> 200"


def provision(settings: Settings, gke: FakeGke, kube: FakeKube, pod: dict[str, Any]) -> Outcome:
    meta = pod["metadata"]
    service = Provisioner(Services(settings, gke, kube))
    return service.handle_pending_pod(meta["namespace"], meta["name"], datetime.datetime.now(tz=datetime.UTC))


def built_pool(gke: FakeGke, kube: FakeKube) -> tuple[dict[str, Any], str, list[str]]:
    """A one-slice JobSet whose pool was built under BUILT_UNDER and runs; its pending pod."""
    jobset = tpu_jobset("train", "team-a", uid="uid-1", replicas=1, topology="2x2")
    kube.add_jobset(jobset)
    pod = expand_pods(jobset)[0]
    kube.add_pod(pod)
    assert provision(BUILT_UNDER, gke, kube, pod).result == CREATED
    (name,) = gke.managed_names(CLUSTER)
    gke.mark(CLUSTER, name, STATUS_RUNNING)
    return pod, name, kube.add_pool_nodes(gke.pools[CLUSTER][name])


def test_drift_is_only_reported_by_default(gke: FakeGke, kube: FakeKube) -> None:
    pod, name, nodes = built_pool(gke, kube)
    outcome = provision(CHANGED, gke, kube, pod)
    assert outcome == Outcome(
        EXISTS,
        f"pool {name} already exists (RUNNING); built under other settings ({DRIFT}), "
        "reported only (REPLACE_DRIFTED_POOLS=false)",
        name,
        outcome.slice,
    )
    assert gke.count("delete") == 0
    assert not any(kube.nodes[n]["spec"].get("unschedulable") for n in nodes)


def test_an_idle_drifted_pool_is_replaced_through_the_guard(gke: FakeGke, kube: FakeKube) -> None:
    pod, name, nodes = built_pool(gke, kube)
    settings = CHANGED.with_overrides(replace_drifted_pools=True)
    outcome = provision(settings, gke, kube, pod)
    message = f"deleted node pool {name} to build it under the current settings ({DRIFT})"
    assert (outcome.result, outcome.why, outcome.pool) == (REPLACED, message, name)
    assert gke.count("delete") == 1 and gke.managed_names(CLUSTER) == []
    assert all(kube.nodes[n]["spec"].get("unschedulable") for n in nodes)  # cordoned before the delete
    released = [(e["kind"], e["message"]) for e in kube.events if e["reason"] == labels.REASON_RELEASED]
    assert released == [("JobSet", message), ("Pod", message)]
    # The pod is still pending: its next event builds the pool under the current settings.
    assert provision(settings, gke, kube, pod).result == CREATED
    assert (gke.specs[name].service_account, gke.specs[name].disk_size_gb) == (NEW_SA, 200)
    gke.mark(CLUSTER, name, STATUS_RUNNING)
    assert provision(settings, gke, kube, pod).why == f"pool {name} already exists (RUNNING)"


def test_a_drifted_pool_a_jobset_pod_runs_on_is_kept_and_reported(gke: FakeGke, kube: FakeKube) -> None:
    pod, name, nodes = built_pool(gke, kube)
    running = copy.deepcopy(pod)  # a pod of the JobSet runs there (e.g. before a restart of its sibling)
    running["metadata"]["name"] = "still-running"
    kube.add_pod(running)
    kube.bind("team-a", "still-running", nodes[0])
    outcome = provision(CHANGED.with_overrides(replace_drifted_pools=True), gke, kube, pod)
    assert (outcome.result, outcome.why) == (
        EXISTS,
        f"pool {name} already exists (RUNNING); built under other settings ({DRIFT}), "
        "kept: replaced only when RUNNING, own and unused",
    )
    assert gke.count("delete") == 0
    assert not any(kube.nodes[n]["spec"].get("unschedulable") for n in nodes)  # our cordon lifted
    assert not [e for e in kube.events if e["reason"] == labels.REASON_RELEASED]


def test_a_pool_handed_to_another_jobset_is_not_replaced_for_drift(gke: FakeGke, kube: FakeKube) -> None:
    pod, name, _ = built_pool(gke, kube)
    pool = gke.pools[CLUSTER][name]
    gke.pools[CLUSTER][name] = dataclasses.replace(
        pool, labels={**pool.labels, labels.OWNER_UID: "another-uid"}
    )
    outcome = provision(CHANGED.with_overrides(replace_drifted_pools=True), gke, kube, pod)
    assert outcome.result == EXISTS and "kept" in outcome.why
    assert gke.count("delete") == 0


def test_the_sweep_reports_drift_and_never_replaces_on_its_own(
    gke: FakeGke, kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    _, name, nodes = built_pool(gke, kube)
    kube.pods.clear()  # no pending pod: nothing for provision to act on
    settings = CHANGED.with_overrides(replace_drifted_pools=True)
    with caplog.at_level(logging.INFO, logger="tpuprov.reconcile"):
        Reconciler(Services(settings, gke, kube)).sweep()
    assert gke.count("delete") == 0 and gke.managed_names(CLUSTER) == [name]
    assert not any(kube.nodes[n]["spec"].get("unschedulable") for n in nodes)
    drifted = [r for r in caplog.records if getattr(r, "fields", {}).get("event") == "reconcile.drift"]
    assert [(r.getMessage(), r.fields["settings"]) for r in drifted] == [  # type: ignore[attr-defined]
        (
            f"node pool {name} was built under other settings: {DRIFT}",
            ["NODE_SERVICE_ACCOUNT", "DISK_SIZE_GB"],
        )
    ]
