"""Capacity policies, fallback across zones and reservations, and node selectors, on the real components.

Scarce capacity comes from the GKE emulator's capacity model (``stack.gke.set_capacity``): a create
that finds its zone empty ends DONE with the pool in ERROR and GKE's ZONE_RESOURCE_POOL_EXHAUSTED
text, exactly what the product sees from real GKE. A pool that reaches RUNNING registers its Nodes in
the real API server with the labels GKE derives from the pool (``sandbox.kube.nodes``): a selector
the product dropped or mis-built would leave the pod pending on a billed pool, for the real
scheduler decides where it runs. Everything asserted is what a user sees: the Events ``kubectl
describe`` shows, the JobSet's state and failure record, the pods' phases and the pools in GKE.

One stack for the module: a multi-zonal cluster (us-east5-b, then us-east5-a) so a policy can name a
second zone; stockout backoff 2, 4, 8 s.

Ported from tests/sandbox/test_capacity_flow.py and tests/sandbox/test_selectors_flow.py. There the
simulated scheduler bound pods to simulated Nodes and a pod "ran" for the stack's default time; here
the real scheduler places them on the Nodes a RUNNING pool registers, KWOK runs each for the
``run-seconds`` its template asks (KWOK stages, ``sandbox.kube.kwok``), and a re-admission under
another flavor is done through the real JobSet controller and its webhook, which lets a suspended
JobSet's pod template change (the stand-in wrote the object directly). Capacity stays the GKE
emulator's. The spot-to-on-demand fallback and the flex-start wait are in test_realstack.py.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.emulators.reservations import Block, SubBlock
from sandbox.jobsets import RUN_SECONDS
from sandbox.realstack.core import JOBSET_API, RealStack
from sandbox.realstack.kubestate import collection
from sandbox.testing.stack import (
    REAL_FAST,
    PoolWatch,
    assert_clean_run,
    create_requests,
    events_about,
    exclusive_tpu_jobset,
    kube,
    owned_pools,
    submit,
    successful_creates,
    wait_finished,
    wait_released,
)
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIRST_ZONE, SECOND_ZONE = "us-east5-b", "us-east5-a"  # the cluster's zones, in NODE_LOCATIONS order
KINDS = ("on-demand", "spot", "flex-start")
MACHINE = "ct6e-standard-4t"  # the machine type of _slice's v6e 2x2 slice: one VM
RELEASE_TIMEOUT = 120.0
FINISH_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    """This module's stack: the real components on a cluster with two zones, JobSet installed."""
    with RealStack(dataclasses.replace(REAL_FAST, cluster_zones=(FIRST_ZONE, SECOND_ZONE))) as running:
        running.setup()
        yield running


@pytest.fixture(autouse=True)
def unlimited_capacity_after(stack: RealStack) -> Iterator[None]:
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


def _capacity_steps(stack: RealStack, pool: str) -> list[tuple[float, str, str, tuple[str, ...]]]:
    """What the GKE emulator's capacity model did with ``pool``: (at, event, kind, zones), in order."""
    return [(e.at, e.event, e.kind, e.zones) for e in stack.gke.capacity.events if e.key.endswith(f"/{pool}")]


def _failure_record(stack: RealStack, name: str) -> dict[str, Any]:
    """The JobSet's ``tpuprov.dev/slice-failures`` annotation, parsed ({} when there is none)."""
    jobset = stack.jobset("default", name) or {}
    text = ((jobset.get("metadata") or {}).get("annotations") or {}).get(labels.SLICE_FAILURES)
    return dict(json.loads(text)) if text else {}


def _running_pool(stack: RealStack, name: str, timeout: float = 90.0) -> dict[str, Any]:
    """The JobSet's single pool once GKE reports it RUNNING (as GKE JSON)."""

    def running() -> dict[str, Any]:  # {} (falsy) until then
        pools = [p for p in owned_pools(stack, name) if p.get("status") == "RUNNING"]
        return pools[0] if pools else {}

    return stack.wait_for(running, timeout, f"a RUNNING pool of {name}")


