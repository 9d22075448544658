"""Post real CloudEvents to a function through functions-framework's Flask test client.

The three delivery shapes a function must accept: Eventarc binary mode (``ce-*`` headers), Eventarc
structured mode (one ``application/cloudevents+json`` document) and a raw Pub/Sub push body, which
functions-framework converts into a CloudEvent itself.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import functions_framework

from shared.app import entry
from shared.core import logs
from shared.core.settings import Settings
from shared.events import entries as logentries

REPO = Path(__file__).resolve().parents[2]
# Called with the target before each delivery: the test world switches the runtime to that
# function's own identity there, as each function's deployment has its own.
_delivery_hook: Callable[[str], None] | None = None


def set_delivery_hook(hook: Callable[[str], None] | None) -> None:
    """Call ``hook(target)`` before every delivery from now on (None: stop)."""
    global _delivery_hook
    _delivery_hook = hook


class FunctionClient:
    """A function app loaded from ``functions/<target>/main.py`` exactly as Cloud Run serves it."""

    def __init__(self, target: str, project: str = "test-proj", topic: str = "") -> None:
        self.target = target
        source = REPO / "functions" / target / "main.py"
        self.app = functions_framework.create_app(target, str(source), "cloudevent")
        self.client = self.app.test_client()
        self.topic = f"projects/{project}/topics/{topic or 'tpuprov-' + target}"
        self.subscription = f"projects/{project}/subscriptions/eventarc-{target}"

    def _before_delivery(self) -> None:
        if _delivery_hook is not None:
            _delivery_hook(self.target)

    def post_message(self, message: dict[str, Any], mode: str = "binary") -> Any:
        """Deliver a Pub/Sub message (see ``logentries.pubsub_message``) in ``mode``."""
        self._before_delivery()
        if mode == "binary":
            return self.client.post(
                "/",
                headers=logentries.binary_cloudevent_headers(message, self.topic),
                data=json.dumps(logentries.eventarc_body(message, self.subscription)),
            )
        if mode == "structured":
            return self.client.post(
                "/",
                headers={"content-type": "application/cloudevents+json"},
                data=json.dumps(logentries.structured_cloudevent(message, self.topic, self.subscription)),
            )
        if mode == "push":
            body = {"message": message, "subscription": self.subscription}
            return self.client.post("/", headers={"content-type": "application/json"}, data=json.dumps(body))
        raise ValueError(f"unknown delivery mode {mode!r}")

    def post_entry(self, entry: dict[str, Any], mode: str = "binary", message_id: str | None = None) -> Any:
        """Deliver a LogEntry as a log sink would publish it."""
        return self.post_message(logentries.pubsub_message(entry, message_id=message_id), mode)

    def post_raw(self, headers: dict[str, str], body: bytes | str) -> Any:
        """Deliver arbitrary bytes (malformed-input tests)."""
        self._before_delivery()
        return self.client.post("/", headers=headers, data=body)


@dataclasses.dataclass
class LoggedFunction:
    """A served function, the JSON log lines it wrote, and a poster of Pub/Sub payloads."""

    function: FunctionClient
    log: io.StringIO
    sent: int = 0

    def post(self, payload: bytes | None, message_id: str | None = None) -> Any:
        """Deliver ``payload`` as a published message (binary mode); no ``data`` when None."""
        self.sent += 1
        message: dict[str, Any] = {
            "messageId": message_id or str(1000 + self.sent),
            "publishTime": "2026-01-05T10:00:00Z",
            "attributes": {},
        }
        if payload is not None:
            message["data"] = base64.b64encode(payload).decode()
        return self.function.post_message(message)

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines whose ``event`` is ``name``."""
        lines = [json.loads(line) for line in self.log.getvalue().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == name]


@contextlib.contextmanager
def served_function(target: str, settings: Settings, topic: str = "") -> Iterator[LoggedFunction]:
    """``functions/<target>`` configured with ``settings`` (as a deploy would), logs captured."""
    entry.reset_runtime(settings)
    log = io.StringIO()
    logs.configure(settings.project_id, stream=log)
    try:
        yield LoggedFunction(FunctionClient(target, settings.project_id, topic), log)
    finally:
        entry.reset_runtime(None)
        logs.configure()
