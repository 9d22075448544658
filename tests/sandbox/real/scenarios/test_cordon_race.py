"""The release/bind race on the real components: a pod lands on a pool between the check and the delete.

Ported from the stand-in stack's tests/sandbox/test_occupancy_race.py (deleted). The product
cordons a pool's Node, waits ``CORDON_SETTLE_SECONDS`` (3 s on the package's stack) and checks the
pool's occupancy once more before it deletes the pool. Each scenario holds back the finished
owner's ``AllJobsCompleted`` export, so that the test decides when the release runs (a reconcile
sweep, as after a lost event).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest

from sandbox.realstack.core import RealStack
from sandbox.testing.stack import (
    events_about,
    exclusive_tpu_jobset,
    kube,
    owned_pools,
    pods_killed,
    restarts,
    submit,
    successful_creates,
    wait_finished,
    wait_released,
)
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("timeline_on_failure")]

FINISH = 180.0
RELEASE = 120.0


def pods(stack: RealStack, name: str) -> list[dict[str, Any]]:
    return kube(stack).list("v1", "pods", "default", f"{labels.JOBSET_NAME}={name}")


TEST_SCHEDULER = "tpuprov-test-scheduler"  # no scheduler runs under this name: the test binds


def _completion_of(name: str) -> Any:
    def matches(entry: Mapping[str, Any]) -> bool:
        payload = entry.get("jsonPayload") or {}
        involved = payload.get("involvedObject") or {}
        return payload.get("reason") == "AllJobsCompleted" and involved.get("name") == name

    return matches


def _finished_owner(stack: RealStack, name: str) -> tuple[str, str]:
    """Run a one-slice v6e 2x2 JobSet to completion without its release event; its pool and Node."""
    assert stack.router is not None
    stack.router.drop_next(_completion_of(name))
    submit(stack, exclusive_tpu_jobset(name, replicas=1, topology="2x2", run_seconds=1))
    assert wait_finished(stack, name, FINISH) == "Completed"
    stack.wait_for(lambda: stack.router is not None and stack.router.dropped, 60, "the lost export")
    (pool,) = owned_pools(stack, name)
    (node,) = kube(stack).list("v1", "nodes", None, f"{labels.NODEPOOL}={pool['name']}")
    return str(pool["name"]), str(node["metadata"]["name"])


def _cordoned(stack: RealStack, node: str) -> bool:
    found = kube(stack).get("v1", "nodes", None, node) or {}
    annotations = (found.get("metadata") or {}).get("annotations") or {}
    return bool((found.get("spec") or {}).get("unschedulable")) and labels.CORDONED in annotations


def test_a_pod_decided_before_the_cordon_and_bound_after_it_is_not_killed(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_occupancy_race.py. There the simulated scheduler held its
    bind until the cordon; here the pod names a scheduler that does not run and the test plays it:
    it decided on the finished owner's Node before the sweep, and binds through the real Binding
    subresource right after the sweep's cordon (the API server accepts a bind to a cordoned Node,
    as it does from kube-scheduler's asynchronous binding cycle). The sweep's last occupancy check,
    ``CORDON_SETTLE_SECONDS`` after the cordon, must see the pod and keep the pool."""
    pool, node = _finished_owner(stack, "race-a")
    settle = int(stack.config.function_env["CORDON_SETTLE_SECONDS"])
    # Still running at the last check: bound right after the cordon, checked ``settle`` after it.
    jobset = exclusive_tpu_jobset("race-b", replicas=1, topology="2x2", run_seconds=settle + 5)
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["schedulerName"] = (
        TEST_SCHEDULER
    )
    submit(stack, jobset)
    (pod,) = stack.wait_for(lambda: pods(stack, "race-b"), 60, "race-b's pod")
    stack.trigger_reconcile()  # the safety net finds race-a over: its pool is up for deletion
    stack.wait_for(lambda: _cordoned(stack, node), 60, "the sweep to cordon race-a's node", interval=0.05)
    cordoned = time.monotonic()
    name = pod["metadata"]["name"]
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    stack.kube_cluster.client().create(f"/api/v1/namespaces/default/pods/{name}/binding", binding)
    bound = time.monotonic()
    assert cordoned < bound

    state = wait_finished(stack, "race-b", FINISH)
    assert pods_killed(stack, "race-a", "race-b") == [], "the pool was deleted under race-b"
    assert state == "Completed"
    wait_released(stack, "race-b", RELEASE)

    assert restarts(stack, "race-b") == 0
    assert successful_creates(stack, "race-b") == {}  # it ran on race-a's pool all along
    (adopted,) = events_about(stack, labels.REASON_ADOPTED, "race-b")
    assert pool in adopted["message"]
    assert owned_pools(stack, "race-a") == []


def test_a_pod_arriving_after_the_cordon_gets_its_own_pool(stack: RealStack) -> None:
    """Ported from tests/sandbox/test_occupancy_race.py. The real scheduler keeps the new pod off
    the cordoned Node (its ``unschedulable`` filter) and reports it pending; provision creates it a
    pool of its own while the sweep deletes the finished owner's."""
    pool, node = _finished_owner(stack, "late-a")
    lists = sum(1 for call in stack.gke.calls if call.method == "list")
    stack.trigger_reconcile()
    stack.wait_for(
        lambda: sum(1 for call in stack.gke.calls if call.method == "list") > lists, 60, "the sweep to start"
    )
    stack.wait_for(lambda: _cordoned(stack, node), 60, "the sweep to cordon late-a's node", interval=0.05)
    submit(stack, exclusive_tpu_jobset("late-b", replicas=1, topology="2x2", run_seconds=1))

    state = wait_finished(stack, "late-b", FINISH)
    ran_on = {str((p.get("spec") or {}).get("nodeName")) for p in pods(stack, "late-b")}
    assert pods_killed(stack, "late-a", "late-b") == [], "the pool was deleted under late-b"
    assert state == "Completed"
    assert node not in ran_on, ran_on
    wait_released(stack, "late-b", RELEASE)
    stack.wait_for(lambda: not owned_pools(stack, "late-a"), RELEASE, "late-a's pool to go")

    assert restarts(stack, "late-b") == 0
    assert len(successful_creates(stack, "late-b")) == 1  # the cordoned pool was not an option
    assert events_about(stack, labels.REASON_ADOPTED, "late-b") == []
    assert [d for d in stack.decisions("release.deleted") if d.get("pool") == pool]
