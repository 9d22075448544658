"""Cloud Logging plus the product's log sinks, for the sandbox.

Every Kubernetes Event written to the sandbox API becomes the LogEntry GKE's event exporter would
write (``shared.events.entries.kube_event_entry``; a Pod's top-level JobSet controller
goes into the entry labels as GKE derives it), and every JobSet deletion the Admin Activity audit
entry GKE writes (``jobset_delete_audit_entry``). Each entry is matched against the very filter
files Terraform installs (``sinks/*.filter`` through ``sandbox.emulators.logging.filter``) and
published to the sink's topic on the Pub/Sub emulator, as the sink's writer identity would.

Like Cloud Logging it knows sinks by filter and destination topic only (the stack hands it
``{sink: topic}``), watches the Kubernetes API through the two calls of ``WatchedApi``, and reports
what it did through a ``note(source, text)`` callable (the stack's timeline).

Tests can drop chosen entries on the way (a lost export) and publish entries of their own.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from sandbox.emulators.logging.filter import LogFilter, load_filter
from sandbox.emulators.worker import QueueWorker
from shared.app.deployment import sink_clusters
from shared.core import labels
from shared.events.entries import (
    jobset_delete_audit_entry,
    kube_event_entry,
    nodepool_operation_entry,
)
from shared.events.fields import ClusterId

EntryPredicate = Callable[[Mapping[str, Any]], bool]
Note = Callable[[str, str], object]
# The project number the sandbox's service agents are named after (a real project has its own).
SANDBOX_PROJECT_NUMBER = "100000000001"
PUBLISHER_ROLE = "roles/pubsub.publisher"
CONTROLLER_TYPE_LABEL = "logging.gke.io/top_level_controller_type"
CONTROLLER_NAME_LABEL = "logging.gke.io/top_level_controller_name"
# Reasons worth a timeline line even though no sink exports them (the product's own Events).
_NOTABLE = (
    labels.REASON_REQUESTED,
    labels.REASON_REFUSED,
    labels.REASON_FAILED,
    labels.REASON_RELEASED,
)


def writer_identity(project_number: str) -> str:
    """The writer identity of a project's sinks with unique writer identities: Logging's service agent."""
    return f"serviceAccount:service-{project_number}@gcp-sa-logging.iam.gserviceaccount.com"


class WatchedApi(Protocol):
    """What the router needs of the Kubernetes API server: reads of Pods, and every write."""

    def get(
        self, api_version: str, kind_plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """One object or None."""
        ...

    def on_change(self, callback: Callable[[str, dict[str, Any]], None]) -> None:
        """Call ``callback(event_type, object)`` after every write."""
        ...


def _ref(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))


@dataclasses.dataclass(frozen=True)
class Routed:
    """One entry a sink exported: the sink, its topic, the Pub/Sub message id and the entry."""

    sink: str
    topic: str
    message_id: str
    entry: Mapping[str, Any]


@dataclasses.dataclass
class _Drop:
    predicate: EntryPredicate
    remaining: int


class LogRouter:
    """Turns API writes into LogEntries, filters them like the sinks, publishes the matches."""

    def __init__(
        self,
        api: WatchedApi,
        cluster: ClusterId,
        sinks_dir: Path,
        sink_topics: Mapping[str, str],
        publisher: Any,
        note: Note,
        deleted_by: str = "user@example.com",
    ) -> None:
        """``sink_topics`` maps each sink (``sinks_dir/<sink>.filter``) to its destination topic's name."""
        self.api = api
        self.cluster = cluster
        self.sink_topics = dict(sink_topics)
        self.publisher = publisher
        self.note = note
        self.deleted_by = deleted_by
        substitutions = {"project_id": cluster.project, "clusters": sink_clusters([cluster.path])}
        self.filters: dict[str, LogFilter] = {
            name: load_filter(sinks_dir / f"{name}.filter", substitutions) for name in self.sink_topics
        }
        self._lock = threading.Lock()
        self._entries: list[dict[str, Any]] = []
        self._routed: list[Routed] = []
        self._dropped: list[dict[str, Any]] = []
        self._drops: list[_Drop] = []
        # Each sink exports as its writer identity (infra: unique_writer_identity, Logging's service
        # agent) and Terraform grants it roles/pubsub.publisher on the sink's topic. Cloud Logging's
        # exports fail until that grant exists; a test can remove it to see a sink go quiet.
        self.writer_identity = writer_identity(SANDBOX_PROJECT_NUMBER)
        self._publishers: dict[str, set[str]] = {
            topic: {self.writer_identity} for topic in self.sink_topics.values()
        }
        self._export_failures: list[tuple[str, str]] = []
        self._worker = QueueWorker(
            "log-router",
            lambda item: self._route(*item),
            # one bad entry must not stop the router; the timeline shows it
            lambda item, exc: self.note("router", f"routing failed: {exc!r}"),
        )
        api.on_change(self._changed)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the routing thread."""
        self._worker.start()

    def stop(self) -> None:
        """Route what is queued, then stop."""
        self._worker.stop()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every write seen so far has been routed."""
        return self._worker.wait_idle(timeout)

    # -- faults and inspection ------------------------------------------------------------------

    def drop_next(self, predicate: EntryPredicate, times: int = 1) -> None:
        """Lose the next ``times`` exported entries for which ``predicate(entry)`` holds."""
        with self._lock:
            self._drops.append(_Drop(predicate, times))

    @property
    def entries(self) -> list[dict[str, Any]]:
        """Every LogEntry written so far (exported or not)."""
        with self._lock:
            return list(self._entries)

    @property
    def routed(self) -> list[Routed]:
        """Every entry a sink exported, in order."""
        with self._lock:
            return list(self._routed)

    @property
    def dropped(self) -> list[dict[str, Any]]:
        """Entries lost on purpose through ``drop_next``."""
        with self._lock:
            return list(self._dropped)

    def sinks(self) -> list[tuple[str, str, str]]:
        """(sink file name, destination topic, writer identity) of every sink."""
        return [(sink, topic, self.writer_identity) for sink, topic in self.sink_topics.items()]

    def publishers(self, topic: str) -> frozenset[str]:
        """Members holding roles/pubsub.publisher on ``topic`` (the topic's IAM policy)."""
        with self._lock:
            return frozenset(self._publishers.get(topic, ()))

    def revoke_publisher(self, topic: str, member: str) -> None:
        """Remove ``member``'s publisher binding on ``topic``."""
        with self._lock:
            self._publishers.get(topic, set()).discard(member)

    def grant_publisher(self, topic: str, member: str) -> None:
        """Bind ``member`` to roles/pubsub.publisher on ``topic``."""
        with self._lock:
            self._publishers.setdefault(topic, set()).add(member)

    @property
    def export_failures(self) -> list[tuple[str, str]]:
        """(sink, topic) of every export that failed for want of the publisher grant."""
        with self._lock:
            return list(self._export_failures)

    def publish(self, topic: str, entry: Mapping[str, Any]) -> str:
        """Publish ``entry`` to the topic named ``topic`` as a sink would; returns the message id."""
        path = self.publisher.topic_path(self.cluster.project, topic)
        data = json.dumps(entry, separators=(",", ":")).encode()
        attributes = {"logging.googleapis.com/timestamp": str(entry.get("timestamp", ""))}
        return str(self.publisher.publish(path, data, **attributes).result(timeout=30))

    # -- routing --------------------------------------------------------------------------------

    def _changed(self, event_type: str, obj: dict[str, Any]) -> None:
        kind = obj.get("kind")
        wanted = (kind == "Event" and event_type in ("ADDED", "MODIFIED")) or (
            kind == "JobSet" and event_type == "DELETED"
        )
        if wanted:
            self._worker.submit((event_type, obj))

    def operation_done(self, cluster_path: str, pool: str, method: str, error: str) -> None:
        """A GKE node-pool operation ended: write its ``operation.last`` audit entry (a GKE hook)."""
        if cluster_path == self.cluster.path:
            self._worker.submit(("OPERATION", {"pool": pool, "method": method, "error": error}))

    def _route(self, event_type: str, obj: dict[str, Any]) -> None:
        if event_type == "OPERATION":
            entry = nodepool_operation_entry(
                self.cluster, obj["pool"], obj["method"], status_code=13 if obj["error"] else 0
            )
            subject = f"audit: {obj['method']} of {obj['pool']} finished"
            detail = f": {obj['error']}" if obj["error"] else ""
        elif obj.get("kind") == "JobSet":
            meta = obj.get("metadata") or {}
            entry = jobset_delete_audit_entry(
                self.cluster,
                str(meta.get("namespace", "")),
                str(meta.get("name", "")),
                principal=self.deleted_by,
            )
            subject, detail = f"audit: JobSet {_ref(obj)} deleted by {self.deleted_by}", ""
        else:
            entry = kube_event_entry(self.cluster, obj, labels=self._entry_labels(obj))
            involved = obj.get("involvedObject") or {}
            count = obj.get("count") or 1
            repeat = f" (x{count})" if int(count) > 1 else ""
            subject = (
                f"{obj.get('reason')}{repeat} on {involved.get('kind')} "
                f"{involved.get('namespace')}/{involved.get('name')}"
            )
            detail = f": {obj.get('message', '')}"
        with self._lock:
            self._entries.append(entry)
        exported = False
        for sink, flt in self.filters.items():
            if not flt.matches(entry):
                continue
            exported = True
            if self._take_drop(entry):
                self.note("router", f"LOST (dropped) {subject}{detail}")
                continue
            topic = self.sink_topics[sink]
            if self.writer_identity not in self.publishers(topic):
                with self._lock:
                    self._export_failures.append((sink, topic))
                self.note(
                    "router",
                    f"NOT EXPORTED {subject}: sink {sink}'s writer identity lacks {PUBLISHER_ROLE} "
                    f"on {topic}",
                )
                continue
            message_id = self.publish(topic, entry)
            with self._lock:
                self._routed.append(Routed(sink, topic, message_id, entry))
            # Destination first: the demo cuts long lines, and the message is the least interesting part.
            self.note("router", f"{subject} -> {topic} (message {message_id}){detail}")
        if not exported and event_type != "OPERATION" and obj.get("reason") in _NOTABLE:
            self.note("events", f"{subject}{detail}")

    def _take_drop(self, entry: Mapping[str, Any]) -> bool:
        with self._lock:
            for drop in self._drops:
                if drop.remaining > 0 and drop.predicate(entry):
                    drop.remaining -= 1
                    self._dropped.append(dict(entry))
                    self._drops = [d for d in self._drops if d.remaining > 0]
                    return True
        return False

    def _entry_labels(self, event: Mapping[str, Any]) -> dict[str, str]:
        """The labels GKE adds to a Pod's Event entries: the pod's top-level controller."""
        involved = event.get("involvedObject") or {}
        if involved.get("kind") != "Pod":
            return {}
        pod = self.api.get("v1", "pods", involved.get("namespace"), str(involved.get("name", "")))
        if pod is None:
            return {}
        pod_labels = (pod.get("metadata") or {}).get("labels") or {}
        jobset = pod_labels.get(labels.JOBSET_NAME)
        if jobset:
            return {CONTROLLER_TYPE_LABEL: "JobSet", CONTROLLER_NAME_LABEL: str(jobset)}
        return {}
