"""Child processes of the sandbox: started in their own process group, registered, stopped by PID.

Every process the stack starts (functions-framework servers; gunicorn forks workers under them)
gets a new session, so its whole tree is one process group the stack created and can signal with
``os.killpg`` without touching anything else on the machine. The registry keeps the PIDs so that
``stop_all`` (called from ``Stack.stop``, an ``atexit`` hook and the SIGINT/SIGTERM handlers)
can always clean up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

LineSink = Callable[[str, str], None]


class ManagedProcess:
    """One child process group: its argv, PID, log file and output pump."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        on_line: LineSink | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log: IO[str] = log_path.open("a", encoding="utf-8")
        self.popen = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=str(cwd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # its own process group: killpg reaches gunicorn's workers too
        )
        self.pid = self.popen.pid
        self._on_line = on_line
        self._pump = threading.Thread(target=self._read, name=f"pump-{name}", daemon=True)
        self._pump.start()

    def _read(self) -> None:
        # Draining the pipe keeps the child from blocking on a full buffer.
        stream = self.popen.stdout
        if stream is None:
            return
        for line in stream:
            self._log.write(line)
            self._log.flush()
            if self._on_line is not None:
                try:
                    self._on_line(self.name, line.rstrip("\n"))
                except Exception:
                    continue  # a broken consumer must not stop the pump (the child would block)

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.popen.poll() is None

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the group, wait up to ``grace`` seconds, then SIGKILL it; close the log."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        # Workers may outlive a leader that exited on SIGTERM; the group id is still ours.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace)
        self._pump.join(timeout=2)
        with contextlib.suppress(OSError):
            self._log.close()

    def tail(self, lines: int = 20) -> str:
        """The last lines of the process's output (for error messages)."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ProcessRegistry:
    """The PIDs the stack started, so that every exit path can stop exactly those."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: list[ManagedProcess] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        log_path: Path,
        on_line: LineSink | None = None,
    ) -> ManagedProcess:
        """Start and register one process group."""
        proc = ManagedProcess(name, argv, env, cwd, log_path, on_line)
        with self._lock:
            self._procs.append(proc)
        return proc

    @property
    def pids(self) -> list[int]:
        """PIDs of the registered processes (running or not)."""
        with self._lock:
            return [p.pid for p in self._procs]

    def stop_all(self, grace: float = 5.0) -> None:
        """Stop every registered process group, newest first."""
        with self._lock:
            procs, self._procs = list(reversed(self._procs)), []
        for proc in procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.stop(grace)


def wait_http(url: str, timeout: float, proc: ManagedProcess | None = None) -> None:
    """Wait until ``url`` answers any HTTP status; raise RuntimeError on timeout or if ``proc`` dies."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                response.read()
            return
        except urllib.error.HTTPError:
            return  # any HTTP answer means the server is accepting requests
        except (OSError, urllib.error.URLError):
            pass
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        if time.monotonic() > deadline:
            detail = f":\n{proc.tail()}" if proc is not None else ""
            raise RuntimeError(f"{url} did not answer within {timeout:.0f}s{detail}")
        time.sleep(0.1)
