"""The admission-check figure in virtual time (``sandbox.bench.admission``): reservation to Ready."""

from __future__ import annotations

from sandbox.bench.admission import Shape, run


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
