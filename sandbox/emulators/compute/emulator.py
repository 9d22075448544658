"""A local, stateful emulator of the Compute Engine REST calls the product makes: workload policies
and the reads of reservations, their blocks and sub-blocks.

It answers the real ``google.cloud.compute_v1`` clients (REST, ``http://`` endpoint, anonymous
credentials) on 127.0.0.1, at the URIs of google-cloud-compute 1.57.0's REST transports:

* ``POST /compute/v1/projects/{project}/regions/{region}/resourcePolicies`` (insert; answers an Operation)
* ``GET  /compute/v1/projects/{project}/regions/{region}/resourcePolicies/{name}``
* ``GET  /compute/v1/projects/{project}/regions/{region}/operations/{operation}``
* ``GET  /compute/v1/projects/{project}/zones/{zone}/reservations/{reservation}``
* ``GET  .../zones/{zone}/reservations/{reservation}/reservationBlocks`` (list)
* ``GET  .../zones/{zone}/reservations/{reservation}/reservationBlocks/{block}/reservationSubBlocks``

Reservations come from a ``ReservationBook`` (``sandbox.emulators.reservations``), the one the GKE
emulator consumes when it admits a pool, so what Compute reports is what GKE will grant.

Errors use Compute's ``{"error": {"code", "message", "errors": [{"reason", ...}]}}`` shape, so the
client raises the same ``google.api_core`` exceptions it raises against Compute. In-process::

    with ComputeEmulator() as compute:
        endpoint = compute.url
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any

from sandbox.emulators.compute.state import ComputeError, ComputeState
from sandbox.emulators.iam import UNAUTHENTICATED, Iam
from sandbox.emulators.reservations import ReservationBook
from sandbox.emulators.serving import BackgroundServer, request_body, request_path, route

__all__ = ["KINDS", "ComputeEmulator", "main"]

_log = logging.getLogger("sandbox.compute")
_REGION = r"^/compute/v1/projects/([^/]+)/regions/([^/]+)"
_RESERVATION = r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/reservations/([^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(rf"{_REGION}/resourcePolicies$"), "insert"),
    ("GET", re.compile(rf"{_REGION}/resourcePolicies/([^/]+)$"), "get"),
    ("GET", re.compile(rf"{_REGION}/operations/([^/]+)$"), "get_operation"),
    ("GET", re.compile(rf"{_RESERVATION}$"), "get_reservation"),
    ("GET", re.compile(rf"{_RESERVATION}/reservationBlocks$"), "list_blocks"),
    (
        "GET",
        re.compile(rf"{_RESERVATION}/reservationBlocks/([^/]+)/reservationSubBlocks$"),
        "list_sub_blocks",
    ),
]
KINDS = tuple(kind for _, _, kind in _ROUTES)
# What Compute Engine checks per method (its IAM reference for resourcePolicies and regionOperations;
# for reservations, "Manage host maintenance across reservations", Required permissions), in the
# project the path names: a shared reservation is read in the project that owns it.
PERMISSIONS = {
    "insert": "compute.resourcePolicies.create",
    "get": "compute.resourcePolicies.get",
    "get_operation": "compute.regionOperations.get",
    "get_reservation": "compute.reservations.get",
    "list_blocks": "compute.reservationBlocks.list",
    "list_sub_blocks": "compute.reservationSubBlocks.list",
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    emulator: ComputeEmulator


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 10

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: calls are recorded on the emulator instead."""

    def do_GET(self) -> None:
        """Dispatch a GET."""
        self.server.emulator._handle(self)

    def do_POST(self) -> None:
        """Dispatch a POST."""
        self.server.emulator._handle(self)

    def send_json(self, code: int, payload: dict[str, Any]) -> None:
        """Write one JSON response."""
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ComputeEmulator:
    """HTTP front end, state and the inspection API tests use."""

    def __init__(
        self,
        op_delay: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        reservations: ReservationBook | None = None,
    ) -> None:
        self.state = ComputeState(op_delay=op_delay)
        # The GKE emulator's (``GkeEmulator.capacity.reservations``) when both serve one sandbox.
        self.reservations = reservations or ReservationBook()
        self._host, self._port = host, port
        self._serving: BackgroundServer | None = None
        self._calls: Counter[str] = Counter()
        self._faults: dict[str, list[ComputeError]] = {}
        self._lock = threading.Lock()
        self.iam: Iam | None = None  # None: every caller may do everything (emulator-only tests)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` once started."""
        if self._serving is None:
            raise RuntimeError("Compute emulator is not started")
        return self._serving.url

    def start(self) -> ComputeEmulator:
        """Bind a free port and serve on a background thread."""
        if self._serving is None:
            server = _Server((self._host, self._port), _Handler)
            server.emulator = self
            self._serving = BackgroundServer(server, "compute")
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        serving, self._serving = self._serving, None
        if serving is not None:
            serving.stop()

    def __enter__(self) -> ComputeEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- configuration and inspection -----------------------------------------------------------

    def fail_next(
        self, kind: str, code: int, message: str, reason: str = "backendError", times: int = 1
    ) -> None:
        """Answer the next ``times`` requests of ``kind`` (``insert``, ``get``...) with an error."""
        if kind not in KINDS:
            raise ValueError(f"unknown request kind {kind!r}; use one of {', '.join(KINDS)}")
        with self._lock:
            self._faults.setdefault(kind, []).extend(
                ComputeError(code, reason, message) for _ in range(times)
            )

    def deny(self, permission: str) -> None:
        """Refuse calls needing ``permission`` with Compute's 403 text."""
        self.state.deny(permission)

    def exists(self, project: str, region: str, name: str) -> bool:
        """Whether a resource policy exists (GKE emulator hook)."""
        return self.state.exists(project, region, name)

    def topology_of(self, name: str) -> str:
        """The accelerator topology of the workload policy ``name`` (any region), "" if none."""
        for policy in self.state.policies():
            if policy.get("name") == name.rsplit("/", 1)[-1]:
                return str((policy.get("workloadPolicy") or {}).get("acceleratorTopology", ""))
        return ""

    def policies(self) -> list[dict[str, Any]]:
        """Every resource policy, as Compute JSON."""
        return self.state.policies()

    def count(self, kind: str) -> int:
        """How many requests of ``kind`` arrived."""
        with self._lock:
            return self._calls[kind]

    # -- HTTP -----------------------------------------------------------------------------------

    def _handle(self, request: _Handler) -> None:
        path = request_path(request)
        body = request_body(request)
        found = route(_ROUTES, request.command, path)
        if found is None:
            request.send_json(
                404, ComputeError(404, "notFound", f"No method {request.command} {path}").payload()
            )
            return
        kind, args = found
        with self._lock:
            self._calls[kind] += 1
            queue = self._faults.get(kind) or []
            fault = queue.pop(0) if queue else None
        try:
            if fault is not None:
                raise fault
            self._authorize(request, kind, args, path)
            request.send_json(200, self._dispatch(kind, args, body))
        except ComputeError as err:
            request.send_json(err.code, err.payload())
        except Exception as exc:  # an emulator bug reaches the client as a 500, not a dropped socket
            _log.exception("Compute emulator failed on %s %s", request.command, path)
            request.send_json(500, ComputeError(500, "backendError", f"emulator error: {exc!r}").payload())

    def _authorize(self, request: _Handler, kind: str, args: tuple[str, ...], path: str) -> None:
        iam = self.iam
        if iam is None:
            return
        principal = iam.principal(request.headers.get("Authorization"))
        if not principal:
            raise ComputeError(401, "authError", UNAUTHENTICATED)
        permission = PERMISSIONS[kind]
        # Checked in the project the path names (every route starts projects/P), as GKE's calls are.
        if iam.missing(principal, (permission,), args[0]):
            resource = path.removeprefix("/compute/v1/")
            if kind == "insert":
                resource = f"projects/{args[0]}/regions/{args[1]}/resourcePolicies"
            raise ComputeError(403, "forbidden", f"Required '{permission}' permission for '{resource}'")

    def _dispatch(self, kind: str, args: tuple[str, ...], body: bytes) -> dict[str, Any]:
        if kind in ("get_reservation", "list_blocks", "list_sub_blocks"):
            return self._reservation(kind, args)
        if kind == "get":
            return self.state.get_policy(*args)
        if kind == "get_operation":
            return self.state.get_operation(*args)
        try:
            resource = json.loads(body or b"{}")
        except ValueError:
            raise ComputeError(
                400, "parseError", "This API does not support parsing form-encoded input."
            ) from None
        if not isinstance(resource, dict):
            raise ComputeError(400, "invalid", "Invalid JSON payload received.")
        return self.state.insert_policy(args[0], args[1], resource)

    def _reservation(self, kind: str, args: tuple[str, ...]) -> dict[str, Any]:
        project, zone, name = args[:3]
        book = self.reservations
        found: Any
        if kind == "get_reservation":
            found = book.reservation_json(project, zone, name)
        elif kind == "list_blocks":
            items = book.blocks_json(project, zone, name)
            found = (
                None if items is None else {"kind": "compute#reservationBlocksListResponse", "items": items}
            )
        else:
            items = book.sub_blocks_json(project, zone, name, args[3])
            found = (
                None
                if items is None
                else {"kind": "compute#reservationSubBlocksListResponse", "items": items}
            )
        if found is None:
            # Compute's 404 for a missing resource (the shape its resourcePolicies answers use).
            what = f"projects/{project}/zones/{zone}/reservations/{name}"
            if kind == "list_sub_blocks":
                what += f"/reservationBlocks/{args[3]}"
            raise ComputeError(404, "notFound", f"The resource '{what}' was not found")
        result: dict[str, Any] = found
        return result


def main(argv: list[str] | None = None) -> int:
    """Run the emulator as a process until SIGTERM/SIGINT (prints its URL first)."""
    parser = argparse.ArgumentParser(prog="python -m sandbox.emulators.compute.emulator")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--op-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    done = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with ComputeEmulator(op_delay=args.op_delay, host=args.host, port=args.port) as emulator:
        print(emulator.url, flush=True)
        while not done.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
