"""SimGke with a capacity model in virtual time: stockouts as ERROR pools, quota refusals as the
adapter raises them, flex-start pools that wait, and the record of where each create landed."""

from __future__ import annotations

import random

import pytest

from sandbox.emulators.gke.capacity import CapacityModel
from sandbox.sim.engine import Simulation
from sandbox.sim.gke import SimGke
from shared.cloud.errors import is_resource_quota as is_quota_error
from shared.core.errors import CapacityUnavailableError
from shared.tpu.nodepools import NodePoolSpec, Placement, Reservation

CLUSTER = "projects/sim/locations/us-central2/clusters/sim"
ZONE_A, ZONE_B = "us-central2-a", "us-central2-b"


def spec(
    name: str, zone: str = ZONE_A, spot: bool = False, flex_start: bool = False, reservation: str = ""
) -> NodePoolSpec:
    """A v5e 4x4 slice (4 VMs, 16 chips)."""
    return NodePoolSpec(
        name=name,
        machine_type="ct5lp-hightpu-4t",
        node_count=4,
        node_locations=(zone,),
        labels={},
        resource_labels={},
        placement=Placement(tpu_topology="4x4"),
        spot=spot,
        flex_start=flex_start,
        reservation=Reservation(reservation) if reservation else None,
    )


def one_minute(rng: random.Random) -> float:
    """Every operation takes a minute."""
    return 60.0


@pytest.fixture
def sim() -> Simulation:
    """The virtual clock."""
    return Simulation()


@pytest.fixture
def capacity(sim: Simulation) -> CapacityModel:
    """Capacity on the sim clock."""
    return CapacityModel(sim.clock)


@pytest.fixture
def gke(sim: Simulation, capacity: CapacityModel) -> SimGke:
    """SimGke with room for many operations."""
    return SimGke(sim, op_limit=10, durations=one_minute, latency=0.0, capacity=capacity, flex_poll=30)


def test_spot_stockout_then_on_demand_lands(sim: Simulation, capacity: CapacityModel, gke: SimGke) -> None:
    capacity.set(ZONE_A, "spot", 0)
    gke.create_node_pool(CLUSTER, spec("slice-spot", spot=True), why="try spot")
    sim.run(until=61)
    failed = gke.get_node_pool(CLUSTER, "slice-spot")
    assert failed.status == "ERROR"
    assert f"The zone '{ZONE_A}' does not have enough resources" in failed.status_message
    gke.create_node_pool(CLUSTER, spec("slice-od"), why="fall back to on-demand")
    sim.run(until=200)
    assert gke.get_node_pool(CLUSTER, "slice-od").status == "RUNNING"
    assert [(p.pool, p.kind, p.zones, p.outcome) for p in gke.stats.placements] == [
        ("slice-spot", "spot", (ZONE_A,), "stockout"),
        ("slice-od", "on-demand", (ZONE_A,), "running"),
    ]


def test_quota_refusal_is_raised_like_the_adapter_raises_a_403(capacity: CapacityModel, gke: SimGke) -> None:
    capacity.set_quota("us-central2", "v5e", 16)
    gke.create_node_pool(CLUSTER, spec("one"), why="test")
    with pytest.raises(CapacityUnavailableError) as caught:
        gke.create_node_pool(CLUSTER, spec("two"), why="test")
    assert is_quota_error(str(caught.value))
    assert (gke.stats.refused, sorted(gke.pools)) == (1, ["one"])


def test_unknown_reservation_is_not_found(capacity: CapacityModel, gke: SimGke) -> None:
    capacity.add_reservation("res-a", ZONE_A, 4, "ct5lp-hightpu-4t")
    with pytest.raises(CapacityUnavailableError, match="not found for node pool"):
        gke.create_node_pool(CLUSTER, spec("r", ZONE_B, reservation="res-a"), why="test")


def test_flex_start_waits_for_capacity(sim: Simulation, capacity: CapacityModel, gke: SimGke) -> None:
    capacity.set(ZONE_A, "flex-start", 0, until=600, then=16)
    gke.create_node_pool(CLUSTER, spec("flex", flex_start=True), why="test")
    sim.run(until=120)
    waiting = gke.get_node_pool(CLUSTER, "flex")
    assert (waiting.status, waiting.current_nodes) == ("RUNNING", 0)
    sim.run(until=700)
    assert gke.get_node_pool(CLUSTER, "flex").current_nodes == 4
    [placement] = gke.stats.placements
    assert (placement.kind, placement.outcome) == ("flex-start", "obtained")
    assert 600 <= placement.at <= 630  # found at the first poll after the refill
