"""Kueue's MultiKueue over the real stack's clusters: one manager, its workers, as Kueue documents it.

What an operator does by hand after ``setup_cluster`` has installed JobSet and Kueue everywhere
(Kueue v0.19.2: site/content/en/docs/tasks/manage/setup_multikueue.md and
site/static/examples/multikueue/create-multikueue-kubeconfig.sh):

* in each worker, a ServiceAccount ``multikueue-sa`` in ``kueue-system`` bound to a ClusterRole
  that lets the manager's Kueue create and watch Workloads and the jobs it dispatches, and a
  kubeconfig for it (token and CA data: Kueue 0.19 refuses token files, CA files, exec plugins);
* in the manager, that kubeconfig in a Secret of ``kueue-system`` under the key ``kubeconfig``, a
  ``MultiKueueCluster`` per worker, a ``MultiKueueConfig`` listing them and an ``AdmissionCheck``
  of controller ``kueue.x-k8s.io/multikueue`` on the manager's ClusterQueue;
* the manager's Kueue limited to the job frameworks the workers serve. Kueue's MultiKueue
  opens a watch in each worker for every enabled framework that has a MultiKueue adapter and
  refuses the connection (``ClientConnectionFailed``) when one fails (``updateConfigAndRefreshWatchers``
  in pkg/controller/admissionchecks/multikueue/multikueuecluster.go); the release enables
  MPIJob, Ray, AppWrapper, TrainJob and LeaderWorkerSet, whose CRDs no worker here has.

The manager's Kueue reaches each worker's API server on loopback, as every process here does.
"""

from __future__ import annotations

import base64
import datetime
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import yaml

from sandbox.kube.api import ApiError, KubeClient
from sandbox.kube.cluster import RealCluster
from sandbox.realstack.kubestate import collection

if TYPE_CHECKING:
    from sandbox.realstack.core import RealStack

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
KUEUE_NAMESPACE = "kueue-system"
CONTROLLER = "kueue.x-k8s.io/multikueue"
ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
ORIGIN = "multikueue"  # Configuration.multiKueue.origin's default (apis/config/v1beta2/defaults.go)
MANAGED_BY = "kueue.x-k8s.io/multikueue"  # what Kueue's JobSet webhook sets spec.managedBy to
WORKER_ACCOUNT = "multikueue-sa"
# The manager's job frameworks: the JobSets this product provisions, and batch Jobs.
MANAGER_FRAMEWORKS = ("batch/job", "jobset.x-k8s.io/jobset")
# create-multikueue-kubeconfig.sh's ClusterRole, for the frameworks above.
WORKER_RULES = (
    {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["workloads"],
        "verbs": ["create", "delete", "get", "list", "watch", "update", "patch"],
    },
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status"], "verbs": ["get", "patch", "update"]},
    {
        "apiGroups": ["kueue.x-k8s.io"],
        "resources": ["clusterqueues", "localqueues"],
        "verbs": ["get", "list", "watch"],
    },
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "delete", "get", "list", "watch"]},
    {"apiGroups": ["batch"], "resources": ["jobs/status"], "verbs": ["get"]},
    {
        "apiGroups": ["jobset.x-k8s.io"],
        "resources": ["jobsets"],
        "verbs": ["create", "delete", "get", "list", "watch"],
    },
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets/status"], "verbs": ["get"]},
)
RBAC = "/apis/rbac.authorization.k8s.io/v1"
TOKEN_SECONDS = 24 * 3600


def _ensure(api: KubeClient, path: str, obj: Mapping[str, Any]) -> None:
    try:
        api.create(path, dict(obj))
    except ApiError as exc:
        if exc.status != 409:
            raise


def worker_kubeconfig(worker: RealCluster, name: str) -> str:
    """The account the manager's Kueue uses in ``worker`` (see the module docstring), as a
    kubeconfig document whose cluster entry is called ``name``."""
    api = worker.client()
    role = f"{WORKER_ACCOUNT}-role"
    _ensure(
        api,
        f"/api/v1/namespaces/{KUEUE_NAMESPACE}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": WORKER_ACCOUNT}},
    )
    _ensure(
        api,
        f"{RBAC}/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [dict(r) for r in WORKER_RULES],
        },
    )
    _ensure(
        api,
        f"{RBAC}/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{role}-binding"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": WORKER_ACCOUNT, "namespace": KUEUE_NAMESPACE}],
        },
    )
    token = api.create(
        f"/api/v1/namespaces/{KUEUE_NAMESPACE}/serviceaccounts/{WORKER_ACCOUNT}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": TOKEN_SECONDS},
        },
    )["status"]["token"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": worker.server,
                    "certificate-authority-data": base64.b64encode(worker.ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": WORKER_ACCOUNT, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": WORKER_ACCOUNT}}],
        "current-context": name,
    }
    return yaml.safe_dump(config, sort_keys=False)