def _finish(stack: RealStack, name: str, reconcile: bool = False) -> None:
    """Wait until the JobSet completed and its pools are gone (optionally with a fast reconcile cron)."""
    end = time.monotonic() + FINISH_TIMEOUT
    while reconcile and stack.jobset_state("default", name) not in ("Completed", "Failed"):
        assert time.monotonic() < end, f"JobSet {name} did not finish"
        stack.trigger_reconcile()
        time.sleep(1.0)
    assert wait_finished(stack, name, timeout=max(1.0, end - time.monotonic())) == "Completed"
    wait_released(stack, name, timeout=RELEASE_TIMEOUT)


def _pods(stack: RealStack, name: str) -> list[dict[str, Any]]:
    return kube(stack).list("v1", "pods", "default", f"{labels.JOBSET_NAME}={name}")


def _slice(name: str, **options: Any) -> dict[str, Any]:
    """A one-slice v6e JobSet whose pods run 3 s (KWOK), unless told otherwise."""
    return exclusive_tpu_jobset(name, replicas=1, **{"topology": "2x2", "run_seconds": 3, **options})


# -- capacity ------------------------------------------------------------------------------------


def test_a_zone_stockout_falls_back_to_the_next_zone(stack: RealStack) -> None:
    stack.gke.set_capacity(FIRST_ZONE, "spot", 0)
    policy = _policy(f"spot@{FIRST_ZONE}, spot@{SECOND_ZONE}")
    with PoolWatch(stack) as watch:
        submit(stack, _slice("zones", annotations=policy))
        pool = _running_pool(stack, "zones")
        nodes = stack.wait_for(
            lambda: kube(stack).list("v1", "nodes", None, f"{labels.NODEPOOL}={pool['name']}"),
            30,
            "the pool's nodes",
        )
        _finish(stack, "zones")

    assert pool.get("locations") == [SECOND_ZONE] and (pool.get("config") or {}).get("spot") is True
    assert {n["metadata"]["labels"].get("topology.kubernetes.io/zone") for n in nodes} == {SECOND_ZONE}
    assert watch.crowded == []
    failed = _messages(events_about(stack, labels.REASON_FAILED, "zones"), "JobSet")
    assert failed and all(f"falling back to spot@{SECOND_ZONE} now" in m for m in failed), failed
    assert_clean_run(stack, "zones", slices=1, creates_per_pool=2)


def test_a_full_reservation_falls_back_to_on_demand_without_a_create(stack: RealStack) -> None:
    stack.gke.add_reservation("tpu-res", FIRST_ZONE, 0, MACHINE)  # exists, but has no room for the slice
    submit(stack, _slice("reserved", annotations=_policy("reservation:tpu-res, on-demand")))
    pool = _running_pool(stack, "reserved")
    assert not (pool.get("config") or {}).get("reservationAffinity", {}).get("values")
    # Compute said the reservation had no room, so no reserved create was sent; the same delivery
    # went on to on-demand.
    assert create_requests(stack, "reserved") == {str(pool["name"]): 1}
    assert successful_creates(stack, "reserved") == {str(pool["name"]): 1}
    failed = _messages(events_about(stack, labels.REASON_FAILED, "reserved"), "JobSet")
    assert any(
        "reservation tpu-res: 0 free VMs of 0, the slice needs 1" in m
        and f"falling back to on-demand@{FIRST_ZONE}" in m
        for m in failed
    ), failed
    _finish(stack, "reserved")
    assert_clean_run(stack, "reserved", slices=1)


