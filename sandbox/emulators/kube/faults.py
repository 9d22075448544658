"""Fault injection and request accounting for the sandbox Kubernetes API server."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from sandbox.emulators.kube.errors import KubeApiError

_REQUEST_LOG_LIMIT = 200_000  # a long-running sandbox must not grow without bound


@dataclasses.dataclass
class _FailRule:
    remaining: int
    status: int
    message: str
    match: Callable[[str, str], bool] | None


class FaultInjector:
    """Request accounting plus the outage and fail-next switches, shared across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._down = False
        self._rules: list[_FailRule] = []
        self._log: list[tuple[str, str]] = []

    def record(self, method: str, path_qs: str) -> None:
        """Remember one request as ``(METHOD, path?query)``."""
        with self._lock:
            self._log.append((method, path_qs))
            if len(self._log) > _REQUEST_LOG_LIMIT:
                del self._log[: len(self._log) - _REQUEST_LOG_LIMIT]

    def snapshot(self) -> list[tuple[str, str]]:
        """A copy of the request log, oldest first."""
        with self._lock:
            return list(self._log)

    def clear(self) -> None:
        """Forget the requests seen so far."""
        with self._lock:
            self._log.clear()

    def set_down(self, down: bool) -> None:
        """Switch the simulated outage on or off."""
        with self._lock:
            self._down = down

    def fail_next(
        self, times: int, status: int, match: Callable[[str, str], bool] | None, message: str
    ) -> None:
        """Queue a rule failing the next ``times`` matching requests."""
        if times > 0:
            with self._lock:
                self._rules.append(_FailRule(times, status, message, match))

    def take(self, method: str, path: str) -> KubeApiError | None:
        """The injected failure for this request, if any (consuming one use of a rule)."""
        with self._lock:
            if self._down:
                return KubeApiError(503, "the API server is down (simulated outage)")
            for rule in self._rules:
                if rule.match is None or rule.match(method, path):
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._rules.remove(rule)
                    return KubeApiError(rule.status, rule.message)
        return None
