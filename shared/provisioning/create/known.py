"""Instance-local memory of node pools seen to exist, and single flight per pool name."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from shared.core.names import SliceId

# How long an instance trusts that a pool it saw (or created) still exists. A burst of duplicate
# events for a slice then costs one read (the pod) instead of two; a pool deleted meanwhile is
# requested again by the first event after this window (or by reconcile).
KNOWN_POOL_TTL_SECONDS = 30.0


def group_of(slice_id: SliceId) -> str:
    """The single-flight key of a slice: its replicated job (one incarnation of the JobSet).

    Provision requests a whole replicated job at once, so every path that may create one of its
    pools in this instance (a pending pod's event, a resume after a finished operation) holds it.
    """
    return f"{slice_id.namespace}/{slice_id.jobset}/{slice_id.jobset_uid}/{slice_id.replicated_job}"


class KnownPools:
    """Instance-local memory of pool names seen to exist, and one create attempt at a time per name.

    Only ever answers "known to exist" for a pool that was listed alive (not ERROR/STOPPING) or
    whose create GKE accepted (or answered 409) less than ``ttl`` seconds ago, so it can delay but
    never suppress the create of a pool nobody has seen. A pool seen STOPPING or ERROR, or deleted
    by this instance, is forgotten at once. A pod created after the pool was last seen (its Job was
    recreated: the JobSet was un-suspended or restarted, and its pools may have been released
    meanwhile) is never answered from memory, so such a pod's pools are requested within one event.
    """

    _PRUNE_AT = 4096  # entries; expired names are dropped when the map grows past this

    def __init__(
        self, ttl: float, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        self.ttl = ttl
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._expiry: dict[str, float] = {}
        self._seen_at: dict[str, float] = {}  # wall-clock time a pool was last seen to exist
        self._flights: dict[str, tuple[threading.Lock, int]] = {}

    def remember(self, name: str) -> None:
        """Note that pool ``name`` exists now."""
        if self.ttl <= 0:
            return
        with self._lock:
            now = self._clock()
            if len(self._expiry) >= self._PRUNE_AT:
                self._expiry = {k: v for k, v in self._expiry.items() if v > now}
                self._seen_at = {k: v for k, v in self._seen_at.items() if k in self._expiry}
            self._expiry[name] = now + self.ttl
            self._seen_at[name] = self._wall()

    def forget(self, name: str) -> None:
        """Drop pool ``name`` (seen STOPPING or ERROR, or deleted): the next event lists again."""
        with self._lock:
            self._expiry.pop(name, None)
            self._seen_at.pop(name, None)

    def known(self, name: str, pod_created: float | None = None) -> bool:
        """Whether pool ``name`` was seen to exist within the last ``ttl`` seconds, and (when the
        asking pod's creation time is given, in Unix seconds) before that pod was created."""
        with self._lock:
            if self._expiry.get(name, 0.0) <= self._clock():
                return False
            # creationTimestamp has whole seconds: a pod of the same second counts as newer.
            return pod_created is None or pod_created < self._seen_at.get(name, 0.0) - 1.0

    @contextmanager
    def single_flight(self, name: str) -> Iterator[None]:
        """Serialize list-and-create for one pool name within this instance.

        Concurrent deliveries for the same slice (every host's pod, duplicates) would otherwise all
        list before the first create lands and all send a create; GKE's 409 keeps that correct,
        but each is a wasted call. Different names never wait on each other.
        """
        with self._lock:
            lock, users = self._flights.get(name, (threading.Lock(), 0))
            self._flights[name] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                lock, users = self._flights[name]
                if users <= 1:
                    del self._flights[name]
                else:
                    self._flights[name] = (lock, users - 1)
