"""A fleet reconcile tick's bounds (#27): a sweep that outlives RECONCILE_CLUSTER_SECONDS goes on in
the background, the tick answers for the other clusters without waiting for it, and the next ticks
skip that cluster (never a second sweep of it at once) until its sweep ends.

The sweeps are stand-ins (``handlers._sweep`` replaced): what is under test is the tick's own
scheduling, which the wire-level fleet tests (tests/functions/test_fleet.py) cannot hold a sweep
open for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from shared.app import handlers

BOUND = 1  # seconds a sweep may take before the tick stops waiting for it


class Member:
    """One fleet cluster's runtime, as the tick reads it (its path and its per-cluster services)."""

    def __init__(self, path: str) -> None:
        self.settings = type("S", (), {"cluster_path": path})()
        self._services: dict[str, Any] = {}

    def service(self, name: str, factory: Callable[[Member], Any]) -> Any:
        return self._services.setdefault(name, factory(self))


class Fleet:
    def __init__(self, *members: Member) -> None:
        self.settings = type("S", (), {"reconcile_cluster_seconds": BOUND})()
        self._members = list(members)

    def members(self) -> list[Member]:
        return self._members


SLOW_PATH, FAST_PATH = "projects/p/locations/l/clusters/slow", "projects/p/locations/l/clusters/fast"


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[str]]]:
    """The slow cluster's sweep blocks until the event is set; every sweep started is recorded."""
    release = threading.Event()
    started: list[str] = []

    def sweep(member: Member) -> str:
        path = member.settings.cluster_path
        started.append(path)
        if path == SLOW_PATH:
            release.wait(30)
        return f"swept {path}"

    monkeypatch.setattr(handlers, "_sweep", sweep)
    yield release, started
    release.set()  # never leave a worker blocked for the next test


def _events(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [
        (r.fields["event"], r.fields.get("cluster", ""))
        for r in caplog.records
        if getattr(r, "fields", {}).get("event", "").startswith("reconcile.")
    ]


def test_an_overrunning_sweep_delays_no_other_cluster_and_is_never_doubled(
    sweeps: tuple[threading.Event, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    release, started = sweeps
    slow_member = Member(SLOW_PATH)
    fleet = Fleet(slow_member, Member(FAST_PATH))
    slow, fast = SLOW_PATH, FAST_PATH
    with caplog.at_level(logging.INFO):
        began = time.monotonic()
        first = handlers.reconcile(fleet, None)  # type: ignore[arg-type]
        waited = time.monotonic() - began
        second = handlers.reconcile(fleet, None)  # type: ignore[arg-type]
    # The tick answered for the fast cluster once the bound passed, the slow sweep still running.
    assert first == {fast: f"swept {fast}"} and BOUND <= waited < BOUND + 10
    # The next tick skipped the slow cluster (one sweep of it at a time) and swept the fast one again.
    assert second == {fast: f"swept {fast}"}
    assert started.count(slow) == 1 and started.count(fast) == 2
    assert (("reconcile.overran", slow) in _events(caplog)) and (
        ("reconcile.skipped", slow) in _events(caplog)
    )

    release.set()  # the slow sweep ends: the cluster is swept again at the tick after
    deadline = time.monotonic() + 10
    busy = slow_member.service("sweeping", lambda _: threading.Lock())
    while not busy.acquire(blocking=False):  # the sweep's worker lets go of its cluster as it ends
        assert time.monotonic() < deadline, "the slow sweep never let go of its cluster"
        time.sleep(0.01)
    busy.release()
    third = handlers.reconcile(fleet, None)  # type: ignore[arg-type]
    assert third == {slow: f"swept {slow}", fast: f"swept {fast}"}
