"""Envelope decoding (shared.events.envelope): Pub/Sub messages, push bodies, CloudEvents."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from shared.events import entries as le
from shared.events.envelope import (
    PUBSUB_EVENT_TYPE,
    ClusterId,
    Decoded,
    Delivery,
    Ignored,
    PodUnschedulable,
    decode_any,
    decode_cloud_event,
    unwrap_cloud_event,
)

CLUSTER = ClusterId("acme-ml-prod", "us-east5", "tpu-v5p-prod")
NS, POD = "ml-team", "llama-pretrain-slice-0-0-x7k2p"
POD_UID = "c3a9e6d2-1f7b-4e58-9b0a-7d64f2e1c835"
WHEN = datetime(2025, 6, 12, 14, 3, 21, tzinfo=UTC)
POD_EVENT = PodUnschedulable(CLUSTER, NS, POD, POD_UID, "FailedScheduling", "m", WHEN, "", "")


def pod_entry(**kwargs: Any) -> dict[str, Any]:
    return le.pod_event_entry(CLUSTER, NS, POD, POD_UID, when=WHEN, **kwargs)


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


MSG = {"data": b64(b"{}"), "attributes": {"a": "b"}, "messageId": "42", "publishTime": "2025-06-12T14:03:22Z"}
DELIVERY = Delivery("42", "2025-06-12T14:03:22Z", "", {"a": "b"})
ENVELOPE_CASES: list[tuple[str, Any, Decoded]] = [
    (
        "bad-base64",
        MSG | {"data": "@@not base64@@"},
        Decoded(Ignored("Pub/Sub message data is not valid base64"), DELIVERY),
    ),
    (
        "bad-json",
        MSG | {"data": b64(b"{nope")},
        Decoded(Ignored("Pub/Sub message data is not JSON"), DELIVERY),
    ),
    (
        "bad-utf8",
        MSG | {"data": b64(b"\xff\xfe\xfd")},
        Decoded(Ignored("Pub/Sub message data is not JSON"), DELIVERY),
    ),
    (
        "data-is-a-list",
        MSG | {"data": b64(b"[1]")},
        Decoded(Ignored("log entry is not a JSON object but list"), DELIVERY),
    ),
    (
        "data-not-text",
        MSG | {"data": 12},
        Decoded(Ignored("Pub/Sub message data is a int, not base64 text"), DELIVERY),
    ),
    (
        "no-data",
        {"messageId": "42", "publishTime": "2025-06-12T14:03:22Z", "attributes": {"a": "b"}},
        Decoded(Ignored("Pub/Sub message has no data"), DELIVERY),
    ),
    (
        "oversize",
        MSG | {"data": b64(b" " * (256 * 1024 + 1))},
        Decoded(Ignored("Pub/Sub message data exceeds 262144 bytes"), DELIVERY),
    ),
    (
        "bad-attributes",
        MSG | {"attributes": {"a": 1}},
        Decoded(Ignored("Pub/Sub message attributes are not a map of strings"), None),
    ),
    (
        "push-message-not-object",
        {"message": "hi", "subscription": "s"},
        Decoded(Ignored("Pub/Sub message is not a JSON object but str"), None),
    ),
    (
        "ce-missing-message",
        {"specversion": "1.0", "type": PUBSUB_EVENT_TYPE, "id": "1", "data": {"subscription": "s"}},
        Decoded(Ignored("CloudEvent data has no Pub/Sub message"), None),
    ),
    (
        "ce-data-not-json",
        {"specversion": "1.0", "type": PUBSUB_EVENT_TYPE, "id": "1", "data": "hello"},
        Decoded(Ignored("CloudEvent data is not JSON"), None),
    ),
    (
        "ce-data-list",
        {"specversion": "1.0", "type": PUBSUB_EVENT_TYPE, "id": "1", "data": [1]},
        Decoded(Ignored("CloudEvent data is not a JSON object but list"), None),
    ),
    (
        "ce-wrong-type",
        {"specversion": "1.0", "type": "google.cloud.storage.object.v1.finalized", "data": {}},
        Decoded(
            Ignored(
                "CloudEvent type 'google.cloud.storage.object.v1.finalized' is not "
                "google.cloud.pubsub.topic.v1.messagePublished"
            ),
            None,
        ),
    ),
    ("not-an-object", "text", Decoded(Ignored("input is not a JSON object but str"), None)),
    (
        "unrecognised",
        {"hello": 1},
        Decoded(Ignored("input is neither a LogEntry, a Pub/Sub message nor a CloudEvent"), None),
    ),
]


@pytest.mark.parametrize(
    ("doc", "expected"), [c[1:] for c in ENVELOPE_CASES], ids=[c[0] for c in ENVELOPE_CASES]
)
def test_garbage_envelopes_are_ignored(doc: Any, expected: Decoded) -> None:
    assert decode_any(doc) == expected


def test_url_safe_base64_and_data_base64_are_accepted() -> None:
    entry = pod_entry(message="m")
    raw = json.dumps(entry).encode()
    message = MSG | {"data": base64.urlsafe_b64encode(raw).decode()}
    assert decode_any(message) == Decoded(POD_EVENT, DELIVERY)
    structured = {
        "specversion": "1.0",
        "type": PUBSUB_EVENT_TYPE,
        "id": "9",
        "time": "t",
        "data_base64": b64(json.dumps({"message": {"data": b64(raw)}}).encode()),
    }
    assert decode_cloud_event(structured) == Decoded(POD_EVENT, Delivery("9", "t", "", {}))


@pytest.mark.parametrize("as_bytes", [False, True], ids=["data-dict", "data-bytes"])
def test_cloudevents_objects(as_bytes: bool) -> None:
    entry = pod_entry(message="m")
    message = le.pubsub_message(entry, message_id="5", attributes={})
    body: Any = le.eventarc_body(message, "projects/p/subscriptions/s")
    body = json.dumps(body).encode() if as_bytes else body
    event = CloudEvent({"type": PUBSUB_EVENT_TYPE, "source": "//pubsub.googleapis.com/x", "id": "5"}, body)
    payload, delivery, why = unwrap_cloud_event(event)
    expected_delivery = Delivery("5", message["publishTime"], "projects/p/subscriptions/s", {})
    assert (json.loads(payload or b""), delivery, why) == (
        json.loads(json.dumps(entry)),
        expected_delivery,
        "",
    )
    assert decode_cloud_event(event) == Decoded(POD_EVENT, expected_delivery)


def test_wrong_cloud_event_type_is_ignored_by_unwrap() -> None:
    event = CloudEvent({"type": "google.cloud.audit.log.v1.written", "source": "//x"}, {"message": MSG})
    assert unwrap_cloud_event(event) == (
        None,
        None,
        f"CloudEvent type 'google.cloud.audit.log.v1.written' is not {PUBSUB_EVENT_TYPE}",
    )
    assert decode_cloud_event(object()) == Decoded(Ignored("not a CloudEvent: object"), None)
