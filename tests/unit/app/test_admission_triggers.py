"""Which finished node-pool operations move Kueue admission checks on at once (``handlers._provision``).

A create that finishes, and the relabel that hands an idle pool to a Workload, can each make a
Workload's slices ready; a delete cannot. The sweep is a stand-in: what is under test is which
operation endings trigger it (the real-stack fleet tutorial once waited for a reconcile tick after
a handover, because only a create did).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from shared.app import handlers
from shared.events.fields import ClusterId
from shared.events.logentry import NodePoolOperationDone, WorkloadQuotaReserved

CLUSTER = ClusterId("p", "us-west4-a", "west")


class Member:
    def __init__(self) -> None:
        self.settings = type("S", (), {"event_coalesce_seconds": 0, "cluster_path": CLUSTER.path})()
        self._services: dict[str, Any] = {}

    def service(self, name: str, factory: Callable[[Member], Any]) -> Any:
        return self._services.setdefault(name, factory(self))


class Checker:
    def __init__(self) -> None:
        self.sweeps: list[str] = []

    def sweep(self, trigger: str) -> list[Any]:
        self.sweeps.append(trigger)
        return []


class Handled:
    """The admission checker's ``handle``, recording each Workload it was asked about."""

    def __init__(self) -> None:
        self.handled: list[str] = []

    def handle(self, namespace: str, name: str, trigger: str) -> Any:
        self.handled.append(f"{namespace}/{name}")
        return type("R", (), {"state": "Pending", "why": "", "created": ()})()


class Provisioner:
    def resume(self, pool: str) -> list[str]:
        return []


class Releaser:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def release_if_owner_over(self, pool: str, trigger: str) -> list[str]:
        self.asked.append(pool)
        return []


class Placement:
    """MultiKueue's placement's ``pool_up``, recording each pool it was told came up."""

    def __init__(self) -> None:
        self.told: list[str] = []

    def pool_up(self, name: str) -> bool:
        self.told.append(name)
        return False


@pytest.fixture(autouse=True)
def placement(monkeypatch: pytest.MonkeyPatch) -> Placement:
    told = Placement()
    monkeypatch.setattr(handlers, "multikueue", lambda runtime: told)
    return told


@pytest.mark.parametrize(
    ("method", "sweeps"),
    [
        ("CreateNodePool", True),
        ("UpdateNodePool", True),
        ("DeleteNodePool", False),
        ("SetNodePoolSize", False),
    ],
)
def test_a_finished_create_or_handover_relabel_sweeps_the_admission_checks(
    monkeypatch: pytest.MonkeyPatch, method: str, sweeps: bool
) -> None:
    checker = Checker()
    monkeypatch.setattr(handlers, "admission_checker", lambda runtime: checker)
    monkeypatch.setattr(handlers, "provisioner", lambda runtime: Provisioner())
    monkeypatch.setattr(handlers, "releaser", lambda runtime: Releaser())
    event = NodePoolOperationDone(CLUSTER, "tpu-pool-a", method, False, datetime.datetime.now(datetime.UTC))
    handlers._provision(Member(), event)  # type: ignore[arg-type]
    assert checker.sweeps == ([f"{method} of tpu-pool-a finished"] if sweeps else [])


def test_each_operation_of_a_pool_sweeps_once_and_a_redelivered_one_does_not_sweep_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The release relabels an idle pool, then a Workload's handover relabels it again a second
    later: the second UpdateNodePool's end is what makes the slices ready, and must not be taken for
    a redelivery of the first (the fleet tutorial stalled on it until a reconcile tick)."""
    checker = Checker()
    monkeypatch.setattr(handlers, "admission_checker", lambda runtime: checker)
    monkeypatch.setattr(handlers, "provisioner", lambda runtime: Provisioner())
    monkeypatch.setattr(handlers, "releaser", lambda runtime: Releaser())
    member = Member()
    member.settings.event_coalesce_seconds = 30  # type: ignore[attr-defined]
    now = datetime.datetime.now(datetime.UTC)
    kept_idle = NodePoolOperationDone(CLUSTER, "tpu-pool-a", "UpdateNodePool", False, now, "operation-1")
    handed_over = NodePoolOperationDone(CLUSTER, "tpu-pool-a", "UpdateNodePool", False, now, "operation-2")
    for event in (kept_idle, kept_idle, handed_over, handed_over):
        handlers._provision(member, event)  # type: ignore[arg-type]
    assert checker.sweeps == ["UpdateNodePool of tpu-pool-a finished"] * 2


@pytest.mark.parametrize(
    ("method", "failed", "asked"),
    [("CreateNodePool", False, True), ("CreateNodePool", True, False), ("UpdateNodePool", False, False)],
)
def test_a_finished_create_asks_whether_its_jobset_is_still_there_and_tells_multikueue(
    monkeypatch: pytest.MonkeyPatch, placement: Placement, method: str, failed: bool, asked: bool
) -> None:
    releaser = Releaser()
    monkeypatch.setattr(handlers, "admission_checker", lambda runtime: Checker())
    monkeypatch.setattr(handlers, "provisioner", lambda runtime: Provisioner())
    monkeypatch.setattr(handlers, "releaser", lambda runtime: releaser)
    event = NodePoolOperationDone(CLUSTER, "tpu-pool-a", method, failed, datetime.datetime.now(datetime.UTC))
    handlers._provision(Member(), event)  # type: ignore[arg-type]
    assert releaser.asked == (["tpu-pool-a"] if asked else [])
    # Only a create that ended well delivered capacity (MultiKueue's shortage record of the shape).
    assert placement.told == (["tpu-pool-a"] if asked else [])


def test_a_new_workload_of_the_same_name_is_looked_at_and_a_redelivered_reservation_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MultiKueue removes a worker's copy of a Workload and creates the next seconds later, same
    namespace and name: its reservation must not be taken for a redelivery of the last one's (the
    real MultiKueue's copies waited for a reconcile tick)."""
    checker = Handled()
    monkeypatch.setattr(handlers, "admission_checker", lambda runtime: checker)
    member = Member()
    member.settings.event_coalesce_seconds = 30  # type: ignore[attr-defined]
    now = datetime.datetime.now(datetime.UTC)
    first = WorkloadQuotaReserved(CLUSTER, "default", "jobset-train-1a2b3", "uid-1", "Quota reserved", now)
    later = now + datetime.timedelta(seconds=4)
    second = WorkloadQuotaReserved(CLUSTER, "default", "jobset-train-1a2b3", "uid-2", "Quota reserved", later)
    for event in (first, first, second, second):
        handlers._provision(member, event)  # type: ignore[arg-type]
    assert checker.handled == ["default/jobset-train-1a2b3"] * 2
