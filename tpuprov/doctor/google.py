"""The production ``Deployment``: the deployed project read through Google's APIs.

Reads with Application Default Credentials (the operator): Service Usage for the enabled APIs, IAM
``projects.roles.get`` and Resource Manager ``getIamPolicy`` for the roles and their bindings, the
Cloud Run Admin API for the services' URLs (REST through ``AuthorizedSession``, no extra client
library), the Pub/Sub admin clients for topics, subscriptions and topic policies, Cloud Logging's
``ConfigServiceV2`` for the sinks, GKE and the Kubernetes API through the functions' own adapters.
Reachability acts as the function's own service account (impersonation), so it tests what the
function gets, not what the operator gets. Nothing here writes.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import tempfile
from collections.abc import Mapping
from typing import Any

from shared.cloud.endpoint import choose_endpoint
from shared.cloud.kube import KubeClient
from shared.core.errors import TpuProvError, TransientError
from shared.core.settings import DEFAULT_SCOPES, Settings
from shared.tpu.nodepools import ClusterInfo
from tpuprov.cluster import ClusterView
from tpuprov.doctor.readers import (
    ClusterObjectReads,
    publishers_in,
    read_subscriptions,
    read_topics,
    short,
)
from tpuprov.doctor.views import (
    SETUP_ROLE,
    Expected,
    ReachView,
    RoleView,
    SinkView,
    SubscriptionView,
)

PUBSUB_DESTINATION = "pubsub.googleapis.com/"


@dataclasses.dataclass(frozen=True)
class ApiRoots:
    """The REST roots the adapter calls (tests point them at a local fake speaking the same JSON)."""

    service_usage: str = "https://serviceusage.googleapis.com/v1"
    iam: str = "https://iam.googleapis.com/v1"
    resource_manager: str = "https://cloudresourcemanager.googleapis.com/v1"
    run: str = "https://run.googleapis.com/v2"


# -- parsing the REST answers (pure; tests/unit/tpuprov/test_doctor_google.py) ---------------------


def enabled_names(page: Mapping[str, Any]) -> list[str]:
    """Service names on one page of ``services.list`` (``config.name``, e.g. ``container.googleapis.com``)."""
    return [
        str((s.get("config") or {}).get("name") or short(str(s.get("name", "")), "services"))
        for s in page.get("services") or []
    ]


def role_view(
    function: str, role: str, answer: Mapping[str, Any] | None, policy: Mapping[str, Any], member: str
) -> RoleView:
    """A ``RoleView`` from ``roles.get`` (None: 404) and the project's IAM policy."""
    bound = any(
        b.get("role") == role and member in (b.get("members") or []) for b in policy.get("bindings") or []
    )
    if answer is None:
        return RoleView(function, role, False, frozenset(), bound)
    return RoleView(
        function,
        role,
        exists=not answer.get("deleted", False),
        permissions=frozenset(answer.get("includedPermissions") or ()),
        bound=bound,
    )


def sink_view(sink: Any) -> SinkView:
    """A ``logging_v2.types.LogSink`` as doctor reads it (topic "" unless it exports to Pub/Sub)."""
    destination = str(sink.destination)
    topic = short(destination, "topics") if destination.startswith(PUBSUB_DESTINATION) else ""
    return SinkView(str(sink.name), topic, str(sink.writer_identity))


# -- the adapter ---------------------------------------------------------------------------------


