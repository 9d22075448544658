"""The generic-object Kubernetes seam used by cluster setup and the Kueue queue function.

``ObjectAPI`` is the small protocol the installer and the Kueue service talk to: server-side
apply, get, list and delete of arbitrary objects given as JSON dicts. ``ApiClientObjects``
implements it over a configured ``kubernetes.client.ApiClient`` with raw JSON requests, so no
generated model class ever sits between a release manifest and the API server.

Requests go through ``shared.cloud.kube.request_json`` (the product's one raw-request path, which
translates errors into ``shared.core.errors``). On top of that, admission and conversion webhooks that
are not serving yet (the controller just started, its certificate is not injected, its Service
has no endpoints) become :class:`WebhookNotReadyError`, which callers retry for a bounded time
with :func:`call_retrying` before letting the delivery be retried by Pub/Sub.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar
from urllib.parse import quote

from shared.cloud.kube import request_json
from shared.core import logs
from shared.core.errors import InvalidInputError, RejectedError, TransientError
from shared.core.settings import Settings

log = logs.get("kube_objects")

FIELD_MANAGER = "tpu-provisioner"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"

# Substrings of API server messages that mean "a webhook is not serving yet".
WEBHOOK_NOT_READY_MARKERS = (
    "failed calling webhook",
    "no endpoints available for service",
    "connection refused",
    "conversion webhook for",
)

T = TypeVar("T")


class WebhookNotReadyError(TransientError):
    """An admission or conversion webhook answered an error; it usually heals within a minute."""


@dataclasses.dataclass(frozen=True)
class ResourceKind:
    """Where objects of one kind live in the REST API."""

    group: str  # "" for the core group
    kind: str
    plural: str
    namespaced: bool


# Kinds the release manifests and the Kueue renderer produce, keyed by (group, kind).
_BUILTIN_KINDS: tuple[ResourceKind, ...] = (
    ResourceKind("", "Namespace", "namespaces", False),
    ResourceKind("", "ServiceAccount", "serviceaccounts", True),
    ResourceKind("", "ConfigMap", "configmaps", True),
    ResourceKind("", "Secret", "secrets", True),
    ResourceKind("", "Service", "services", True),
    ResourceKind("", "Pod", "pods", True),
    ResourceKind("", "Node", "nodes", False),
    ResourceKind("", "Event", "events", True),
    ResourceKind("batch", "Job", "jobs", True),
    ResourceKind("apps", "Deployment", "deployments", True),
    ResourceKind("rbac.authorization.k8s.io", "Role", "roles", True),
    ResourceKind("rbac.authorization.k8s.io", "RoleBinding", "rolebindings", True),
    ResourceKind("rbac.authorization.k8s.io", "ClusterRole", "clusterroles", False),
    ResourceKind("rbac.authorization.k8s.io", "ClusterRoleBinding", "clusterrolebindings", False),
    ResourceKind("apiextensions.k8s.io", "CustomResourceDefinition", "customresourcedefinitions", False),
    ResourceKind("apiregistration.k8s.io", "APIService", "apiservices", False),
    ResourceKind(
        "admissionregistration.k8s.io", "MutatingWebhookConfiguration", "mutatingwebhookconfigurations", False
    ),
    ResourceKind(
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        False,
    ),
    ResourceKind("scheduling.k8s.io", "PriorityClass", "priorityclasses", False),
    ResourceKind("kueue.x-k8s.io", "ResourceFlavor", "resourceflavors", False),
    ResourceKind("kueue.x-k8s.io", "ClusterQueue", "clusterqueues", False),
    ResourceKind("kueue.x-k8s.io", "AdmissionCheck", "admissionchecks", False),
    ResourceKind("kueue.x-k8s.io", "LocalQueue", "localqueues", True),
    ResourceKind("kueue.x-k8s.io", "WorkloadPriorityClass", "workloadpriorityclasses", False),
    ResourceKind("kueue.x-k8s.io", "Cohort", "cohorts", False),
    ResourceKind("kueue.x-k8s.io", "Workload", "workloads", True),
    ResourceKind("jobset.x-k8s.io", "JobSet", "jobsets", True),
)


def split_api_version(api_version: str) -> tuple[str, str]:
    """``"apps/v1"`` -> ``("apps", "v1")``; ``"v1"`` -> ``("", "v1")``."""
    group, _, version = api_version.rpartition("/")
    return group, version


class KindRegistry:
    """Maps (group, kind) to plural and scope; knows the built-ins and learns CRDs.

    A static table instead of API discovery: discovery costs a round trip per group on every cold
    start and the product only ever touches the kinds listed here or defined by the CRDs it applies.
    """

    def __init__(self) -> None:
        self._kinds: dict[tuple[str, str], ResourceKind] = {(k.group, k.kind): k for k in _BUILTIN_KINDS}

    def register_crd(self, crd: Mapping[str, Any]) -> None:
        """Learn the kind a CustomResourceDefinition document defines."""
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        group, kind, plural = spec.get("group", ""), names.get("kind", ""), names.get("plural", "")
        if group and kind and plural:
            self._kinds[(group, kind)] = ResourceKind(group, kind, plural, spec.get("scope") != "Cluster")

    def resolve(self, api_version: str, kind: str) -> ResourceKind:
        """The REST location of ``kind``; unknown kinds raise InvalidInputError."""
        group, _ = split_api_version(api_version)
        found = self._kinds.get((group, kind))
        if found is None:
            raise InvalidInputError(f"unknown kind {kind} in {api_version or 'the core group'}")
        return found

    def path(self, api_version: str, kind: str, namespace: str = "", name: str = "") -> str:
        """The collection path (no ``name``) or object path of ``kind``."""
        info = self.resolve(api_version, kind)
        base = f"/apis/{api_version}" if info.group else f"/api/{api_version}"
        if info.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        elif info.namespaced and name:
            raise InvalidInputError(f"{kind} {name} needs a namespace")
        base += f"/{info.plural}"
        return f"{base}/{quote(name, safe='')}" if name else base


def object_key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name) of an object dict; the identity used for diffs."""
    meta = obj.get("metadata") or {}
    return (
        str(obj.get("apiVersion", "")),
        str(obj.get("kind", "")),
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
    )


