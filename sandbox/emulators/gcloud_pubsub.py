"""Run Google's Pub/Sub emulator (``gcloud beta emulators pubsub start``) on a free loopback port.

The emulator is two processes: the gcloud wrapper (Python) and the Java server it starts. Stopping
only the wrapper would leave Java listening, so the wrapper is started in a new session and the
whole process group is signalled on stop (TERM, then KILL after a grace period).

Clients find it through ``PUBSUB_EMULATOR_HOST`` (see :meth:`PubsubEmulator.env`); the
``google-cloud-pubsub`` library then talks plain gRPC to it without credentials.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from sandbox.emulators.sockets import free_port, group_members, listener_is_ours

_GCLOUD_ENV = {
    # Never prompt, never check for updates or report usage from a test run.
    "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "1",
    "CLOUDSDK_CORE_DISABLE_USAGE_REPORTING": "1",
}


# What the Java server prints when its port is taken (it then keeps running without serving).
_BIND_FAILED = "java.net.BindException"
_PORT_ATTEMPTS = 3


class _PortTaken(Exception):
    """The chosen port was taken by someone else before the emulator could bind it."""


def unavailable_reason(gcloud: str = "gcloud") -> str:
    """Why the emulator cannot run here ("" when it can): gcloud, Java or the component missing."""
    binary = shutil.which(gcloud)
    if binary is None:
        return f"{gcloud!r} is not on PATH (install the Google Cloud CLI)"
    if shutil.which("java") is None:
        return "java is not on PATH (the Pub/Sub emulator is a Java program)"
    sdk_root = Path(binary).resolve().parent.parent
    candidates = [
        sdk_root / "platform" / "pubsub-emulator",
        Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator"),
    ]
    if not any(path.is_dir() for path in candidates):
        return "the pubsub-emulator component is missing (gcloud components install pubsub-emulator)"
    return ""


class PubsubEmulator:
    """One emulator process group serving ``project`` on ``127.0.0.1:<port>``."""

    def __init__(
        self,
        project: str = "test-project",
        port: int = 0,
        startup_timeout: float = 60.0,
        stop_timeout: float = 10.0,
        gcloud: str = "gcloud",
    ) -> None:
        self.project = project
        self.port = port
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.gcloud = gcloud
        self._process: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._log_path: Path | None = None

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, the value for ``PUBSUB_EMULATOR_HOST``."""
        if not self.port:
            raise RuntimeError("the emulator has not been started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """Process id (and process-group id) of the gcloud wrapper, None when not running."""
        return self._process.pid if self._process is not None else None

    def env(self) -> dict[str, str]:
        """Environment variables that point Pub/Sub clients at this emulator."""
        return {"PUBSUB_EMULATOR_HOST": self.host, "PUBSUB_PROJECT_ID": self.project}

    def start(self) -> PubsubEmulator:
        """Start the emulator and block until ``GET http://host/`` answers 200; raise if it does not.

        With no fixed port, a port someone else takes between choosing and binding it (the JVM
        binds seconds after the choice) costs one restart on another port, not a failed start.
        """
        if self._process is not None:
            raise RuntimeError("the emulator is already running")
        reason = unavailable_reason(self.gcloud)
        if reason:
            raise RuntimeError(f"cannot start the Pub/Sub emulator: {reason}")
        chosen = self.port
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            self.port = chosen or free_port()
            try:
                self._launch()
                self._wait_ready()
            except _PortTaken as taken:
                self.stop()
                if chosen or attempt == _PORT_ATTEMPTS:
                    raise RuntimeError(f"the Pub/Sub emulator could not bind a port: {taken}") from None
                continue
            except BaseException:
                self.stop()
                raise
            return self
        raise AssertionError("unreachable")  # the loop returns or raises

    def _launch(self) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="pubsub-emulator-")
        data_dir = Path(self._workdir.name) / "data"
        data_dir.mkdir()
        self._log_path = Path(self._workdir.name) / "emulator.log"
        command = [
            self.gcloud,
            "beta",
            "emulators",
            "pubsub",
            "start",
            f"--host-port={self.host}",
            f"--project={self.project}",
            f"--data-dir={data_dir}",
        ]
        with self._log_path.open("wb") as log:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **_GCLOUD_ENV},
                # A new session makes the wrapper a process-group leader; Java inherits the group.
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        url = f"http://{self.host}/"
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the Pub/Sub emulator exited with code {self._process.returncode}:\n{self.log_tail()}"
                )
            # The JVM reports a failed bind and then stays up, serving nothing: waiting is pointless.
            if self._bind_failed():
                raise _PortTaken(f"{self.host} is in use:\n{self.log_tail(lines=3)}")
            with (
                contextlib.suppress(urllib.error.URLError, OSError),
                urllib.request.urlopen(url, timeout=1.0) as response,
            ):
                if response.status == 200:
                    if not listener_is_ours(self.port, self._process.pid):
                        raise _PortTaken(f"another process answers on {self.host}")
                    return
            time.sleep(0.2)
        raise RuntimeError(
            f"the Pub/Sub emulator did not answer on {url} within {self.startup_timeout}s:\n{self.log_tail()}"
        )

    def _bind_failed(self) -> bool:
        if self._log_path is None or not self._log_path.exists():
            return False
        return _BIND_FAILED in self._log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, lines: int = 20) -> str:
        """The last lines the emulator printed (for error messages)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def group_members(self) -> list[int]:
        """PIDs still alive in the emulator's process group (read from /proc)."""
        if self._process is None:
            return []
        return group_members(self._process.pid)

    def stop(self) -> None:
        """Terminate the wrapper and the Java server (the whole group); idempotent."""
        process, self._process = self._process, None
        if process is not None:
            pgid = process.pid
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout
            while time.monotonic() < deadline and (process.poll() is None or group_members(pgid)):
                time.sleep(0.1)
            if process.poll() is None or group_members(pgid):
                _signal_group(pgid, signal.SIGKILL)
                process.wait(timeout=self.stop_timeout)
                _wait_group_gone(pgid, self.stop_timeout)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> PubsubEmulator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
