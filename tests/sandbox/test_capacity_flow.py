"""End to end on the sandbox: capacity policies, fallback across capacity types and zones, flex-start.

Scarce capacity comes from the GKE emulator's capacity model (``stack.gke.set_capacity``): a create
that finds its zone empty ends DONE with the pool in ERROR and GKE's ZONE_RESOURCE_POOL_EXHAUSTED
text, exactly what the product sees from real GKE. Everything asserted is what a user sees: the
Events ``kubectl describe`` shows, the JobSet's state and failure record, and the pools in GKE.

The module runs its own stack: a multi-zonal cluster (us-east5-b, then us-east5-a) so a policy can
name a second zone, with FAST's settings otherwise (stockout backoff 2, 4, 8 s).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.stack.core import Stack
from sandbox.testing.stack import (
    FAST,
    PoolWatch,
    assert_clean_run,
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

FIRST_ZONE, SECOND_ZONE = "us-east5-b", "us-east5-a"  # the cluster's zones, in NODE_LOCATIONS order
TWO_ZONES = dataclasses.replace(FAST, cluster_zones=(FIRST_ZONE, SECOND_ZONE))
KINDS = ("on-demand", "spot", "flex-start")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """This module's sandbox: FAST settings on a cluster with two zones."""
    with Stack(TWO_ZONES) as running:
        yield running


@pytest.fixture(autouse=True)
def unlimited_capacity_after(stack: Stack) -> Iterator[None]:
    """Each scenario starts with unlimited capacity, whatever the previous one left."""
    yield
    for zone in (FIRST_ZONE, SECOND_ZONE):
        for kind in KINDS:
            stack.gke.set_capacity(zone, kind, None)


def _policy(text: str) -> dict[str, str]:
    return {labels.CAPACITY_POLICY: text}


def _messages(events: list[dict[str, Any]], kind: str = "") -> list[str]:
    """Messages of ``events`` (only those about a ``kind`` object when given)."""
    return [
        str(e.get("message", ""))
        for e in events
        if not kind or (e.get("involvedObject") or {}).get("kind") == kind
    ]


def _capacity_steps(stack: Stack, pool: str) -> list[tuple[float, str, str, tuple[str, ...]]]:
    """What the GKE emulator's capacity model did with ``pool``: (at, event, kind, zones), in order."""
    return [(e.at, e.event, e.kind, e.zones) for e in stack.gke.capacity.events if e.key.endswith(f"/{pool}")]


def _failure_record(stack: Stack, name: str) -> dict[str, Any]:
    """The JobSet's ``tpuprov.dev/slice-failures`` annotation, parsed ({} when there is none)."""
    jobset = stack.jobset("default", name) or {}
    text = ((jobset.get("metadata") or {}).get("annotations") or {}).get(labels.SLICE_FAILURES)
    return dict(json.loads(text)) if text else {}


def _running_pool(stack: Stack, name: str, timeout: float = 20.0) -> dict[str, Any]:
    """The JobSet's single pool once GKE reports it RUNNING (as GKE JSON)."""

    def running() -> dict[str, Any]:  # {} (falsy) until then
        pools = [p for p in owned_pools(stack, name) if p.get("status") == "RUNNING"]
        return pools[0] if pools else {}

    return stack.wait_for(running, timeout, f"a RUNNING pool of {name}")


def _finish(stack: Stack, name: str, timeout: float = 30.0, reconcile: bool = False) -> None:
    """Wait until the JobSet completed and its pools are gone (optionally with a fast reconcile cron)."""
    end = time.monotonic() + timeout
    while reconcile and stack.jobset_state("default", name) not in ("Completed", "Failed"):
        assert time.monotonic() < end, f"JobSet {name} did not finish"
        stack.trigger_reconcile()
        time.sleep(0.5)
    assert wait_finished(stack, name, timeout=max(1.0, end - time.monotonic())) == "Completed"
    wait_released(stack, name)


