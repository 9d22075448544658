"""Deliveries at the function boundary with call accounting and output capture (fuzz and corpus tests).

``started`` runs the GKE emulator and the provision/release apps in-process against a real API server
(the functions' requests counted from its audit log); ``deliver`` posts one HTTP request through
functions-framework's app and reports the status, the product's JSON log lines, everything else
logged or written to stderr, and how many GKE and Kubernetes API requests the delivery caused.
The envelope helpers build Eventarc/Pub/Sub wrappings around arbitrary, even
wrong-typed, content.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.testing.fixtures.kube import KubeHandle
from sandbox.testing.fnclient import FunctionClient
from shared.app import entry
from shared.core import logs
from shared.core.settings import Settings
from shared.events import entries as logentries
from shared.events.envelope import PUBSUB_EVENT_TYPE
from shared.events.fields import ClusterId

CLUSTER_ID = ClusterId("fuzz-proj", "us-central2-b", "fuzz-cluster")
TOPIC = f"projects/{CLUSTER_ID.project}/topics/t"
SUBSCRIPTION = f"projects/{CLUSTER_ID.project}/subscriptions/s"


@dataclass
class Boundary:
    """The GKE emulator, the API server and one in-process app per function, configured against them."""

    gke: GkeEmulator
    kube: KubeHandle
    settings: Settings
    apps: dict[str, FunctionClient]

    def calls(self) -> tuple[int, int]:
        """(GKE requests, Kubernetes API requests) so far."""
        return len(self.gke.calls), self.kube.count()


@contextlib.contextmanager
def started(kube: KubeHandle, functions: tuple[str, ...] = ("provision", "release")) -> Iterator[Boundary]:
    """Start the GKE emulator and the functions' apps (as provision's identity) against ``kube``."""
    gke = GkeEmulator([ClusterSeed(CLUSTER_ID.project, CLUSTER_ID.location, CLUSTER_ID.name)], op_delay=0)
    gke.start()
    try:
        settings = Settings(
            unlimited_spending=True,
            project_id=CLUSTER_ID.project,
            location=CLUSTER_ID.location,
            cluster_name=CLUSTER_ID.name,
            gke_api_endpoint=gke.url,
            kubeconfig=str(kube.kubeconfig_for("provision")),
        )
        entry.reset_runtime(settings)
        apps = {name: FunctionClient(name, project=CLUSTER_ID.project) for name in functions}
        try:
            yield Boundary(gke, kube, settings, apps)
        finally:
            entry.reset_runtime(None)
            logs.configure()
    finally:
        gke.stop()


@dataclass
class Answer:
    """What one delivery produced."""

    status: int
    body: str
    lines: list[dict[str, Any]]  # the product's JSON log lines
    other_log: str  # every other logger (Flask's app logger, werkzeug...)
    stderr: str
    calls: tuple[int, int]  # (GKE, Kubernetes API) requests caused by this delivery


class _Collect(logging.Handler):
    """Text of every record that reaches the root logger, tracebacks marked."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.text = io.StringIO()

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's text; an attached exception is flagged as a traceback."""
        self.text.write(self.format(record) + "\n")
        if record.exc_info:
            self.text.write("Traceback (from the record's exc_info)\n")


def deliver(boundary: Boundary, function: str, headers: dict[str, str], body: bytes) -> Answer:
    """Post one delivery to ``function`` and capture everything it caused."""
    log_buffer, err_buffer, other = io.StringIO(), io.StringIO(), _Collect()
    root = logging.getLogger()
    root.addHandler(other)
    # DEBUG too: a repeat some reasons are said at (a coalesced object, another outsider event of
    # a cluster already named) still has to say why it was acknowledged.
    logs.configure(boundary.settings.project_id, stream=log_buffer, level=logging.DEBUG)
    before = boundary.calls()
    try:
        with contextlib.redirect_stderr(err_buffer):
            response = boundary.apps[function].post_raw(headers, body)
    finally:
        root.removeHandler(other)
        logs.configure(boundary.settings.project_id)
    after = boundary.calls()
    raw = log_buffer.getvalue()
    return Answer(
        status=response.status_code,
        body=response.get_data(as_text=True),
        lines=[json.loads(line) for line in raw.splitlines() if line.strip()],
        other_log=other.text.getvalue(),
        stderr=err_buffer.getvalue(),
        calls=(after[0] - before[0], after[1] - before[1]),
    )


def message_for(data: Any, attributes: Any = None, message_id: str = "4242") -> dict[str, Any]:
    """A Pub/Sub message with arbitrary (possibly wrong-typed) data and attributes."""
    message: dict[str, Any] = {"data": data, "messageId": message_id, "publishTime": "2026-01-01T00:00:00Z"}
    if attributes is not None:
        message["attributes"] = attributes
    return message


def encode(document: Any) -> str:
    """Base64 of a JSON document, as a log sink publishes a LogEntry."""
    return base64.b64encode(json.dumps(document).encode()).decode()


def wrap(message: Any, mode: str, ce_type: str = PUBSUB_EVENT_TYPE) -> tuple[dict[str, str], bytes]:
    """Headers and body carrying ``message`` in Eventarc binary or structured mode, or as a raw push."""
    return wrap_body({"message": message, "subscription": SUBSCRIPTION}, mode, ce_type)


def wrap_body(
    body: dict[str, Any], mode: str, ce_type: str = PUBSUB_EVENT_TYPE
) -> tuple[dict[str, str], bytes]:
    """Headers and body carrying a push body (``{"message", "subscription"}``) in ``mode``."""
    if mode == "binary":
        headers = logentries.binary_cloudevent_headers({"messageId": "4242", "publishTime": ""}, TOPIC)
        headers["ce-type"] = ce_type
        return headers, json.dumps(body).encode()
    if mode == "structured":
        doc = {
            "specversion": "1.0",
            "id": "4242",
            "source": f"//pubsub.googleapis.com/{TOPIC}",
            "type": ce_type,
            "datacontenttype": "application/json",
            "data": body,
        }
        return {"content-type": "application/cloudevents+json"}, json.dumps(doc).encode()
    return {"content-type": "application/json"}, json.dumps(body).encode()


def load_case(path: Path) -> dict[str, Any]:
    """A corpus file: function, headers, and a body given as text, JSON, or base64 bytes."""
    case: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    if "body_json" in case:
        case["body"] = json.dumps(case["body_json"]).encode()
    elif "body_base64" in case:
        case["body"] = base64.b64decode(case["body_base64"])
    else:
        case["body"] = str(case.get("body_text", "")).encode()
    return case