def limit_frameworks(manager: RealCluster, frameworks: Sequence[str] = MANAGER_FRAMEWORKS) -> None:
    """Edit the manager's Kueue Configuration to enable only ``frameworks`` and roll its Deployment,
    as an operator does (the sandbox restarts the local controller on the new pod template)."""
    api = manager.client()
    path = f"/api/v1/namespaces/{KUEUE_NAMESPACE}/configmaps/kueue-manager-config"
    config_map = api.get(path)
    assert config_map is not None, "Kueue is not installed on the manager"
    key, raw = next(iter(config_map["data"].items()))
    config = yaml.safe_load(raw)
    config.setdefault("integrations", {})["frameworks"] = list(frameworks)
    api.patch(path, {"data": {key: yaml.safe_dump(config, sort_keys=False)}})
    stamp = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    restart = {
        "spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}}}
    }
    api.patch(f"/apis/apps/v1/namespaces/{KUEUE_NAMESPACE}/deployments/kueue-controller-manager", restart)


def manager_objects(workers: Mapping[str, str], check: str, config: str) -> list[dict[str, Any]]:
    """The manager's Secrets, MultiKueueClusters, MultiKueueConfig and AdmissionCheck; ``workers``
    maps each MultiKueueCluster's name to its kubeconfig document."""
    objects: list[dict[str, Any]] = []
    for name, kubeconfig in workers.items():
        secret = f"{name}-kubeconfig"
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": KUEUE_NAMESPACE},
                "stringData": {"kubeconfig": kubeconfig},
            }
        )
        objects.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "MultiKueueCluster",
                "metadata": {"name": name},
                "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": secret}}},
            }
        )
    objects.append(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "MultiKueueConfig",
            "metadata": {"name": config},
            "spec": {"clusters": list(workers)},
        }
    )
    objects.append(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": check},
            "spec": {
                "controllerName": CONTROLLER,
                "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": config},
            },
        }
    )
    return objects


def apply(cluster: RealCluster, objects: Sequence[Mapping[str, Any]]) -> None:
    """Server-side apply ``objects`` with kubectl, as the operator."""
    text = yaml.safe_dump_all([dict(o) for o in objects], sort_keys=False)
    result = cluster.kubectl("apply", "--server-side", "-f", "-", input=text, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl apply on the manager failed:\n{result.stderr}")


def active(api: KubeClient, kind: str, name: str) -> bool:
    """Whether the Kueue object's ``Active`` condition is True."""
    obj = api.get(f"{collection('kueue.x-k8s.io/v1beta2', kind, None)}/{name}") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Active" and c.get("status") == "True" for c in conditions)


def why_inactive(api: KubeClient, kind: str, name: str) -> str:
    """The ``Active`` condition's reason and message (for a timeout's message)."""
    obj = api.get(f"{collection('kueue.x-k8s.io/v1beta2', kind, None)}/{name}") or {}
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Active":
            return f"{kind}/{name}: {c.get('reason')}: {c.get('message')}"
    return f"{kind}/{name}: no Active condition"


def wait_active(api: KubeClient, kinds_names: Sequence[tuple[str, str]], timeout: float) -> None:
    """Wait until every ``(kind, name)`` is Active (TimeoutError naming the ones that are not)."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = [(k, n) for k, n in kinds_names if not active(api, k, n)]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("; ".join(why_inactive(api, k, n) for k, n in waiting))
        time.sleep(0.5)


def manager_queues(worker_config: str, check: str) -> list[dict[str, Any]]:
    """The workers' queue document rendered for the manager: the same flavors, quotas and
    LocalQueues, with the ``multikueue`` check instead of the product's (the manager runs no pod:
    its ClusterQueue only hands Workloads to the workers)."""
    from shared.kueue.config import parse_config
    from shared.kueue.render import render

    plain = worker_config.replace("tpuSlicesCheck: true", "tpuSlicesCheck: false")
    objects = [o for o in render(parse_config(plain)) if o["kind"] != "AdmissionCheck"]
    for obj in objects:
        if obj["kind"] == "ClusterQueue":
            obj["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    return objects


def connect(stack: RealStack, worker_config: str, check: str = "multikueue", timeout: float = 300.0) -> None:
    """Make the stack's managed cluster the MultiKueue manager of its fleet clusters: setup_cluster
    on every cluster, ``worker_config`` (a queue document with the product's check) applied to each
    worker by apply_kueue, then everything in the module docstring; returns once every
    MultiKueueCluster and the check are Active."""
    for plane in stack.planes:
        stack.setup(timeout=timeout, cluster=plane.path)
    for plane in stack.fleet:
        stack.apply_kueue(worker_config, timeout=120, cluster=plane.path)
    manager = stack.home
    releases = manager.releases
    assert releases is not None, "the stack is not started"
    restarts = len(releases.restarts)
    limit_frameworks(manager.kube_cluster)
    stack.wait_for(
        lambda: len(releases.restarts) > restarts and releases.wait_ready("kueue", 1),
        120,
        "the manager's Kueue restarted with the JobSet and Job frameworks only",
    )
    kubeconfigs = {
        p.cluster_id.name: worker_kubeconfig(p.kube_cluster, p.cluster_id.name) for p in stack.fleet
    }
    apply(
        manager.kube_cluster,
        [*manager_objects(kubeconfigs, check, "workers"), *manager_queues(worker_config, check)],
    )
    wait_active(
        manager.kube_cluster.client(),
        [*(("multikueueclusters", name) for name in kubeconfigs), ("admissionchecks", check)],
        120,
    )