def test_a_spot_stockout_falls_back_to_on_demand_at_once(stack: Stack) -> None:
    stack.gke.set_capacity(FIRST_ZONE, "spot", 0)  # no Spot TPUs in the slice's zone, all along
    with PoolWatch(stack) as watch:
        submit(
            stack,
            exclusive_tpu_jobset(
                "fallback", replicas=1, topology="2x2", annotations=_policy("spot, on-demand")
            ),
        )
        pool = _running_pool(stack, "fallback")
        record = _failure_record(stack, "fallback")
        _finish(stack, "fallback")

    name = str(pool["name"])
    assert not (pool.get("config") or {}).get("spot"), "landed on Spot although the zone had none"
    assert watch.crowded == [], "two pools of the slice at once"
    # GKE accepted exactly two creates of the slice's pool: the Spot one that stocked out, then on-demand.
    assert successful_creates(stack, "fallback") == {name: 2}
    steps = _capacity_steps(stack, name)
    assert [(event, kind) for _, event, kind, _ in steps if event != "released"] == [
        ("accepted", "spot"),
        ("stockout", "spot"),
        ("accepted", "on-demand"),
        ("running", "on-demand"),
    ]
    # What kubectl describe shows on the JobSet: the stockout and the fallback, no wait (the Events,
    # not a stopwatch, tell a fallback from a backoff: timings depend on this machine's load).
    failed = _messages(events_about(stack, labels.REASON_FAILED, "fallback"), "JobSet")
    assert failed and all(f"falling back to on-demand@{FIRST_ZONE} now" in m for m in failed), failed
    assert any("ZONE_RESOURCE_POOL_EXHAUSTED" in m for m in failed), failed
    assert not any("retrying in" in m for m in failed), failed
    # The failure record on the JobSet (no reconcile ran to forget it): what failed, what came next.
    assert {k: record[name].get(k) for k in ("attempts", "option", "next")} == {
        "attempts": 1,
        "option": f"spot@{FIRST_ZONE}",
        "next": f"on-demand@{FIRST_ZONE}",
    }, record
    assert_clean_run(stack, "fallback", slices=1, creates_per_pool=2)


def test_a_zone_stockout_falls_back_to_the_next_zone(stack: Stack) -> None:
    stack.gke.set_capacity(FIRST_ZONE, "spot", 0)
    policy = _policy(f"spot@{FIRST_ZONE}, spot@{SECOND_ZONE}")
    with PoolWatch(stack) as watch:
        submit(stack, exclusive_tpu_jobset("zones", replicas=1, topology="2x2", annotations=policy))
        pool = _running_pool(stack, "zones")
        nodes = stack.wait_for(
            lambda: stack.kube.list("v1", "nodes", label_selector=f"{labels.NODEPOOL}={pool['name']}"),
            10,
            "the pool's nodes",
        )
        _finish(stack, "zones")

    assert pool.get("locations") == [SECOND_ZONE] and (pool.get("config") or {}).get("spot") is True
    assert {n["metadata"]["labels"].get("topology.kubernetes.io/zone") for n in nodes} == {SECOND_ZONE}
    assert watch.crowded == []
    failed = _messages(events_about(stack, labels.REASON_FAILED, "zones"), "JobSet")
    assert failed and all(f"falling back to spot@{SECOND_ZONE} now" in m for m in failed), failed
    assert_clean_run(stack, "zones", slices=1, creates_per_pool=2)


def test_a_full_reservation_falls_back_to_on_demand_by_redelivery(stack: Stack) -> None:
    stack.gke.add_reservation("tpu-res", FIRST_ZONE, 0)  # exists, but has no room for the slice
    jobset = exclusive_tpu_jobset(
        "reserved", replicas=1, topology="2x2", annotations=_policy("reservation:tpu-res, on-demand")
    )
    submit(stack, jobset)
    pool = _running_pool(stack, "reserved")
    assert not (pool.get("config") or {}).get("reservationAffinity", {}).get("values")
    # GKE refused the reserved create at once (no pool was made); the redelivery created on-demand.
    assert successful_creates(stack, "reserved") == {str(pool["name"]): 1}
    failed = _messages(events_about(stack, labels.REASON_FAILED, "reserved"), "JobSet")
    assert any(
        "Reservation does not have enough resources" in m and f"falling back to on-demand@{FIRST_ZONE}" in m
        for m in failed
    ), failed
    _finish(stack, "reserved")
    assert_clean_run(stack, "reserved", slices=1)


