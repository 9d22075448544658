"""The real control plane in the sandbox: API server, scheduler, controller manager, KWOK nodes, RBAC.

Everything asserted here is what the upstream components do (scheduling, pod GC, authorization):
the harness only starts them, registers Nodes as GKE would and lets KWOK play the kubelets.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from sandbox import polling
from sandbox.kube import describe, rbac
from sandbox.kube.api import ApiError
from sandbox.kube.cluster import RealCluster
from sandbox.kube.kwok import FAIL_UNTIL_ATTEMPT, RUN_SECONDS
from sandbox.kube.nodes import PoolNodes, delete_pool_nodes, ready, register_pool_nodes
from shared.cloud.permissions import denied_permission
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = TypeVar("T")
CLUSTER = "sandbox"
NS = "default"
PODS = f"/api/v1/namespaces/{NS}/pods"


def eventually(probe: Callable[[], T | None], timeout: float, what: str, cluster: RealCluster) -> T:
    """``sandbox.polling.eventually`` that shows the scheduler's and KWOK's logs when it times out."""

    def logs() -> str:
        return "\n".join(f"--- {c}\n{cluster.logs(c, 15)}" for c in ("kube-scheduler", "kwok"))

    return polling.eventually(probe, timeout, what, 0.2, explain=logs)  # type: ignore[return-value]


def v6e_pool(name: str, nodes: int = 2) -> PoolNodes:
    # A 2x4 v6e slice: two VMs of 4 chips (ct6e-standard-4t).
    return PoolNodes(
        pool=name,
        machine_type="ct6e-standard-4t",
        zones={"us-east5-b": nodes},
        accelerator="tpu-v6e-slice",
        topology="2x4",
        chips_per_node=4,
        spot=True,
    )


def tpu_pod(name: str, pool: PoolNodes, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "restartPolicy": "Never",
            # The pool too: the tests of this module share one cluster and its pools look alike.
            "nodeSelector": {
                labels.TPU_ACCELERATOR: pool.accelerator,
                labels.TPU_TOPOLOGY: pool.topology,
                labels.NODEPOOL: pool.pool,
            },
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.12",
                    "resources": {
                        "requests": {labels.TPU_RESOURCE: str(pool.chips_per_node)},
                        "limits": {labels.TPU_RESOURCE: str(pool.chips_per_node)},
                    },
                }
            ],
        },
    }


def pod(cluster: RealCluster, name: str) -> dict[str, Any] | None:
    return cluster.client().get(f"{PODS}/{name}")


def phase_of(cluster: RealCluster, name: str, phase: str) -> dict[str, Any] | None:
    found = pod(cluster, name)
    return found if found and found.get("status", {}).get("phase") == phase else None


def pool_ready(cluster: RealCluster, pool: PoolNodes) -> list[dict[str, Any]]:
    api = cluster.client()
    register_pool_nodes(api, CLUSTER, pool)
    want = sum(pool.zones.values())

    def all_ready() -> list[dict[str, Any]] | None:
        nodes = api.list("/api/v1/nodes", label_selector=f"{labels.NODEPOOL}={pool.pool}")
        return nodes if len(nodes) == want and all(ready(n) for n in nodes) else None

    return eventually(all_ready, 60, f"pool {pool.pool} Ready", cluster)


def test_plain_kubectl_works_with_the_printed_kubeconfig(cluster: RealCluster) -> None:
    version = cluster.kubectl("version", "-o", "json")
    assert '"gitVersion": "v1.36.3"' in version.stdout
    ns = f"team-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    assert cluster.kubectl("get", "namespace", ns, "-o", "name").stdout.strip() == f"namespace/{ns}"
    assert cluster.kubectl("get", "nodes").returncode == 0


def test_a_pools_nodes_registered_like_gke_become_ready_through_kwok(cluster: RealCluster) -> None:
    pool = v6e_pool("np-ready")
    nodes = pool_ready(cluster, pool)
    names = sorted(n["metadata"]["name"] for n in nodes)
    assert names == [f"gke-{CLUSTER}-np-ready-0", f"gke-{CLUSTER}-np-ready-1"]
    for node in nodes:
        node_labels = node["metadata"]["labels"]
        assert node_labels[labels.NODEPOOL] == "np-ready"
        assert node_labels[labels.TPU_ACCELERATOR] == "tpu-v6e-slice"
        assert node_labels[labels.TPU_TOPOLOGY] == "2x4"
        assert node_labels[labels.ZONE] == "us-east5-b"
        assert node_labels[labels.SPOT] == "true"
        assert node["status"]["allocatable"][labels.TPU_RESOURCE] == "4"


def test_the_real_scheduler_places_a_tpu_pod_and_kwok_runs_it_for_its_requested_time(
    cluster: RealCluster,
) -> None:
    pool = v6e_pool("np-run")
    pool_ready(cluster, pool)
    cluster.client().create(PODS, tpu_pod("trainer-ok", pool, {RUN_SECONDS: "3"}))
    running = eventually(lambda: phase_of(cluster, "trainer-ok", "Running"), 60, "Running", cluster)
    assert running["spec"]["nodeName"].startswith(f"gke-{CLUSTER}-np-run-")
    started = time.monotonic()
    done = eventually(lambda: phase_of(cluster, "trainer-ok", "Succeeded"), 60, "Succeeded", cluster)
    assert time.monotonic() - started >= 2.0  # ran (about) the 3 s its template asked for
    (status,) = done["status"]["containerStatuses"]
    assert status["state"]["terminated"]["reason"] == "Completed"
    assert status["state"]["terminated"]["exitCode"] == 0


def test_a_pod_whose_attempt_must_fail_ends_failed(cluster: RealCluster) -> None:
    pool = v6e_pool("np-fail", nodes=1)
    pool_ready(cluster, pool)
    cluster.client().create(PODS, tpu_pod("trainer-bad", pool, {RUN_SECONDS: "1", FAIL_UNTIL_ATTEMPT: "1"}))
    failed = eventually(lambda: phase_of(cluster, "trainer-bad", "Failed"), 60, "Failed", cluster)
    (status,) = failed["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 1


def test_a_pod_no_node_fits_gets_the_schedulers_failed_scheduling_event(cluster: RealCluster) -> None:
    pool_ready(cluster, v6e_pool("np-other", nodes=1))  # a node there, but not the shape asked for
    pool = PoolNodes(
        pool="np-none",
        machine_type="ct6e-standard-4t",
        zones={},
        accelerator="tpu-v6e-slice",
        topology="16x16",
        chips_per_node=4,
    )
    cluster.client().create(PODS, tpu_pod("trainer-waits", pool))

    def failed_scheduling() -> list[dict[str, Any]]:
        events = cluster.client().list(
            f"/api/v1/namespaces/{NS}/events", field_selector="involvedObject.name=trainer-waits"
        )
        return [e for e in events if e.get("reason") == "FailedScheduling"]

    (event, *_) = eventually(failed_scheduling, 60, "FailedScheduling", cluster)
    assert event["reportingComponent"] == "default-scheduler"
    assert event["message"].startswith("0/")
    assert "didn't match Pod's node affinity/selector" in event["message"]


def test_what_a_timed_out_wait_prints_names_the_nodes_and_why_a_pod_pends(cluster: RealCluster) -> None:
    # describe.cluster_now is what RealStack.wait_for prints when it times out: a failure on the real
    # components must say which Node held a pod off (taints, cordon, Ready) and what the scheduler said.
    pool = v6e_pool("np-describe", nodes=1)
    pool_ready(cluster, pool)
    api = cluster.client()
    node = f"gke-{CLUSTER}-np-describe-0"
    api.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
    api.create(PODS, tpu_pod("trainer-describe", pool))

    def said() -> list[str]:
        lines = describe.cluster_now(api)
        ours = [line for line in lines if "trainer-describe" in line and "scheduled=False 0/" in line]
        return lines if ours else []

    lines = eventually(said, 60, "the pod's PodScheduled=False in the description", cluster)
    [node_line] = [line for line in lines if f"node {node} " in line]
    assert "pool=np-describe Ready=True cordoned" in node_line
    [pod_line] = [line for line in lines if "trainer-describe" in line]
    assert pod_line.startswith(f"  pod {NS}/trainer-describe Pending owner=-/- ")
    assert "unschedulable" in pod_line  # the scheduler's own words for a cordoned node
    assert not [line for line in lines if line.startswith("  jobset ")]  # no JobSet CRD here: none, no error


def test_deleting_a_pools_nodes_lets_the_real_pod_gc_fail_and_remove_their_pods(cluster: RealCluster) -> None:
    pool = v6e_pool("np-gone", nodes=1)
    pool_ready(cluster, pool)
    api = cluster.client()
    created = api.create(PODS, tpu_pod("trainer-orphan", pool))  # no run-seconds: runs until stopped
    eventually(lambda: phase_of(cluster, "trainer-orphan", "Running"), 60, "Running", cluster)
    assert delete_pool_nodes(api, "np-gone") == [f"gke-{CLUSTER}-np-gone-0"]
    last: dict[str, Any] = {}
    # Pod GC waits for a missing node to stay missing (its quarantine) before it acts.
    for kind, obj in api.watch(
        PODS, created["metadata"]["resourceVersion"], 150, field_selector="metadata.name=trainer-orphan"
    ):
        last = obj
        if kind == "DELETED":
            break
    else:
        pytest.fail(f"pod not deleted after its node went:\n{cluster.logs('kube-controller-manager')}")
    assert pod(cluster, "trainer-orphan") is None
    assert last["status"]["phase"] == "Failed"
    disruption = [c for c in last["status"].get("conditions", []) if c["type"] == "DisruptionTarget"]
    assert disruption and disruption[0]["reason"] == "DeletionByPodGC"


def test_a_function_gets_the_real_403_for_what_its_role_lacks_and_only_that(cluster: RealCluster) -> None:
    # release lists pods to find a JobSet's pods; drop that one permission from its role.
    role = cluster.roles["release"]
    assert "container.pods.list" in role
    release = cluster.client("release")
    release.list(PODS)  # allowed by the role as infra/ grants it
    with pytest.raises(ApiError) as refused:
        release.delete(f"{PODS}/trainer-ok")  # no container.pods.delete in any function's role
    assert refused.value.status == 403
    assert f'User "{rbac.user_name("release")}" cannot delete resource "pods"' in refused.value.message
    # GKE's IAM authorizer completes the refusal with the permission; the product logs it by name.
    assert refused.value.message.endswith(': requires one of ["container.pods.delete"] permission(s).')
    assert denied_permission(refused.value.message) == "container.pods.delete"

    admin = cluster.client()
    reduced = [p for p in role if p != "container.pods.list"]
    try:
        admin.apply_all(rbac.objects_for("release", reduced))

        def refused_now() -> ApiError | None:
            try:
                release.list(PODS)
            except ApiError as exc:
                return exc if exc.status == 403 else None
            return None

        error = eventually(refused_now, 10, "403 after removing container.pods.list", cluster)
        assert 'cannot list resource "pods"' in error.message
        assert denied_permission(error.message) == "container.pods.list"
    finally:
        admin.apply_all(rbac.objects_for("release", role))

    def allowed_again() -> bool | None:
        try:
            release.list(PODS)
        except ApiError as exc:
            if exc.status == 403:
                return None
            raise
        return True

    eventually(allowed_again, 10, "list allowed again", cluster)


def test_a_webhook_pointing_at_a_service_cannot_leave_loopback(cluster: RealCluster) -> None:
    """The API server dials a Service's cluster IP for a webhook that names it (as the unmodified
    release manifests do). In the control plane's network namespace that dial fails at once."""
    server_pid = cluster.procs["kube-apiserver"].pid
    server_interfaces = [
        line.split(":", 1)[0].strip()
        for line in open(f"/proc/{server_pid}/net/dev").read().splitlines()[2:]  # noqa: SIM115
    ]
    assert server_interfaces == ["lo"]
    api = cluster.client()
    ns = f"escape-{uuid.uuid4().hex[:6]}"
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    service = api.create(
        f"/api/v1/namespaces/{ns}/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "hook"},
            "spec": {"ports": [{"port": 443}]},
        },
    )
    cluster_ip = service["spec"]["clusterIP"]
    assert not cluster_ip.startswith("127.")
    hooks = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    name = f"{ns}.tpuprov.dev"
    api.create(
        hooks,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": name,
                    "clientConfig": {"service": {"namespace": ns, "name": "hook", "path": "/validate"}},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10,
                }
            ],
        },
    )
    try:
        config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}}

        def refused() -> ApiError | None:
            started = time.monotonic()
            try:
                api.create(f"/api/v1/namespaces/{ns}/configmaps", config_map)
            except ApiError as exc:
                if "failed calling webhook" in exc.message:
                    assert time.monotonic() - started < 5.0, "the dial waited instead of failing at once"
                    return exc
                raise
            api.delete(f"/api/v1/namespaces/{ns}/configmaps/probe")
            return None  # the webhook configuration is not active yet

        error = eventually(refused, 30, "the webhook to be called", cluster)
        assert f"{cluster_ip}:443" in error.message
        assert "network is unreachable" in error.message
    finally:
        api.delete(f"{hooks}/{name}")
