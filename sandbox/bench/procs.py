"""Function processes for the benchmark: launch under functions-framework, post over HTTP, read peak RSS.

A process is started in its own session (``sandbox.stack.processes``) so that stopping it signals its
process group only: the functions-framework leader and the gunicorn worker it forks.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from sandbox.emulators.sockets import free_port
from sandbox.stack.functions import function_argv
from sandbox.stack.processes import ManagedProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE_SOURCE = Path(__file__).resolve().parent / "reference" / "main.py"
REFERENCE_TARGET = "reference"


class DeliveryError(RuntimeError):
    """A function answered a delivery with a non-2xx status where the benchmark expects 2xx."""


def source_of(target: str) -> Path:
    """The ``main.py`` serving ``target`` (the reference lives in the sandbox, products in functions/)."""
    if target == REFERENCE_TARGET:
        return REFERENCE_SOURCE
    return REPO_ROOT / "functions" / target / "main.py"


def base_env(extra: Mapping[str, str]) -> dict[str, str]:
    """A child environment built from scratch, so nothing from the caller's shell leaks in."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(REPO_ROOT),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


@dataclass
class FunctionProcess:
    """One running functions-framework instance."""

    target: str
    url: str
    process: ManagedProcess
    started_at: float  # time.perf_counter() just before the launch

    @property
    def pid(self) -> int:
        """The functions-framework (gunicorn master) PID."""
        return self.process.pid


@contextlib.contextmanager
def launched(target: str, env: Mapping[str, str], log_dir: Path) -> Iterator[FunctionProcess]:
    """Launch ``functions-framework --target TARGET`` on a free loopback port; stopped on exit."""
    port = free_port()
    argv = function_argv(target, source_of(target), port)
    log_dir.mkdir(parents=True, exist_ok=True)
    started_at = time.perf_counter()
    proc = ManagedProcess(target, argv, base_env(env), REPO_ROOT, log_dir / f"{target}-{port}.log")
    try:
        yield FunctionProcess(target, f"http://127.0.0.1:{port}", proc, started_at)
    finally:
        proc.stop(grace=5.0)


def post(url: str, headers: Mapping[str, str], body: bytes, timeout: float = 30.0) -> int:
    """POST one delivery; the HTTP status (non-2xx included). Connection failures raise OSError."""
    request = urllib.request.Request(url + "/", data=body, headers=dict(headers), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


def first_2xx(fn: FunctionProcess, headers: Mapping[str, str], body: bytes, timeout: float = 60.0) -> float:
    """Seconds from launch until the function answered this delivery with 2xx.

    Until the server listens the connection is refused (nothing is delivered), so the first
    request that gets any answer is the one measured; a non-2xx answer is an error.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            status = post(fn.url, headers, body)
        except (OSError, urllib.error.URLError):
            if not fn.process.alive():
                raise DeliveryError(f"{fn.target} exited:\n{fn.process.tail()}") from None
            if time.monotonic() > deadline:
                raise DeliveryError(f"{fn.target} did not answer within {timeout:.0f}s") from None
            time.sleep(0.003)
            continue
        if 200 <= status < 300:
            return time.perf_counter() - fn.started_at
        raise DeliveryError(f"{fn.target} answered {status}:\n{fn.process.tail()}")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    with contextlib.suppress(OSError):
        for task in task_dir.iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


@dataclass(frozen=True)
class PeakRss:
    """Peak resident set sizes (VmHWM) of a function instance, in MiB."""

    worker_mib: float  # the gunicorn worker that served the requests
    instance_mib: float  # leader + workers: an upper bound (forked pages are shared)


def peak_rss(pid: int) -> PeakRss:
    """Read VmHWM of the functions-framework leader and its workers (call before stopping it)."""
    workers = _children(pid)
    worker = max((_status_kib(w, "VmHWM") for w in workers), default=0)
    total = _status_kib(pid, "VmHWM") + sum(_status_kib(w, "VmHWM") for w in workers)
    return PeakRss(round(worker / 1024, 1), round(total / 1024, 1))
