"""The storage core of the sandbox Kubernetes API: objects, resourceVersions, watches, hooks.

Stored objects are never mutated in place (writers build new dicts), so watch history, responses
and readers may share them safely; only callers outside the package get deep copies.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sandbox.emulators.kube.errors import KubeApiError, bad_request, conflict, not_found
from sandbox.emulators.kube.registry import Registry, ResourceType
from sandbox.emulators.kube.selectors import (
    fields_match,
    labels_match,
    parse_field_selector,
    parse_label_selector,
)

GroupResource = tuple[str, str]
ObjectKey = tuple[str, str]  # (namespace or "", name)
CreateDefault = Callable[[ResourceType, dict[str, Any]], None]
WriteHook = Callable[[ResourceType, str, dict[str, Any], str | None], None]
DeleteHook = Callable[[ResourceType, dict[str, Any]], None]

_HISTORY_LIMIT = 20_000
_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUFFIX_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def clone(obj: Any) -> Any:
    """Deep-copy JSON-like data (a JSON round trip is much faster than ``copy.deepcopy``)."""
    return json.loads(json.dumps(obj))


def now_rfc3339() -> str:
    """The current UTC time in the second-precision RFC 3339 form the API server uses."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """One committed change; ``old`` is the previous state for MODIFIED events."""

    rv: int
    type: str
    group_resource: GroupResource
    obj: dict[str, Any]
    old: dict[str, Any] | None = None


class Subscription:
    """A live watch: committed events are pushed into an asyncio queue on the watcher's loop."""

    def __init__(self, group_resource: GroupResource, loop: asyncio.AbstractEventLoop) -> None:
        self.group_resource = group_resource
        self.loop = loop
        self.queue: asyncio.Queue[WatchEvent | None] = asyncio.Queue()

    def push(self, event: WatchEvent | None) -> None:
        """Deliver an event (None ends the watch) from any thread."""
        with contextlib.suppress(RuntimeError):  # the watcher's loop is already closed
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


def key_namespace(rtype: ResourceType, namespace: str | None) -> str:
    """Cluster-scoped objects are keyed under the empty namespace whatever the caller passed."""
    return (namespace or "") if rtype.namespaced else ""


def content_of(obj: dict[str, Any]) -> dict[str, Any]:
    """What decides whether a write changed anything (version bookkeeping excluded)."""
    meta = {
        k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")
    }
    return {**{k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}, "metadata": meta}


