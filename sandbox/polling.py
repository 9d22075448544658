"""The one polling wait of the sandbox: the stacks' ``wait_for`` and the tests' ``eventually``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    probe: Callable[[], T],
    timeout: float = 5.0,
    what: str = "",
    interval: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> T:
    """Call ``probe`` until it returns something truthy and return that.

    After ``timeout`` seconds raise ``TimeoutError`` naming ``what`` (or the probe) followed by
    ``explain()``, e.g. the tail of a timeline or a component's log, to show why it never came.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f":\n{explain()}" if explain is not None else ""
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what or probe!r}{detail}")
        time.sleep(interval)
