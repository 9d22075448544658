"""The README's first command, and the promise that the sandbox leaves no process behind.

``tpuprov demo`` (the Kueue multislice flow; ``--scenario basic`` the smallest one) and
``tpuprov sandbox up`` run as real subprocesses, exactly as a person runs them; the tests read what
they print and check through /proc that every child they started is gone after they exit, also when
they are interrupted.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.emulators.sockets import alive, listening_sockets
from sandbox.stack.config import StackConfig
from sandbox.stack.core import Stack
from tests.paths import REPO

pytestmark = pytest.mark.integration


def _wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.2)
    return [pid for pid in pids if alive(pid)]


def _pids(output: str) -> list[int]:
    match = re.search(r"child processes \(pids\):\s+([\d ]+)", output)
    assert match, output
    return [int(p) for p in match.group(1).split()]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tpuprov", *args]


def _run_demo(*args: str) -> str:
    # How long the demo takes is for `make bench`-style measurement, not a test: the demo's own
    # timeout (60 s) already fails it when it hangs.
    result = subprocess.run(
        _cli("demo", *args), cwd=REPO, capture_output=True, text=True, timeout=150, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _in_order(out: str, story: list[str]) -> None:
    """Each step is caused by the one before, so the lines appear in this order."""
    positions = [out.find(step) for step in story]
    assert -1 not in positions, [s for s, p in zip(story, positions, strict=True) if p == -1]
    assert positions == sorted(positions), out


def test_demo_runs_the_kueue_multislice_flow_by_default_and_cleans_up() -> None:
    out = _run_demo()

    _in_order(
        out,
        [
            "applied the Kueue configuration",
            "submitted JobSet default/multislice-3",
            "multislice-3 unsuspended",
            "FailedScheduling on Pod default/multislice-3-",
            "provision.created: default/multislice-3",
            "bound to gke-sandbox-tpu-multislice-3-",
            "JobSet default/multislice-3 Completed",
            "JobSet default/multislice-2 unsuspended",
            "multislice-2-slice-0-0-r0 bound to gke-sandbox-tpu-multislice-3-",  # lands on its pools
            "release.adopted",
            "release.deleted",
            "deleted: 2 node(s) removed",
        ],
    )
    assert "pending: couldn't assign flavors" in out  # the queue is full while multislice-3 runs
    assert "TPUSliceReleased on JobSet default/multislice-3: handed node pool" in out
    assert "JobSets:        multislice-3 Completed, multislice-1 Completed, multislice-2 Completed" in out
    assert re.search(r"node pools:     created 3, handed over [1-3], deleted 3, leaked 0", out), out
    assert "pods killed by a pool deletion: 0" in out
    assert "result:         OK" in out
    assert _wait_gone(_pids(out)) == []


def test_basic_demo_runs_the_whole_loop_and_cleans_up() -> None:
    out = _run_demo("--scenario", "basic")

    _in_order(
        out,
        [
            "submitted JobSet default/demo-train",
            "FailedScheduling on Pod default/demo-train-",
            "provision.created",
            "RUNNING: 1 node(s) Ready 2x2",
            "bound to gke-sandbox-tpu-demo-train-",
            "JobSet default/demo-train Completed",
            "release.deleted",
            "deleted: 1 node(s) removed",
        ],
    )
    assert "TPUSliceRequested on Pod default/demo-train-" in out
    assert "AllJobsCompleted on JobSet default/demo-train -> tpuprov-jobset-lifecycle" in out
    assert "node pools:     created 2, deleted 2, leaked 0" in out
    assert "JobSets:        demo-train Completed, demo-cpu Completed" in out
    assert "result:         OK" in out
    assert _wait_gone(_pids(out)) == []


class _Reader:
    """Lines of a child's stdout, readable with a timeout."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        self.stream = proc.stdout
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in self.stream:
            self.lines.put(line)

    def until(self, marker: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append(line)
            if marker in line:
                return "".join(self.seen)
        raise AssertionError(f"{marker!r} not printed within {timeout:.0f}s:\n{''.join(self.seen)}")


@pytest.fixture
def sandbox_up() -> Iterator[tuple[subprocess.Popen[str], _Reader]]:
    proc = subprocess.Popen(
        _cli("sandbox", "up", "--quiet"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # lets the finally below reach the whole tree if the test fails
    )
    try:
        yield proc, _Reader(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_sandbox_up_serves_until_interrupted_then_leaves_nothing(
    sandbox_up: tuple[subprocess.Popen[str], _Reader], sig: signal.Signals
) -> None:
    proc, reader = sandbox_up
    out = reader.until("Press Ctrl-C", timeout=120)
    exports = dict(re.findall(r"export (\w+)=(\S+)", out))
    assert set(exports) >= {"PUBSUB_EMULATOR_HOST", "KUBECONFIG", "GKE_API_ENDPOINT", "KUBE_API_ENDPOINT"}
    pids = _pids(out)
    assert pids and all(alive(pid) for pid in pids)
    if shutil.which("kubectl"):
        listed = subprocess.run(
            ["kubectl", "--kubeconfig", exports["KUBECONFIG"], "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert listed.returncode == 0, listed.stderr
        assert "node/gke-sandbox-default-pool-0" in listed.stdout

    proc.send_signal(sig)
    assert proc.wait(timeout=60) in (0, 128 + sig.value)
    assert _wait_gone(pids) == []


def test_a_failed_start_stops_what_it_had_started(tmp_path: Path) -> None:
    stack = Stack(StackConfig(manifests_dir=tmp_path / "missing", workdir=tmp_path / "work"))
    with pytest.raises(FileNotFoundError):
        stack.start()
    # The Pub/Sub emulator was booting on its own thread when the Kubernetes API failed to start.
    port = stack.pubsub.port
    assert port, "the emulator had been started"
    wrappers = [
        int(path.parent.name) for path in Path("/proc").glob("[0-9]*/cmdline") if _mentions(path, port)
    ]
    assert _wait_gone(wrappers) == []
    assert listening_sockets(port) == set(), "the Java emulator still listens"


def _mentions(cmdline: Path, port: int) -> bool:
    try:
        return f"--host-port=127.0.0.1:{port}".encode() in cmdline.read_bytes()
    except OSError:
        return False
