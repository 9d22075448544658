"""What every thin entrypoint shares: the per-instance runtime and the outcome -> HTTP mapping.

A function's ``main.py`` decodes nothing and decides nothing; it hands the CloudEvent and one
service call to :func:`handle`. The mapping is the product's delivery contract with Eventarc:

* the call returns, or raises ``PermanentError`` -> 2xx, the message is acknowledged (and the reason logged);
* it raises ``TransientError`` -> 503 (a clean HTTP error, no traceback), Pub/Sub redelivers with backoff;
* anything else is a bug -> 500 with the traceback logged; redelivery then dead-lettering keep the message.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import flask
from werkzeug.exceptions import HTTPException, ServiceUnavailable

from shared.cloud.permissions import denied_permission, denied_project
from shared.core import logs
from shared.core.errors import InvalidInputError, PermanentError, PermissionDeniedError, TransientError
from shared.core.settings import Settings
from shared.tpu import capacity

if TYPE_CHECKING:  # the adapters import the Google and Kubernetes clients; they are built on first use
    from shared.app.discovery import FleetDirectory
    from shared.cloud.kube import KubeClient
    from shared.cloud.ports import KubeAPI, NodePoolAPI, ReservationAPI, WorkloadPolicyAPI

log = logs.get("entry")

# Clusters outside the fleet whose events are counted one by one; a forged stream of cluster names
# costs a bounded counter, not memory.
OUTSIDERS_KEPT = 256


class Redeliver(ServiceUnavailable):
    """Raised out of a function to answer 503 so that Pub/Sub redelivers the message."""


class Runtime:
    """Per-instance state: settings parsed once, API adapters built lazily and cached.

    Cloud Run reuses an instance for many deliveries, so clients (and their TCP/TLS connections,
    tokens and the GKE cluster lookup) are built on first use and kept; nothing is built at import.
    """

    def __init__(self, settings: Settings, fleet: Runtime | None = None) -> None:
        """``fleet``: the instance's runtime when this one serves another cluster of its fleet."""
        try:  # a misspelled policy would fail every slice; say so at startup instead
            capacity.parse_policy(settings.capacity_policy)
        except ValueError as exc:
            raise InvalidInputError(f"setting CAPACITY_POLICY: {exc}") from None
        for path in settings.fleet_paths if fleet is None else ():
            try:  # and each fleet cluster's own (FLEET_OVERRIDES), before its first event
                capacity.parse_policy(settings.for_cluster(path).capacity_policy)
            except ValueError as exc:
                raise InvalidInputError(
                    f'FLEET_OVERRIDES["{path}"]: setting CAPACITY_POLICY: {exc}'
                ) from None
        self.settings = settings
        self._fleet = fleet
        self._lock = threading.RLock()  # services built under it ask for the adapters
        self._cache: dict[str, Any] = {}
        self.outsiders: collections.Counter[str] = collections.Counter()

    def _cached(self, key: str, build: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._cache:
                self._cache[key] = build()
            return self._cache[key]

    # -- the fleet ------------------------------------------------------------------------------

    def member(self, cluster_path: str, fresh: bool = False) -> Runtime | None:
        """The runtime serving ``cluster_path`` when it is one of the fleet's clusters, else None.
        A cluster of FLEET_PROJECTS is one while GKE lists it with FLEET_LABEL (``discovery``;
        ``fresh`` asks GKE now rather than trusting a listing up to one TTL old).

        Each cluster has its own runtime, so its own Kubernetes client and service graph: GKE's
        operation slots, the request-quota account, stockout backoffs and learnt limits are per
        cluster (GKE counts them per cluster), and a cluster that is unreachable or rate-limited
        holds up none of the others' deliveries. The managed cluster's is this one; the GKE and
        Compute clients (stateless, every call names its resource) are the instance's."""
        if self._fleet is not None:
            return self._fleet.member(cluster_path, fresh)
        if cluster_path == self.settings.cluster_path and self.settings.cluster_name:
            return self
        if cluster_path not in self.settings.fleet_paths and not self._labelled(cluster_path, fresh):
            return None
        member: Runtime = self._cached(
            f"member:{cluster_path}", lambda: Runtime(self.settings.for_cluster(cluster_path), fleet=self)
        )
        return member

    def members(self) -> list[Runtime]:
        """The runtimes of every fleet cluster: the managed cluster's first, then FLEET_CLUSTERS,
        then the labelled clusters of FLEET_PROJECTS."""
        root = self._fleet or self
        paths = list(root.settings.fleet_paths)
        if root.settings.fleet_projects:
            paths += [p for p in root.directory().members() if p not in paths]
        return [m for m in (root.member(p) for p in paths) if m is not None]

    def directory(self) -> FleetDirectory:
        """The instance's listing of the labelled clusters of FLEET_PROJECTS (``shared.app.discovery``)."""
        root = self._fleet or self

        def build() -> FleetDirectory:
            from shared.app.discovery import FleetDirectory

            return FleetDirectory(root.settings, root.gke)

        directory: FleetDirectory = root._cached("directory", build)
        return directory

    def _labelled(self, cluster_path: str, fresh: bool) -> bool:
        if not self.settings.discoverable(cluster_path):
            return False  # not a listed project's: decided without a call
        return self.directory().labelled(cluster_path, fresh)

    def outsider(self, cluster_path: str) -> int:
        """Count one event of a cluster outside the fleet; how many of that cluster's there were.
        The counter keeps at most ``OUTSIDERS_KEPT`` clusters (any further one counts as "other")."""
        root = self._fleet or self
        with root._lock:
            key = (
                cluster_path
                if cluster_path in root.outsiders or len(root.outsiders) < OUTSIDERS_KEPT
                else "other"
            )
            root.outsiders[key] += 1
            return root.outsiders[key]

    def gke(self) -> NodePoolAPI:
        """The GKE node-pool adapter (``shared.cloud.gke.GkeNodePoolAPI``)."""
        if self._fleet is not None:
            return self._fleet.gke()

        def build() -> NodePoolAPI:
            from shared.cloud.gke import GkeNodePoolAPI

            return GkeNodePoolAPI(
                endpoint=self.settings.gke_api_endpoint, access_token=self.settings.emulator_access_token
            )

        gke: NodePoolAPI = self._cached("gke", build)
        return gke

    def compute(self) -> WorkloadPolicyAPI:
        """The Compute Engine workload-policy adapter (``shared.cloud.compute.ComputeWorkloadPolicyAPI``)."""
        if self._fleet is not None:
            return self._fleet.compute()

        def build() -> WorkloadPolicyAPI:
            from shared.cloud.compute import ComputeWorkloadPolicyAPI

            return ComputeWorkloadPolicyAPI(
                endpoint=self.settings.compute_api_endpoint, access_token=self.settings.emulator_access_token
            )

        compute: WorkloadPolicyAPI = self._cached("compute", build)
        return compute

    def reservations(self) -> ReservationAPI:
        """The Compute Engine reservation reader (``shared.cloud.reservations.ComputeReservationAPI``)."""
        if self._fleet is not None:
            return self._fleet.reservations()

        def build() -> ReservationAPI:
            from shared.cloud.reservations import ComputeReservationAPI

            return ComputeReservationAPI(
                endpoint=self.settings.compute_api_endpoint, access_token=self.settings.emulator_access_token
            )

        api: ReservationAPI = self._cached("reservations", build)
        return api

    def kube(self) -> KubeAPI:
        """The Kubernetes adapter (``shared.cloud.kube.KubeClient``) for the managed cluster."""
        return self._kube_client()

    def kube_api_client(self) -> Any:
        """The managed cluster's configured ``kubernetes.client.ApiClient``, which the generic-object
        adapter (``shared.cloud.objects.ApiClientObjects``) shares with ``kube()``."""
        return self._kube_client().api_client

    def _kube_client(self) -> KubeClient:
        def build() -> KubeClient:
            from shared.cloud.kube import connect

            return connect(self.settings, self.gke)

        client: KubeClient = self._cached("kube", build)
        return client

    def service(self, key: str, build: Callable[[Runtime], Any]) -> Any:
        """A domain service built once per instance from this runtime."""
        return self._cached(f"service:{key}", lambda: build(self))


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """The instance's runtime; the first call parses the environment (entrypoints only)."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            settings = Settings.from_env()
            logs.configure(settings.project_id)
            _runtime = Runtime(settings)
        return _runtime


def reset_runtime(settings: Settings | None = None) -> Runtime | None:
    """Drop the cached runtime (tests, sandbox); with ``settings`` install a fresh one built from them."""
    global _runtime
    with _runtime_lock:
        _runtime = Runtime(settings) if settings is not None else None
        if settings is not None:
            logs.configure(settings.project_id)
        return _runtime


def _trace_id(cloud_event: Any) -> str:
    # Eventarc forwards W3C trace context as the `traceparent` extension: 00-<trace>-<span>-<flags>.
    try:
        parent = cloud_event.get("traceparent") or ""
    except Exception:
        return ""
    parts = str(parent).split("-")
    return parts[1] if len(parts) >= 3 else ""


def guard_boundary(function: str) -> None:
    """Answer 400, not a 500 with a traceback, for requests functions-framework itself cannot parse.

    functions-framework raises before calling the function for some malformed bodies (a JSON array,
    a legacy event whose context is a string, undecodable bytes); a 500 would make Pub/Sub redeliver
    garbage until it is dead-lettered. Called from ``main.py`` at import, which functions-framework
    does inside the app context; elsewhere (plain imports) it does nothing.
    """
    if not flask.has_app_context():
        return
    app = flask.current_app._get_current_object()  # type: ignore[attr-defined]

    @app.errorhandler(Exception)
    def _unparseable(exc: Exception) -> Any:
        if isinstance(exc, HTTPException):
            return exc  # functions-framework's own 4xx and our 503 are answers already
        if flask.g.get("tpuprov_entered"):
            raise exc  # the product itself failed: keep the 500 and its traceback
        why = f"not a deliverable event: functions-framework could not parse it ({type(exc).__name__})"
        logs.decision(log, "delivery.rejected", why, logging.WARNING, function=function)
        return why, 400


def handle(function: str, cloud_event: Any, action: Callable[[], Any]) -> None:
    """Run ``action`` for one delivery and map its outcome onto ack (return) or redelivery (raise)."""
    if flask.has_app_context():
        flask.g.tpuprov_entered = True
    try:
        message_id = str(cloud_event.get("id") or "")
    except Exception:
        message_id = ""
    with logs.bound(function=function, message_id=message_id, trace=_trace_id(cloud_event)):
        try:
            action()
        except PermanentError as exc:
            logs.decision(log, "delivery.acked", f"acknowledged without effect: {exc.why}", logging.WARNING)
        except TransientError as exc:
            # Services gather the failures of several pools into one error; a 403 naming a
            # permission among them is still a deployment error, whoever wrapped it.
            permission = (
                exc.permission if isinstance(exc, PermissionDeniedError) else denied_permission(exc.why)
            )
            if permission:
                # Not weather: said once per delivery with the grant that fixes it; the message is
                # still redelivered, so nothing is lost once the role holds the permission.
                project = denied_project(exc.why)
                home = _runtime.settings.project_id if _runtime is not None else ""
                if project and home and project != home:
                    # Custom roles are per project: another project holds no copy until infra makes one.
                    fix = (
                        f"the {function} function holds no role with {permission} in project {project}; "
                        "list it in infra's fleet_projects (its clusters) or reservation_projects (its "
                        "shared reservations) and apply."
                    )
                else:
                    fix = (
                        f"the {function} function's role lacks {permission}; add it to "
                        f'"{function}" in infra/roles.json and apply.'
                    )
                logs.decision(
                    log,
                    "permission.denied",
                    f"will be redelivered: {fix} {exc.why}",
                    logging.ERROR,
                    permission=permission,
                    role=function,
                    project=project or home,
                )
            else:
                logs.decision(log, "delivery.retry", f"will be redelivered: {exc.why}", logging.ERROR)
            raise Redeliver(description=exc.why) from None
