"""Decode what the functions receive into typed events, once, at the boundary.

Input arrives as a Pub/Sub ``messagePublished`` CloudEvent (Eventarc binary or structured mode,
or the variant functions-framework builds from a raw Pub/Sub push) whose message data is one
Cloud Logging ``LogEntry`` routed there by a log sink. Three kinds of entries matter:

* a Kubernetes Event about a Pod that cannot be scheduled -> :class:`PodUnschedulable`;
* a Kubernetes Event that a JobSet reached a terminal state -> :class:`JobSetFinished`;
* a GKE Admin Activity audit entry for a successful JobSet delete -> :class:`JobSetDeleted`.

Everything else becomes :class:`Ignored` with a precise reason. Nothing here raises on bad
input, and every name that later ends up in an API path is validated first, because the log
router forwards whatever lands in the log. This module handles the envelopes; LogEntry
classification lives in ``shared.events.logentry`` and field validation in ``shared.events.fields``
(import everything from here).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from shared.events.fields import (
    JOBSET_TERMINAL_REASONS,
    OUTCOME_COMPLETED,
    OUTCOME_FAILED,
    SCHEDULING_FAILURE_REASONS,
    ClusterId,
    clip,
    first_str,
    format_timestamp,
    parse_timestamp,
)
from shared.events.logentry import (
    Event,
    Ignored,
    JobSetDeleted,
    JobSetFinished,
    NodePoolOperationDone,
    PodUnschedulable,
    WorkloadQuotaReserved,
    decode_log_entry,
)

__all__ = [
    "JOBSET_TERMINAL_REASONS",
    "MAX_LOG_ENTRY_BYTES",
    "OUTCOME_COMPLETED",
    "OUTCOME_FAILED",
    "PUBSUB_EVENT_TYPE",
    "PUBSUB_MESSAGE_TYPE",
    "SCHEDULING_FAILURE_REASONS",
    "ClusterId",
    "Decoded",
    "Delivery",
    "Event",
    "Ignored",
    "JobSetDeleted",
    "JobSetFinished",
    "NodePoolOperationDone",
    "PodUnschedulable",
    "WorkloadQuotaReserved",
    "decode_any",
    "decode_cloud_event",
    "decode_log_entry",
    "decode_pubsub_message",
    "parse_timestamp",
    "to_dict",
    "unwrap_cloud_event",
]

PUBSUB_EVENT_TYPE = "google.cloud.pubsub.topic.v1.messagePublished"
PUBSUB_MESSAGE_TYPE = "type.googleapis.com/google.pubsub.v1.PubsubMessage"
# Cloud Logging refuses entries above 256 KiB, so a bigger message cannot be one of ours.
MAX_LOG_ENTRY_BYTES = 256 * 1024
_MAX_BASE64_CHARS = (MAX_LOG_ENTRY_BYTES + 2) // 3 * 4


@dataclasses.dataclass(frozen=True)
class Delivery:
    """How a message reached us; ``message_id`` is the idempotency key for redeliveries."""

    message_id: str
    publish_time: str
    subscription: str  # "" when the envelope does not say (raw push converted by functions-framework)
    attributes: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class Decoded:
    """A decoded event plus its delivery metadata (None when decoding a bare LogEntry)."""

    event: Event
    delivery: Delivery | None


# ----------------------------------------------------------------------------- envelopes


def _unwrap_message(
    message: Any, subscription: str, fallback_id: str = "", fallback_time: str = ""
) -> tuple[bytes | None, Delivery | None, str]:
    if not isinstance(message, Mapping):
        return None, None, f"Pub/Sub message is not a JSON object but {type(message).__name__}"
    attributes = message.get("attributes")
    attributes = {} if attributes is None else attributes
    if not isinstance(attributes, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        return None, None, "Pub/Sub message attributes are not a map of strings"
    delivery = Delivery(
        # Push bodies carry both spellings; the converted raw-push variant only camelCase.
        message_id=first_str(message, "messageId", "message_id") or fallback_id,
        publish_time=first_str(message, "publishTime", "publish_time") or fallback_time,
        subscription=subscription,
        attributes=dict(attributes),
    )
    data = message.get("data")
    if data is None or data == "":
        return None, delivery, "Pub/Sub message has no data"
    if not isinstance(data, str):
        return None, delivery, f"Pub/Sub message data is a {type(data).__name__}, not base64 text"
    if len(data) > _MAX_BASE64_CHARS:
        return None, delivery, f"Pub/Sub message data exceeds {MAX_LOG_ENTRY_BYTES} bytes"
    try:
        payload = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        try:  # proto3 JSON also allows the URL-safe alphabet for bytes fields
            payload = base64.b64decode(data, altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            return None, delivery, "Pub/Sub message data is not valid base64"
    if len(payload) > MAX_LOG_ENTRY_BYTES:
        return None, delivery, f"Pub/Sub message data exceeds {MAX_LOG_ENTRY_BYTES} bytes"
    return payload, delivery, ""


def _decoded(payload: bytes | None, delivery: Delivery | None, why: str) -> Decoded:
    if payload is None:
        return Decoded(Ignored(why), delivery)
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return Decoded(Ignored("Pub/Sub message data is not JSON"), delivery)
    return Decoded(decode_log_entry(doc), delivery)


def _json_object(data: Any, what: str) -> tuple[Mapping[str, Any] | None, str]:
    if isinstance(data, (bytes, bytearray, str)):
        if len(data) > 2 * _MAX_BASE64_CHARS:
            return None, f"{what} is too large"
        try:
            data = json.loads(data)
        except (ValueError, RecursionError):
            return None, f"{what} is not JSON"
    if not isinstance(data, Mapping):
        return None, f"{what} is not a JSON object but {type(data).__name__}"
    return data, ""


def _cloud_event_parts(cloud_event: Any) -> tuple[Mapping[str, Any], Any, str]:
    """Attributes and data of a CloudEvent object or of its structured-mode JSON dict."""
    if isinstance(cloud_event, Mapping):
        data = cloud_event.get("data")
        encoded = cloud_event.get("data_base64")
        if data is None and isinstance(encoded, str):
            try:
                data = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                return cloud_event, None, "CloudEvent data_base64 is not valid base64"
        return cloud_event, data, ""
    try:
        get_attributes = getattr(cloud_event, "get_attributes", None)
        get_data = getattr(cloud_event, "get_data", None)
        if callable(get_attributes) and callable(get_data):
            return get_attributes(), get_data(), ""
        return {k: cloud_event.get(k) for k in ("type", "id", "time")}, cloud_event.data, ""
    except (AttributeError, KeyError, TypeError):
        return {}, None, f"not a CloudEvent: {type(cloud_event).__name__}"


def unwrap_cloud_event(cloud_event: Any) -> tuple[bytes | None, Delivery | None, str]:
    """Pub/Sub message payload bytes, its Delivery and "", or (None, delivery or None, why not)."""
    attributes, data, why = _cloud_event_parts(cloud_event)
    if why:
        return None, None, why
    event_type = attributes.get("type")
    if event_type != PUBSUB_EVENT_TYPE:
        return None, None, f"CloudEvent type {clip(event_type)} is not {PUBSUB_EVENT_TYPE}"
    body, why = _json_object(data, "CloudEvent data")
    if body is None:
        return None, None, why
    if "message" not in body:
        return None, None, "CloudEvent data has no Pub/Sub message"
    subscription = body.get("subscription")
    ce_id, ce_time = attributes.get("id"), attributes.get("time")
    return _unwrap_message(
        body["message"],
        subscription if isinstance(subscription, str) else "",
        fallback_id=ce_id if isinstance(ce_id, str) else "",
        fallback_time=ce_time if isinstance(ce_time, str) else "",
    )


def decode_pubsub_message(message: Any) -> Decoded:
    """Decode a Pub/Sub message ``{"data": base64, "attributes", "messageId", "publishTime"}``."""
    return _decoded(*_unwrap_message(message, subscription=""))


def decode_cloud_event(cloud_event: Any) -> Decoded:
    """Decode a Pub/Sub CloudEvent (a cloudevents object or a structured-mode JSON dict)."""
    return _decoded(*unwrap_cloud_event(cloud_event))


def _decode_push_body(body: Mapping[str, Any]) -> Decoded:
    subscription = body.get("subscription")
    return _decoded(
        *_unwrap_message(body.get("message"), subscription if isinstance(subscription, str) else "")
    )


def decode_any(doc: Any) -> Decoded:
    """Auto-detect a LogEntry, Pub/Sub message, push body or structured CloudEvent and decode it."""
    if not isinstance(doc, Mapping):
        return Decoded(Ignored(f"input is not a JSON object but {type(doc).__name__}"), None)
    if "specversion" in doc:
        return decode_cloud_event(doc)
    if "message" in doc:
        return _decode_push_body(doc)
    if any(key in doc for key in ("data", "messageId", "message_id")):
        return decode_pubsub_message(doc)
    if any(key in doc for key in ("logName", "resource", "jsonPayload", "protoPayload", "textPayload")):
        return Decoded(decode_log_entry(doc), None)
    return Decoded(Ignored("input is neither a LogEntry, a Pub/Sub message nor a CloudEvent"), None)


# ----------------------------------------------------------------------------- output


def _delivery_dict(delivery: Delivery) -> dict[str, Any]:
    return {
        "message_id": delivery.message_id,
        "publish_time": delivery.publish_time,
        "subscription": delivery.subscription,
        "attributes": dict(delivery.attributes),
    }


def to_dict(decoded: Decoded) -> dict[str, Any]:
    """A JSON-safe summary: ``{"kind", "cluster", identifying fields..., "reason"[, "delivery"]}``."""
    event = decoded.event
    out: dict[str, Any] = {"kind": event.kind}
    if isinstance(event, Ignored):
        out["cluster"] = event.cluster.path if event.cluster else ""
        out["reason"] = event.reason
    elif isinstance(event, NodePoolOperationDone):
        out["cluster"] = event.cluster.path
        out.update(pool=event.pool, method=event.method, failed=event.failed)
        out["reason"] = (
            f"{event.method} of {event.pool or 'a node pool'} {'failed' if event.failed else 'finished'}"
        )
        out["timestamp"] = format_timestamp(event.timestamp)
    else:
        out["cluster"] = event.cluster.path
        out["namespace"] = event.namespace
        if isinstance(event, PodUnschedulable):
            out.update(pod=event.pod, pod_uid=event.pod_uid)
            out.update(controller_type=event.controller_type, controller_name=event.controller_name)
            out.update(reason=event.reason, message=event.message)
        elif isinstance(event, JobSetFinished):
            out.update(name=event.name, uid=event.uid, outcome=event.outcome, reason=event.reason)
        elif isinstance(event, WorkloadQuotaReserved):
            out.update(name=event.name, uid=event.uid, reason="QuotaReserved", message=event.message)
        else:
            target = f"JobSet {event.name}" if event.name else "every JobSet in the namespace"
            out.update(name=event.name, principal=event.principal)
            out["reason"] = f"{target} deleted by {event.principal or 'an unknown principal'}"
        out["timestamp"] = format_timestamp(event.timestamp)
    if decoded.delivery is not None:
        out["delivery"] = _delivery_dict(decoded.delivery)
    return out
