"""The admission-check figure in virtual time (``sandbox.bench.admission``): reservation to Ready."""

from __future__ import annotations

from sandbox.bench.admission import (
    GKE_REQUESTS_PER_MINUTE,
    LEARNT_LIMIT,
    SETTINGS,
    Shape,
    run,
    slow_start_rounds,
)


def test_all_slices_are_ready_about_one_pool_create_after_the_reservation_whatever_their_number() -> None:
    shape = Shape(16, op_limit=20)
    result = run(shape)
    # Every create in one fan-out: the slowest create plus the sink's delays, not 16 creates in a row.
    assert result.seconds_to_ready <= shape.create_seconds[1] + 3 * shape.sink_delay
    assert result.creates_accepted == 16 and result.creates_refused == 0


def test_beyond_gkes_operation_limit_the_rest_follows_each_finished_operation() -> None:
    result = run(Shape(64, op_limit=20))
    assert result.creates_accepted == 64
    assert result.creates_refused <= 1  # the 429 that names the limit; nothing is sent beyond it after
    assert result.seconds_to_ready < 4 * 360 + 60  # four waves of at most six minutes


def test_a_stocked_out_slice_turns_the_check_to_retry_as_soon_as_its_pool_fails() -> None:
    shape = Shape(4, stocked_out=1)
    result = run(shape)
    # Quota is released when Kueue reads Retry: the failed create's entry is the only wait.
    assert result.stockout_to_retry == shape.sink_delay
    assert result.requeue_after == SETTINGS.stockout_backoff_seconds
    assert result.creates_accepted == 4 and result.creates_refused == 0  # nothing re-sent meanwhile
    assert result.seconds_to_ready == float("inf")


def test_a_wide_fan_out_at_one_second_per_create_stays_within_the_delivery_and_the_api_quota() -> None:
    result = run(Shape(256, op_limit=256, create_latency=1.0))
    assert result.creates_accepted == 256 and result.creates_refused == 0
    assert not result.deadline_reached
    # Rounds of 8, 16, 32, then CREATE_CONCURRENCY_MAX (64) after the QuotaReserved delivery.
    assert slow_start_rounds(256) == 7
    assert result.seconds_to_all_accepted == 5.0 + slow_start_rounds(256)
    assert result.widest_round == SETTINGS.create_concurrency_max
    assert result.quota_refused == 0
    assert result.busiest_minute_requests <= GKE_REQUESTS_PER_MINUTE


def test_the_fan_out_learns_gkes_operation_limit_and_fills_it_without_a_quota_refusal() -> None:
    # GKE runs at most 100 operations; the product is not told, and learns it from GKE's first 429.
    result = run(Shape(256, op_limit=LEARNT_LIMIT, create_latency=1.0))
    assert result.learnt_limit == LEARNT_LIMIT
    assert result.max_operations == LEARNT_LIMIT  # concurrency reached GKE's limit, never beyond
    assert result.creates_refused == 1  # the 429 that named it; nothing is sent beyond it after
    assert result.creates_accepted == 256
    assert result.quota_refused == 0
    assert result.busiest_minute_requests <= GKE_REQUESTS_PER_MINUTE
