"""Post real CloudEvents to a function through functions-framework's Flask test client.

The three delivery shapes a function must accept: Eventarc binary mode (``ce-*`` headers), Eventarc
structured mode (one ``application/cloudevents+json`` document) and a raw Pub/Sub push body, which
functions-framework converts into a CloudEvent itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import functions_framework

from sandbox.emulators.logging import entries as logentries

REPO = Path(__file__).resolve().parents[2]


class FunctionClient:
    """A function app loaded from ``functions/<target>/main.py`` exactly as Cloud Run serves it."""

    def __init__(self, target: str, project: str = "test-proj", topic: str = "") -> None:
        source = REPO / "functions" / target / "main.py"
        self.app = functions_framework.create_app(target, str(source), "cloudevent")
        self.client = self.app.test_client()
        self.topic = f"projects/{project}/topics/{topic or 'tpuprov-' + target}"
        self.subscription = f"projects/{project}/subscriptions/eventarc-{target}"

    def post_message(self, message: dict[str, Any], mode: str = "binary") -> Any:
        """Deliver a Pub/Sub message (see ``logentries.pubsub_message``) in ``mode``."""
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
        return self.client.post("/", headers=headers, data=body)