def test_the_slice_runs_in_the_reservation_block_with_room_not_the_full_one(stack: RealStack) -> None:
    # Two reservations of one shape: "res-full" is taken by a running JobSet, "res-dense" has a
    # degraded sub-block and one with room. The second JobSet's pool goes to the healthy sub-block;
    # GKE never refuses a create, and the real scheduler runs the pods on the reserved nodes.
    stack.gke.add_reservation("res-full", FIRST_ZONE, 1, MACHINE)
    subs = [SubBlock("s1", 4, health="DEGRADED"), SubBlock("s2", 4)]
    stack.gke.add_reservation("res-dense", FIRST_ZONE, 0, MACHINE, blocks=[Block("b1", 8, sub_blocks=subs)])
    submit(stack, _slice("holder", annotations=_policy("reservation:res-full"), run_seconds=60))
    holder = _running_pool(stack, "holder")
    assert (holder.get("config") or {}).get("reservationAffinity", {}).get("values") == ["res-full"]
    # The holder's pod on its node first: a pool of the shape with no pod bound yet is free to any
    # JobSet's exclusive Job, and "placed" would run on it (seen in CI) instead of on its own pool.
    stack.wait_for(
        lambda: any((p.get("status") or {}).get("phase") == "Running" for p in _pods(stack, "holder")),
        60,
        "the holder's pod Running on its pool",
    )
    policy = _policy("reservation:res-full, reservation:res-dense")
    submit(stack, _slice("placed", annotations=policy))
    pool = _running_pool(stack, "placed")
    values = (pool.get("config") or {}).get("reservationAffinity", {}).get("values")
    assert values == ["res-dense/reservationBlocks/b1/reservationSubBlocks/s2"]
    assert create_requests(stack, "placed") == {str(pool["name"]): 1}
    refused = [e.key for e in stack.gke.capacity.events if e.event == "refused-reservation"]
    assert refused == [], refused
    requested = _messages(events_about(stack, labels.REASON_REQUESTED, "placed"), "JobSet")
    assert any("reservation res-dense: 4 free VMs in block b1, sub-block s2" in m for m in requested), (
        requested
    )
    _finish(stack, "placed")
    assert_clean_run(stack, "placed", slices=1)
    stack.delete_jobset("default", "holder")
    wait_released(stack, "holder", timeout=RELEASE_TIMEOUT)


def test_a_pod_that_selects_spot_never_falls_back_to_on_demand(stack: RealStack) -> None:
    stack.gke.set_capacity(FIRST_ZONE, "spot", 0)  # no Spot until the slice has stocked out once
    jobset = _slice("spotonly", selectors={labels.SPOT: "true"}, annotations=_policy("spot, on-demand"))
    with PoolWatch(stack) as watch:
        submit(stack, jobset)
        stack.wait_for(
            lambda: _messages(events_about(stack, labels.REASON_FAILED, "spotonly"), "JobSet"),
            60,
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


def test_spot_with_a_reservation_is_refused_without_a_create(stack: RealStack) -> None:
    creates = stack.gke.count("create")
    submit(stack, _slice("spotres", selectors={labels.SPOT: "true", labels.RESERVATION_NAME: "tpu-res"}))
    refused = stack.wait_for(
        lambda: _messages(events_about(stack, labels.REASON_REFUSED, "spotres"), "Pod"),
        60,
        "a TPUSliceRefused Event on the pod",
    )
    assert any("Spot VMs cannot consume reservations" in m for m in refused), refused
    assert {p["status"].get("phase") for p in _pods(stack, "spotres")} == {"Pending"}
    stack.delete_jobset("default", "spotres")
    assert stack.gke.count("create") == creates and owned_pools(stack, "spotres") == []


def test_a_v6e_pool_boots_from_hyperdisk_and_follows_the_release_channel(stack: RealStack) -> None:
    submit(stack, _slice("disk"))
    pool = _running_pool(stack, "disk")
    _finish(stack, "disk")
    config = pool.get("config") or {}
    assert config.get("machineType") == "ct6e-standard-4t"
    assert config.get("diskType") == "hyperdisk-balanced"
    # The sandbox cluster is enrolled in REGULAR, which refuses pools with auto-upgrade off.
    assert pool.get("management") == {"autoUpgrade": True, "autoRepair": True}
    assert_clean_run(stack, "disk", slices=1)


# -- selectors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "selector"),
    [
        ("ici-off", {labels.ICI_RESILIENCY: "false"}),
        ("hinted", {labels.LOCATION_HINT: "cell-a"}),
        ("counted", {labels.ACCELERATOR_COUNT: "4", "topology.kubernetes.io/region": "us-east5"}),
    ],
)
def test_pod_selecting_a_label_gke_takes_or_sets_runs(
    stack: RealStack, name: str, selector: dict[str, str]
) -> None:
    assert stack.config.location == "us-east5-b"  # the region selected above
    submit(stack, _slice(name, topology="2x4", selectors=selector))

    def pool_labels() -> dict[str, str]:
        pools = owned_pools(stack, name)
        return dict((pools[0].get("config") or {}).get("labels") or {}) if pools else {}

    seen = stack.wait_for(pool_labels, 60, f"the pool of {name}")
    assert wait_finished(stack, name, timeout=FINISH_TIMEOUT) == "Completed"
    # The real scheduler placed every pod: the Nodes of the pool carried what it selects.
    pods = _pods(stack, name)
    assert pods and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    # What GKE takes as a node label is in the pool's node labels; what it derives itself is not.
    taken = {k: v for k, v in selector.items() if k in (labels.ICI_RESILIENCY, labels.LOCATION_HINT)}
    assert {k: seen[k] for k in selector if k in seen} == taken
    wait_released(stack, name, timeout=RELEASE_TIMEOUT)
    assert_clean_run(stack, name, slices=1)


