"""A local, stateful emulator of the ``google.container.v1`` REST surface the provisioner uses.

It answers the real ``ClusterManagerClient`` (REST transport, ``http://`` endpoint, anonymous
credentials) on 127.0.0.1 for: get and list clusters, set a cluster's resource labels,
list/create node pools, get/delete/update (node labels) a node pool and get an operation.
Requests and responses use the same JSON mapping as GKE (camelCase fields, string or numeric
enums as the client asks) and errors use the ``{"error": {"code", "message", "status"}}`` shape,
so the client raises the same ``google.api_core`` exceptions it raises against GKE.

In-process::

    with GkeEmulator([ClusterSeed("p", "us-central2-b", "c")], op_delay=0) as gke:
        client_endpoint = gke.url

As a process (prints its URL on the first stdout line, stops cleanly on SIGTERM)::

    python -m sandbox.emulators.gke.emulator --port 0 --cluster projects/p/locations/us-central2-b/clusters/c
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from google.cloud.container_v1.types import cluster_service as cs
from google.protobuf import json_format

from sandbox.emulators.gke.capacity import CapacityModel
from sandbox.emulators.gke.faults import KINDS, Faults
from sandbox.emulators.gke.hooks import PoolDeletedHook, PoolReadyHook
from sandbox.emulators.gke.quota import RequestQuota
from sandbox.emulators.gke.rules import ApiError, invalid
from sandbox.emulators.gke.state import ClusterSeed, GkeState
from sandbox.emulators.gke.timing import Duration, InFlight, Latency, as_draw
from sandbox.emulators.gke.wire import ROUTES, Call, Handler, Server, summarize
from sandbox.emulators.iam import UNAUTHENTICATED, Iam, gke_denial
from sandbox.emulators.reservations import Block
from sandbox.emulators.serving import BackgroundServer, request_body, request_path
from sandbox.emulators.serving import route as match_route

__all__ = ["KINDS", "Call", "ClusterSeed", "GkeEmulator", "main"]

_log = logging.getLogger("sandbox.gke")
_CreateRequestPb: Any = cs.CreateNodePoolRequest.pb()
_UpdateRequestPb: Any = cs.UpdateNodePoolRequest.pb()
_ListResponsePb: Any = cs.ListNodePoolsResponse.pb()
_SetLabelsRequestPb: Any = cs.SetLabelsRequest.pb()
# What GKE checks per method: its "API permissions" reference names container.clusters.update for
# node-pool mutations and container.clusters.get for reads; its roles also carry the per-resource
# container.nodePools.* permissions, and the emulator requires both.
PERMISSIONS: dict[str, tuple[str, ...]] = {
    "get_cluster": ("container.clusters.get",),
    # projects.locations.clusters.list and setResourceLabels: GKE's REST reference names the one
    # permission each needs.
    "list_clusters": ("container.clusters.list",),
    "set_labels": ("container.clusters.update",),
    "list": ("container.clusters.get", "container.nodePools.list"),
    "get": ("container.clusters.get", "container.nodePools.get"),
    "create": ("container.clusters.update", "container.nodePools.create"),
    "delete": ("container.clusters.update", "container.nodePools.delete"),
    "update": ("container.clusters.update", "container.nodePools.update"),
    "get_operation": ("container.operations.get",),
}


class GkeEmulator:
    """The emulator: HTTP front end, state, faults and the inspection API tests use."""

    def __init__(
        self,
        clusters: list[ClusterSeed] | None = None,
        op_delay: float = 0.5,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = CapacityModel(clock)
        self.state = GkeState(list(clusters or []), op_delay=op_delay, clock=clock, capacity=self.capacity)
        self.faults = Faults()
        self.quota = RequestQuota(clock)  # GKE's default 3000 requests a minute per project
        self.latency = Latency()
        self.in_flight = InFlight()
        self._host, self._port = host, port
        self._calls: list[Call] = []
        self._answers: Counter[tuple[str, int]] = Counter()
        self._calls_lock = threading.Lock()
        self._stopping = threading.Event()
        self._serving: BackgroundServer | None = None
        self._ticker: threading.Thread | None = None
        self.iam: Iam | None = None  # None: every caller may do everything (emulator-only tests)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` once started."""
        if self._serving is None:
            raise RuntimeError("GKE emulator is not started")
        return self._serving.url

    def start(self) -> GkeEmulator:
        """Bind, then serve and tick operations on background threads."""
        if self._serving is not None:
            return self
        self._stopping.clear()
        server = Server((self._host, self._port), Handler)
        server.emulator = self
        self._serving = BackgroundServer(server, "gke")
        self._ticker = threading.Thread(target=self._tick, name="gke-ticker", daemon=True)
        self._ticker.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake any hung request and join the background threads."""
        serving, self._serving = self._serving, None
        if serving is None:
            return
        self._stopping.set()
        serving.stop()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None

    def __enter__(self) -> GkeEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _tick(self) -> None:
        # Operations finish (and hooks fire) even when nobody polls, like the real service.
        while not self._stopping.wait(0.05):
            self.state.advance()

    # -- configuration, faults and hooks ----------------------------------------------------------

    def set_iam(self, iam: Iam | None) -> None:
        """Authorize every request against ``iam`` (401 without a known token, 403 naming the
        missing permission); None switches authorization off."""
        self.iam = iam

    def set_op_delay(self, seconds: float) -> None:
        """How long operations started from now on take to reach DONE (0: immediately)."""
        self.state.set_op_delay(seconds)

    def set_strict_cluster_ops(self, strict: bool = True) -> None:
        """Reject any mutation while another operation runs on the same cluster (400 FAILED_PRECONDITION)."""
        self.state.set_strict_cluster_ops(strict)

    def set_policy_lookup(self, lookup: Callable[[str, str, str], bool] | None) -> None:
        """Refuse (400) pools whose named placement policy ``lookup(project, region, name)`` says is
        missing, e.g. ``ComputeEmulator.exists``; None (the default) checks nothing."""
        self.state.set_policy_lookup(lookup)

    def set_latency(self, duration: Duration | None, kinds: tuple[str, ...] = KINDS) -> None:
        """Hold every request of ``kinds`` for ``duration`` (seconds or a draw) before answering.

        Requests are served on their own threads, so the latency of concurrent calls overlaps as
        it does against GKE. None or 0 switches it off.
        """
        for kind in kinds:
            if kind not in KINDS:
                raise ValueError(f"unknown request kind {kind!r}; use one of {', '.join(KINDS)}")
        self.latency.set(duration, kinds)

    def set_operation_limit(self, limit: int) -> None:
        """At most ``limit`` running node-pool operations per cluster; more mutations get 429."""
        self.state.set_operation_limit(limit)

    def set_op_durations(self, duration: Duration | None) -> None:
        """Operations started from now on take ``duration`` (seconds or a draw per operation)."""
        self.state.set_op_durations(None if duration is None else as_draw(duration))

    def set_request_quota(self, per_minute: int) -> None:
        """API requests a minute per project before GKE's 429 RESOURCE_EXHAUSTED (0: no quota)."""
        self.quota.set(per_minute)

    def running_operations(self, cluster_path: str) -> int:
        """Operations of the cluster not DONE yet."""
        return self.state.running_operations(cluster_path)

    def max_in_flight(self, kind: str) -> int:
        """The most ``kind`` requests the emulator was serving at the same time."""
        return self.in_flight.peak(kind)

    def fail_next(
        self, method: str, status_code: int, message: str = "", times: int | None = 1, status: str = ""
    ) -> None:
        """Answer the next ``times`` ``method`` requests (a kind from ``KINDS``) with an error."""
        self.faults.fail_next(method, status_code, message, times, status)

    def hang_next(self, method: str, seconds: float, times: int | None = 1) -> None:
        """Hold the next ``times`` ``method`` requests for ``seconds`` (woken early by ``stop``)."""
        self.faults.hang_next(method, seconds, times)

    def stockout(self, machine_type: str | None = None, message: str = "", times: int | None = 1) -> None:
        """Make the next creates of ``machine_type`` (None: any) end DONE with a capacity error."""
        self.faults.stockout(machine_type, message, times)

    def set_capacity(
        self, zone: str, kind: str, chips: int | None, until: float | None = None, then: int | None = None
    ) -> None:
        """TPU chips of ``kind`` ("on-demand", "spot", "flex-start") in ``zone`` from now (None:
        unlimited, the default); with ``until``, ``then`` chips that many seconds from now."""
        self.capacity.set(zone, kind, chips, until, then)

    def schedule_capacity(self, zone: str, kind: str, steps: list[tuple[float, int | None]]) -> None:
        """Capacity of ``kind`` in ``zone`` as ``(seconds from now, chips or None)`` steps."""
        self.capacity.schedule(zone, kind, steps)

    def add_reservation(
        self,
        name: str,
        zone: str,
        vms: int,
        machine_type: str = "",
        project: str = "",
        blocks: list[Block] | None = None,
        shared_with: tuple[str, ...] = (),
    ) -> None:
        """A specific reservation of ``vms`` VMs of ``machine_type`` in ``zone`` (project "": the
        cluster's; ``blocks``: a dense one; ``shared_with``: the other projects that may consume it).
        Hand ``capacity.reservations`` to the Compute emulator so that it reports the same book."""
        self.capacity.add_reservation(name, zone, vms, machine_type, project, blocks, shared_with)

    def set_quota(self, region: str, generation: str, chips: int | None, preemptible: bool = False) -> None:
        """Regional Compute quota in TPU chips for ``generation`` ("v5e", "v6e"...; None: unlimited)."""
        self.capacity.set_quota(region, generation, chips, preemptible)

    def capacity_report(self) -> dict[str, Any]:
        """Supply and use per zone and kind, reservations, quota and the pools holding capacity."""
        return self.capacity.report()

    def pool_nodes(self, cluster_path: str, pool: str) -> dict[str, int]:
        """The pool's current nodes per zone (a flex-start pool has none until it gets its slice)."""
        return self.state.node_counts(cluster_path, pool)

    def clear_faults(self) -> None:
        """Disarm every fault."""
        self.faults.clear()

    def faults_fired(self, what: str) -> int:
        """How often a fault fired, e.g. ``"error:create"``, ``"hang:get"``, ``"stockout"``."""
        return self.faults.fired(what)

    def on_pool_ready(self, callback: PoolReadyHook) -> None:
        """Call ``callback(cluster_path, pool_json)`` when a pool reaches RUNNING."""
        self.state.on_pool_ready(callback)

    def on_operation_done(self, callback: Callable[[str, str, str, str], None]) -> None:
        """Call ``callback(cluster_path, pool, method, error)`` whenever a node-pool operation ends."""
        self.state.on_operation_done(callback)

    def on_pool_deleted(self, callback: PoolDeletedHook) -> None:
        """Call ``callback(cluster_path, pool_name)`` when a pool is gone."""
        self.state.on_pool_deleted(callback)

    def on_pool_updated(self, callback: Callable[[str, dict[str, Any]], None]) -> None:
        """Call ``callback(cluster_path, pool_json)`` when a pool update (e.g. new labels) is DONE."""
        self.state.on_pool_updated(callback)

    def finish_operations(self) -> None:
        """Complete all running operations now."""
        self.state.finish_operations()

    # -- inspection -----------------------------------------------------------------------------

    @property
    def calls(self) -> list[Call]:
        """Every request received so far, in order."""
        with self._calls_lock:
            return list(self._calls)

    def count(self, method: str) -> int:
        """How many requests of one kind (``create``, ``delete``, ``list``, ``get``...) arrived."""
        if method not in KINDS:
            raise ValueError(f"unknown request kind {method!r}; use one of {', '.join(KINDS)}")
        with self._calls_lock:
            return Counter(call.method for call in self._calls)[method]

    def answered(self, method: str, status: int) -> int:
        """How many ``method`` requests were answered with HTTP ``status`` (200, 429, 400...)."""
        with self._calls_lock:
            return self._answers[(method, status)]

    def pools(self, cluster_path: str) -> list[dict[str, Any]]:
        """The cluster's node pools as GKE JSON dicts (camelCase, string enums)."""
        return self.state.pools_json(cluster_path)

    # -- HTTP -----------------------------------------------------------------------------------

    def _handle(self, request: Handler) -> None:
        path = request_path(request)
        body = request_body(request)
        route = match_route(ROUTES, request.command, path)
        if route is None:
            self._send_error(request, ApiError(404, "NOT_FOUND", f"No method {request.command} {path}."))
            return
        kind, args = route
        request.kind = kind
        with self._calls_lock:
            self._calls.append(Call(kind, path, summarize(kind, body)))
        try:  # every method counts against the project's quota, reads as much as mutations
            self.quota.admit(path.split("/projects/", 1)[-1].split("/", 1)[0])
        except ApiError as err:
            self._send_error(request, err)
            return
        self.in_flight.enter(kind)
        try:
            latency = self.latency.draw(kind)
            if latency and self._stopping.wait(latency):
                return
            self._serve(request, kind, args, body, path)
        finally:
            self.in_flight.leave(kind)

    def _count_answer(self, kind: str, status: int) -> None:
        if kind:
            with self._calls_lock:
                self._answers[(kind, status)] += 1

    def _serve(self, request: Handler, kind: str, args: tuple[str, ...], body: bytes, path: str) -> None:
        int_enums = "enum-encoding=int" in urllib.parse.unquote(urllib.parse.urlsplit(request.path).query)
        hang = self.faults.take_hang(kind)
        if hang and self._stopping.wait(hang):
            return
        fault = self.faults.take_error(kind)
        if fault is not None:
            self._send_error(request, ApiError(fault.code, fault.status, fault.message))
            return
        try:
            self._authorize(request, kind, args)
            message = self._dispatch(kind, args, body)
        except ApiError as err:
            self._send_error(request, err)
            return
        except Exception as exc:  # an emulator bug must reach the client as a 500, not a dropped socket
            _log.exception("GKE emulator failed on %s %s", request.command, path)
            self._send_error(request, ApiError(500, "INTERNAL", f"emulator error: {exc!r}"))
            return
        request.send_json(200, json_format.MessageToJson(message, use_integers_for_enums=int_enums))

    def _authorize(self, request: Handler, kind: str, args: tuple[str, ...]) -> None:
        if self.iam is None:
            return
        principal = self.iam.principal(request.headers.get("Authorization"))
        if not principal:
            raise ApiError(401, "UNAUTHENTICATED", UNAUTHENTICATED)
        resource = args[0]
        if kind == "get_operation":
            resource = f"projects/{args[0]}/locations/{args[1]}/operations/{args[2]}"
        # IAM checks the grant in the project of the resource asked for (every GKE path starts
        # projects/P), so a role bound in the home project does not reach a fleet cluster elsewhere.
        missing = self.iam.missing(principal, PERMISSIONS[kind], resource.split("/")[1])
        if missing:
            raise ApiError(403, "PERMISSION_DENIED", gke_denial(missing, resource))

    def _dispatch(self, kind: str, args: tuple[str, ...], body: bytes) -> Any:
        if kind == "get_cluster":
            return self.state.get_cluster(args[0])
        if kind == "list_clusters":
            return self.state.list_clusters(args[1], args[2])
        if kind == "set_labels":
            labels = _parsed(body, _SetLabelsRequestPb())
            return self.state.set_resource_labels(
                args[0], dict(labels.resource_labels), labels.label_fingerprint
            )
        if kind == "list":
            return _ListResponsePb(node_pools=self.state.list_pools(args[0]))
        if kind == "get":
            return self.state.get_pool(args[0], args[1])
        if kind == "delete":
            return self.state.delete_pool(args[0], args[1])
        if kind == "get_operation":
            return self.state.get_operation(*args)
        if kind == "update":
            update = _parsed(body, _UpdateRequestPb())
            expected = f"{args[0]}/nodePools/{args[1]}"
            if update.name and update.name != expected:
                raise invalid(f"name {update.name!r} does not match the URL ({expected!r}).")
            return self.state.update_pool(args[0], args[1], update)
        request = _parsed(body, _CreateRequestPb())
        if request.parent and request.parent != args[0]:
            raise invalid(f"parent {request.parent!r} does not match the URL ({args[0]!r}).")
        if not request.HasField("node_pool"):
            raise invalid("node_pool must be specified.")
        return self.state.create_pool(args[0], request.node_pool, self.faults.take_stockout)

    @staticmethod
    def _send_error(request: Handler, err: ApiError) -> None:
        payload = {"error": {"code": err.code, "message": err.message, "status": err.status}}
        request.send_json(err.code, json.dumps(payload))


