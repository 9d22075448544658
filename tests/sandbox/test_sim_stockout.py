"""Issue acceptance in virtual time: Spot capacity for a v5e 2x4 slice is exhausted for 20 minutes
while on-demand is available. With fallback the JobSet runs on on-demand one attempt after the first
stockout; without it the slice is retried with backoff and lands when Spot capacity returns."""

from __future__ import annotations

import pytest

from sandbox.sim.stockout import StockoutConfig, run


def test_with_fallback_the_slice_runs_on_demand_one_attempt_after_the_first_stockout() -> None:
    result = run(StockoutConfig(policy="spot, on-demand", select_spot=False, outage_minutes=20))
    assert result.kinds == ("spot", "on-demand")  # at most 2 creates: the stockout and the one that lands
    assert result.landed_on == ("on-demand",)
    assert result.landed_at is not None and result.landed_at < 20 * 60  # long before Spot returns
    assert result.max_pools_per_slice == 1


def test_a_pod_that_selects_spot_never_falls_back_even_with_a_policy() -> None:
    result = run(StockoutConfig(policy="spot, on-demand", select_spot=True, outage_minutes=20))
    assert set(result.kinds) == {"spot"} and result.landed_on == ("spot",)


@pytest.mark.parametrize("outage", [20, 60, 180])
def test_without_fallback_the_slice_backs_off_and_lands_when_capacity_returns(outage: int) -> None:
    result = run(StockoutConfig(select_spot=True, outage_minutes=outage, horizon_hours=8))
    assert result.creates_first_hour <= 6  # not one every sweep (12 an hour)
    assert result.landed_on == ("spot",)
    assert result.landed_at is not None
    # Capacity returned at `outage`; the slice waits at most the backoff cap (30 min) plus one sweep,
    # one FailedScheduling period and the create itself.
    assert result.landed_at <= outage * 60 + 1800 + 300 + 300 + 150
    assert result.max_pools_per_slice == 1


def test_fallback_for_a_multislice_jobset_costs_two_creates_per_slice() -> None:
    result = run(StockoutConfig(policy="spot, on-demand", select_spot=False, slices=4))
    assert result.creates == 8 and result.landed_on == ("on-demand",) * 4
