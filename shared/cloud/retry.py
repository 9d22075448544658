"""One place for retries: a deadline shared by every wait of a call, and a bounded retry loop.

``TransientError`` is the only thing retried; anything else propagates at once. When the window or
the deadline runs out, the last error is re-raised (still transient) so Pub/Sub redelivers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from shared.core import logs
from shared.core.errors import TransientError

log = logs.get("retry")

T = TypeVar("T")


class Budget:
    """A deadline shared by every wait and retry of one function call (clock and sleep injectable)."""

    def __init__(
        self,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.clock = clock
        self.sleep = sleep
        self.deadline = clock() + seconds

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.deadline - self.clock())

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` but never past the deadline."""
        self.sleep(max(0.0, min(seconds, self.remaining())))


def call_retrying(
    call: Callable[[], T],
    what: str,
    budget: Budget,
    window: float,
    first_delay: float,
    max_delay: float = 10.0,
) -> T:
    """Run ``call``; retry TransientErrors with doubling delays for at most ``window`` seconds.

    The window and the budget both bound the retries; when they run out the last error is
    re-raised (still a TransientError) so that the delivery is retried by Pub/Sub.
    """
    end = min(budget.deadline, budget.clock() + window)
    delay = max(first_delay, 0.001)
    attempts = 0
    while True:
        try:
            return call()
        except TransientError as exc:
            attempts += 1
            if budget.clock() + delay > end:
                raise type(exc)(f"{what}: gave up after {attempts} attempt(s): {exc.why}") from None
            logs.decision(
                log, "retry", f"{what} failed, retrying in {delay:.2f}s: {exc.why}", attempt=attempts
            )
            budget.pause(delay)
            delay = min(delay * 2, max_delay)
