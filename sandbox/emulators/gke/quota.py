"""The Kubernetes Engine API's request quota per project, refused the way Google's APIs refuse it.

GKE's "Quotas and limits" page gives the API a default rate limit of 3000 requests a minute per
project. A request beyond it is answered 429 RESOURCE_EXHAUSTED with the wording every Google API
uses for a spent rate quota ("Quota exceeded for quota metric '...' and limit '... per minute' of
service '...' for consumer 'project_number:N'."). The metric and limit names GKE itself uses were
not found in the sources searched; 'Requests' / 'Requests per minute' follow the other services.

The window slides (at most ``per_minute`` requests in any 60 s), which is stricter than a quota
refilled at fixed intervals: a client held under this one is under GKE's too. Refused requests are
not counted, so a client that waits gets through again.
"""

from __future__ import annotations

import collections
import threading
import zlib
from collections.abc import Callable

from sandbox.emulators.gke.rules import ApiError

DEFAULT_PER_MINUTE = 3000
WINDOW_SECONDS = 60.0
QUOTA_EXCEEDED = (
    "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute' of service "
    "'container.googleapis.com' for consumer 'project_number:{number}'."
)


def project_number(project: str) -> int:
    """A stable stand-in for the project's number (the emulator knows projects by id only)."""
    return 100000000000 + zlib.crc32(project.encode())


class RequestQuota:
    """Requests admitted per project in the last minute; thread-safe."""

    def __init__(self, clock: Callable[[], float], per_minute: int = DEFAULT_PER_MINUTE) -> None:
        self.clock = clock
        self.per_minute = per_minute
        self._admitted: dict[str, collections.deque[float]] = {}
        self._busiest: dict[str, int] = {}
        self._refused = 0
        self._lock = threading.Lock()

    def set(self, per_minute: int) -> None:
        """Requests a minute per project from now on (0: no quota)."""
        if per_minute < 0:
            raise ValueError("request quota must be >= 0")
        with self._lock:
            self.per_minute = per_minute

    def admit(self, project: str) -> None:
        """Count one request of ``project``; raises the 429 when its minute is full."""
        with self._lock:
            now = self.clock()
            sent = self._admitted.setdefault(project, collections.deque())
            while sent and sent[0] <= now - WINDOW_SECONDS:
                sent.popleft()
            if self.per_minute and len(sent) >= self.per_minute:
                self._refused += 1
                message = QUOTA_EXCEEDED.format(number=project_number(project))
                raise ApiError(429, "RESOURCE_EXHAUSTED", message)
            sent.append(now)
            self._busiest[project] = max(self._busiest.get(project, 0), len(sent))

    def refused(self) -> int:
        """Requests refused for the quota so far."""
        with self._lock:
            return self._refused

    def busiest_minute(self, project: str) -> int:
        """The most requests of ``project`` admitted within any 60 s."""
        with self._lock:
            return self._busiest.get(project, 0)
