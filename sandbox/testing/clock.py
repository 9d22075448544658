"""The one fake clock of the tests: a number that moves only when the test moves it."""

from __future__ import annotations


class FakeClock:
    """Read with ``clock()``; move with ``clock.now += 5`` or ``clock.sleep(5)``.

    Serves as a monotonic clock (``GkeEmulator(clock=...)``, a provisioner's ``clock``), a wall
    clock in Unix seconds (start it at a date) and, through ``sleep``, a sleep that takes no time.
    """

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass at once."""
        self.now += seconds
