"""The Kubernetes adapter: ``KubeClient`` implements the ``KubeAPI`` port (``shared.cloud.ports``).

``KubeClient`` talks to the API through the official ``kubernetes`` client's ``ApiClient`` but asks
for raw JSON (``_preload_content=False``): the product needs a handful of fields, and skipping the
client's model deserialization keeps per-event overhead in the low milliseconds. ``request_json``
is the product's one raw-request path (``shared.cloud.objects`` uses it too) and translates library
errors into ``shared.core.errors``; ``connect`` builds a client for a cluster found through GKE.
The Events it records are built by ``shared.cloud.kube_events``.
"""

from __future__ import annotations

import base64
import json
import logging
import tempfile
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from shared.cloud.endpoint import choose_endpoint
from shared.cloud.errors import from_status
from shared.cloud.kube_events import event_name, event_object, timestamp
from shared.core import labels, logs
from shared.core.errors import (
    AlreadyExistsError,
    ConflictError,
    InvalidInputError,
    NotFoundError,
    PermissionDeniedError,
    RejectedError,
    TransientError,
)
from shared.core.settings import Settings
from shared.tpu.jobsets import JobSet
from shared.tpu.nodes import Node
from shared.tpu.owners import Job
from shared.tpu.pods import Pod
from shared.tpu.workloads import MultiKueueClusterView, WorkloadView, parse_workload

log = logs.get("kube")

JOBSET_PATH = f"/apis/{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"
KUEUE_PATH = "/apis/kueue.x-k8s.io/v1beta2"
# The field manager of the check's status entries (server-side apply owns only what it sets).
CHECK_FIELD_MANAGER = "tpu-provisioner-admission-check"


