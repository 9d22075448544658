"""How slow the GKE emulator is: per-call latency and operation durations, fixed or drawn.

Real GKE answers CreateNodePool in roughly half a second to two seconds and takes minutes to finish a
multi-host TPU pool. Everything here is off by default (no latency, the emulator's fixed op delay), so
tests that do not ask for realism keep their speed. A duration is either a number of seconds or a
``Draw``: a zero-argument callable returning seconds, e.g. ``uniform(0.5, 2.0, seed=1)``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterable

Draw = Callable[[], float]
Duration = float | Draw


def fixed(seconds: float) -> Draw:
    """Always ``seconds``."""
    if seconds < 0:
        raise ValueError("a duration must be >= 0")
    return lambda: seconds


def uniform(low: float, high: float, seed: int | None = None) -> Draw:
    """Uniform between ``low`` and ``high`` seconds (seeded for repeatable runs)."""
    if not 0 <= low <= high:
        raise ValueError("need 0 <= low <= high")
    rng, lock = random.Random(seed), threading.Lock()

    def draw() -> float:
        with lock:
            return rng.uniform(low, high)

    return draw


def lognormal(median: float, sigma: float, cap: float, seed: int | None = None) -> Draw:
    """Log-normal around ``median`` seconds (long right tail, like API latency), capped at ``cap``."""
    if median <= 0 or sigma < 0 or cap < median:
        raise ValueError("need median > 0, sigma >= 0 and cap >= median")
    rng, lock = random.Random(seed), threading.Lock()

    def draw() -> float:
        with lock:
            return min(cap, rng.lognormvariate(0.0, sigma) * median)

    return draw


def as_draw(duration: Duration) -> Draw:
    """A ``Draw`` for a number of seconds or a ``Draw``."""
    return fixed(float(duration)) if isinstance(duration, int | float) else duration


class Latency:
    """Per-request-kind latency; kinds without one answer at once. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_kind: dict[str, Draw] = {}

    def set(self, duration: Duration | None, kinds: Iterable[str]) -> None:
        """Delay requests of ``kinds`` by ``duration`` (None or 0: no delay)."""
        with self._lock:
            for kind in kinds:
                if duration is None or duration == 0:
                    self._by_kind.pop(kind, None)
                else:
                    self._by_kind[kind] = as_draw(duration)

    def draw(self, kind: str) -> float:
        """Seconds to hold one request of ``kind`` before answering it."""
        with self._lock:
            draw = self._by_kind.get(kind)
        return max(0.0, draw()) if draw is not None else 0.0


class InFlight:
    """Counts requests being served per kind and remembers the highest count seen."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now: dict[str, int] = {}
        self._peak: dict[str, int] = {}

    def enter(self, kind: str) -> None:
        """A request of ``kind`` started."""
        with self._lock:
            self._now[kind] = self._now.get(kind, 0) + 1
            self._peak[kind] = max(self._peak.get(kind, 0), self._now[kind])

    def leave(self, kind: str) -> None:
        """A request of ``kind`` was answered."""
        with self._lock:
            self._now[kind] -= 1

    def peak(self, kind: str) -> int:
        """The most requests of ``kind`` served at the same time so far."""
        with self._lock:
            return self._peak.get(kind, 0)

    def reset_peak(self) -> None:
        """Start counting the peak again from the current load."""
        with self._lock:
            self._peak = dict(self._now)
