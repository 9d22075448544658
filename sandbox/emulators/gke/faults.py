"""Switchable faults for the GKE emulator: canned errors, hangs and stockouts.

Each fault is armed for a number of matching requests (``times``; None means until cleared) and
every time one fires it is counted, so tests can assert that the product actually met the fault.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter

# The request kinds the emulator distinguishes; fault and count APIs take one of these.
KINDS = ("get_cluster", "list", "get", "create", "delete", "update", "get_operation")

_STATUS_BY_CODE = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

DEFAULT_STOCKOUT = (
    "The zone '{zone}' does not have enough resources available to fulfill the request. "
    "Try a different zone, or try again later."
)


def status_for(code: int, message: str) -> str:
    """The canonical status name GKE pairs with an HTTP code (and message, for 400s)."""
    if code == 400 and "incompatible operation" in message.lower():
        return "FAILED_PRECONDITION"
    return _STATUS_BY_CODE.get(code, "INTERNAL" if code >= 500 else "UNKNOWN")


@dataclasses.dataclass
class ErrorFault:
    """Answer the next matching request with an error instead of handling it."""

    kind: str
    code: int
    status: str
    message: str
    remaining: int | None


@dataclasses.dataclass
class HangFault:
    """Hold the next matching request for ``seconds`` before handling it."""

    kind: str
    seconds: float
    remaining: int | None


@dataclasses.dataclass
class StockoutFault:
    """Make matching create operations end DONE with a capacity error."""

    machine_type: str | None
    message: str
    remaining: int | None


def _take(remaining: int | None) -> int | None:
    return None if remaining is None else remaining - 1


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown request kind {kind!r}; use one of {', '.join(KINDS)}")


def _check_times(times: int | None) -> None:
    if times is not None and times < 1:
        raise ValueError("times must be >= 1 (or None for 'until cleared')")


class Faults:
    """The armed faults; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._errors: list[ErrorFault] = []
        self._hangs: list[HangFault] = []
        self._stockouts: list[StockoutFault] = []
        self._fired: Counter[str] = Counter()

    def fail_next(
        self, kind: str, code: int, message: str = "", times: int | None = 1, status: str = ""
    ) -> None:
        """Answer the next ``times`` requests of ``kind`` with HTTP ``code`` and ``message``."""
        _check_kind(kind)
        _check_times(times)
        message = message or f"Injected failure {code}."
        with self._lock:
            self._errors.append(ErrorFault(kind, code, status or status_for(code, message), message, times))

    def hang_next(self, kind: str, seconds: float, times: int | None = 1) -> None:
        """Hold the next ``times`` requests of ``kind`` for ``seconds`` before answering."""
        _check_kind(kind)
        _check_times(times)
        with self._lock:
            self._hangs.append(HangFault(kind, seconds, times))

    def stockout(self, machine_type: str | None = None, message: str = "", times: int | None = 1) -> None:
        """Make the next ``times`` creates of ``machine_type`` (None: any) run out of capacity."""
        _check_times(times)
        with self._lock:
            self._stockouts.append(StockoutFault(machine_type, message or DEFAULT_STOCKOUT, times))

    def clear(self) -> None:
        """Disarm every fault (counts of fired faults are kept)."""
        with self._lock:
            self._errors.clear()
            self._hangs.clear()
            self._stockouts.clear()

    def fired(self, what: str) -> int:
        """How often faults fired: ``"error:create"``, ``"hang:get"``, ``"stockout"``..."""
        with self._lock:
            return self._fired[what]

    def take_hang(self, kind: str) -> float:
        """Seconds to hold a request of ``kind`` (0 when no hang is armed)."""
        with self._lock:
            for fault in self._hangs:
                if fault.kind == kind:
                    fault.remaining = _take(fault.remaining)
                    if fault.remaining == 0:
                        self._hangs.remove(fault)
                    self._fired[f"hang:{kind}"] += 1
                    return fault.seconds
        return 0.0

    def take_error(self, kind: str) -> ErrorFault | None:
        """The error to answer a request of ``kind`` with, if one is armed."""
        with self._lock:
            for fault in self._errors:
                if fault.kind == kind:
                    fault.remaining = _take(fault.remaining)
                    if fault.remaining == 0:
                        self._errors.remove(fault)
                    self._fired[f"error:{kind}"] += 1
                    return fault
        return None

    def take_stockout(self, machine_type: str) -> str | None:
        """The capacity error a create of ``machine_type`` ends with, if a stockout is armed."""
        with self._lock:
            for fault in self._stockouts:
                if fault.machine_type in (None, machine_type):
                    fault.remaining = _take(fault.remaining)
                    if fault.remaining == 0:
                        self._stockouts.remove(fault)
                    self._fired["stockout"] += 1
                    return fault.message
        return None