@pytest.mark.parametrize(
    ("name", "selector", "needle"),
    [
        (
            "classy",
            {"cloud.google.com/compute-class": "tpu"},
            'Node labels with key "cloud.google.com/compute-class" are managed by GKE or Kubernetes',
        ),
        ("armed", {"kubernetes.io/arch": "amd64"}, "pod selects kubernetes.io/arch=amd64"),
        ("notspot", {labels.SPOT: "false"}, "the pool's nodes carry no cloud.google.com/gke-spot label"),
    ],
)
def test_pod_selecting_a_label_no_pool_can_carry_is_refused_without_a_pool(
    stack: RealStack, name: str, selector: dict[str, str], needle: str
) -> None:
    creates = stack.gke.count("create")
    submit(stack, _slice(name, topology="2x4", selectors=selector))

    def refused() -> list[str]:
        return _messages(events_about(stack, labels.REASON_REFUSED, name), "Pod")

    messages = stack.wait_for(refused, 60, "a TPUSliceRefused Event on the pod")
    assert any(needle in m and next(iter(selector)) in m for m in messages), messages
    assert {p["status"].get("phase") for p in _pods(stack, name)} == {"Pending"}
    stack.delete_jobset("default", name)
    assert stack.gke.count("create") == creates and create_requests(stack, name) == {}
    assert owned_pools(stack, name) == []


def test_readmission_under_spot_replaces_the_idle_on_demand_pool(stack: RealStack) -> None:
    # What Kueue does to a JobSet it evicts and admits again under another flavor, done by hand
    # through the real JobSet controller: suspend it (the Job controller deletes its pods, the pool
    # stays through SUSPEND_GRACE_SECONDS), write the new flavor's node labels into the pod
    # template (JobSet's webhook allows that only while suspended), unsuspend it.
    name = "flavored"
    api = stack.kube_cluster.client()
    path = f"{collection(JOBSET_API, 'jobsets', 'default')}/{name}"
    submit(stack, _slice(name, topology="2x4", run_seconds=600))

    def running() -> bool:
        pods = _pods(stack, name)
        return bool(pods) and {p["status"].get("phase") for p in pods} == {"Running"}

    stack.wait_for(running, 120, f"the pods of {name} running")
    (before,) = owned_pools(stack, name)
    assert not (before.get("config") or {}).get("spot")

    api.patch(path, {"spec": {"suspend": True}})
    stack.wait_for(lambda: not _pods(stack, name), 60, f"the pods of suspended {name} deleted")
    jobset = stack.jobset("default", name)
    assert jobset is not None
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["spec"]["nodeSelector"][labels.SPOT] = "true"
    template["metadata"]["annotations"][RUN_SECONDS] = "2"
    jobset["spec"]["suspend"] = False
    api.request("PUT", path, jobset)

    assert wait_finished(stack, name, timeout=FINISH_TIMEOUT) == "Completed"
    replaced = [d for d in stack.decisions("provision.replaced") if d.get("pool") == before["name"]]
    assert replaced and "cloud.google.com/gke-spot=true" in str(replaced[0].get("message", "")), replaced
    # The pods select gke-spot=true: the real scheduler could only place them on the rebuilt Spot pool.
    pods = _pods(stack, name)
    assert pods and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    wait_released(stack, name, timeout=RELEASE_TIMEOUT)
    # The same pool name, created twice: on-demand first, then as the re-admitted pods asked.
    assert successful_creates(stack, name) == {before["name"]: 2}
    rebuilt = [
        e["message"]
        for e in events_about(stack, labels.REASON_RELEASED, name)
        if "to build it again" in e["message"]
    ]
    assert rebuilt, "no Event tells why the pool was deleted"
    assert stack.killed_pods() == []
