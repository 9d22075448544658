"""The README's commands on the real components, run as a person runs them, and what they leave behind.

``tpuprov demo`` (the Kueue multislice flow; ``--scenario basic`` the smallest one) and
``tpuprov sandbox up`` run as real subprocesses; the tests read what they print, use the printed
exports with plain ``kubectl`` and ``tpuprov status``/``why`` as a user would, and check through
/proc that every child they started is gone after they exit, also when interrupted.

Ported from tests/sandbox/test_demo.py. There the demo ran on the stand-in stack (kmock API,
simulated scheduler, JobSet controller and Kueue) and ``kubectl`` met the kmock server; here the
same commands start etcd, kube-apiserver, the scheduler, the controller manager, KWOK and the
JobSet and Kueue controllers the product's ``setup_cluster`` installed, and ``kubectl`` talks to
the real API server inside the stack's loopback-only network namespace (the printed ``nsenter``
prefix). The stand-in's "bound to <node>" lines are now the real scheduler's ``Scheduled`` Events.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.emulators.sockets import alive
from sandbox.jobsets import tpu_jobset
from sandbox.realstack.core import RealStack
from sandbox.realstack.demo import JOBSETS
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from shared.core import labels
from tests.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
JOBSET_NAMES = [name for name, _ in JOBSETS]


def _wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
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
    # The demo's own --timeout (600 s) fails it when it hangs; this one only stops a stuck process.
    result = subprocess.run(
        _cli("demo", *args), cwd=REPO, capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _in_order(out: str, story: list[str]) -> None:
    """Each step is caused by the one before, so its first line appears after the previous step's."""
    positions = [out.find(step) for step in story]
    assert -1 not in positions, [s for s, p in zip(story, positions, strict=True) if p == -1]
    assert positions == sorted(positions), out


def test_demo_runs_the_kueue_multislice_flow_by_default_and_cleans_up() -> None:
    out = _run_demo()

    _in_order(
        out,
        [
            "published the setup message",
            "kueue.applied",
            "submitted JobSet default/multislice-3",
            "Admitted Workload default/jobset-multislice-3-",
            "FailedScheduling on Pod default/multislice-3-",
            "provision.created: default/multislice-3",
            "Scheduled Pod default/multislice-3-",
            "AllJobsCompleted on JobSet default/multislice-3",
            "Admitted Workload default/jobset-multislice-2-",  # queued, admitted once the quota is free
            "release.adopted",
            "release.deleted",
            "deleted: 2 Node(s) gone",
        ],
    )
    # The pool's "RUNNING" line is written once all its Nodes registered; the scheduler may bind a
    # pod to the first of them before that line (CI saw it once): both follow the create.
    _in_order(
        out,
        [
            "provision.created: default/multislice-3",
            "RUNNING: 2 Node(s) registered",
            "AllJobsCompleted on JobSet default/multislice-3",
        ],
    )
    assert "setup.done" in out
    assert "TPUSliceReleased on JobSet default/multislice-3: handed node pool" in out
    assert "JobSets:        multislice-3 Completed, multislice-1 Completed, multislice-2 Completed" in out
    # The 3-slice JobSet's pools, handed over to the queued two; more when their pods pended before
    # the pools were free (every pool created is deleted all the same).
    counts = re.search(r"node pools:     created (\d+), handed over (\d+), deleted (\d+), leaked 0", out)
    assert counts, out
    created, adopted, deleted = map(int, counts.groups())
    assert created >= 3 and deleted == created and adopted >= 1, out
    assert "pods killed by a pool deletion: 0 (read from the real pods)" in out
    assert "result:         OK" in out
    assert _wait_gone(_pids(out)) == []


