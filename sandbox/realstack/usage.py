"""What a running stack costs the machine: its processes' resident memory and CPU time.

Read from ``/proc`` (proc(5): ``VmRSS`` in ``/proc/PID/status``, ``utime`` and ``stime``, fields 14
and 15 of ``/proc/PID/stat``, in clock ticks), for the stack's child processes and this one, so
``tpuprov demo`` can say what a scenario needs on the machine it ran on.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Sequence

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Usage:
    """The stack's processes over a run: peak summed RSS and CPU seconds they used."""

    processes: int
    peak_rss_mib: float
    cpu_seconds: float
    wall_seconds: float

    def render(self) -> str:
        cores = os.cpu_count() or 1
        busy = self.cpu_seconds / self.wall_seconds / cores * 100 if self.wall_seconds else 0.0
        return (
            f"peak memory {self.peak_rss_mib:.0f} MiB over {self.processes} processes, CPU "
            f"{self.cpu_seconds:.0f}s in {self.wall_seconds:.0f}s ({busy:.0f}% of {cores} cores)"
        )


def rss_kib(pid: int) -> int:
    """The process's resident set in KiB; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cpu_ticks(pid: int) -> int:
    """User plus system time the process has used, in clock ticks; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            text = stat.read()
    except OSError:
        return 0
    # The command name (field 2) is parenthesised and may hold spaces: count from after it.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return 0


class UsageSampler:
    """Samples the summed RSS of ``pids()`` and this process every ``interval`` seconds; ``stop()``
    reads their CPU time (call it before the processes exit, or their time is lost)."""

    def __init__(self, pids: Callable[[], Sequence[int]], interval: float = 1.0) -> None:
        self._pids = pids
        self._interval = interval
        self._peak_kib = 0
        self._seen: set[int] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="usage-sampler", daemon=True)
        self._started = 0.0

    def _all(self) -> list[int]:
        return [os.getpid(), *self._pids()]

    def _run(self) -> None:
        while not self._done.is_set():
            pids = self._all()
            self._seen.update(pids)
            self._peak_kib = max(self._peak_kib, sum(rss_kib(pid) for pid in pids))
            self._done.wait(self._interval)

    def start(self) -> UsageSampler:
        import time

        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> Usage:
        import time

        self._done.set()
        self._thread.join(timeout=5)
        pids = self._all()
        ticks = sum(cpu_ticks(pid) for pid in pids)
        return Usage(
            processes=len(set(pids) | self._seen),
            peak_rss_mib=self._peak_kib / 1024,
            cpu_seconds=ticks / _TICKS,
            wall_seconds=time.monotonic() - self._started,
        )
