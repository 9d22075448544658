"""The Pub/Sub emulator wrapper: its process group, early exits, and ports taken before it binds.

Most tests use a stand-in for gcloud (a shell wrapper that runs a Python HTTP server in its own
process group, as gcloud runs Java); one runs the real emulator against a port a stranger holds.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from sandbox.emulators import gcloud_pubsub as pubsub_emulator_module
from sandbox.emulators.gcloud_pubsub import PubsubEmulator, unavailable_reason
from sandbox.emulators.sockets import alive, free_port, listener_is_ours

FAKE_GCLOUD = """#!/bin/bash
# Stands in for `gcloud beta emulators pubsub start`: a wrapper that runs a child server (the real
# one is Java) in its own process group and waits for it.
for arg in "$@"; do case "$arg" in --host-port=*) port="${arg##*:}";; esac; done
[ -n "$FAIL" ] && { echo "ERROR: (gcloud) simulated failure"; exit 3; }
[ -n "$PORTS" ] && echo "$port $$" >> "$PORTS"
if [ -n "$TAKEN_ONCE" ] && [ ! -e "$TAKEN_ONCE" ]; then
  # What the Java server does when its port is taken: report it, then stay up serving nothing.
  touch "$TAKEN_ONCE"
  echo '[pubsub] Exception in thread "main" java.net.BindException: Address already in use'
  sleep 300 &
  wait
fi
python3 -m http.server "$port" --bind 127.0.0.1 >/dev/null 2>&1 &
wait
"""


@pytest.fixture
def fake_sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with a fake gcloud (and java) next to an SDK-like platform/pubsub-emulator directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "platform" / "pubsub-emulator").mkdir(parents=True)
    for name, body in (("gcloud", FAKE_GCLOUD), ("java", "#!/bin/sh\nexit 0\n")):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir / "gcloud"


def test_emulator_stop_ends_the_wrapper_and_its_child(fake_sdk: Path) -> None:
    emulator = PubsubEmulator(project="stop-test", gcloud=str(fake_sdk), startup_timeout=20)
    try:
        emulator.start()
        members = emulator.group_members()
        assert len(members) >= 2, "expected the wrapper and its server child"
        assert emulator.env() == {"PUBSUB_EMULATOR_HOST": emulator.host, "PUBSUB_PROJECT_ID": "stop-test"}
    finally:
        emulator.stop()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(pid) for pid in members):
        time.sleep(0.05)
    assert [pid for pid in members if alive(pid)] == []
    assert emulator.pid is None
    emulator.stop()  # idempotent


def test_emulator_that_exits_early_reports_its_output(
    fake_sdk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL", "1")
    emulator = PubsubEmulator(gcloud=str(fake_sdk), startup_timeout=20)
    with pytest.raises(RuntimeError, match=r"exited with code 3:\n.*simulated failure"):
        emulator.start()
    assert emulator.pid is None


def test_emulator_reports_why_it_cannot_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", os.devnull)
    emulator = PubsubEmulator(gcloud="gcloud-that-does-not-exist")
    with pytest.raises(RuntimeError, match="is not on PATH"):
        emulator.start()
    assert emulator.pid is None


def test_emulator_whose_port_was_taken_starts_again_on_another(
    fake_sdk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports_file = tmp_path / "ports"
    monkeypatch.setenv("PORTS", str(ports_file))
    monkeypatch.setenv("TAKEN_ONCE", str(tmp_path / "taken"))
    emulator = PubsubEmulator(gcloud=str(fake_sdk), startup_timeout=20)
    started = time.monotonic()
    try:
        emulator.start()
        runs = [line.split() for line in ports_file.read_text().splitlines()]
        assert len(runs) == 2, "one failed bind, one start elsewhere"
        (first_port, first_pid), (second_port, _) = runs
        assert emulator.port == int(second_port) != int(first_port)
        assert time.monotonic() - started < 15, "the failed bind is noticed, not waited out"
        assert not alive(int(first_pid)), "the run that failed to bind is stopped"
    finally:
        emulator.stop()


def test_emulator_on_a_fixed_port_someone_else_holds_fails_clearly(
    fake_sdk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAKEN_ONCE", str(tmp_path / "taken"))
    emulator = PubsubEmulator(gcloud=str(fake_sdk), port=free_port(), startup_timeout=20)
    with pytest.raises(RuntimeError, match=r"could not bind a port: 127\.0\.0\.1:\d+ is in use"):
        emulator.start()
    assert emulator.pid is None


@pytest.mark.integration
def test_the_real_emulator_moves_off_a_port_taken_before_it_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"Pub/Sub emulator unavailable: {reason}")
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        taken = stranger.getsockname()[1]
        choices = iter([taken])
        monkeypatch.setattr(pubsub_emulator_module, "free_port", lambda: next(choices, None) or free_port())
        with PubsubEmulator(project="moved") as emulator:
            assert emulator.port != taken
            assert listener_is_ours(emulator.port, emulator.pid or 0)
            with urllib.request.urlopen(f"http://{emulator.host}/", timeout=5) as response:
                assert response.status == 200