def test_fleet_demo_runs_the_kueue_flow_in_two_clusters_at_once_and_says_what_it_took() -> None:
    out = _run_demo("--scenario", "fleet")

    for cluster in ("sandbox", "west"):
        assert f"{cluster}'s API server https://" in out
        # Each cluster's own real Kueue admits its Workloads (the timeline names the cluster).
        assert f"{cluster}: Admitted Workload default/jobset-multislice-3-" in out
        assert f"{cluster}: Admitted Workload default/jobset-multislice-2-" in out
    states = ", ".join(f"{c}/{n} Completed" for c in ("sandbox", "west") for n in JOBSET_NAMES)
    assert f"JobSets:        {states}" in out
    counts = re.findall(
        r"node pools:     (\w+): created (\d+), handed over (\d+), deleted (\d+), leaked (\d+)", out
    )
    assert [c[0] for c in counts] == ["sandbox", "west"], out
    for _, created, _, deleted, leaked in counts:
        assert int(created) >= 3 and deleted == created and leaked == "0", out
    assert "pods killed by a pool deletion: 0 (read from the real pods)" in out
    machine = re.search(
        r"machine:        peak memory (\d+) MiB over (\d+) processes, CPU (\d+)s in (\d+)s", out
    )
    assert machine, out
    # Two control planes with their controllers, the functions and the emulators: all counted.
    assert int(machine.group(2)) >= 2 * 7 and int(machine.group(1)) > 0, out
    assert "result:         OK" in out
    assert _wait_gone(_pids(out)) == []


def test_basic_demo_runs_the_whole_loop_and_cleans_up() -> None:
    out = _run_demo("--scenario", "basic")

    _in_order(
        out,
        [
            "submitted JobSet default/demo-train",
            "FailedScheduling on Pod default/demo-train-",
            "provision.created: default/demo-train",
            "RUNNING: 1 Node(s) registered",
            "Scheduled Pod default/demo-train-",
            "AllJobsCompleted on JobSet default/demo-train -> tpuprov-jobset-lifecycle",
            "release.deleted",
            "deleted: 1 Node(s) gone",
        ],
    )
    assert "TPUSliceRequested on JobSet default/demo-train" in out
    assert "Scheduled Pod default/demo-cpu-" in out  # on the default pool, no TPU pool for it
    assert "provision.created: default/demo-cpu" not in out
    assert "node pools:     created 2, handed over 0, deleted 2, leaked 0" in out
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

    def drained(self) -> str:
        """Everything printed so far (for a failure message)."""
        while not self.lines.empty():
            self.seen.append(self.lines.get_nowait())
        return "".join(self.seen)


@pytest.fixture
def sandbox_up() -> Iterator[tuple[subprocess.Popen[str], _Reader]]:
    proc = subprocess.Popen(
        _cli("sandbox", "up"),  # with its timeline: a failure message shows what the stack did
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: a signal to the test's group does not reach it
    )
    try:
        yield proc, _Reader(proc)
    finally:
        if proc.poll() is None:
            # A failed test: Ctrl-C first, which stops every child (each leads its own process
            # group, so killing only this one's group would leave them running).
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


