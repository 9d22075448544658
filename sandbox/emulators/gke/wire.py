"""The HTTP plumbing of the GKE emulator: routes, the server and the per-request handler."""

from __future__ import annotations

import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from sandbox.emulators.gke.emulator import GkeEmulator

_CLUSTER = r"/v1/(projects/[^/]+/locations/[^/]+/clusters/[^/]+)"
ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(r"^/v1/(projects/([^/]+)/locations/([^/]+))/clusters$"), "list_clusters"),
    (
        "POST",
        re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/clusters/[^/:]+):setResourceLabels$"),
        "set_labels",
    ),
    ("GET", re.compile(rf"^{_CLUSTER}$"), "get_cluster"),
    ("GET", re.compile(rf"^{_CLUSTER}/nodePools$"), "list"),
    ("POST", re.compile(rf"^{_CLUSTER}/nodePools$"), "create"),
    ("GET", re.compile(rf"^{_CLUSTER}/nodePools/([^/]+)$"), "get"),
    ("DELETE", re.compile(rf"^{_CLUSTER}/nodePools/([^/]+)$"), "delete"),
    ("PUT", re.compile(rf"^{_CLUSTER}/nodePools/([^/]+)$"), "update"),
    ("GET", re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/operations/([^/]+)$"), "get_operation"),
]


class Call(NamedTuple):
    """One request the emulator received: its kind (``create``...), URL path and a short summary."""

    method: str
    path: str
    summary: str


def summarize(kind: str, body: bytes) -> str:
    """A one-line summary of a create request (for the call log)."""
    if kind != "create":
        return ""
    try:
        pool = json.loads(body or b"{}").get("nodePool", {})
        config, placement = pool.get("config", {}), pool.get("placementPolicy", {})
        return (
            f"name={pool.get('name', '')} machineType={config.get('machineType', '')} "
            f"nodes={pool.get('initialNodeCount', 0)} topology={placement.get('tpuTopology', '')}"
        )
    except (ValueError, AttributeError):
        return "<unparseable body>"


class Server(ThreadingHTTPServer):
    """The threaded HTTP server; each request is handed to its emulator."""

    daemon_threads = True
    emulator: GkeEmulator


class Handler(BaseHTTPRequestHandler):
    """One HTTP exchange, dispatched to the emulator."""

    server: Server
    timeout = 10  # a client that connects and never sends must not pin a thread forever
    status_sent = 0  # the HTTP status of the answer, once sent
    kind = ""  # the routed method, once known

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet; calls are recorded on the emulator instead."""

    def do_GET(self) -> None:
        """Dispatch a GET."""
        self.server.emulator._handle(self)

    def do_POST(self) -> None:
        """Dispatch a POST."""
        self.server.emulator._handle(self)

    def do_DELETE(self) -> None:
        """Dispatch a DELETE."""
        self.server.emulator._handle(self)

    def do_PUT(self) -> None:
        """Dispatch a PUT."""
        self.server.emulator._handle(self)

    def send_json(self, code: int, payload: str) -> None:
        """Write one JSON response and close the exchange."""
        data = payload.encode()
        self.status_sent = code
        # Counted before the client can read the answer, so a test that got it sees it counted.
        self.server.emulator._count_answer(self.kind, code)
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
