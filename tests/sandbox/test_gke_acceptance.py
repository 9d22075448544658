"""Acceptance: every NodePool the product can build is accepted by the GKE emulator, on every cluster kind.

Each case derives a pool exactly as the provision function does (pod -> ``slice_request`` ->
``build_node_pool`` with the cluster read through the real adapter) and sends it through
``GkeNodePoolAPI`` to the emulator, whose rules are written independently of the product's catalog.
The cases cover every accelerator with its listed topologies and its largest slice, every chip
request the catalog accepts for them, four capacity types and four cluster kinds.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.jobsets import tpu_jobset
from shared.cloud.gke import GkeNodePoolAPI
from shared.core import labels
from shared.core.errors import Refused
from shared.core.settings import Settings
from shared.tpu import catalog
from shared.tpu.jobsets import expand_pods
from shared.tpu.slices import FLEX_START_GENERATIONS, build_node_pool, slice_request

PROJECT = "acc-proj"
ZONAL = "us-central2-b"
REGION = "us-central2"
TWO_ZONES = ("us-central2-b", "us-central2-c")

# name -> (cluster location, cluster zones, release channel, NODE_LOCATIONS)
CLUSTER_KINDS: dict[str, tuple[str, tuple[str, ...], str, tuple[str, ...]]] = {
    "zonal-channel": (ZONAL, (ZONAL,), "REGULAR", ()),
    "zonal-no-channel": (ZONAL, (ZONAL,), "", ()),
    "regional-2-zones-channel": (REGION, TWO_ZONES, "STABLE", TWO_ZONES),
    "regional-2-zones-no-channel": (REGION, TWO_ZONES, "", TWO_ZONES),
}
CAPACITY: dict[str, dict[str, str]] = {
    "on-demand": {},
    "spot": {labels.SPOT: "true"},
    "reservation": {labels.RESERVATION_NAME: "tpu-res"},
    "flex-start": {labels.FLEX_START: "true"},
}


def _chips(topology: str) -> int:
    total = 1
    for dim in topology.split("x"):
        total *= int(dim)
    return total


def _representative_topologies(info: catalog.AcceleratorInfo) -> list[str]:
    """Every 2D topology; for 3D ones the small shapes, one in the middle and a largest one."""
    if info.dimensions == 2:
        return list(info.topologies)
    small = [t for t in info.topologies if _chips(t) <= 64]
    largest = [t for t in info.topologies if _chips(t) == info.max_chips]
    # Of the largest slices, the most cube-like (e.g. v5p 16x20x28, not 4x4x560).
    roundest = min(largest, key=lambda t: max(int(d) for d in t.split("x")))
    return list(dict.fromkeys([*small, info.topologies[len(info.topologies) // 2], roundest]))


def _shapes() -> list[tuple[str, str, int]]:
    shapes = []
    for info in catalog.accelerators():
        for topology in _representative_topologies(info):
            for chips in catalog.chips_per_vm_options(info.accelerator, topology):
                shapes.append((info.accelerator, topology, chips))
    return shapes


SHAPES = _shapes()
CASES = [
    pytest.param(shape, capacity, kind, id=f"{shape[0]}-{shape[1]}-{shape[2]}chips-{capacity}-{kind}")
    for shape, capacity, kind in itertools.product(SHAPES, CAPACITY, CLUSTER_KINDS)
]


def _path(kind: str) -> str:
    return f"projects/{PROJECT}/locations/{CLUSTER_KINDS[kind][0]}/clusters/{kind}"


@pytest.fixture(scope="module")
def emulator() -> Iterator[GkeEmulator]:
    """One emulator holding a cluster of every kind."""
    seeds = [
        ClusterSeed(PROJECT, location, kind, locations=zones, release_channel=channel)
        for kind, (location, zones, channel, _) in CLUSTER_KINDS.items()
    ]
    with GkeEmulator(seeds, op_delay=0) as gke:
        yield gke


@pytest.fixture(scope="module")
def api(emulator: GkeEmulator) -> GkeNodePoolAPI:
    """The production adapter pointed at the emulator."""
    return GkeNodePoolAPI(endpoint=emulator.url, timeout=5.0)


_names = itertools.count()


@pytest.mark.parametrize(("shape", "capacity", "kind"), CASES)
def test_every_buildable_pool_is_accepted(
    emulator: GkeEmulator, api: GkeNodePoolAPI, shape: tuple[str, str, int], capacity: str, kind: str
) -> None:
    accelerator, topology, chips = shape
    location, _, channel, node_locations = CLUSTER_KINDS[kind]
    settings = Settings(
        unlimited_spending=True,
        project_id=PROJECT,
        location=location,
        cluster_name=kind,
        node_locations=node_locations,
        tpu7x_workload_policy="tpu7x-{topology}",
    )
    jobset = tpu_jobset(
        f"acc-{next(_names)}",
        "team-a",
        replicas=1,
        accelerator=accelerator,
        topology=topology,
        chips_per_vm=chips,
        selectors=CAPACITY[capacity],
    )
    pod = expand_pods(jobset)[0]
    cluster = api.get_cluster(settings.cluster_path)
    assert cluster.release_channel == channel
    if capacity == "flex-start" and catalog.resolve(*shape).generation not in FLEX_START_GENERATIONS:
        with pytest.raises(Refused, match="flex-start capacity is not offered"):
            build_node_pool(settings, slice_request(pod), cluster)
        return
    spec, slice_shape = build_node_pool(settings, slice_request(pod), cluster)

    api.create_node_pool(settings.cluster_path, spec, "acceptance")

    stored: dict[str, Any] = next(p for p in emulator.pools(settings.cluster_path) if p["name"] == spec.name)
    assert stored["locations"] == [TWO_ZONES[0] if node_locations else ZONAL]
    if capacity == "flex-start":  # created empty; the autoscaler brings the whole slice
        assert int(stored.get("initialNodeCount", 0)) == 0 and stored["config"]["flexStart"] is True
        assert int(stored["autoscaling"]["totalMaxNodeCount"]) == slice_shape.num_vms
    else:
        assert int(stored["initialNodeCount"]) == slice_shape.num_vms
    assert stored.get("management", {}).get("autoUpgrade", False) is bool(channel)
    assert stored["config"]["diskType"] == catalog.boot_disk_types(slice_shape.machine_type)[0]


def test_the_acceptance_matrix_covers_every_accelerator_and_machine_type() -> None:
    # Guards the generator above: a catalog change must not silently shrink what is sent to GKE.
    assert {s[0] for s in SHAPES} == {info.accelerator for info in catalog.accelerators()}
    machine_types = {catalog.resolve(*s).machine_type for s in SHAPES}
    assert machine_types == {m.name for info in catalog.accelerators() for m in info.machine_types}
    assert ("tpu-v5p-slice", "16x20x28", 4) in SHAPES
