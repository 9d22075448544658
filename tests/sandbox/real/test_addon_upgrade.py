"""setup_cluster on a cluster that already runs older add-ons, as users' clusters do (xpk's).

The operator installed JobSet v0.11.1 and Kueue v0.18.4 the way xpk does (``kubectl apply
--server-side`` of the release manifests, here rendered from those versions' Go modules by
``sandbox.kube.build``; their controllers are those versions' binaries), applied the tutorial's
queues and queued a JobSet, held (ClusterQueue ``stopPolicy: Hold``) for the maintenance. Then the
product's ``setup_cluster`` runs with the defaults (ADDON_UPGRADE=keep-newer): Kueue v0.18.4 is
older than the pinned v0.19.2 and is upgraded in place, JobSet v0.11.1 is newer than the pinned
v0.10.1 and supported, so it is left alone. The Workload, the queues and the JobSet come through the
upgrade as they were (same UIDs), and once the hold is lifted the real Kueue v0.19.2 admits the
JobSet, ``provision`` creates its pools, it runs to completion and its pools are released.
``tpuprov doctor``'s lines name both versions and call both supported.

Opt-in with the version matrix (``TPUPROV_VERSION_MATRIX=1``, ``make test-matrix``): it needs the
extra controllers built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.kube import build
from sandbox.kube.api import ApiError
from sandbox.realstack import demo
from sandbox.realstack.core import RealStack
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from shared.app.deployment import RetryPolicy
from shared.core.errors import NotFoundError
from shared.setup.manifests import JOBSET, KUEUE
from tpuprov.doctor.checks import check_addon
from tpuprov.doctor.readers import addon_view

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("TPUPROV_VERSION_MATRIX"),
        reason="needs JobSet v0.11.1 and Kueue v0.18.4 built: make test-matrix (TPUPROV_VERSION_MATRIX=1)",
    ),
]

OLD = (build.Release("jobset", "v0.11.1"), build.Release("kueue", "v0.18.4"))
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE = f"{KUEUE_API}/clusterqueues/cluster-queue"
LOCAL_QUEUE = f"{KUEUE_API}/namespaces/default/localqueues/multislice-queue"
WORKLOADS = f"{KUEUE_API}/namespaces/default/workloads"
JOBSET_NAME = "held-over"
CONFIG = StackConfig(
    functions=ALL_FUNCTIONS,
    function_env={"SUSPEND_GRACE_SECONDS": "1"},
    gke_op_delay=1.0,
    retry=RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4),
)


class _Objects:
    """The ``get`` of an ObjectAPI over the admin client (what doctor's reader calls)."""

    def __init__(self, stack: RealStack) -> None:
        self.api = stack.kube_cluster.client()

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        assert (api_version, kind) == ("apps/v1", "Deployment")
        found = self.api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
        if found is None:
            raise NotFoundError(f"Deployment {namespace}/{name}")
        return found


def _workload(stack: RealStack) -> dict[str, Any] | None:
    try:
        listed = stack.kube_cluster.client().list(WORKLOADS)
    except ApiError as exc:
        if exc.status != 429:  # "storage is (re)initializing": a CRD was just written (an apply)
            raise
        return None
    for found in listed:
        if JOBSET_NAME in {o.get("name") for o in found["metadata"].get("ownerReferences") or []}:
            return found
    return None


def _condition(obj: dict[str, Any] | None, kind: str) -> bool:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    build.ensure_releases(OLD)
    with RealStack(CONFIG) as running:
        assert running.releases is not None
        for release in OLD:  # what xpk runs: kubectl apply --server-side -f manifests.yaml
            running.kube_cluster.kubectl("apply", "--server-side", "-f", str(release.manifest))
        for release in OLD:
            assert running.releases.wait_ready(release.name, 240), running.releases.errors
        running.wait_for(running.releases.admits_jobsets, 120, "the old releases' webhooks")
        yield running


@pytest.fixture(scope="module")
def before(stack: RealStack) -> dict[str, str]:
    """The queued JobSet on the old releases, held; the UIDs of what must survive the upgrade."""
    demo.apply_default_queues(stack, 120)
    api = stack.kube_cluster.client()
    api.patch(QUEUE, {"spec": {"stopPolicy": "Hold"}})
    # Kueue reports a stopped ClusterQueue inactive: only then is a new Workload sure to wait.
    stack.wait_for(lambda: not _condition(api.get(QUEUE), "Active"), 60, "the ClusterQueue held")
    stack.submit(demo.queued_jobset(JOBSET_NAME, 2, run_seconds=5))
    workload = stack.wait_for(lambda: _workload(stack), 120, "Kueue v0.18.4 to create the Workload")
    assert workload is not None
    assert not _condition(workload, "QuotaReserved")
    jobset = stack.jobset("default", JOBSET_NAME)
    assert jobset is not None and jobset["spec"]["suspend"] is True
    return {
        "workload": workload["metadata"]["uid"],
        "jobset": jobset["metadata"]["uid"],
        "cluster-queue": (api.get(QUEUE) or {})["metadata"]["uid"],
        "local-queue": (api.get(LOCAL_QUEUE) or {})["metadata"]["uid"],
    }


@pytest.fixture(scope="module")
def upgraded(stack: RealStack, before: dict[str, str]) -> dict[str, dict[str, Any]]:
    """setup_cluster run on the old releases; the decisions it logged, by component."""
    stack.setup(timeout=300)
    assert stack.releases is not None
    releases = stack.releases

    def kueue_restarted() -> bool:
        return releases.running.get("kueue", ("", ""))[0] == "v0.19.2" and releases.wait_ready("kueue", 0.1)

    stack.wait_for(kueue_restarted, 180, "the local Kueue controller to be v0.19.2")
    stack.wait_for(releases.admits_jobsets, 120, "the upgraded releases' webhooks")
    return {d["component"]: d for d in stack.decisions("setup.component", function="setup_cluster")}


def test_setup_upgrades_the_older_kueue_and_keeps_the_newer_supported_jobset(
    stack: RealStack, upgraded: dict[str, dict[str, Any]]
) -> None:
    assert (upgraded["kueue"]["action"], upgraded["kueue"]["found"]) == ("upgraded", "v0.18.4")
    assert (upgraded["jobset"]["action"], upgraded["jobset"]["found"]) == ("skipped-newer", "v0.11.1")
    assert upgraded["jobset"]["supported"] is True and upgraded["kueue"]["supported"] is True
    assert stack.releases is not None
    assert "kueue v0.18.4 -> v0.19.2" in stack.releases.restarts
    assert not any(r.startswith("jobset") for r in stack.releases.restarts)
    assert stack.releases.errors == []


def test_the_workload_queues_and_jobset_come_through_the_upgrade(
    stack: RealStack, before: dict[str, str], upgraded: dict[str, dict[str, Any]]
) -> None:
    api = stack.kube_cluster.client()
    workload = _workload(stack)
    jobset = stack.jobset("default", JOBSET_NAME)
    assert workload is not None and jobset is not None
    assert {
        "workload": workload["metadata"]["uid"],
        "jobset": jobset["metadata"]["uid"],
        "cluster-queue": (api.get(QUEUE) or {})["metadata"]["uid"],
        "local-queue": (api.get(LOCAL_QUEUE) or {})["metadata"]["uid"],
    } == before
    assert jobset["spec"]["suspend"] is True  # still held: nothing ran during the upgrade
    assert not stack.managed_pools()


def test_doctor_names_both_versions_and_calls_them_supported(
    stack: RealStack, upgraded: dict[str, dict[str, Any]]
) -> None:
    objects = _Objects(stack)
    jobset = check_addon(addon_view(objects, JOBSET), "v0.10.1")
    stack.wait_for(lambda: check_addon(addon_view(objects, KUEUE), "v0.19.2").ok, 60, "Kueue Available")
    kueue = check_addon(addon_view(objects, KUEUE), "v0.19.2")
    assert jobset.ok, jobset.detail
    assert jobset.detail.startswith("v0.11.1, newer than the pinned v0.10.1, kept (ADDON_UPGRADE=keep-newer)")
    assert "supported: tested" in jobset.detail
    assert kueue.detail.startswith("v0.19.2 (pinned), supported: tested")


def test_the_held_jobset_runs_on_the_upgraded_kueue_and_its_pools_are_released(
    stack: RealStack, upgraded: dict[str, dict[str, Any]]
) -> None:
    stack.kube_cluster.client().patch(QUEUE, {"spec": {"stopPolicy": "None"}})
    stack.wait_for(lambda: _condition(_workload(stack), "Admitted"), 180, "Kueue v0.19.2 to admit it")
    stack.wait_for(
        lambda: stack.jobset_state("default", JOBSET_NAME) in ("Completed", "Failed"),
        420,
        "the JobSet to end",
    )
    assert stack.jobset_state("default", JOBSET_NAME) == "Completed"
    stack.wait_for(lambda: not stack.managed_pools(), 240, "its pools to be released")
    summary = stack.summary()
    assert summary.pools_created >= 2
    assert summary.pools_deleted == summary.pools_created
    assert summary.pools_leaked == [] and summary.pods_killed == 0
    assert _condition(_workload(stack), "Finished")
