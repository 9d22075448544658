"""The slot accountant's learning policy (whole-object table tests) and its request pacing."""

from __future__ import annotations

import pytest

from sandbox.testing.clock import FakeClock
from shared.cloud.retry import Budget
from shared.core.errors import OperationLimitError
from shared.core.settings import Settings
from shared.provisioning.create.slots import Pace, RequestRate, after_round, start

# GKE's answers as the adapter raises them (shared.cloud.errors): the 429 names its quota.
TOO_MANY = OperationLimitError(
    'Too many operations: cluster "c" hits the concurrent operations quota 12, please try again later.', 12
)
INCOMPATIBLE = OperationLimitError("Cluster is running incompatible operation operation-7.")
WIDEST = 64


@pytest.mark.parametrize(
    ("before", "accepted", "running", "refusal", "after"),
    [
        # Slow start: every create of the round accepted doubles the width.
        (Pace(8), 8, 8, None, Pace(16)),
        (Pace(32), 32, 63, None, Pace(WIDEST)),  # never wider than CREATE_CONCURRENCY_MAX
        # GKE names its quota: that is the limit, and the width halves.
        (Pace(16), 4, 12, TOO_MANY, Pace(8, 12, fixed=True, growing=False)),
        # No number: GKE ran what was in flight when it refused, and no more (a learnt limit).
        (Pace(16), 5, 9, INCOMPATIBLE, Pace(8, 9, fixed=False, growing=False)),
        (Pace(1), 0, 0, INCOMPATIBLE, Pace(1, 1, fixed=False, growing=False)),
        # A configured limit outlives a refusal that names no number.
        (Pace(8, 20, fixed=True), 3, 7, INCOMPATIBLE, Pace(4, 20, fixed=True, growing=False)),
        # After a refusal the width grows by one a round (additive increase).
        (Pace(4, 9, growing=False), 4, 8, None, Pace(5, 9, growing=False)),
        # The probe beyond a learnt limit was accepted: the limit grows to what GKE runs.
        (Pace(4, 9, growing=False), 1, 10, None, Pace(5, 10, growing=False)),
        # ... but a stated one is never moved by successes.
        (Pace(4, 12, fixed=True, growing=False), 2, 12, None, Pace(5, 12, fixed=True, growing=False)),
    ],
    ids=[
        "slow-start",
        "capped",
        "stated-429",
        "unstated-400",
        "floor-one",
        "configured-kept",
        "additive",
        "probe-accepted",
        "stated-fixed",
    ],
)
def test_after_round(
    before: Pace, accepted: int, running: int, refusal: OperationLimitError | None, after: Pace
) -> None:
    assert after_round(before, WIDEST, accepted, running, refusal) == after


@pytest.mark.parametrize(
    ("pace", "running", "room"),
    [
        (Pace(8), 30, None),  # nothing refused yet: no limit known
        (Pace(8, 12, fixed=True), 9, 3),
        (Pace(8, 12, fixed=True), 15, 0),
        (Pace(8, 9), 9, 1),  # a learnt limit: one probe beyond it
        (Pace(8, 9), 4, 6),
    ],
)
def test_room(pace: Pace, running: int, room: int | None) -> None:
    assert pace.room(running) == room


def test_a_fresh_instance_starts_at_the_settings() -> None:
    settings = Settings(unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c")
    assert start(settings) == Pace(8)
    configured = settings.with_overrides(gke_operation_limit=20, create_concurrency=100)
    assert start(configured) == Pace(64, 20, fixed=True)


def test_requests_are_paced_so_that_no_minute_holds_more_than_the_quota() -> None:
    clock = FakeClock(1000.0)

    def sleep(seconds: float) -> None:
        clock.now += seconds

    rate = RequestRate(10, clock=clock, sleep=sleep)
    budget = Budget(120, clock=clock, sleep=sleep)
    assert rate.take(6, budget) == 6
    clock.now += 30
    assert rate.take(6, budget) == 4  # four left in this minute
    assert clock.now == 1030.0
    # None left: wait until the first six leave the window (60 s after they were sent).
    assert rate.take(6, budget) == 6
    assert clock.now == 1060.0
    assert rate.in_window() == 10


def test_no_request_when_the_window_frees_only_after_the_deadline() -> None:
    clock = FakeClock(0.0)
    rate = RequestRate(2, clock=clock, sleep=lambda s: None)
    assert rate.take(2, Budget(45, clock=clock)) == 2
    assert rate.take(1, Budget(45, clock=clock)) == 0


def test_gke_saying_the_quota_is_spent_stops_requests_for_a_window() -> None:
    clock = FakeClock(0.0)
    rate = RequestRate(3000, clock=clock, sleep=lambda s: None)
    rate.take(1, Budget(45, clock=clock))
    rate.spent()
    assert rate.take(1, Budget(45, clock=clock)) == 0
    clock.now += 60.5
    assert rate.take(5, Budget(45, clock=clock)) == 5
