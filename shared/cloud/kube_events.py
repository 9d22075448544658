"""The core/v1 Events the product records, named so that stateless instances aggregate repeats.

``event_object`` builds an Event about an involved object as Kubernetes' event recorder writes it;
``event_name`` gives one (object, reason, message) one name, so a repeat is a 409 that bumps its count.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

from shared.core import labels


def timestamp() -> str:
    """Now, as the API writes timestamps (RFC 3339, seconds, UTC)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_object(
    involved: dict[str, Any],
    reason: str,
    message: str,
    *,
    warning: bool = False,
    component: str = labels.EVENT_COMPONENT,
    name: str = "",
) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` as an event recorder writes it (``generateName`` unless named)."""
    meta = involved.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    now = timestamp()
    event_meta = {"name": name} if name else {"generateName": f"{meta.get('name', 'object')}."}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {**event_meta, "namespace": namespace},
        "involvedObject": {
            "apiVersion": involved.get("apiVersion", ""),
            "kind": involved.get("kind", ""),
            "name": meta.get("name", ""),
            "namespace": namespace,
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


def event_name(involved: dict[str, Any], reason: str, message: str) -> str:
    """The deterministic name of the Event about ``involved`` with this reason and message.

    Kubernetes' event recorder aggregates repeats of one (object, reason, message) into one Event
    whose ``count`` and ``lastTimestamp`` grow; a name derived from exactly those lets stateless
    function instances do the same: the first create wins, every repeat answers 409 and bumps it.
    """
    meta = involved.get("metadata") or {}
    key = "\x00".join((str(meta.get("uid", "")), str(meta.get("name", "")), reason, message[:1024]))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{str(meta.get('name') or 'object')[:200]}.{digest}"