def spec_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The part of an object whose change bumps ``metadata.generation``."""
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}


class StoreCore:
    """Objects of every resource, a global resourceVersion counter, watch fan-out and write hooks."""

    def __init__(self, registry: Registry, *, strict_namespaces: bool = True) -> None:
        self.registry = registry
        self.strict_namespaces = strict_namespaces
        self._lock = threading.RLock()
        self._objects: dict[GroupResource, dict[ObjectKey, dict[str, Any]]] = collections.defaultdict(dict)
        self._rv = 0
        self._history: collections.deque[WatchEvent] = collections.deque()
        self._history_floor = 0  # watches from before this resourceVersion get 410 Expired
        self._subscriptions: list[Subscription] = []
        self._depth = 0
        self._pending: list[tuple[str, dict[str, Any]]] = []
        self._listeners: list[Callable[[list[tuple[str, dict[str, Any]]]], None]] = []
        self._timers: list[threading.Timer] = []
        self._closed = False
        self.create_defaults: list[CreateDefault] = []
        self.write_hooks: list[WriteHook] = []
        self.delete_hooks: list[DeleteHook] = []
        # Called once an object is marked for deletion but held back by a finalizer.
        self.terminating_hooks: list[DeleteHook] = []
        # Extra reasons besides metadata.finalizers to hold a deleted object (namespaces' spec.finalizers).
        self.holders: list[Callable[[ResourceType, dict[str, Any]], bool]] = []

    # -- plumbing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """Serialise writes; hand the batch of changes to listeners when the outermost write ends."""
        with self._lock:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._pending:
                    batch, self._pending = self._pending, []
                    for listener in self._listeners:
                        listener(batch)

    def add_listener(self, listener: Callable[[list[tuple[str, dict[str, Any]]]], None]) -> None:
        """Receive each batch of ``(event_type, object)`` changes (called under the store lock)."""
        with self._lock:
            self._listeners.append(listener)

    def schedule(self, delay: float, action: Callable[[], None]) -> None:
        """Run a delayed behaviour; with no delay it runs at once, inside the current write."""
        if delay <= 0:
            action()
            return
        timer = threading.Timer(delay, action)
        timer.daemon = True
        with self._lock:
            if self._closed:
                return
            self._timers = [t for t in self._timers if t.is_alive()] + [timer]
        timer.start()

    def close(self) -> None:
        """Cancel pending timers and end every watch."""
        with self._lock:
            self._closed = True
            timers, self._timers = self._timers, []
            subscriptions, self._subscriptions = self._subscriptions, []
        for timer in timers:
            timer.cancel()
        for sub in subscriptions:
            sub.push(None)

    @property
    def resource_version(self) -> int:
        """The resourceVersion of the latest committed write."""
        with self._lock:
            return self._rv

    def present(self, rtype: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The object as served at one group/version: ``apiVersion`` and ``kind`` set first."""
        rest = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
        return {"apiVersion": rtype.api_version, "kind": rtype.kind, **rest}

    def _commit(
        self, rtype: ResourceType, etype: str, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict:
        self._rv += 1
        meta = {**obj.get("metadata", {}), "resourceVersion": str(self._rv)}
        stored = self.present(rtype, {**obj, "metadata": meta})
        group_resource = (rtype.group, rtype.plural)
        key = (meta.get("namespace", ""), meta["name"])
        if etype == "DELETED":
            self._objects[group_resource].pop(key, None)
        else:
            self._objects[group_resource][key] = stored
        event = WatchEvent(self._rv, etype, group_resource, stored, old)
        self._history.append(event)
        if len(self._history) > _HISTORY_LIMIT:
            self._history_floor = self._history.popleft().rv
        for sub in self._subscriptions:
            if sub.group_resource == group_resource:
                sub.push(event)
        self._pending.append((etype, stored))
        return stored

    def _namespace_of(self, rtype: ResourceType, namespace: str | None, meta: dict[str, Any]) -> str:
        if not rtype.namespaced:
            meta.pop("namespace", None)
            return ""
        body_ns = meta.get("namespace")
        if namespace and body_ns and body_ns != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        resolved = namespace or body_ns or "default"
        meta["namespace"] = resolved
        return str(resolved)

    def _check_namespace(self, namespace: str) -> None:
        if not namespace or not self.strict_namespaces:
            return
        ns_obj = self._objects[("", "namespaces")].get(("", namespace))
        if ns_obj is None:
            raise not_found("namespaces", namespace)
        if ns_obj["metadata"].get("deletionTimestamp"):
            raise KubeApiError(
                403, f"unable to create new content in namespace {namespace} because it is being terminated"
            )

    def _body(self, rtype: ResourceType, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON or YAML object")
        obj = clone(body)
        if obj.get("kind") not in (None, "", rtype.kind):
            raise bad_request(f"the kind {obj['kind']!r} does not match the resource kind {rtype.kind!r}")
        if obj.get("apiVersion") and str(obj["apiVersion"]).rpartition("/")[0] != rtype.group:
            raise bad_request(
                f"the apiVersion {obj['apiVersion']!r} does not match the group {rtype.group!r}"
            )
        if not isinstance(obj.setdefault("metadata", {}), dict):
            raise bad_request("metadata must be an object")
        return obj

    def _find(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        found = self._objects[(rtype.group, rtype.plural)].get((key_namespace(rtype, namespace), name))
        if found is None:
            raise not_found(rtype.plural, name, rtype.group)
        return found

    def preload(self, rtype: ResourceType, objects: Iterable[dict[str, Any]]) -> int:
        """Store objects as given (server fields filled in) without events, history or admission.

        For building clusters of tens of thousands of objects in benchmarks: watches and change
        listeners do not see these writes, which is fine for state that exists before the run.
        """
        count = 0
        with self._lock:
            bucket = self._objects[(rtype.group, rtype.plural)]
            for obj in objects:
                self._rv += 1
                meta = dict(obj.get("metadata") or {})
                namespace = (meta.get("namespace") or "default") if rtype.namespaced else ""
                if rtype.namespaced:
                    meta["namespace"] = namespace
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", now_rfc3339())
                meta["resourceVersion"] = str(self._rv)
                bucket[(namespace, meta["name"])] = self.present(rtype, {**obj, "metadata": meta})
                count += 1
        return count

    # -- reads ---------------------------------------------------------------------------------

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        """One object as served at the resource's version; 404 ``KubeApiError`` when missing."""
        with self._lock:
            return self.present(rtype, self._find(rtype, namespace, name))

    def list_objects(
        self, rtype: ResourceType, namespace: str | None, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[dict[str, Any]], int]:
        """Matching objects sorted by namespace and name, with the store's resourceVersion."""
        labels = parse_label_selector(label_selector)
        fields = parse_field_selector(field_selector, rtype.group, rtype.plural, rtype.selectable_fields)
        if not rtype.namespaced:
            namespace = None  # cluster-scoped objects live outside every namespace
        with self._lock:
            bucket = self._objects[(rtype.group, rtype.plural)]
            items = [
                self.present(rtype, obj)
                for (ns, _), obj in sorted(bucket.items())
                if (namespace is None or ns == namespace)
                and labels_match(labels, obj["metadata"].get("labels"))
                and fields_match(fields, obj)
            ]
            return items, self._rv

    def subscribe(
        self,
        rtype: ResourceType,
        since: str | None,
        loop: asyncio.AbstractEventLoop,
        replay_all: bool = False,
    ) -> tuple[list[WatchEvent], Subscription]:
        """Start a watch: the events to replay first, and the live subscription."""
        group_resource = (rtype.group, rtype.plural)
        with self._lock:
            if replay_all or since in (None, "", "0"):
                objs = sorted(self._objects[group_resource].items())
                initial = [
                    WatchEvent(int(o["metadata"]["resourceVersion"]), "ADDED", group_resource, o)
                    for _, o in objs
                ]
            else:
                try:
                    start = int(str(since))
                except ValueError:
                    raise bad_request(f"invalid resourceVersion {since!r}") from None
                if start < self._history_floor:
                    raise KubeApiError(
                        410, f"too old resource version: {start} ({self._history_floor})", "Expired"
                    )
                initial = [e for e in self._history if e.rv > start and e.group_resource == group_resource]
            sub = Subscription(group_resource, loop)
            if self._closed:
                sub.push(None)
            else:
                self._subscriptions.append(sub)
            return initial, sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop delivering events to a finished watch."""
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)

    # -- helpers shared by the write paths ----------------------------------------------------

    def _held(self, rtype: ResourceType, obj: dict[str, Any]) -> bool:
        """Whether deleting the object must wait for a finalizer."""
        return bool(obj["metadata"].get("finalizers")) or any(holder(rtype, obj) for holder in self.holders)

    def _check_version(self, rtype: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> None:
        wanted = (new.get("metadata") or {}).get("resourceVersion")
        if wanted and str(wanted) != old["metadata"]["resourceVersion"]:
            raise conflict(rtype.plural, old["metadata"]["name"], rtype.group)

    @staticmethod
    def _with_status(old: dict[str, Any], status: Any) -> dict[str, Any]:
        new = {k: v for k, v in old.items() if k != "status"}
        if status is not None:
            new["status"] = status
        return new

    @staticmethod
    def _carry_server_fields(
        rtype: ResourceType, old: dict[str, Any], new: dict[str, Any], *, keep_status: bool
    ) -> dict[str, Any]:
        """Keep what clients cannot change through the main resource: identity, times, status."""
        old_meta = old["metadata"]
        meta = {k: v for k, v in (new.get("metadata") or {}).items() if k not in _SERVER_META}
        meta.update({k: old_meta[k] for k in _SERVER_META if k in old_meta})
        meta["name"] = old_meta["name"]
        if "namespace" in old_meta:
            meta["namespace"] = old_meta["namespace"]
        meta.setdefault("managedFields", old_meta.get("managedFields"))
        if meta["managedFields"] is None:
            del meta["managedFields"]
        result = {**new, "metadata": meta}
        if rtype.has_status and not keep_status:
            result = StoreCore._with_status(result, old.get("status"))
        return result

    @staticmethod
    def _managed_entry(rtype: ResourceType, manager: str, operation: str, subresource: str | None) -> dict:
        entry = {
            "manager": manager,
            "operation": operation,
            "apiVersion": rtype.api_version,
            "time": now_rfc3339(),
            "fieldsType": "FieldsV1",
            "fieldsV1": {},
        }
        if subresource:
            entry["subresource"] = subresource
        return entry

    def group_resources(self) -> list[GroupResource]:
        """Every group/plural that has ever held an object."""
        with self._lock:
            return list(self._objects)
