"""The product's admission check against the REAL Kueue v0.19.2 and JobSet v0.10.1 controllers.

A ClusterQueue whose ``admissionChecksStrategy`` names the product's AdmissionCheck; JobSets queued
on it. The check's service (``AdmissionChecker``) runs here in the test process with the product's
own Kubernetes adapter authenticated as the provision function (its RBAC is its role in infra/) and
the product's GKE adapter over HTTP against the GKE emulator, whose finished creates register the
pool's Nodes in the real API server (KWOK makes them Ready). What is asserted is what real Kueue
does with the states the check writes: nothing runs while the check is Pending, Ready admits the
Workload and the JobSet starts on all of its slices, Retry evicts it (quota released) and requeues
it, Rejected deactivates it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from sandbox import polling
from sandbox.emulators.gke.emulator import GkeEmulator
from sandbox.emulators.gke.seeds import ClusterSeed
from sandbox.kube import addons
from sandbox.kube.cluster import ADMIN, RealCluster
from sandbox.kube.kwok import RUN_SECONDS
from sandbox.kube.nodes import pool_from_gke, register_pool_nodes, takes_pods
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.kube import KubeClient
from shared.cloud.objects import ApiClientObjects
from shared.core import labels
from shared.core.errors import TransientError
from shared.core.settings import Settings
from shared.kueue.render import to_yaml
from shared.provisioning.admission.check import CONTROLLER_NAME, AdmissionChecker
from shared.provisioning.reconciler import Reconciler
from shared.provisioning.services import Services
from tpuprov import admission
from tpuprov.commands.status import admission_section
from tpuprov.doctor.checks import check_admission_check
from tpuprov.doctor.readers import admission_check_view

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = TypeVar("T")
CHECK = "tpu-slices"
QUEUE = "checked-queue"
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
SETTINGS = Settings(
    unlimited_spending=True,
    project_id="sandbox",
    location="us-west4-a",
    cluster_name="sandbox",
    admission_check_name=CHECK,
    stockout_backoff_seconds=5,
    stockout_backoff_max_seconds=5,
    create_concurrency=4,
)
V5E = {labels.TPU_ACCELERATOR: "tpu-v5-lite-podslice", labels.TPU_TOPOLOGY: "2x4"}


def queues() -> list[dict[str, Any]]:
    meta = {"labels": {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}}
    return [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": CHECK, **meta},
            "spec": {"controllerName": CONTROLLER_NAME},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "vlp-8", **meta},
            "spec": {"nodeLabels": V5E},
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "checked", **meta},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": [labels.TPU_RESOURCE],
                        "flavors": [
                            {
                                "name": "vlp-8",
                                "resources": [{"name": labels.TPU_RESOURCE, "nominalQuota": 16}],
                            }
                        ],
                    }
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": CHECK, "onFlavors": ["vlp-8"]}]},
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": "default", **meta},
            "spec": {"clusterQueue": "checked"},
        },
    ]


def jobset(name: str, replicas: int) -> dict[str, Any]:
    # The template selects no shape: the flavor's node labels are what Kueue writes in on admission.
    pod_spec = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "jax",
                "image": "python:3.12",
                "resources": {"limits": {labels.TPU_RESOURCE: "4"}, "requests": {labels.TPU_RESOURCE: "4"}},
            }
        ],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "labels": {"kueue.x-k8s.io/queue-name": QUEUE},
            "annotations": {labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL},
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "backoffLimit": 0,
                            "template": {"metadata": {"annotations": {RUN_SECONDS: "600"}}, "spec": pod_spec},
                        }
                    },
                }
            ]
        },
    }


class Rig:
    """The real cluster with the releases and the queues, the GKE emulator, and the check's service."""

    def __init__(self, cluster: RealCluster, gke: GkeEmulator, settings: Settings) -> None:
        self.cluster = cluster
        self.gke = gke
        self.api = cluster.client()
        self.kube = product_client(cluster, "provision")
        self.checker = AdmissionChecker(Services(settings, GkeNodePoolAPI(endpoint=gke.url), self.kube))

    def eventually(self, probe: Callable[[], T | None], timeout: float, what: str) -> T:
        """``sandbox.polling.eventually`` that shows Kueue's and JobSet's logs when it times out."""

        def tails() -> str:
            return "\n".join(f"--- {c}\n{self.cluster.logs(c, 25)}" for c in ("kueue", "jobset"))

        return polling.eventually(probe, timeout, what, 0.3, explain=tails)  # type: ignore[return-value]

    def workload_of(self, name: str) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            for wl in self.api.list(f"{KUEUE}/namespaces/default/workloads"):
                owners = wl["metadata"].get("ownerReferences") or []
                if any(o["kind"] == "JobSet" and o["name"] == name for o in owners):
                    return wl
            return None

        return self.eventually(find, 60, f"the Workload of {name}")

    def reload(self, workload: dict[str, Any]) -> dict[str, Any]:
        found = self.api.get(f"{KUEUE}/namespaces/default/workloads/{workload['metadata']['name']}")
        assert found is not None
        return found

    def condition(self, workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
        conditions = (self.reload(workload).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind and c["status"] == "True"), None)

    def check_state(self, workload: dict[str, Any]) -> dict[str, Any]:
        checks = (self.reload(workload).get("status") or {}).get("admissionChecks") or []
        return next((c for c in checks if c["name"] == CHECK), {})

    def pods(self, name: str) -> list[dict[str, Any]]:
        return self.api.list("/api/v1/namespaces/default/pods", label_selector=f"{labels.JOBSET_NAME}={name}")