class KubeClient:
    """``KubeAPI`` over ``kubernetes.client.ApiClient`` (raw JSON, errors wrapped)."""

    def __init__(self, api_client: Any, timeout: float = 5.0, page_size: int = 500) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self.page_size = page_size

    def _call(self, method: str, path: str, query: dict[str, str] | None = None, body: Any = None) -> Any:
        return request_json(self.api_client, method, path, query, body, timeout=self.timeout)

    def get_pod(self, namespace: str, name: str) -> Pod:
        """One pod, parsed once here into the view the product decides on. Raises NotFoundError."""
        return Pod.parse(self._call("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"))

    def _list(self, path: str, query: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Every item of a collection, read ``page_size`` at a time with ``limit``/``continue``.

        Pages keep each response (and the API server's work per request) small on clusters with
        tens of thousands of pods. A continue token that expired between pages (410 Gone) is a
        TransientError like any other failed read: the caller's delivery is retried whole.
        """
        items: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self._call("GET", path, {**(query or {}), "limit": str(self.page_size), "continue": token})
            items.extend(page.get("items") or [])
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    def list_pods(
        self, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> list[Pod]:
        """Pods, optionally in one namespace and filtered by label and field selectors (paged),
        each parsed here into the view ``get_pod`` returns."""
        path = f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"
        query = {"labelSelector": label_selector, "fieldSelector": field_selector}
        return [Pod.parse(pod) for pod in self._list(path, query)]

    def list_nodes(self, label_selector: str = "") -> list[Node]:
        """Nodes, optionally filtered by a label selector, parsed at the boundary."""
        return [Node.parse(n) for n in self._list("/api/v1/nodes", {"labelSelector": label_selector})]

    def set_unschedulable(self, node: str, unschedulable: bool, why: str) -> None:
        """Cordon or uncordon ``node`` with one JSON merge patch (``kubectl cordon`` does the same)."""
        # The annotation names the product and the reason, so an operator running `kubectl describe
        # node` sees who cordoned it; null removes it again on uncordon.
        patch = {
            "metadata": {"annotations": {labels.CORDONED: why[:1024] if unschedulable else None}},
            "spec": {"unschedulable": True if unschedulable else None},
        }
        request_json(
            self.api_client,
            "PATCH",
            f"/api/v1/nodes/{quote(node)}",
            body=patch,
            content_type="application/merge-patch+json",
            timeout=self.timeout,
        )

    def get_jobset(self, namespace: str, name: str) -> JobSet:
        """One JobSet, parsed at the boundary. Raises NotFoundError."""
        path = f"{JOBSET_PATH}/namespaces/{quote(namespace)}/{labels.JOBSET_PLURAL}/{quote(name)}"
        return JobSet.parse(self._call("GET", path))

    def get_namespace_labels(self, name: str) -> dict[str, str]:
        """A Namespace's labels. Raises NotFoundError."""
        found = (self._call("GET", f"/api/v1/namespaces/{quote(name)}").get("metadata") or {}).get("labels")
        return {str(k): str(v) for k, v in (found or {}).items()}

    def get_job(self, namespace: str, name: str) -> Job:
        """One batch/v1 Job, parsed at the boundary. Raises NotFoundError."""
        return Job.parse(
            self._call("GET", f"/apis/batch/v1/namespaces/{quote(namespace)}/jobs/{quote(name)}")
        )

    def list_jobsets(self, namespace: str | None = None) -> list[JobSet]:
        """JobSets, optionally in one namespace, parsed at the boundary."""
        if namespace:
            path = f"{JOBSET_PATH}/namespaces/{quote(namespace)}/{labels.JOBSET_PLURAL}"
        else:
            path = f"{JOBSET_PATH}/{labels.JOBSET_PLURAL}"
        return [JobSet.parse(js) for js in self._list(path)]

    def annotate_jobset(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str,
        why: str,
    ) -> JobSet:
        """Patch a JobSet's annotations (JSON merge patch) on the condition that it is unchanged.

        The resourceVersion in the patch makes the API server refuse it with 409 Conflict if another
        writer got there first, so read-modify-write of an annotation never loses an update.
        """
        path = f"{JOBSET_PATH}/namespaces/{quote(namespace)}/{labels.JOBSET_PLURAL}/{quote(name)}"
        logs.decision(log, "kube.annotate_jobset", why, namespace=namespace, jobset=name)
        return JobSet.parse(self._patch_annotations(path, annotations, resource_version))

    def _patch_annotations(
        self, path: str, annotations: Mapping[str, str | None], resource_version: str
    ) -> Any:
        """A JSON merge patch of an object's annotations, conditional on ``resource_version``
        (ConflictError when the API server answers 409)."""
        patch = {"metadata": {"resourceVersion": resource_version, "annotations": dict(annotations)}}
        try:
            return request_json(
                self.api_client,
                "PATCH",
                path,
                body=patch,
                content_type="application/merge-patch+json",
                timeout=self.timeout,
            )
        except AlreadyExistsError as exc:  # a 409 on an update is a Conflict, not "exists"
            raise ConflictError(exc.why) from None

    def record_event(
        self, involved: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        """Record a core/v1 Event, aggregated like Kubernetes' recorder; best effort, because the
        decision it reports was already made.

        The Event's name is derived from (object, reason, message): a repeat meets 409 and bumps
        ``count`` and ``lastTimestamp`` of the existing Event instead of adding another object.
        """
        name = event_name(involved, reason, message)
        event = event_object(involved, reason, message, warning=warning, name=name)
        events = f"/api/v1/namespaces/{quote(event['metadata']['namespace'])}/events"
        try:
            try:
                self._call("POST", events, body=event)
            except AlreadyExistsError:
                existing = self._call("GET", f"{events}/{quote(name)}")
                bump = {"count": int(existing.get("count") or 1) + 1, "lastTimestamp": timestamp()}
                request_json(
                    self.api_client,
                    "PATCH",
                    f"{events}/{quote(name)}",
                    body=bump,
                    content_type="application/merge-patch+json",
                    timeout=self.timeout,
                )
        except PermissionDeniedError as exc:
            # The decision stands, but `kubectl describe` will never show it: say which grant is missing.
            logs.decision(
                log,
                "permission.denied",
                f"could not record {reason} Event: the function's role lacks {exc.permission}",
                logging.ERROR,
                permission=exc.permission,
            )
        except (TransientError, RejectedError, NotFoundError, AlreadyExistsError) as exc:
            logs.decision(log, "event.unrecorded", f"could not record {reason} Event: {exc.why}")

    # -- Kueue (the admission check) -------------------------------------------------------------

    def get_workload(self, namespace: str, name: str) -> WorkloadView:
        """One Kueue Workload, parsed here once. Raises NotFoundError."""
        path = f"{KUEUE_PATH}/namespaces/{quote(namespace)}/workloads/{quote(name)}"
        return parse_workload(self._call("GET", path))

    def list_workloads(self, namespace: str | None = None) -> list[WorkloadView]:
        """Kueue Workloads, optionally in one namespace (paged), parsed here once."""
        where = f"/namespaces/{quote(namespace)}" if namespace else ""
        path = f"{KUEUE_PATH}{where}/workloads"
        return [parse_workload(w) for w in self._list(path)]

    def get_multikueue_cluster(self, name: str) -> MultiKueueClusterView:
        """One MultiKueueCluster (a MultiKueue manager's). Raises NotFoundError."""
        return MultiKueueClusterView.parse(
            self._call("GET", f"{KUEUE_PATH}/multikueueclusters/{quote(name)}")
        )

    def annotate_multikueue_cluster(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str, why: str
    ) -> None:
        """Merge-patch a MultiKueueCluster's annotations on the condition that it is unchanged (409
        Conflict otherwise, as ``annotate_jobset``)."""
        logs.decision(log, "kube.annotate_multikueue_cluster", why, multikueue_cluster=name)
        self._patch_annotations(
            f"{KUEUE_PATH}/multikueueclusters/{quote(name)}", annotations, resource_version
        )

    def get_cluster_queue(self, name: str) -> dict[str, Any]:
        """One Kueue ClusterQueue. Raises NotFoundError."""
        return dict(self._call("GET", f"{KUEUE_PATH}/clusterqueues/{quote(name)}"))

    def get_resource_flavor(self, name: str) -> dict[str, Any]:
        """One Kueue ResourceFlavor. Raises NotFoundError."""
        return dict(self._call("GET", f"{KUEUE_PATH}/resourceflavors/{quote(name)}"))

    def _apply_status(self, path: str, body: dict[str, Any]) -> None:
        # admissionChecks and conditions are list maps keyed by name/type: an apply owns only the
        # entry it sends, so Kueue's and other controllers' entries are never overwritten.
        request_json(
            self.api_client,
            "PATCH",
            f"{path}/status",
            {"fieldManager": CHECK_FIELD_MANAGER, "force": "true"},
            body=body,
            content_type="application/apply-patch+yaml",
            timeout=self.timeout,
        )

    def set_admission_check_state(self, namespace: str, name: str, state: Mapping[str, Any]) -> None:
        """Server-side apply of this product's ``status.admissionChecks`` entry on a Workload."""
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"admissionChecks": [dict(state)]},
        }
        self._apply_status(f"{KUEUE_PATH}/namespaces/{quote(namespace)}/workloads/{quote(name)}", body)

    def set_admission_check_active(self, name: str, message: str) -> None:
        """Server-side apply of the AdmissionCheck's ``Active=True`` condition."""
        condition = {
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": message[:32768],
            "lastTransitionTime": timestamp(),
        }
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {"conditions": [condition]},
        }
        self._apply_status(f"{KUEUE_PATH}/admissionchecks/{quote(name)}", body)


