"""The real API server seen the way the sandbox's log router reads a cluster.

``sandbox.emulators.logging.router.LogRouter`` subscribes to writes (``on_change``) and reads Pods
(``get``). Here the writes come from where Cloud Logging gets them on GKE: the API server's Events
(a watch of core/v1 Events in every namespace: the scheduler's ``FailedScheduling``, the JobSet
controller's and Kueue's Events, the product's own) and its audit log (``--audit-log-path``, whose
policy records JobSet deletions). Each successful JobSet ``delete`` in the audit log is passed on
as a deleted JobSet, which the router turns into GKE's Admin Activity entry.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.kube.api import ApiError, KubeClient

Listener = Callable[[str, dict[str, Any]], None]
EVENTS = "/api/v1/events"
WATCH_SECONDS = 60.0


def collection(api_version: str, plural: str, namespace: str | None) -> str:
    """The URL path of a collection (``api_version`` ``v1`` is the core group)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


def audited_jobset_deletions(line: str) -> dict[str, Any] | None:
    """The deleted JobSet (as the router wants it) of one audit log line, or None."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    ref = event.get("objectRef") or {}
    status = (event.get("responseStatus") or {}).get("code", 0)
    if (
        event.get("stage") != "ResponseComplete"
        or event.get("verb") != "delete"
        or ref.get("resource") != "jobsets"
        or not 200 <= int(status) < 300
    ):
        return None
    meta = {"namespace": ref.get("namespace", ""), "name": ref.get("name", "")}
    return {
        "apiVersion": f"{ref.get('apiGroup')}/{ref.get('apiVersion')}",
        "kind": "JobSet",
        "metadata": meta,
    }


def follow(
    api: KubeClient,
    path: str,
    handle: Listener,
    stop: threading.Event,
    errors: list[str],
    timeout: float = 5.0,
) -> None:
    """List then watch ``path`` until ``stop``: ``handle("ADDED", obj)`` for what the list holds,
    then every watch event; a fresh list when the watch's version has expired (410)."""
    version = ""
    while not stop.is_set():
        try:
            if not version:
                listing = api.request("GET", path)
                for item in listing.get("items") or []:
                    handle("ADDED", item)
                version = str(listing["metadata"]["resourceVersion"])
            for event_type, obj in api.watch(path, version, timeout=timeout):
                if event_type == "ERROR":
                    version = ""
                    break
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                handle(event_type, obj)
                if stop.is_set():
                    return
        except (ApiError, OSError, ValueError) as exc:
            if stop.is_set():
                return
            errors.append(repr(exc))
            time.sleep(0.5)


class RealKubeState:
    """``get``/``list``/``on_change`` over the real API server (see the module docstring)."""

    def __init__(self, api: KubeClient, audit_log: Path) -> None:
        self.api = api
        self.audit_log = audit_log
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        return self.api.get(f"{collection(api_version, plural, namespace)}/{name}")

    def list(
        self, api_version: str, plural: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        return self.api.list(collection(api_version, plural, namespace), label_selector=label_selector)

    def on_change(self, callback: Listener) -> None:
        self._listeners.append(callback)

    def start(self) -> None:
        for name, target in (("kube-events", self._watch_events), ("kube-audit", self._tail_audit)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=WATCH_SECONDS + 15)

    def _emit(self, event_type: str, obj: dict[str, Any]) -> None:
        for listener in list(self._listeners):
            listener(event_type, obj)

    def _watch_events(self) -> None:
        follow(self.api, EVENTS, self._event, self._stop, self.errors)

    def _event(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type in ("ADDED", "MODIFIED"):
            self._emit(event_type, {"apiVersion": "v1", "kind": "Event", **obj})

    def _tail_audit(self) -> None:
        offset, pending = 0, b""
        while not self._stop.wait(0.2):
            try:
                with self.audit_log.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except FileNotFoundError:
                continue
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                deleted = audited_jobset_deletions(line.decode(errors="replace"))
                if deleted is not None:
                    self._emit("DELETED", deleted)