class GoogleDeployment(ClusterObjectReads):
    """``Deployment`` over the deployed project and cluster."""

    def __init__(
        self, settings: Settings, expected: Expected, region: str, roots: ApiRoots = ApiRoots()
    ) -> None:
        self.settings = settings
        self.expected = expected
        self.region = region
        self.roots = roots
        self.project = settings.project_id  # the deployment's: topics, functions, roles
        self.sink_project = settings.project_id  # whose sinks export the cluster's entries

    def at(self, cluster: str) -> GoogleDeployment:
        """This deployment's view of fleet cluster ``cluster``: that cluster read through GKE, its
        project's sinks; the rest stays the deployment's project."""
        other = GoogleDeployment(self.settings.for_cluster(cluster), self.expected, self.region, self.roots)
        other.project = self.project
        other.sink_project = cluster.split("/")[1]
        return other

    @functools.cached_property
    def _credentials(self) -> Any:
        import google.auth

        try:
            credentials, _ = google.auth.default(scopes=list(DEFAULT_SCOPES))
        except Exception as exc:  # DefaultCredentialsError
            raise TpuProvError(
                f"no Application Default Credentials: {exc} (gcloud auth application-default login)"
            ) from None
        return credentials

    @functools.cached_property
    def _session(self) -> Any:
        from google.auth.transport.requests import AuthorizedSession

        return AuthorizedSession(self._credentials)

    def _rest(self, method: str, url: str, body: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """The JSON answer; None for 404; TpuProvError naming the call otherwise."""
        try:
            response = self._session.request(method, url, json=body, timeout=30)
        except Exception as exc:  # transport failure
            raise TransientError(f"{method} {url}: {exc}") from None
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            try:
                message = response.json().get("error", {}).get("message", "")
            except ValueError:
                message = response.text[:200]
            raise TransientError(f"{method} {url}: HTTP {response.status_code}: {message}")
        answer: dict[str, Any] = response.json()
        return answer

    @functools.cached_property
    def _pubsub(self) -> tuple[Any, Any]:
        from google.cloud.pubsub_v1 import PublisherClient, SubscriberClient

        return PublisherClient(credentials=self._credentials), SubscriberClient(credentials=self._credentials)

    @functools.cached_property
    def _policy(self) -> dict[str, Any]:
        url = f"{self.roots.resource_manager}/projects/{self.project}:getIamPolicy"
        # The functions' roles are bound with IAM conditions (infra/iam.tf): IAM returns a policy with
        # conditional bindings only when version 3 is requested ("Policy versions", IAM docs).
        return self._rest("POST", url, {"options": {"requestedPolicyVersion": 3}}) or {}

    def enabled_services(self) -> frozenset[str]:
        names: list[str] = []
        token = ""
        while True:
            query = f"filter=state:ENABLED&pageSize=200{f'&pageToken={token}' if token else ''}"
            url = f"{self.roots.service_usage}/projects/{self.project}/services?{query}"
            page = self._rest("GET", url) or {}
            names += enabled_names(page)
            token = str(page.get("nextPageToken") or "")
            if not token:
                return frozenset(names)

    def role(self, function: str) -> RoleView:
        role = self.expected.role_name(function)
        member = f"serviceAccount:{self.expected.service_account(function)}"
        if role == SETUP_ROLE:
            return role_view(function, role, {}, self._policy, member)
        return role_view(function, role, self._rest("GET", f"{self.roots.iam}/{role}"), self._policy, member)

    def held_in(self, project: str, function: str) -> frozenset[str]:
        # The project's policy names the roles bound to the account; each role lists its permissions
        # (iam roles.get: projects/P/roles/R for a custom role, roles/R for a predefined one).
        url = f"{self.roots.resource_manager}/projects/{project}:getIamPolicy"
        policy = self._rest("POST", url, {"options": {"requestedPolicyVersion": 3}}) or {}
        member = f"serviceAccount:{self.expected.service_account(function)}"
        held: set[str] = set()
        for binding in policy.get("bindings") or []:
            if member in (binding.get("members") or []):
                role = self._rest("GET", f"{self.roots.iam}/{binding.get('role', '')}") or {}
                held.update(role.get("includedPermissions") or ())
        return frozenset(held)

    def topics(self) -> frozenset[str]:
        return read_topics(self._pubsub[0], self.project)

    def subscriptions(self) -> list[SubscriptionView]:
        return read_subscriptions(self._pubsub[1], self.project)

    def function_url(self, function: str) -> str:
        name = f"projects/{self.project}/locations/{self.region}/services/{self.expected.service(function)}"
        return str((self._rest("GET", f"{self.roots.run}/{name}") or {}).get("uri", ""))

    def function_env(self, function: str) -> dict[str, str]:
        # Cloud Run Admin API v2: a service's template lists each container's env as {name, value}.
        name = f"projects/{self.project}/locations/{self.region}/services/{self.expected.service(function)}"
        service = self._rest("GET", f"{self.roots.run}/{name}") or {}
        containers = (service.get("template") or {}).get("containers") or [{}]
        return {
            str(e.get("name")): str(e.get("value", ""))
            for e in containers[0].get("env") or []
            if e.get("name")
        }

    def sinks(self) -> list[SinkView]:
        from google.cloud.logging_v2.services.config_service_v2 import ConfigServiceV2Client

        try:
            listed = list(
                ConfigServiceV2Client(credentials=self._credentials).list_sinks(
                    parent=f"projects/{self.sink_project}"
                )
            )
        except Exception as exc:
            raise TransientError(f"Cloud Logging list sinks: {exc}") from None
        return [sink_view(s) for s in listed]

    def topic_publishers(self, topic: str) -> frozenset[str]:
        try:
            policy = self._pubsub[0].get_iam_policy(request={"resource": self.expected.topic_path(topic)})
        except Exception as exc:
            raise TransientError(f"Pub/Sub get IAM policy of {topic}: {exc}") from None
        return publishers_in(policy)

    def cluster(self) -> ClusterInfo:
        return ClusterView(self.settings).gke.get_cluster(self.settings.cluster_path)

    def reach(self, function: str) -> ReachView:
        from google.auth import impersonated_credentials
        from google.auth.transport.requests import Request
        from kubernetes import client as k8s

        endpoint = ""
        try:
            chosen = choose_endpoint(self.cluster(), self.settings.control_plane_endpoint)
            endpoint = f"{chosen.kind} {chosen.host.removeprefix('https://')}"
            as_function = impersonated_credentials.Credentials(
                source_credentials=self._credentials,
                target_principal=self.expected.service_account(function),
                target_scopes=list(DEFAULT_SCOPES),
            )
            try:
                as_function.refresh(Request())
            except Exception as exc:
                raise TpuProvError(
                    f"cannot act as {self.expected.service_account(function)} ({exc}); grant yourself "
                    "roles/iam.serviceAccountTokenCreator on it to run this check"
                ) from None
            cfg = k8s.Configuration()
            cfg.host = chosen.host
            if chosen.cluster_ca:
                with tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False) as ca:
                    ca.write(base64.b64decode(self.cluster().ca_certificate))
                cfg.ssl_ca_cert = ca.name
            cfg.api_key = {"authorization": as_function.token}
            cfg.api_key_prefix = {"authorization": "Bearer"}
            KubeClient(k8s.ApiClient(cfg), page_size=self.settings.kube_list_page_size).list_pods("default")
        except TpuProvError as exc:
            return ReachView(function, endpoint, exc.why)
        return ReachView(function, endpoint, "")
