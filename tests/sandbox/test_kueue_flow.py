"""The Kueue multislice scenario on the whole sandbox: real functions, Pub/Sub, simulated Kueue.

What the simulation guarantees whatever the product does: the queue configuration is applied by
the product's code, the 3-slice JobSet takes the whole 24-chip quota and runs first, the 1- and
2-slice ones wait for it and then run, every JobSet ends and no pool is left behind. Whether pods
die because a pool was deleted under them is what ``pods_killed`` reports (0 once the product
hands pools over instead of deleting them).
"""

from __future__ import annotations

import pytest

from sandbox.stack.core import Stack
from sandbox.stack.demo_kueue import JOBSETS, run_kueue_scenario
from sandbox.testing.stack import workload

pytestmark = pytest.mark.integration


def test_kueue_scenario_runs_the_big_jobset_first_and_leaves_no_pool(
    stack: Stack, timeline_on_failure: None
) -> None:
    outcome = run_kueue_scenario(stack, run_seconds=1.0, timeout=90)

    assert set(outcome.states) == {name for name, _ in JOBSETS}
    assert all(state in ("Completed", "Failed") for state in outcome.states.values()), outcome.problems
    assert outcome.states["multislice-3"] == "Completed"  # it ran alone on its own pools
    assert outcome.summary.pools_leaked == []
    assert outcome.summary.pools_created >= 3
    assert outcome.summary.pods_killed == len(stack.ctx.pods_killed)
    admissions = [event["involvedObject"]["name"] for event in stack.events("Started", "default")]
    assert sorted(admissions) == sorted(name for name, _ in JOBSETS)  # each admitted exactly once
    first = [e.text for e in stack.timeline.entries() if "admitted by cluster-queue" in e.text]
    assert "multislice-3" in first[0], first
    for name, _ in JOBSETS:
        found = workload(stack, name)
        assert found is not None and any(
            c["type"] == "Finished" and c["status"] == "True" for c in found["status"]["conditions"]
        )
    assert stack.kueue is not None and stack.kueue.errors == []
