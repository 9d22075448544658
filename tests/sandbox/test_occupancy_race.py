"""The release/bind race on the whole sandbox: a pod lands on a pool between the check and the delete.

The scheduler here binds ``BIND_DELAY`` seconds after it decides (kube-scheduler's asynchronous
binding cycle), and the functions cordon, then wait ``CORDON_SETTLE_SECONDS`` before the last
occupancy check. Each scenario holds back the finished owner's ``AllJobsCompleted`` export so that
the test decides when the release runs (a reconcile sweep, as after a lost event), and records when
the product cordoned the pool's node and when the pod was bound there.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from sandbox.stack.core import Stack
from sandbox.testing.stack import (
    FAST,
    events_about,
    exclusive_tpu_jobset,
    owned_pools,
    pods_killed,
    restarts,
    submit,
    successful_creates,
    wait_finished,
    wait_released,
)
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("timeline_on_failure")]

BIND_DELAY = 4.0
SETTLE = 5  # > BIND_DELAY: a pod decided before the cordon is bound before the last check


class Moments:
    """When the product cordoned a node and when a pod was bound, from the API's change stream."""

    def __init__(self) -> None:
        self.cordoned: dict[str, float] = {}  # node -> first time it carried the product's cordon
        self.bound: dict[str, float] = {}  # pod -> first time it had a node
        self._lock = threading.Lock()

    def __call__(self, event_type: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        now = time.monotonic()
        with self._lock:
            if obj.get("kind") == "Node" and (obj.get("spec") or {}).get("unschedulable"):
                if labels.CORDONED in (meta.get("annotations") or {}):
                    self.cordoned.setdefault(name, now)
            elif obj.get("kind") == "Pod" and (obj.get("spec") or {}).get("nodeName"):
                self.bound.setdefault(name, now)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """This module's sandbox: binds land ``BIND_DELAY`` after the decision; a longer settle wait."""
    config = dataclasses.replace(
        FAST, scheduler_bind_delay=BIND_DELAY, function_env={"CORDON_SETTLE_SECONDS": str(SETTLE)}
    )
    with Stack(config) as running:
        yield running


@pytest.fixture(scope="module")
def moments(stack: Stack) -> Moments:
    recorder = Moments()
    stack.kube.on_change(recorder)
    return recorder


def _completion_of(name: str) -> Any:
    def matches(entry: Mapping[str, Any]) -> bool:
        payload = entry.get("jsonPayload") or {}
        involved = payload.get("involvedObject") or {}
        return payload.get("reason") == "AllJobsCompleted" and involved.get("name") == name

    return matches


def _finished_owner(stack: Stack, name: str) -> str:
    """Run a one-slice v6e 2x2 JobSet to completion without its release event; returns its pool."""
    assert stack.router is not None
    stack.router.drop_next(_completion_of(name))
    submit(stack, exclusive_tpu_jobset(name, replicas=1, topology="2x2", run_seconds=1))
    assert wait_finished(stack, name, 30) == "Completed"
    stack.wait_for(lambda: stack.router is not None and stack.router.dropped, 10, "the lost export")
    (pool,) = owned_pools(stack, name)
    return str(pool["name"])


def _assumed(stack: Stack, pod_prefix: str) -> str:
    """The node the scheduler decided on for a pod of ``pod_prefix`` (not bound yet), or ""."""
    for entry in stack.timeline.entries():
        if (
            entry.source == "scheduler"
            and f"pod default/{pod_prefix}" in entry.text
            and "assumed" in entry.text
        ):
            return entry.text.rsplit(" on ", 1)[1].split(",")[0]
    return ""


def test_a_pod_decided_before_the_cordon_and_bound_after_it_is_not_killed(
    stack: Stack, moments: Moments
) -> None:
    pool = _finished_owner(stack, "race-a")
    node = f"gke-sandbox-{pool}-0"

    # It still runs at the last check: bound at most BIND_DELAY after the cordon, checked SETTLE after.
    run_seconds = BIND_DELAY + SETTLE
    # The bind waits for the cordon however long the sweep takes to get there: the interleaving
    # under test then happens on a loaded machine too.
    stack.scheduler.hold_binds()
    try:
        submit(stack, exclusive_tpu_jobset("race-b", replicas=1, topology="2x2", run_seconds=run_seconds))
        assert stack.wait_for(lambda: _assumed(stack, "race-b-"), 10, "the scheduler's decision") == node
        stack.trigger_reconcile()  # the safety net finds race-a over: its pool is up for deletion
        stack.wait_for(lambda: node in moments.cordoned, 30, "the sweep to cordon race-a's node")
    finally:
        stack.scheduler.hold_binds(False)

    state = wait_finished(stack, "race-b", 40)
    assert pods_killed(stack, "race-a", "race-b") == [], "the pool was deleted under race-b"
    assert state == "Completed"
    bound = next(t for pod, t in moments.bound.items() if pod.startswith("race-b-"))
    # The interleaving under test really happened: decided, then cordoned, then bound.
    assert node in moments.cordoned and moments.cordoned[node] < bound, (moments.cordoned, bound)
    wait_released(stack, "race-b", 20)

    assert restarts(stack, "race-b") == 0
    assert successful_creates(stack, "race-b") == {}  # it ran on race-a's pool all along
    (adopted,) = events_about(stack, labels.REASON_ADOPTED, "race-b")
    assert pool in adopted["message"]
    assert owned_pools(stack, "race-a") == [] and not stack.managed_pools()
    node_now = stack.kube.get("v1", "nodes", None, node)
    assert node_now is None or not node_now["spec"].get("unschedulable")


def test_a_pod_arriving_after_the_cordon_gets_its_own_pool(stack: Stack, moments: Moments) -> None:
    pool = _finished_owner(stack, "late-a")
    node = f"gke-sandbox-{pool}-0"
    lists = sum(1 for call in stack.gke.calls if call.method == "list")
    stack.trigger_reconcile()
    stack.wait_for(
        lambda: sum(1 for call in stack.gke.calls if call.method == "list") > lists, 10, "the sweep to start"
    )
    # Inside the settle wait: a pod decided now would be bound after the last check, were the
    # node schedulable; the cordon (made right after the sweep's first reads) keeps it off.
    stack.wait_for(lambda: node in moments.cordoned, SETTLE - 1, "the sweep to cordon late-a's node")
    submitted = time.monotonic()
    submit(stack, exclusive_tpu_jobset("late-b", replicas=1, topology="2x2", run_seconds=1))

    state = wait_finished(stack, "late-b", 40)
    assert pods_killed(stack, "late-a", "late-b") == [], "the pool was deleted under late-b"
    assert state == "Completed"
    assert moments.cordoned.get(node, submitted) < submitted, "the node was not cordoned in time"
    wait_released(stack, "late-b", 20)
    stack.wait_for(lambda: not stack.managed_pools(), 20, "every pool to go")

    assert restarts(stack, "late-b") == 0
    assert len(successful_creates(stack, "late-b")) == 1  # the cordoned pool was not an option
    assert events_about(stack, labels.REASON_ADOPTED, "late-b") == []
    assert not any(node in e.text and "late-b" in e.text for e in stack.timeline.entries())