def request_json(
    api_client: Any,
    method: str,
    path: str,
    query: Mapping[str, str] | None = None,
    body: Any = None,
    content_type: str = "application/json",
    timeout: float = 5.0,
) -> Any:
    """One raw request through a ``kubernetes`` ApiClient; JSON in, JSON out, errors translated.

    Uses the client's own serialization, auth hooks and connection pool, but skips its model
    deserialization. This is the only place the product touches the client's request layer.
    """
    from kubernetes.client.exceptions import ApiException

    what = f"{method} {path}"
    headers = {"Accept": "application/json", "Content-Type": content_type}
    query_params = [(k, v) for k, v in (query or {}).items() if v]
    try:
        request = api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query_params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = api_client.call_api(*request, _request_timeout=timeout)
        response.read()
        status, raw = int(response.status), response.data
    except ApiException as exc:
        raise translate_status(
            int(exc.status or 0), _detail(exc.body) or str(exc.reason or ""), what
        ) from None
    except Exception as exc:  # urllib3 connection/protocol errors and timeouts
        raise TransientError(f"Kubernetes API unreachable for {what}: {exc}") from None
    if not 200 <= status <= 299:
        raise translate_status(status, _detail(raw), what)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        raise TransientError(f"Kubernetes API returned non-JSON for {what}") from None


