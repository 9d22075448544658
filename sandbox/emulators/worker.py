"""One ordered work queue on a daemon thread, for callbacks that arrive on other threads.

The log router (Kubernetes writes, GKE operation hooks) and the simulated cluster's node mirror
(GKE pool hooks) both turn such callbacks into ordered work without holding the caller.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class QueueWorker:
    """A daemon thread that handles submitted items in order; ``wait_idle`` waits for all of them.

    A failing item is reported through ``on_error`` and never stops the ones behind it.
    """

    def __init__(
        self, name: str, handle: Callable[[Any], object], on_error: Callable[[Any, Exception], object]
    ) -> None:
        self.name = name
        self._handle = handle
        self._on_error = on_error
        self._queue: queue.Queue[tuple[Any] | None] = queue.Queue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, item: Any) -> None:
        """Queue ``item`` for the worker thread."""
        with self._idle:
            self._pending += 1
        self._queue.put((item,))

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Handle what is queued, then stop."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=10)
            self._thread = None

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until every item submitted so far has been handled."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _work(self) -> None:
        while (boxed := self._queue.get()) is not None:
            try:
                self._handle(boxed[0])
            except Exception as exc:
                self._on_error(boxed[0], exc)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()