def describe(obj: Mapping[str, Any]) -> str:
    """Human form of an object's identity, e.g. ``Deployment kueue-system/kueue-controller-manager``."""
    _, kind, namespace, name = object_key(obj)
    return f"{kind} {namespace + '/' if namespace else ''}{name}"


def webhook_not_ready(why: str) -> bool:
    """True when an API error's server message says an admission/conversion webhook is not serving."""
    _, server_said, detail = why.partition(": HTTP ")
    # Only the API server's own answer counts: "connection refused" from the client means the API
    # server itself is unreachable, which is transient but not a webhook problem.
    return bool(server_said) and any(marker in detail.lower() for marker in WEBHOOK_NOT_READY_MARKERS)


class ApiClientObjects:
    """``ObjectAPI`` over a configured ``kubernetes.client.ApiClient``."""

    def __init__(
        self,
        api_client: Any,
        kinds: KindRegistry | None = None,
        field_manager: str = FIELD_MANAGER,
        timeout: float = 30.0,
    ) -> None:
        self.api_client = api_client
        self.kinds = kinds or KindRegistry()
        self.field_manager = field_manager
        self.timeout = timeout

    def _request(self, method: str, path: str, query: Mapping[str, str], body: Any, content_type: str) -> Any:
        try:
            return request_json(
                self.api_client, method, path, query, body, content_type, timeout=self.timeout
            )
        except (TransientError, RejectedError) as exc:
            if webhook_not_ready(exc.why):
                raise WebhookNotReadyError(exc.why) from None
            raise

    def apply(self, obj: Mapping[str, Any], force: bool = True) -> dict[str, Any]:
        """Server-side apply ``obj`` (created when missing) and return the object as stored."""
        api_version, kind, namespace, name = object_key(obj)
        if not name:
            raise InvalidInputError(f"{kind} without metadata.name cannot be applied")
        path = self.kinds.path(api_version, kind, namespace, name)
        query = {"fieldManager": self.field_manager, "force": "true" if force else ""}
        return dict(self._request("PATCH", path, query, dict(obj), APPLY_CONTENT_TYPE))

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        """One object. Raises NotFoundError."""
        path = self.kinds.path(api_version, kind, namespace, name)
        return dict(self._request("GET", path, {}, None, "application/json"))

    def list_objects(
        self, api_version: str, kind: str, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Objects of ``kind`` (in every namespace when ``namespace`` is empty), optionally filtered."""
        path = self.kinds.path(api_version, kind, namespace)
        body = self._request("GET", path, {"labelSelector": label_selector}, None, "application/json")
        items = body.get("items") or []
        # List items omit apiVersion/kind; restore them so callers can treat items like manifests.
        return [{"apiVersion": api_version, "kind": kind, **item} for item in items]

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "") -> None:
        """Delete one object (dependents in the background). Raises NotFoundError."""
        path = self.kinds.path(api_version, kind, namespace, name)
        self._request("DELETE", path, {"propagationPolicy": "Background"}, None, "application/json")


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Time limits of one setup or Kueue run, in seconds."""

    total: float = 280.0
    webhook_retry: float = 120.0
    poll: float = 2.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Bounds:
        """The bounds configured in ``settings``."""
        return cls(
            total=float(settings.setup_timeout_seconds),
            webhook_retry=float(settings.setup_webhook_retry_seconds),
            poll=settings.setup_poll_interval_ms / 1000.0,
        )
