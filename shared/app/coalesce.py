"""Per-object coalescing of repeated events: one decision per object per few seconds per instance.

Anyone allowed to write log entries in the project (``roles/logging.logWriter``) can write entries
the sinks route to the functions, and a real pending pod's FailedScheduling Event repeats too. Each
delivery would cost the Kubernetes reads and a GKE listing, and GKE's request quota is shared with
the creates that matter. So an object (a pod, a Workload, a node pool's finished operation, a
JobSet's end) decided within ``window`` seconds is answered from that decision, with no API call.

Nothing is lost by it: the object's next event after the window is decided afresh (a pending pod's
events repeat for as long as it waits, and the reconcile sweep looks at everything every five
minutes), and a delivery that raised (redelivery) is never remembered, so its retry is decided.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

# The default of EVENT_COALESCE_SECONDS: long enough to absorb a storm of duplicates and forged
# entries, short against how often a real pending pod's events repeat (kube-scheduler retries an
# unschedulable pod within seconds to minutes) and against GKE's minutes-long operations.
WINDOW_SECONDS = 5.0


class Coalescer:
    """Remembers, per object key, that a decision was made and what it said, for ``window`` seconds.
    Bounded: the oldest keys go beyond ``capacity``."""

    def __init__(
        self,
        window: float = WINDOW_SECONDS,
        capacity: int = 8192,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.capacity = capacity
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self.coalesced = 0  # deliveries answered from memory (a metric for the decision line)

    def recent(self, key: str) -> str | None:
        """What was decided for ``key`` less than ``window`` seconds ago, else None."""
        with self._lock:
            found = self._seen.get(key)
            if found is None or self.clock() - found[0] >= self.window:
                return None
            self.coalesced += 1
            return found[1]

    def note(self, key: str, why: str) -> None:
        """Remember that ``key`` was decided now (``why``: what was decided)."""
        if self.window <= 0:
            return
        with self._lock:
            self._seen[key] = (self.clock(), why)
            self._seen.move_to_end(key)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
