"""The event loop: a virtual clock and a heap of timed callbacks, deterministic for a given seed."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class Simulation:
    """Runs callbacks in virtual-time order; ``now`` is what every simulated component reads."""

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.stopped = False

    def clock(self) -> float:
        """The virtual time in seconds (usable wherever the product takes a ``clock``)."""
        return self.now

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` at virtual time ``when`` (never in the past)."""
        heapq.heappush(self._queue, (max(when, self.now), next(self._seq), action))

    def after(self, delay: float, action: Callable[[], None]) -> None:
        """Run ``action`` ``delay`` seconds from now."""
        self.at(self.now + delay, action)

    def run(self, until: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Process events in order until ``until``, an empty queue, or ``stop()`` turns true."""
        while self._queue and not self.stopped:
            when, _, action = self._queue[0]
            if when > until:
                break
            heapq.heappop(self._queue)
            self.now = when
            action()
            if stop():
                self.stopped = True
        if not self.stopped:
            self.now = max(self.now, min(until, self._queue[0][0] if self._queue else until))
