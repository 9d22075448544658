"""Stockout and quota backoff over the stateful fakes, with a fake wall clock.

A slice GKE cannot provision is retried after a backoff that doubles per failed attempt up to a cap;
the record lives on the JobSet (annotation) and every attempt is one aggregated TPUSliceFailed Event
saying what happens next and when.
"""

from __future__ import annotations

import json
import logging

import pytest

from sandbox.testing.clock import FakeClock
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.cloud.errors import is_resource_quota
from shared.core import labels
from shared.core.errors import InvalidInputError, TransientError
from shared.core.settings import Settings
from shared.provisioning.create import backoff
from shared.provisioning.outcomes import CREATED, EXISTS, FAILED, SKIPPED
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler
from shared.provisioning.services import Services
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import STATUS_PROVISIONING, STATUS_RUNNING
from tests.unit.provisioning.stockouts import (
    CLUSTER,
    OPTION,
    SETTINGS,
    STOCKOUT,
    T0,
    failed_events,
    pending,
    record,
    stock_out,
    submit,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


# -- the schedule ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "cap", "attempts", "expected"),
    [
        (300, 1800, 1, 300),
        (300, 1800, 2, 600),
        (300, 1800, 3, 1200),
        (300, 1800, 4, 1800),
        (300, 1800, 5, 1800),
        (300, 1800, 40, 1800),
        (300, 1800, 0, 0),
        (0, 1800, 3, 0),
        (60, 60, 4, 60),
    ],
    ids=[
        "first-failure-waits-base",
        "second-doubles",
        "third-doubles-again",
        "fourth-hits-cap",
        "fifth-stays-at-cap",
        "many-failures-no-overflow",
        "no-failure-no-wait",
        "zero-base-disables",
        "cap-equal-base-is-constant",
    ],
)
def test_backoff_schedule(base: int, cap: int, attempts: int, expected: int) -> None:
    settings = SETTINGS.with_overrides(stockout_backoff_seconds=base, stockout_backoff_max_seconds=cap)
    assert backoff.delay(settings, attempts) == expected


@pytest.mark.parametrize(
    ("message", "quota"),
    [
        (
            "GKE create node pool x: Insufficient regional quota to satisfy request: resource "
            "\"TPU_V6E\": request requires '16.0' and is short '8.0'.",
            True,
        ),
        ("Insufficient quota to satisfy the request: Not all instances running in IGM", True),
        ("Instance creation failed: QUOTA_EXCEEDED: Quota 'TPUS_PER_TPU_FAMILY' exceeded", True),
        ("Quota exceeded for quota metric 'Write requests' and limit 'Write requests per minute'", False),
        (STOCKOUT, False),
        ("400 Invalid machine type", False),
    ],
    ids=[
        "regional-quota-403",
        "igm-quota",
        "compute-quota-exceeded",
        "api-rate-limit",
        "stockout",
        "bad-spec",
    ],
)
def test_quota_errors_are_told_from_other_refusals(message: str, quota: bool) -> None:
    assert is_resource_quota(message) is quota


def test_backoff_settings_are_validated() -> None:
    parsed = Settings.from_env({"STOCKOUT_BACKOFF_SECONDS": "60", "STOCKOUT_BACKOFF_MAX_SECONDS": "600"})
    assert (parsed.stockout_backoff_seconds, parsed.stockout_backoff_max_seconds) == (60, 600)
    with pytest.raises(InvalidInputError, match="STOCKOUT_BACKOFF_MAX_SECONDS"):
        Settings.from_env({"STOCKOUT_BACKOFF_SECONDS": "900", "STOCKOUT_BACKOFF_MAX_SECONDS": "600"})
    with pytest.raises(InvalidInputError, match="must be <="):
        Settings.from_env({"STOCKOUT_BACKOFF_MAX_SECONDS": str(24 * 3600)})


def test_a_malformed_record_is_ignored_rather_than_blocking_the_jobset() -> None:
    jobset = {"metadata": {"annotations": {labels.SLICE_FAILURES: "{not json"}}}
    assert backoff.failures(JobSet.parse(jobset)) == {}
    jobset["metadata"]["annotations"][labels.SLICE_FAILURES] = json.dumps({"p": {"attempts": "x"}, "q": 3})
    assert backoff.failures(JobSet.parse(jobset)) == {}


