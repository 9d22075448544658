"""Pub/Sub push delivery in virtual time, with the retry policy and dead-lettering infra configures.

A message is delivered at once; a handler that raises (the function answering non-2xx) is redelivered
after an exponential backoff between ``minimum_backoff`` and ``maximum_backoff`` (doubling per
attempt, as the sandbox's real-emulator wiring assumes), and after ``max_attempts`` deliveries it goes
to the dead-letter topic instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sandbox.sim.engine import Simulation
from shared.app.deployment import INFRA_MAX_DELIVERY_ATTEMPTS, INFRA_RETRY_POLICY


@dataclasses.dataclass
class DeliveryStats:
    """What one subscription delivered."""

    deliveries: int = 0
    redeliveries: int = 0
    acked: int = 0
    dead_lettered: int = 0


class SimSubscription:
    """A push subscription: ``publish`` schedules a delivery to ``handler`` (which raises to nack)."""

    def __init__(
        self,
        sim: Simulation,
        handler: Callable[[Any], None],
        minimum_backoff: float = INFRA_RETRY_POLICY.minimum_backoff_seconds,
        maximum_backoff: float = INFRA_RETRY_POLICY.maximum_backoff_seconds,
        max_attempts: int = INFRA_MAX_DELIVERY_ATTEMPTS,
        delay: float = 0.0,
    ) -> None:
        self.sim = sim
        self.handler = handler
        self.minimum_backoff = minimum_backoff
        self.maximum_backoff = maximum_backoff
        self.max_attempts = max_attempts
        self.delay = delay  # export + push latency before the first delivery
        self.stats = DeliveryStats()

    def backoff(self, attempt: int) -> float:
        """Seconds before delivery ``attempt + 1`` after ``attempt`` failed ones."""
        return float(min(self.maximum_backoff, self.minimum_backoff * 2 ** (attempt - 1)))

    def publish(self, message: Any) -> None:
        """Deliver ``message`` after the subscription's delay."""
        self.sim.after(self.delay, lambda: self._deliver(message, 1))

    def _deliver(self, message: Any, attempt: int) -> None:
        self.stats.deliveries += 1
        if attempt > 1:
            self.stats.redeliveries += 1
        try:
            self.handler(message)
        except Exception:  # the function answered non-2xx (TransientError, or a bug)
            if attempt >= self.max_attempts:
                self.stats.dead_lettered += 1
                return
            self.sim.after(self.backoff(attempt), lambda: self._deliver(message, attempt + 1))
            return
        self.stats.acked += 1