def test_a_pod_that_selects_spot_never_falls_back_to_on_demand(stack: Stack) -> None:
    stack.gke.set_capacity(FIRST_ZONE, "spot", 0)  # no Spot until the slice has stocked out once
    jobset = exclusive_tpu_jobset(
        "spotonly",
        replicas=1,
        topology="2x2",
        selectors={labels.SPOT: "true"},
        annotations=_policy("spot, on-demand"),
    )
    with PoolWatch(stack) as watch:
        submit(stack, jobset)
        stack.wait_for(
            lambda: _messages(events_about(stack, labels.REASON_FAILED, "spotonly"), "JobSet"),
            30,
            "a TPUSliceFailed Event on the JobSet",
        )
        stack.gke.set_capacity(FIRST_ZONE, "spot", None)  # Spot returns
        _finish(stack, "spotonly", reconcile=True)  # a cron much faster than the backoff

    [(name, accepted)] = successful_creates(stack, "spotonly").items()
    kinds = {kind for _, event, kind, _ in _capacity_steps(stack, name) if event == "accepted"}
    assert kinds == {"spot"}, "a pod that asked for Spot got other capacity"
    assert accepted >= 2  # at least one stockout, then the create that landed
    assert watch.crowded == []
    failed = _messages(events_about(stack, labels.REASON_FAILED, "spotonly"), "JobSet")
    assert any("retrying in 2 s" in m for m in failed), failed  # backed off: no other option
    assert not any("falling back" in m for m in failed), failed
    assert_clean_run(stack, "spotonly", slices=1, creates_per_pool=accepted)


def test_a_flex_start_slice_waits_for_capacity_without_failing(stack: Stack) -> None:
    stack.gke.set_capacity(FIRST_ZONE, "flex-start", 0)  # none until the test says so
    jobset = exclusive_tpu_jobset("flex", replicas=1, topology="2x2", selectors={labels.FLEX_START: "true"})
    submit(stack, jobset)
    pool = _running_pool(stack, "flex")
    name = str(pool["name"])
    config = pool.get("config") or {}
    assert config.get("flexStart") is True and pool.get("initialNodeCount", 0) == 0
    assert (pool.get("autoscaling") or {}).get("totalMaxNodeCount") == 1
    assert (pool.get("management") or {}).get("autoRepair", False) is False

    # While GKE waits for capacity: the pool is there with no nodes, the pods pend, nothing failed,
    # and reconcile sweeps leave the pool alone.
    waited_until = time.monotonic() + 3.0
    while time.monotonic() < waited_until:
        stack.trigger_reconcile()
        assert sum(stack.gke.pool_nodes(stack.cluster.path, name).values()) == 0
        assert stack.kube.list("v1", "nodes", label_selector=f"{labels.NODEPOOL}={name}") == []
        time.sleep(0.5)
    assert stack.jobset_state("default", "flex") == "Running"
    pods = stack.kube.list("v1", "pods", "default")
    assert [p["status"].get("phase") for p in pods if p["metadata"]["name"].startswith("flex-")] == [
        "Pending"
    ]
    assert events_about(stack, labels.REASON_FAILED, "flex") == []

    stack.gke.set_capacity(FIRST_ZONE, "flex-start", None)  # capacity arrives
    _finish(stack, "flex", reconcile=True)  # nodes appear and the JobSet completes
    steps = [event for _, event, _, _ in _capacity_steps(stack, name)]
    assert steps == ["accepted", "waiting", "obtained", "released"], steps
    # One pool, created once, never recycled (a release racing a reconcile sweep may both send the
    # delete, and a sweep may race provision to a 409: both are idempotent, so requests are not counted).
    assert successful_creates(stack, "flex") == {name: 1}
    assert_clean_run(stack, "flex", slices=1)


def test_spot_with_a_reservation_is_refused_without_a_create(stack: Stack) -> None:
    creates = stack.gke.count("create")
    jobset = exclusive_tpu_jobset(
        "spotres",
        replicas=1,
        topology="2x2",
        selectors={labels.SPOT: "true", labels.RESERVATION_NAME: "tpu-res"},
    )
    submit(stack, jobset)
    refused = stack.wait_for(
        lambda: _messages(events_about(stack, labels.REASON_REFUSED, "spotres"), "Pod"),
        20,
        "a TPUSliceRefused Event on the pod",
    )
    assert any("Spot VMs cannot consume reservations" in m for m in refused), refused
    stack.delete_jobset("default", "spotres")
    assert stack.gke.count("create") == creates and owned_pools(stack, "spotres") == []


def test_a_v6e_pool_boots_from_hyperdisk_and_follows_the_release_channel(stack: Stack) -> None:
    submit(stack, exclusive_tpu_jobset("disk", replicas=1, topology="2x2"))
    pool = _running_pool(stack, "disk")
    _finish(stack, "disk")
    config = pool.get("config") or {}
    assert config.get("machineType") == "ct6e-standard-4t"
    assert config.get("diskType") == "hyperdisk-balanced"
    # The sandbox cluster is enrolled in REGULAR, which refuses pools with auto-upgrade off.
    assert pool.get("management") == {"autoUpgrade": True, "autoRepair": True}
    assert_clean_run(stack, "disk", slices=1)