def test_a_record_stamped_in_the_future_is_the_tenants_and_is_ignored() -> None:
    # The annotation is on the tenant's own JobSet: a failedAt after now would postpone the slice's
    # create and its ERROR pool's recycling for as long as it says.
    now = 1_800_000_000.0
    record = {
        "soon": {"attempts": 1, "failedAt": int(now + backoff.MAX_CLOCK_SKEW_SECONDS)},
        "forged": {"attempts": 1, "failedAt": 9_999_999_999},
    }
    jobset = {"metadata": {"annotations": {labels.SLICE_FAILURES: json.dumps(record)}}}
    assert set(backoff.failures(JobSet.parse(jobset), now)) == {"soon"}
    assert backoff.waiting(SETTINGS, JobSet.parse(jobset), "forged", now) is None


# -- what the user sees ---------------------------------------------------------------------------


def test_first_sighting_records_the_attempt_on_the_jobset_and_says_when_it_is_retried(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube)
    service = Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock))
    assert pending(service, pods[0]) == CREATED
    stock_out(gke)
    [name] = gke.managed_names(CLUSTER)
    for _ in range(3):  # every FailedScheduling of the pod: the same Event, counted
        assert pending(service, pods[0]) == EXISTS
        clock.now += 20

    [event] = failed_events(kube)
    assert (event["kind"], event["name"], event["type"], event["count"]) == ("JobSet", "a", "Warning", 3)
    assert event["message"] == (
        f"node pool {name} ({OPTION}) could not be provisioned: {STOCKOUT}; "
        "attempt 1, retrying in 5 min (not before 08:05:00Z)"
    )
    assert record(kube) == {
        name: {"attempts": 1, "failedAt": int(T0), "recycled": False, "option": OPTION, "rounds": 1}
    }
    assert gke.count("create") == 1


def test_reconcile_keeps_a_failed_pool_until_its_backoff_is_over_then_recycles_it(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube)
    provision = Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock))
    reconcile = Reconciler(Services(SETTINGS, gke, kube, wall_clock=clock))
    pending(provision, pods[0])
    stock_out(gke)
    [name] = gke.managed_names(CLUSTER)

    summary = reconcile.sweep()
    assert (summary.backing_off, summary.deleted) == (1, 0)
    clock.now += 299
    assert reconcile.sweep().deleted == 0 and pending(provision, pods[0]) == EXISTS
    assert gke.count("delete") == 0 and gke.count("create") == 1

    clock.now += 1
    summary = reconcile.sweep()
    assert (summary.deleted, summary.healed) == (1, 1)
    assert record(kube)[name]["recycled"] is True
    assert pending(provision, pods[0]) == CREATED  # the retry: attempt 2
    stock_out(gke)
    assert pending(provision, pods[0]) == EXISTS
    assert record(kube)[name] == {
        "attempts": 2,
        "failedAt": int(T0) + 300,
        "recycled": False,
        "option": OPTION,
        "rounds": 2,
    }
    messages = [e["message"] for e in failed_events(kube)]
    assert [m.split("; ", 1)[1] for m in messages] == [
        "attempt 1, retrying in 5 min (not before 08:05:00Z)",
        "attempt 2, retrying in 10 min (not before 08:15:00Z)",
    ]


def test_a_stockout_lasting_hours_costs_a_few_creates_per_hour_and_the_slice_lands_after(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube)
    provision = Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock))
    reconcile = Reconciler(Services(SETTINGS, gke, kube, wall_clock=clock))
    creates_by_hour: list[int] = []
    # Three hours of stockout: a pending event every minute, a sweep every five, every create fails.
    for hour in range(3):
        before = gke.count("create")
        for minute in range(60):
            clock.now = T0 + hour * 3600 + minute * 60
            pending(provision, pods[0])
            if minute % 5 == 0:
                reconcile.sweep()
            stock_out(gke)
        creates_by_hour.append(gke.count("create") - before)
    # Attempts 1-4 wait 5, 10, 20, 30 min (each plus up to a sweep period): a handful in the first
    # hour, then one or two per hour at the cap, instead of one per sweep (12 an hour).
    assert 2 <= creates_by_hour[0] <= 6
    assert all(1 <= n <= 2 for n in creates_by_hour[1:])
    assert len(gke.managed_names(CLUSTER)) <= 1  # one pool of the slice at a time

    # Capacity returns: within one capped backoff (plus a sweep) the slice gets its pool and runs.
    landed_by = clock.now + SETTINGS.stockout_backoff_max_seconds + 300
    while clock.now < landed_by and not any(p.status == STATUS_RUNNING for p in gke.pools[CLUSTER].values()):
        clock.now += 60
        pending(provision, pods[0])
        if int(clock.now - T0) // 60 % 5 == 0:
            reconcile.sweep()
        for name, pool in list(gke.pools[CLUSTER].items()):
            if pool.status == STATUS_PROVISIONING:
                gke.mark(CLUSTER, name, STATUS_RUNNING)
    assert [p.status for p in gke.pools[CLUSTER].values()] == [STATUS_RUNNING]
    reconcile.sweep()
    assert record(kube) == {}  # landed: a later stockout starts again from attempt 1


