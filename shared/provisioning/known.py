"""Instance-local memory of node pools seen to exist, and single flight per pool name."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# How long an instance trusts that a pool it saw (or created) still exists. A burst of duplicate
# events for a slice then costs one read (the pod) instead of two; a pool deleted meanwhile is
# requested again by the first event after this window (or by reconcile).
KNOWN_POOL_TTL_SECONDS = 30.0


class KnownPools:
    """Instance-local memory of pool names seen to exist, and one create attempt at a time per name.

    Only ever answers "known to exist" for a pool that was listed alive (not ERROR/STOPPING) or
    whose create GKE accepted (or answered 409) less than ``ttl`` seconds ago, so it can delay but
    never suppress the create of a pool nobody has seen.
    """

    _PRUNE_AT = 4096  # entries; expired names are dropped when the map grows past this

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._expiry: dict[str, float] = {}
        self._flights: dict[str, tuple[threading.Lock, int]] = {}

    def remember(self, name: str) -> None:
        """Note that pool ``name`` exists now."""
        if self.ttl <= 0:
            return
        with self._lock:
            now = self._clock()
            if len(self._expiry) >= self._PRUNE_AT:
                self._expiry = {k: v for k, v in self._expiry.items() if v > now}
            self._expiry[name] = now + self.ttl

    def forget(self, name: str) -> None:
        """Stop trusting that pool ``name`` exists (the next event for it lists the pools again)."""
        with self._lock:
            self._expiry.pop(name, None)

    def known(self, name: str) -> bool:
        """Whether pool ``name`` was seen to exist within the last ``ttl`` seconds."""
        with self._lock:
            return self._expiry.get(name, 0.0) > self._clock()

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
