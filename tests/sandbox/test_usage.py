"""``sandbox.realstack.usage``: what ``tpuprov demo`` reports of the machine, read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys

from sandbox.realstack.usage import UsageSampler, cpu_ticks, rss_kib


def test_a_busy_child_counts_in_the_cpu_time_and_a_gone_process_reads_as_nothing() -> None:
    # A child that burns CPU for a moment, then waits for its stdin to close.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nend = time.time() + 0.5\nwhile time.time() < end: pass\nsys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
    )
    try:
        sampler = UsageSampler(lambda: [child.pid], interval=0.05).start()
        # The child has burnt its half second once its own CPU time says so.
        for _ in range(200):
            if cpu_ticks(child.pid) >= 0.4 * os.sysconf("SC_CLK_TCK"):
                break
            subprocess.run(["sleep", "0.05"], check=True)
        usage = sampler.stop()
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=10)
    assert usage.processes == 2  # this process and the child
    assert usage.cpu_seconds >= 0.4
    assert usage.peak_rss_mib >= rss_kib(child.pid) / 1024  # the child is gone now: 0
    assert usage.peak_rss_mib > 1
    assert (rss_kib(child.pid), cpu_ticks(child.pid)) == (0, 0)
    assert "processes, CPU" in usage.render()