def test_a_quota_refusal_is_reported_on_the_jobset_and_backs_off_the_same_way(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube)
    provision = Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock))
    reconcile = Reconciler(Services(SETTINGS, gke, kube, wall_clock=clock))
    gke.fail("create", "quota")
    assert pending(provision, pods[0]) == FAILED
    name = next(iter(record(kube)))
    assert record(kube) == {
        name: {"attempts": 1, "failedAt": int(T0), "recycled": True, "option": OPTION, "rounds": 1}
    }
    [event] = failed_events(kube)
    assert event["kind"] == "JobSet" and "Insufficient regional quota" in event["message"]
    assert event["message"].endswith("attempt 1, retrying in 5 min (not before 08:05:00Z)")

    clock.now += 120  # within the backoff neither a pending event nor a sweep sends a create
    assert pending(provision, pods[0]) == SKIPPED
    assert reconcile.sweep().requested == 0
    assert gke.count("create") == 1

    clock.now += 180
    gke.fail("create", "quota")
    assert reconcile.sweep().requested == 0  # the sweep's retry met the quota again: attempt 2
    assert record(kube)[name] == {
        "attempts": 2,
        "failedAt": int(T0) + 300,
        "recycled": True,
        "option": OPTION,
        "rounds": 2,
    }
    clock.now += 600
    assert pending(provision, pods[0]) == CREATED
    assert gke.count("create") == 3


def test_siblings_backing_off_are_not_created_with_the_group(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube, replicas=2)
    provision = Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock))
    gke.fail("create", "quota", times=2)
    pending(provision, pods[0])
    assert len(record(kube)) == 2 and gke.count("create") == 2
    clock.now += 60
    assert pending(provision, pods[1]) == SKIPPED and gke.count("create") == 2


def test_two_functions_seeing_the_same_failure_count_it_once(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube)
    provision = Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock))
    pending(provision, pods[0])
    stock_out(gke)
    [name] = gke.managed_names(CLUSTER)
    stale = kube.get_jobset("team-a", "a")  # what a concurrent reconcile listed before provision wrote
    pending(provision, pods[0])
    other = backoff.Backoff(SETTINGS, kube, clock)
    seen = other.observe(stale, name, STOCKOUT, tried=OPTION, options=[OPTION])
    assert seen.attempts == 1  # conflict, re-read: already counted
    assert record(kube)[name]["attempts"] == 1
    assert [e["count"] for e in failed_events(kube)] == [2]


def test_a_jobset_that_keeps_changing_makes_the_write_retry_by_redelivery(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube)
    provision = Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock))
    pending(provision, pods[0])
    stock_out(gke)
    kube.before_annotate = kube.touch_jobset  # every write loses the race
    with pytest.raises(TransientError, match="kept changing"):
        pending(provision, pods[0])
    kube.before_annotate = None
    assert pending(provision, pods[0]) == EXISTS and record(kube)


def test_a_failed_pool_of_a_jobset_that_is_gone_is_deleted_without_waiting(
    gke: FakeGke, kube: FakeKube, clock: FakeClock
) -> None:
    pods = submit(kube)
    pending(Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock)), pods[0])
    stock_out(gke)
    del kube.jobsets[("team-a", "a")]
    assert Reconciler(Services(SETTINGS, gke, kube, wall_clock=clock)).sweep().deleted == 1
    assert gke.managed_names(CLUSTER) == []


def test_an_attempt_is_logged_as_failed_once_however_often_it_is_seen(
    gke: FakeGke, kube: FakeKube, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    # The stockout metric counts backoff.failed lines: one per attempt, not one per sighting.
    pods = submit(kube)
    provision = Provisioner(Services(SETTINGS, gke, kube, wall_clock=clock))
    pending(provision, pods[0])
    stock_out(gke)
    with caplog.at_level(logging.INFO, logger="tpuprov.backoff"):
        for _ in range(3):
            pending(provision, pods[0])
    events = [r.fields["event"] for r in caplog.records if r.name == "tpuprov.backoff"]
    assert events == ["backoff.failed", "backoff.seen", "backoff.seen"]