def _parsed(body: bytes, message: Any) -> Any:
    """A request body parsed into ``message``; GKE's 400 text for a body that is not its JSON."""
    try:
        json_format.Parse(body or b"{}", message)
    except json_format.ParseError as err:
        raise invalid(f"Invalid JSON payload received. {err}") from None
    return message


def main(argv: list[str] | None = None) -> int:
    """Run the emulator as a process until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.emulators.gke.emulator", description="Local GKE API emulator"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cluster", action="append", required=True, help="projects/P/locations/L/clusters/C")
    parser.add_argument("--op-delay", type=float, default=0.5)
    parser.add_argument("--endpoint", default="127.0.0.1", help="the clusters' Kubernetes API endpoint")
    parser.add_argument("--ca-cert-b64", default="", help="the clusters' base64 CA certificate")
    parser.add_argument(
        "--release-channel", default="REGULAR", help="the clusters' release channel; '' for none"
    )
    parser.add_argument(
        "--no-workload-identity",
        action="store_true",
        help="seed the clusters without Workload Identity (GKE_METADATA node pools are then refused)",
    )
    args = parser.parse_args(argv)
    seeds = [
        ClusterSeed.from_path(
            path,
            args.endpoint,
            args.ca_cert_b64,
            release_channel=args.release_channel,
            workload_identity=not args.no_workload_identity,
        )
        for path in args.cluster
    ]
    done = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with GkeEmulator(seeds, op_delay=args.op_delay, host=args.host, port=args.port) as emulator:
        print(emulator.url, flush=True)
        while not done.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
