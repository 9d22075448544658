"""Progress lines for commands that wait, in the style of gcloud and kubectl.

On a terminal one line per step is redrawn in place with a spinner and the latest detail
(``Waiting for Kueue v0.19.2 ⠹ 1/2 replicas available``) and closed with ``done.`` or
``failed: why``; when the output is a file or a pipe, each step prints one line when it starts and
one when it ends, so logs stay readable.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Progress:
    """Writes step progress to ``out`` (stderr by default, so stdout stays for results)."""

    def __init__(self, out: TextIO | None = None, tty: bool | None = None) -> None:
        self.out = out or sys.stderr
        self.tty = self.out.isatty() if tty is None else tty
        self._frame = 0

    def _draw(self, what: str, detail: str) -> None:
        if self.tty:
            self._frame = (self._frame + 1) % len(SPINNER)
            self.out.write(f"\r\x1b[2K{what} {SPINNER[self._frame]} {detail}".rstrip())
            self.out.flush()

    def _end(self, what: str, result: str) -> None:
        if self.tty:
            self.out.write(f"\r\x1b[2K{what}...{result}\n")
        else:
            self.out.write(f"{what}...{result}\n")
        self.out.flush()

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[Callable[[str], None]]:
        """A step; the yielded callable updates its detail. Ends ``done.``, or ``failed`` when it raises."""
        if not self.tty:
            self.out.write(f"{what}...\n")
            self.out.flush()
        else:
            self._draw(what, "")
        try:
            yield lambda detail: self._draw(what, detail)
        except BaseException as exc:
            self._end(what, f"failed: {exc}" if str(exc) else "failed.")
            raise
        self._end(what, "done.")

    def wait_until(
        self,
        what: str,
        check: Callable[[], tuple[bool, str]],
        timeout: float,
        poll: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> bool:
        """Poll ``check`` (-> (done, detail)) until done or ``timeout``; True when it got done."""
        deadline = clock() + timeout
        with contextlib.suppress(TimeoutError), self.step(what) as update:
            while True:
                done, detail = check()
                update(detail)
                if done:
                    return True
                if clock() >= deadline:
                    raise TimeoutError(f"gave up after {timeout:.0f}s ({detail})" if detail else "timed out")
                sleep(poll)
        return False
