"""End to end on the sandbox: a stockout that lasts is retried with backoff, and the JobSet lands
when capacity returns.

FAST backs off 2, 4, 8, 8... seconds. Reconcile is triggered far more often than that (every half
second, as if the cron ran every few seconds), so without a backoff every sweep would recycle the
pool and create it again.
"""

from __future__ import annotations

import datetime
import itertools
import re
import time
from collections.abc import Iterator

import pytest

from sandbox.stack.core import Stack
from sandbox.testing.stack import (
    FAST,
    assert_clean_run,
    created_decisions,
    events_about,
    exclusive_tpu_jobset,
    owned_pools,
    submit,
    successful_creates,
    wait_finished,
    wait_released,
)
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("timeline_on_failure")]


@pytest.fixture(autouse=True)
def no_faults_left(stack: Stack) -> Iterator[None]:
    yield
    stack.gke.clear_faults()
    stack.gke.set_op_delay(FAST.gke_op_delay)


def _attempts(stack: Stack, name: str) -> dict[int, str]:
    """Failed attempts the JobSet was told about: attempt number -> the wait it announced."""
    found: dict[int, str] = {}
    for event in events_about(stack, labels.REASON_FAILED, name):
        match = re.search(r"attempt (\d+), retrying in (\d+ s)", str(event.get("message", "")))
        if match and (event.get("involvedObject") or {}).get("kind") == "JobSet":
            found[int(match.group(1))] = match.group(2)
    return found


def _create_times(stack: Stack, name: str) -> list[datetime.datetime]:
    """When each create GKE accepted for the JobSet's pools was logged, oldest first."""
    return sorted(datetime.datetime.fromisoformat(str(d["time"])) for d in created_decisions(stack, name))


def test_a_lasting_stockout_is_retried_with_backoff_and_the_jobset_lands_when_capacity_returns(
    stack: Stack,
) -> None:
    stack.gke.stockout("ct6e-standard-4t", "GCE_STOCKOUT: ZONE_RESOURCE_POOL_EXHAUSTED", times=None)
    submit(stack, exclusive_tpu_jobset("scarce", replicas=1, topology="2x2"))

    most_pools = 0

    def three_attempts() -> bool:
        nonlocal most_pools
        stack.trigger_reconcile()  # a cron much faster than the backoff
        most_pools = max(most_pools, len(owned_pools(stack, "scarce")))
        return len(_attempts(stack, "scarce")) >= 3

    stack.wait_for(three_attempts, 60, "three failed attempts", interval=0.5)

    attempts = _attempts(stack, "scarce")
    assert sorted(attempts) == list(range(1, len(attempts) + 1))
    assert [attempts[k] for k in (1, 2, 3)] == ["2 s", "4 s", "8 s"]  # the backoff, in the Events
    # Each attempt is one accepted create, and the waits lie between them: recycling at every
    # sweep would have created again a second or so after each failure. (Load only adds delay.)
    created = _create_times(stack, "scarce")
    assert len(attempts) <= len(created) <= len(attempts) + 1, (attempts, created)
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(created[:3])]
    assert gaps[0] >= 2 and gaps[1] >= 4, gaps
    assert most_pools == 1  # one pool of the slice at a time, never a second one beside it
    assert stack.jobset_state("default", "scarce") == "Running"  # still waiting for its slice

    stack.gke.clear_faults()  # capacity returns
    end = time.monotonic() + 30
    while stack.jobset_state("default", "scarce") not in ("Completed", "Failed") and time.monotonic() < end:
        stack.trigger_reconcile()
        time.sleep(0.5)
    assert wait_finished(stack, "scarce", timeout=5) == "Completed"
    wait_released(stack, "scarce")
    # Every accepted create was a failed attempt, but the one that landed.
    final_attempts = len(_attempts(stack, "scarce"))
    [(_, accepted)] = successful_creates(stack, "scarce").items()
    assert accepted <= final_attempts + 1, (accepted, final_attempts)
    assert_clean_run(stack, "scarce", slices=1, creates_per_pool=accepted)