def product_client(cluster: RealCluster, function: str) -> KubeClient:
    """The product's own Kubernetes adapter, authenticated as ``function`` (RBAC from infra/roles.json)."""
    from kubernetes import client as k8s

    ca = Path(cluster.dir) / "product-ca.crt"
    ca.write_bytes(cluster.ca_pem)
    cfg = k8s.Configuration()
    cfg.host = cluster.server
    cfg.ssl_ca_cert = str(ca)
    cfg.api_key = {"authorization": cluster.identities[function].token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return KubeClient(k8s.ApiClient(cfg))


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    seed = ClusterSeed("sandbox", "us-west4-a", "sandbox", locations=("us-west4-a",))
    with RealCluster() as cluster, GkeEmulator([seed], op_delay=1.0) as gke:
        for release in [addons.apply_release(cluster, a) for a in (addons.JOBSET, addons.KUEUE)]:
            addons.run_controller(cluster, release)
        api = cluster.client()
        # What GKE does when a create finishes: the pool's VMs register as Nodes (KWOK: Ready).
        gke.state.on_pool_ready(lambda _path, pool: register_pool_nodes(api, "sandbox", pool_from_gke(pool)))
        cluster.kubectl("apply", "--server-side", "-f", "-", input=to_yaml(queues()))
        built = Rig(cluster, gke, SETTINGS)
        # The product keeps its check Active (reconcile and apply_kueue), or Kueue keeps the queue inactive.
        assert built.checker.keep_active()
        built.eventually(
            lambda: any(
                c["type"] == "Active" and c["status"] == "True"
                for c in (api.get(f"{KUEUE}/clusterqueues/checked") or {})
                .get("status", {})
                .get("conditions", [])
            ),
            60,
            "the ClusterQueue active",
        )
        yield built


@pytest.fixture(autouse=True)
def no_quota_left_behind(rig: Rig) -> Iterator[None]:
    """Each test starts on an empty queue, whatever the one before left (a failed test's JobSet
    would hold the ClusterQueue's quota and fail every later test on 'quota reserved')."""
    yield
    for item in rig.api.list(JOBSETS):
        with contextlib.suppress(Exception):
            rig.api.delete(f"{JOBSETS}/{item['metadata']['name']}")

    def quota_free() -> bool:
        workloads = rig.api.list(f"{KUEUE}/namespaces/default/workloads")
        return not any(
            c.get("type") == "QuotaReserved" and c.get("status") == "True"
            for w in workloads
            for c in (w.get("status") or {}).get("conditions") or []
        )

    rig.eventually(quota_free, 60, "no Workload holding quota")


def test_the_workload_waits_for_every_slice_then_starts_on_all_of_them(rig: Rig) -> None:
    rig.api.create(JOBSETS, jobset("train", replicas=2))
    wl = rig.workload_of("train")
    rig.eventually(lambda: rig.condition(wl, "QuotaReserved"), 60, "quota reserved")
    # Kueue's own QuotaReserved Event (the trigger the log sink exports) is on the Workload.
    events = rig.api.list("/api/v1/namespaces/default/events", field_selector="involvedObject.kind=Workload")
    reserved = [e for e in events if e["reason"] == "QuotaReserved"]
    assert reserved and reserved[0]["message"].startswith("Quota reserved in ClusterQueue checked")
    assert rig.check_state(wl)["state"] == "Pending"

    result = rig.checker.handle("default", wl["metadata"]["name"], "QuotaReserved")
    assert result.state == "Pending" and len(result.created) == 2
    assert rig.check_state(wl)["message"] == "pools ready 0/2"

    def nodes_ready() -> bool:
        # For as long as the check says Pending, Kueue admits nothing and keeps the JobSet
        # suspended: no pod is ever pending for a slice (checked at every look, not after a sleep).
        assert rig.condition(wl, "Admitted") is None
        assert rig.pods("train") == []
        nodes = rig.api.list(
            "/api/v1/nodes", label_selector=labels.MANAGED_BY + "=" + labels.MANAGED_BY_VALUE
        )
        # Ready is not enough: the lifecycle controller lifts the not-ready taint a pass later, and
        # the check (like the scheduler) counts a Node only once it takes pods.
        return len(nodes) == 4 and all(takes_pods(n) for n in nodes)

    rig.eventually(nodes_ready, 60, "both slices' Nodes Ready and untainted")
    assert [r.state for r in rig.checker.sweep()] == ["Ready"]
    state = rig.check_state(wl)
    assert state["message"] == "pools ready 2/2"
    assert state["podSetUpdates"] == [{"name": "slice", "nodeSelector": V5E}]
    rig.eventually(lambda: rig.condition(wl, "Admitted"), 60, "Kueue admitting the Workload")

    def running() -> list[dict[str, Any]] | None:
        pods = rig.pods("train")
        return pods if len(pods) == 4 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = rig.eventually(running, 90, "four pods bound")
    by_job = {}
    for pod in pods:
        node = rig.api.get(f"/api/v1/nodes/{pod['spec']['nodeName']}") or {}
        by_job.setdefault(pod["metadata"]["labels"][labels.JOB_INDEX], set()).add(
            node["metadata"]["labels"][labels.NODEPOOL]
        )
    # Each slice on a pool of its own, and the pools are the ones the check created.
    assert sorted(p for pools in by_job.values() for p in pools) == sorted(result.created)
    assert all(len(pools) == 1 for pools in by_job.values())
    reasons = {e["reason"] for e in rig.api.list("/api/v1/namespaces/default/events")}
    assert {"TPUSlicesPending", "TPUSlicesReady"} <= reasons
    rig.api.delete(f"{JOBSETS}/train")


def test_a_stockout_is_retry_kueue_releases_the_quota_requeues_and_admits_once_capacity_returns(
    rig: Rig,
) -> None:
    rig.gke.stockout("ct5lp-hightpu-4t", times=1)
    rig.api.create(JOBSETS, jobset("stocked", replicas=2))
    wl = rig.workload_of("stocked")
    rig.eventually(lambda: rig.condition(wl, "QuotaReserved"), 90, "quota reserved")
    assert rig.checker.handle("default", wl["metadata"]["name"]).state == "Pending"

    def retried() -> bool:
        return any(r.state == "Retry" for r in rig.checker.sweep())

    rig.eventually(retried, 60, "the check in Retry")

    # Real Kueue: evicted by the admission check (its quota released), requeued after
    # requeueAfterSeconds, quota reserved again with the check reset to Pending.
    def evictions() -> int:
        stats = (rig.reload(wl).get("status") or {}).get("schedulingStats") or {}
        return sum(
            e.get("count", 0) for e in stats.get("evictions") or [] if e.get("reason") == "AdmissionCheck"
        )

    rig.eventually(lambda: evictions() >= 1, 30, "Kueue evicting the Workload for the check")
    rig.eventually(
        lambda: rig.condition(wl, "QuotaReserved") and rig.check_state(wl).get("state") == "Pending",
        60,
        "quota reserved again with the check Pending",
    )
    retried_events = [
        e for e in rig.api.list("/api/v1/namespaces/default/events") if e["reason"] == "TPUSlicesRetry"
    ]
    assert {e["involvedObject"]["kind"] for e in retried_events} == {"Workload", "JobSet"}

    def admitted() -> bool:
        rig.checker.sweep()
        return rig.condition(wl, "Admitted") is not None

    rig.eventually(admitted, 120, "the Workload admitted once capacity is back")
    rig.api.delete(f"{JOBSETS}/stocked")


def test_what_can_never_succeed_is_rejected_and_kueue_deactivates_it(rig: Rig) -> None:
    strict = AdmissionChecker(
        Services(
            SETTINGS.with_overrides(max_chips_per_slice=4), GkeNodePoolAPI(endpoint=rig.gke.url), rig.kube
        )
    )
    rig.api.create(JOBSETS, jobset("toolarge", replicas=1))
    wl = rig.workload_of("toolarge")
    rig.eventually(lambda: rig.condition(wl, "QuotaReserved"), 90, "quota reserved")
    result = strict.handle("default", wl["metadata"]["name"])
    assert result.state == "Rejected" and "MAX_CHIPS_PER_SLICE" in result.why
    rig.eventually(lambda: rig.reload(wl)["spec"].get("active") is False, 30, "Kueue deactivating it")
    # Kueue says why on the Workload (and resets the check once it has evicted it).
    events = rig.api.list("/api/v1/namespaces/default/events", field_selector="involvedObject.kind=Workload")
    rejected = [e for e in events if e["reason"] == "AdmissionCheckRejected"]
    assert rejected and "MAX_CHIPS_PER_SLICE" in rejected[0]["message"]
    assert any(e["reason"] == "TPUSlicesRejected" and e["type"] == "Warning" for e in events)
    assert rig.pods("toolarge") == []
    # A deactivated Workload is not the check's any more: the sweep leaves it alone.
    assert all(r.workload != f"default/{wl['metadata']['name']}" for r in strict.sweep())


def test_a_workload_deactivated_while_its_slices_are_provisioned_has_its_pools_released_after_the_grace(
    rig: Rig,
) -> None:
    # Release as the reconcile function runs it, with a short suspend grace: the keep window the
    # docs/functions.md documents for a Workload the check no longer looks at.
    grace = 8
    settings = SETTINGS.with_overrides(suspend_grace_seconds=grace)
    reconciler = Reconciler(
        Services(settings, GkeNodePoolAPI(endpoint=rig.gke.url), product_client(rig.cluster, "reconcile"))
    )
    rig.api.create(JOBSETS, jobset("evicted", replicas=2))
    wl = rig.workload_of("evicted")
    rig.eventually(lambda: rig.condition(wl, "QuotaReserved"), 90, "quota reserved")
    result = rig.checker.handle("default", wl["metadata"]["name"], "QuotaReserved")
    assert result.state == "Pending" and len(result.created) == 2
    looked = time.time()

    def pools() -> set[str]:
        return {p["name"] for p in rig.gke.pools(SETTINGS.cluster_path)} & set(result.created)

    def sweep() -> None:
        with contextlib.suppress(TransientError):  # e.g. a pool still being created: the next sweep
            reconciler.sweep()

    sweep()
    assert pools() == set(result.created)  # the check is provisioning them: release keeps them

    # Evicted during provisioning: the Workload is deactivated, Kueue evicts it and releases its quota.
    rig.api.patch(
        f"{KUEUE}/namespaces/default/workloads/{wl['metadata']['name']}", {"spec": {"active": False}}
    )
    rig.eventually(lambda: rig.condition(wl, "QuotaReserved") is None, 30, "Kueue releasing the quota")
    assert all(r.workload != f"default/{wl['metadata']['name']}" for r in rig.checker.sweep())

    def released() -> bool:
        sweep()
        assert rig.pods("evicted") == []  # nothing ever ran on them, so nothing can be killed
        if pools():
            # Kept no longer than the check's last look plus the grace (one sweep period of slack).
            assert time.time() - looked < grace + 20, f"{sorted(pools())} kept past the grace"
            return False
        return True

    rig.eventually(released, 60, "the deactivated Workload's pools released")
    # Not before the grace from the check's last look: a Workload requeued at once would find them.
    assert time.time() - looked >= grace - 1
    events = rig.api.list("/api/v1/namespaces/default/events", field_selector="involvedObject.name=evicted")
    assert any(e["reason"] == "TPUSlicesPending" for e in events)
    rig.api.delete(f"{JOBSETS}/evicted")


def test_a_check_nobody_keeps_active_is_seen_by_kueue_doctor_and_status(rig: Rig) -> None:
    # The product removed from the cluster: its reconcile no longer sets the check Active, and the
    # condition says so (here written as Kueue's API accepts it for the check's controller).
    stale = {
        "type": "Active",
        "status": "False",
        "reason": "NoController",
        "message": "tpuprov.dev/tpu-slices no longer runs",
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    def queue_inactive() -> bool:
        queue = rig.api.get(f"{KUEUE}/clusterqueues/checked") or {}
        conditions = (queue.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Active" and c["status"] == "False" for c in conditions)

    rig.api.patch(f"{KUEUE}/admissionchecks/{CHECK}/status", {"status": {"conditions": [stale]}})
    try:
        rig.eventually(queue_inactive, 60, "real Kueue holding the ClusterQueue inactive")
        # What tpuprov doctor and tpuprov status read, through the CLI's own object reader.
        view = SimpleNamespace(settings=SETTINGS, objects=cli_objects(rig.cluster))
        check = check_admission_check(admission_check_view(view.objects, CHECK))
        assert (
            not check.ok
            and "tpu-slices is not Active (tpuprov.dev/tpu-slices no longer runs)" in check.detail
        )
        assert "ClusterQueue(s) checked inactive" in check.detail
        health, _ = admission_section(view)
        section = admission.render(health, [])
        assert "AdmissionCheck tpu-slices is NOT Active (tpuprov.dev/tpu-slices no longer runs)" in section
        assert "Kueue keeps ClusterQueue(s) checked inactive" in section
    finally:
        # The product back: reconcile's keep_active, and Kueue activates the queue again.
        assert rig.checker.keep_active()
        rig.eventually(lambda: not queue_inactive(), 60, "the ClusterQueue active again")


def cli_objects(cluster: RealCluster) -> ApiClientObjects:
    """The CLI's ``ObjectAPI`` as a cluster administrator runs it."""
    from kubernetes import client as k8s

    ca = Path(cluster.dir) / "cli-ca.crt"
    ca.write_bytes(cluster.ca_pem)
    cfg = k8s.Configuration()
    cfg.host = cluster.server
    cfg.ssl_ca_cert = str(ca)
    cfg.api_key = {"authorization": cluster.identities[ADMIN].token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return ApiClientObjects(k8s.ApiClient(cfg))
