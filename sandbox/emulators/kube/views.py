"""How stored objects are shown: list pages, kubectl's Table format, and watch event lines."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
from typing import Any

import kmock

from sandbox.emulators.kube.errors import bad_request
from sandbox.emulators.kube.object_store import StoreCore, WatchEvent
from sandbox.emulators.kube.registry import ResourceType
from sandbox.emulators.kube.selectors import (
    Requirement,
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)


def _token(namespace: str, name: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([namespace, name]).encode()).decode()


def list_page(
    rtype: ResourceType,
    items: list[dict[str, Any]],
    rv: int,
    limit: str | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    """A ``<Kind>List`` body; ``limit``/``continue`` page through items ordered by namespace/name."""
    meta: dict[str, Any] = {"resourceVersion": str(rv)}
    if token:
        try:
            after = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
        except ValueError:
            raise bad_request(f"invalid continue token {token!r}") from None
        items = [i for i in items if (i["metadata"].get("namespace", ""), i["metadata"]["name"]) > after]
    if limit and limit.isdigit() and 0 < int(limit) < len(items):
        last = items[int(limit) - 1]["metadata"]
        meta["continue"] = _token(last.get("namespace", ""), last["name"])
        meta["remainingItemCount"] = len(items) - int(limit)
        items = items[: int(limit)]
    return {"kind": f"{rtype.kind}List", "apiVersion": rtype.api_version, "metadata": meta, "items": items}


def wants_table(request: kmock.Request) -> bool:
    """Whether the client (kubectl get) asked for the server-side Table rendering."""
    return "as=Table" in request.headers.get("Accept", "")


def _age(timestamp: str | None) -> str:
    if not timestamp:
        return "<unknown>"
    created = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    seconds = int((datetime.datetime.now(datetime.UTC) - created).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * 2:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def render_table(rtype: ResourceType, items: list[dict[str, Any]], rv: str) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table with the Name and Age columns every resource has."""
    columns = [
        {"name": "Name", "type": "string", "format": "name", "description": "Object name", "priority": 0},
        {"name": "Age", "type": "string", "format": "", "description": "Time since creation", "priority": 0},
    ]
    rows = [
        {
            "cells": [item["metadata"]["name"], _age(item["metadata"].get("creationTimestamp"))],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": item["metadata"],
            },
        }
        for item in items
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": columns,
        "rows": rows,
    }


@dataclasses.dataclass(frozen=True)
class WatchFilter:
    """Which objects one watch is about: namespace plus label and field selectors."""

    namespace: str | None
    labels: list[Requirement]
    fields: list[Requirement]

    @classmethod
    def parse(cls, rtype: ResourceType, namespace: str | None, labels: str, fields: str) -> WatchFilter:
        """Parse the selectors once per watch (400 ``KubeApiError`` on bad ones)."""
        return cls(
            namespace,
            parse_label_selector(labels),
            parse_field_selector(fields, rtype.group, rtype.plural, rtype.selectable_fields),
        )

    def matches(self, obj: dict[str, Any] | None) -> bool:
        """Whether an object state is in scope of the watch."""
        if obj is None:
            return False
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return labels_match(self.labels, meta.get("labels")) and fields_match(self.fields, obj)


def watch_line(
    store: StoreCore, rtype: ResourceType, event: WatchEvent, selector: WatchFilter
) -> bytes | None:
    """One newline-terminated watch event, or None when the change is out of the watch's scope.

    As on the real server, an update moving an object into the selection is sent as ADDED and
    one moving it out as DELETED.
    """
    now = selector.matches(event.obj)
    before = selector.matches(event.old) if event.type == "MODIFIED" else now
    if event.type == "MODIFIED" and now != before:
        etype = "ADDED" if now else "DELETED"
    elif now:
        etype = event.type
    else:
        return None
    return (json.dumps({"type": etype, "object": store.present(rtype, event.obj)}) + "\n").encode()


def bookmark_line(rtype: ResourceType, rv: int) -> bytes:
    """The BOOKMARK that marks the end of the initial events of a ``sendInitialEvents`` watch."""
    obj = {
        "apiVersion": rtype.api_version,
        "kind": rtype.kind,
        "metadata": {"resourceVersion": str(rv), "annotations": {"k8s.io/initial-events-end": "true"}},
    }
    return (json.dumps({"type": "BOOKMARK", "object": obj}) + "\n").encode()
