"""What the sandbox's simulated cluster components share: API access, a write lock, Events, loops.

The JobSet controller, the scheduler and the node mirror all read-modify-write Pods in the same
``KubeApiServer``. The direct ``put`` creates an object that is missing, so two of them racing on
one Pod could resurrect a Pod another just deleted; one lock around every read-modify-write keeps
them from interleaving (the functions only read Pods, they never write them).
"""

from __future__ import annotations

import datetime
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from shared.cloud.kube_events import event_object
from shared.core import labels

JOBSET_API = f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"
RUN_SECONDS_ANNOTATION = "sandbox.tpuprov.dev/run-seconds"
# Pods of restart attempts below this number fail instead of succeeding (to exercise restarts).
FAIL_UNTIL_ATTEMPT_ANNOTATION = "sandbox.tpuprov.dev/fail-until-attempt"


class KubeState(Protocol):
    """The direct-access surface of ``sandbox.emulators.kube.api.KubeApiServer`` the simulation uses."""

    def get(
        self, api_version: str, kind_plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """One object or None."""
        ...

    def list(
        self, api_version: str, plural: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Matching objects."""
        ...

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace."""
        ...

    def patch_status(
        self, api_version: str, plural: str, namespace: str | None, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the status."""
        ...

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> bool:
        """Delete; False if missing."""
        ...

    def on_change(self, callback: Callable[[str, dict[str, Any]], None]) -> None:
        """Subscribe to writes."""
        ...

    def on_create(self, mutate: Callable[[str, str, dict[str, Any]], None]) -> None:
        """Mutate objects as they are created (a mutating admission webhook)."""
        ...


def now_rfc3339() -> str:
    """The current time as Kubernetes writes timestamps (seconds, UTC, ``Z``)."""
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """The object's status condition of type ``kind`` (any status), or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_true(obj: Mapping[str, Any], kind: str) -> bool:
    """Whether condition ``kind`` is True."""
    cond = condition(obj, kind)
    return cond is not None and cond.get("status") == "True"


def with_condition(
    status: Mapping[str, Any], kind: str, value: bool, reason: str, message: str
) -> list[dict[str, Any]]:
    """The status's conditions with ``kind`` set (transition time kept when the value is unchanged)."""
    wanted = "True" if value else "False"
    conditions = [dict(c) for c in status.get("conditions") or []]
    for cond in conditions:
        if cond.get("type") == kind:
            if cond.get("status") != wanted:
                cond["lastTransitionTime"] = now_rfc3339()
            cond.update(status=wanted, reason=reason, message=message)
            return conditions
    conditions.append(
        {
            "type": kind,
            "status": wanted,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now_rfc3339(),
        }
    )
    return conditions


def jobset_pods(api: KubeState, jobset: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods of this JobSet object: its name's label, and its uid's (not a recreated namesake's)."""
    meta = jobset.get("metadata") or {}
    pods = api.list(
        "v1",
        "pods",
        meta.get("namespace", "default"),
        label_selector=f"{labels.JOBSET_NAME}={meta.get('name', '')}",
    )
    return [
        p
        for p in pods
        if (p.get("metadata") or {}).get("labels", {}).get(labels.JOBSET_UID) == meta.get("uid", "")
    ]


def ref(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of an object."""
    meta = obj.get("metadata") or {}
    return (
        f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        if meta.get("namespace")
        else str(meta.get("name"))
    )


class Notes(Protocol):
    """Where the simulated components write what they did (the stack's ``Timeline``)."""

    def add(self, source: str, text: str) -> object:
        """Record one line from ``source``."""
        ...


class SimContext:
    """The API, the shared write lock and the timeline, handed to every simulated component."""

    def __init__(self, api: KubeState, timeline: Notes) -> None:
        self.api = api
        self.timeline = timeline
        self.lock = threading.RLock()
        # ``namespace/name`` of every pod that failed because its node's pool was deleted under it.
        self.pods_killed: list[str] = []

    def record_event(
        self,
        involved: Mapping[str, Any],
        reason: str,
        message: str,
        *,
        warning: bool = False,
        component: str,
    ) -> dict[str, Any]:
        """Create a core/v1 Event about ``involved`` as a controller's event recorder would."""
        meta = involved.get("metadata") or {}
        event = event_object(
            dict(involved),
            reason,
            message,
            warning=warning,
            component=component,
            name=f"{meta.get('name')}.{secrets.token_hex(8)}",
        )
        return self.api.put(event)

    def bump_event(self, event: dict[str, Any], message: str) -> dict[str, Any] | None:
        """Record a repeat of ``event`` the way the API aggregates them: count + 1, new lastTimestamp.

        Returns None when the Event is gone (the caller then records a new one).
        """
        meta = event.get("metadata") or {}
        current = self.api.get("v1", "events", meta.get("namespace"), str(meta.get("name", "")))
        if current is None:
            return None
        current["count"] = int(current.get("count") or 1) + 1
        current["lastTimestamp"] = now_rfc3339()
        current["message"] = message
        return self.api.put(current)


class Loop:
    """A background thread running ``step()`` every ``interval`` seconds or sooner when woken."""

    name = "loop"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def wake(self) -> None:
        """Run the next step now rather than at the next tick."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                self.step()
            except Exception as exc:  # a bad step is recorded; the loop keeps simulating
                self.errors = [*self.errors[-49:], repr(exc)]

    def step(self) -> None:
        """One pass of the loop (subclasses)."""
        raise NotImplementedError