def _detail(raw: Any) -> str:
    try:
        return str(json.loads(raw or "{}").get("message", ""))
    except (ValueError, AttributeError, TypeError):
        return ""


def translate_status(status: int, detail: str, what: str) -> Exception:
    """Map a Kubernetes API HTTP status onto the product's errors (``shared.cloud.errors``, the
    mapping GKE and Compute Engine share; an expired list continue token's 410 is transient there)."""
    return from_status(status, f"{what}: HTTP {status} {detail}".strip(), detail)


def api_client_for(settings: Settings, gke: Callable[[], Any], cluster_path: str | None = None) -> Any:
    """Build a configured ``kubernetes.client.ApiClient`` for the managed (or the named) cluster.

    Local runs name an endpoint (no auth) or a kubeconfig; production looks the cluster up in GKE
    and authenticates with the function's Google identity, refreshing the token as it expires.
    """
    from kubernetes import client as k8s

    cfg = k8s.Configuration()
    cfg.retries = 1
    if settings.kube_api_endpoint:
        cfg.host = settings.kube_api_endpoint.rstrip("/")
        if settings.emulator_access_token:  # the identity the sandbox's API server authorizes
            cfg.api_key = {"authorization": settings.emulator_access_token}
            cfg.api_key_prefix = {"authorization": "Bearer"}
        return k8s.ApiClient(cfg)
    if settings.kubeconfig:
        from kubernetes import config as k8s_config

        try:
            k8s_config.load_kube_config(
                config_file=settings.kubeconfig,
                context=settings.kube_context or None,
                client_configuration=cfg,
            )
        except k8s_config.ConfigException as exc:
            # A fleet cluster without its context: a deployment error, the same at every redelivery.
            raise InvalidInputError(
                f"kubeconfig {settings.kubeconfig} cannot reach {settings.cluster_path}: {exc}"
            ) from None
        return k8s.ApiClient(cfg)

    path = cluster_path or settings.cluster_path
    if not (settings.project_id and settings.location and settings.cluster_name) and not cluster_path:
        raise InvalidInputError("PROJECT_ID, LOCATION and CLUSTER_NAME must be set to reach the cluster")
    cluster = gke().get_cluster(path)
    endpoint = choose_endpoint(cluster, settings.control_plane_endpoint)
    cfg.host = endpoint.host
    if endpoint.cluster_ca:
        with tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False) as ca:
            ca.write(base64.b64decode(cluster.ca_certificate))
        cfg.ssl_ca_cert = ca.name
    cfg.api_key_prefix = {"authorization": "Bearer"}

    import google.auth
    import google.auth.transport.requests

    credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])

    def refresh(conf: Any) -> None:
        if not credentials.valid:
            credentials.refresh(google.auth.transport.requests.Request())
        conf.api_key = {"authorization": credentials.token}

    # The client calls this hook before each request; the attribute is untyped in the library.
    setattr(cfg, "refresh_api_key_hook", refresh)  # noqa: B010
    refresh(cfg)
    return k8s.ApiClient(cfg)


def connect(settings: Settings, gke: Callable[[], Any], cluster_path: str | None = None) -> KubeClient:
    """A ``KubeClient`` for the managed cluster (or ``cluster_path``)."""
    return KubeClient(api_client_for(settings, gke, cluster_path), page_size=settings.kube_list_page_size)