class _Shell:
    """A second shell that ran the printed exports and enters the printed namespace prefix."""

    def __init__(self, printed: str) -> None:
        self.env = {
            **os.environ,
            **{k: shlex.split(v)[0] for k, v in re.findall(r"export (\w+)=(\S+)", printed)},
        }
        alias = re.search(r"alias kubectl='([^']+)'", printed)
        assert alias, printed
        self.kubectl_argv = shlex.split(alias.group(1))
        enter = re.search(r"^\s+(nsenter --net=\S+) \.venv/bin/tpuprov status", printed, re.MULTILINE)
        assert enter, printed
        self.enter = shlex.split(enter.group(1))

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [*self.kubectl_argv, *args], env=self.env, input=stdin, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def tpuprov(self, *args: str) -> str:
        done = subprocess.run(
            [*self.enter, str(REPO / ".venv" / "bin" / "tpuprov"), *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"tpuprov {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout


def test_sandbox_up_serves_kubectl_and_tpuprov_until_interrupted_then_leaves_nothing(
    sandbox_up: tuple[subprocess.Popen[str], _Reader],
) -> None:
    proc, reader = sandbox_up
    printed = reader.until("Press Ctrl-C", timeout=300)
    shell = _Shell(printed)
    assert {"PUBSUB_EMULATOR_HOST", "KUBECONFIG", "GKE_API_ENDPOINT", "SANDBOX_LOG_DIR"} <= set(shell.env)
    pids = _pids(printed)
    assert pids and all(alive(pid) for pid in pids)

    # Plain kubectl, as on any cluster: the setup_cluster-installed CRDs, the default pool's Nodes.
    shell.kubectl("create", "namespace", "team-a")
    assert "namespace/team-a" in shell.kubectl("get", "namespaces", "-o", "name")
    assert "node/gke-sandbox-default-pool-0" in shell.kubectl("get", "nodes", "-o", "name")
    jobset = tpu_jobset(
        "by-hand",
        "team-a",
        replicas=1,
        topology="2x2",
        run_seconds=600,
        annotations={labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL},
    )
    jobset["metadata"].pop("uid", None)
    shell.kubectl("create", "-f", "-", stdin=json.dumps(jobset))

    def described() -> str:
        return shell.kubectl("describe", "jobset", "-n", "team-a", "by-hand")

    deadline = time.monotonic() + 240
    while "TPUSliceRequested" not in described():
        assert time.monotonic() < deadline, described() + reader.drained()
        time.sleep(1.0)
    phases = ("get", "pods", "-n", "team-a", "-o", "jsonpath={.items[*].status.phase}")
    while "Running" not in shell.kubectl(*phases):
        assert time.monotonic() < deadline, shell.kubectl("get", "pods,nodes", "-A") + reader.drained()
        time.sleep(1.0)
    events = shell.kubectl("get", "events", "-n", "team-a")
    assert "TPUSliceRequested" in events and "Scheduled" in events  # the product's and the scheduler's

    # tpuprov status and why read the same API server (and the GKE emulator) from that shell.
    status = shell.tpuprov("status")
    assert "team-a/by-hand" in status and "tpu-by-hand-slice-0-" in status, status
    why = shell.tpuprov("why", "--jobset", "team-a/by-hand")
    assert "tpu-by-hand-slice-0-" in why, why

    proc.send_signal(signal.SIGINT)  # Ctrl-C
    assert proc.wait(timeout=120) == 0
    assert _wait_gone(pids) == []


def test_a_failed_start_stops_what_it_had_started(tmp_path: Path) -> None:
    """Ported from tests/sandbox/test_demo.py: there the kmock API failed on a missing manifests
    dir; here the real control plane fails (roles whose permission the RBAC translation refuses)
    while the Pub/Sub emulator boots on its own thread, which must not come up after the stop."""
    workdir = tmp_path / "work"
    roles = {f: ["container.widgets.get"] for f in ALL_FUNCTIONS}
    stack = RealStack(StackConfig(functions=ALL_FUNCTIONS, workdir=workdir), roles=roles)
    with pytest.raises(ValueError, match=r"container\.widgets\.get"), stack:
        pass
    assert (workdir / "kube" / "kube-apiserver.log").exists(), "the API server had been started"
    assert stack.pubsub.port, "the emulator had been started"
    # The stop waited for the emulator's boot to end (and then stopped it) instead of leaving it to
    # come up later: no thread still starts it, so the scan below sees everything ever started.
    assert [t for t in threading.enumerate() if t.name == "pubsub-start" and t.is_alive()] == []
    started = [
        int(path.parent.name)
        for path in Path("/proc").glob("[0-9]*/cmdline")
        if _mentions(path, str(workdir)) or _mentions(path, f"--host-port=127.0.0.1:{stack.pubsub.port}")
    ]
    assert _wait_gone(started) == []


def _mentions(cmdline: Path, text: str) -> bool:
    try:
        return text.encode() in cmdline.read_bytes()
    except OSError:
        return False
