"""The virtual-time simulation: the real services under GKE's operation limit, judged in virtual time.

Makespans here are virtual seconds computed from seeded durations, so the assertions are about the
product's behaviour (how it uses GKE's slots), not about how fast this machine is.
"""

from __future__ import annotations

import itertools

import pytest

from sandbox.sim.engine import Simulation
from sandbox.sim.push_delivery import SimSubscription
from sandbox.sim.scenario import SimConfig, run


def _resume(provisioner):
    return provisioner.resume()


@pytest.mark.parametrize(("slices", "limit"), [(16, 4), (24, 10)], ids=["4-waves", "3-waves"])
def test_waves_run_close_to_the_lower_bound_without_dead_letters_or_a_create_storm(slices, limit):
    result = run(SimConfig(slices=slices, op_limit=limit, seed=3), resume=_resume)
    assert result.creates_accepted == slices  # exactly one pool per slice
    assert result.makespan is not None and result.ratio is not None and result.ratio <= 1.15
    assert result.dead_lettered == 0
    assert result.wasted <= result.waves  # at most one refused create per wave
    assert result.max_in_flight <= limit


def test_finished_operation_events_are_what_keeps_the_waves_tight():
    config = SimConfig(slices=16, op_limit=4, seed=3)
    with_events = run(config, resume=_resume)
    without = run(SimConfig(slices=16, op_limit=4, seed=3, finished_ops=False))
    assert without.makespan is not None and with_events.makespan is not None
    # Without them the next wave waits for a redelivery backoff or the next FailedScheduling.
    assert without.makespan > with_events.makespan * 1.1


def test_pubsub_redelivers_with_the_infra_backoff_then_dead_letters():
    sim = Simulation()
    attempts: list[float] = []

    def always_fail(_message):
        attempts.append(sim.now)
        raise RuntimeError("503")

    sub = SimSubscription(sim, always_fail, minimum_backoff=10, maximum_backoff=600, max_attempts=10)
    sub.publish("m")
    sim.run(until=10_000)
    gaps = [round(b - a) for a, b in itertools.pairwise(attempts)]
    assert gaps == [10, 20, 40, 80, 160, 320, 600, 600, 600]
    assert (sub.stats.deliveries, sub.stats.dead_lettered, sub.stats.acked) == (10, 1, 0)
