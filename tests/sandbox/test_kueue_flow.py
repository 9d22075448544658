"""The Kueue multislice scenario on the whole sandbox: real functions, Pub/Sub, simulated Kueue.

What the simulation guarantees whatever the product does: the queue configuration is applied by
the product's code, the 3-slice JobSet takes the whole 24-chip quota and runs first, the 1- and
2-slice ones wait for it and then run. What the product must add (issue 11): the queued JobSets'
pods land on the first JobSet's pools and the product hands those pools over instead of deleting
them under the pods, so no pod is killed, no JobSet restarts, no slice ever has two pools, and
every pool is gone at the end.
"""

from __future__ import annotations

import pytest

from sandbox.stack.core import Stack
from sandbox.stack.demo_kueue import JOBSETS, run_kueue_scenario
from sandbox.testing.stack import PoolWatch, events_about, pods_killed, restarts, workload
from shared.core import labels

pytestmark = pytest.mark.integration


def test_kueue_scenario_runs_the_big_jobset_first_and_leaves_no_pool(
    stack: Stack, timeline_on_failure: None
) -> None:
    with PoolWatch(stack) as watch:
        # The queued JobSets must still run when the first one's release looks at its pools (a
        # second later on a loaded machine); real training runs for hours.
        outcome = run_kueue_scenario(stack, run_seconds=3.0, timeout=90)

    names = [name for name, _ in JOBSETS]
    assert outcome.problems == []
    assert outcome.states == dict.fromkeys(names, "Completed")
    assert {name: restarts(stack, name) for name in names} == dict.fromkeys(names, 0)
    assert outcome.summary.pods_killed == 0 and pods_killed(stack, *names) == []
    assert outcome.summary.pools_leaked == []
    assert outcome.summary.pools_created >= 3
    assert outcome.summary.pools_adopted >= 1  # the queued JobSets ran on the first one's pools
    assert watch.crowded == [], watch.crowded[:3]
    # The handover is visible on both sides: adopted by a queued JobSet, handed over by the first.
    adopters = {e["involvedObject"]["name"] for e in stack.events(labels.REASON_ADOPTED, "default")}
    assert adopters and adopters <= {"multislice-1", "multislice-2"}, adopters
    handed = [e["message"] for e in events_about(stack, labels.REASON_RELEASED, "multislice-3")]
    assert any("handed node pool" in m for m in handed), handed
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
