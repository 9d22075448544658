"""The sandbox timeline: what happened, when, and which part of the stack saw it.

Every component (controllers, scheduler, log router, relay, node mirror, function logs) appends
``(t, source, text)`` here; the demo prints it live and the tests search it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple


class TimelineEntry(NamedTuple):
    """One line: seconds since the stack started, the component, and a human sentence."""

    t: float
    source: str
    text: str

    def render(self) -> str:
        """``  12.34s  router     FailedScheduling ...`` as the demo prints it."""
        return f"{self.t:7.2f}s  {self.source:<10} {self.text}"


Listener = Callable[[TimelineEntry], None]


class Timeline:
    """A thread-safe, append-only list of entries with optional live listeners."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._start = clock()
        self._lock = threading.Lock()
        self._entries: list[TimelineEntry] = []
        self._listeners: list[Listener] = []

    def now(self) -> float:
        """Seconds since the timeline started."""
        return self._clock() - self._start

    def add(self, source: str, text: str) -> TimelineEntry:
        """Record one entry and hand it to the listeners (outside the lock)."""
        with self._lock:
            entry = TimelineEntry(round(self.now(), 3), source, text)
            self._entries.append(entry)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(entry)
            except Exception:
                continue  # a broken printer must not stop the stack
        return entry

    def listen(self, listener: Listener) -> None:
        """Call ``listener`` for every entry added from now on."""
        with self._lock:
            self._listeners.append(listener)

    def entries(self, source: str | None = None, contains: str = "") -> list[TimelineEntry]:
        """A snapshot, optionally filtered by source and by a substring of the text."""
        with self._lock:
            snapshot = list(self._entries)
        return [
            e
            for e in snapshot
            if (source is None or e.source == source) and (not contains or contains in e.text)
        ]

    def render(self) -> str:
        """The whole timeline, one entry per line."""
        return self.render_from(0)

    def render_from(self, index: int) -> str:
        """The timeline from entry number ``index`` on, one entry per line."""
        return "\n".join(entry.render() for entry in self.entries()[index:])
