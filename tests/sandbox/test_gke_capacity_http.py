"""Scarce TPU capacity through the product's GKE adapter over HTTP: stockouts per zone and kind,
refills, quota 403s, reservations and flex-start pools that get their nodes later."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.kube.nodes import FLEX_START, node_manifests, pool_from_gke
from sandbox.testing.clock import FakeClock
from shared.cloud.errors import is_resource_quota as is_quota_error
from shared.cloud.gke import GkeNodePoolAPI
from shared.core.errors import CapacityUnavailableError
from shared.tpu.nodepools import NodePoolSpec, Placement, Reservation

CLUSTER = "projects/test-proj/locations/us-central2/clusters/regional"
ZONE_A, ZONE_B = "us-central2-a", "us-central2-b"


def spec(
    name: str,
    zone: str = ZONE_A,
    spot: bool = False,
    flex_start: bool = False,
    reservation: str = "",
    nodes: int = 4,
) -> NodePoolSpec:
    """A v5e slice of ``nodes`` VMs (4 VMs: 4x4, 16 chips) as the product builds it."""
    return NodePoolSpec(
        name=name,
        machine_type="ct5lp-hightpu-4t",
        node_count=nodes,
        node_locations=(zone,),
        labels={},
        resource_labels={},
        placement=Placement(tpu_topology="4x4") if nodes == 4 else None,
        spot=spot,
        flex_start=flex_start,
        reservation=Reservation(reservation) if reservation else None,
        auto_upgrade=True,
        auto_repair=not flex_start,
    )


@pytest.fixture
def clock() -> FakeClock:
    """The emulator's clock (operations and capacity windows)."""
    return FakeClock()


@pytest.fixture
def gke(clock: FakeClock) -> Iterator[GkeEmulator]:
    """A regional cluster in two zones; operations take 10 s of the fake clock."""
    seed = ClusterSeed.from_path(CLUSTER, locations=(ZONE_A, ZONE_B))
    with GkeEmulator([seed], op_delay=10, clock=clock) as emulator:
        yield emulator


@pytest.fixture
def api(gke: GkeEmulator) -> GkeNodePoolAPI:
    """The product's adapter."""
    return GkeNodePoolAPI(endpoint=gke.url, timeout=5.0)


def finish(gke: GkeEmulator, clock: FakeClock) -> None:
    """Let every running operation reach DONE."""
    clock.now += 10
    gke.state.advance()


def status(api: GkeNodePoolAPI, name: str) -> tuple[str, str]:
    """The pool's status and status message as the product reads them."""
    info = api.get_node_pool(CLUSTER, name)
    return info.status, info.status_message


def test_spot_stockout_in_one_zone_while_on_demand_and_the_other_zone_have_chips(
    gke: GkeEmulator, api: GkeNodePoolAPI, clock: FakeClock
) -> None:
    gke.set_capacity(ZONE_A, "spot", 0)
    gke.set_capacity(ZONE_B, "spot", 16)
    for name, zone, spot in (("spot-a", ZONE_A, True), ("od-a", ZONE_A, False), ("spot-b", ZONE_B, True)):
        api.create_node_pool(CLUSTER, spec(name, zone, spot=spot), why="test")
    finish(gke, clock)
    assert status(api, "spot-a") == (
        "ERROR",
        f"ZONE_RESOURCE_POOL_EXHAUSTED: The zone '{ZONE_A}' does not have enough resources available to "
        "fulfill the request. Try a different zone, or try again later.",
    )
    assert status(api, "od-a") == ("RUNNING", "")
    assert status(api, "spot-b") == ("RUNNING", "")
    report = gke.capacity_report()
    assert report["supply"][f"{ZONE_B}/spot"] == {"supply": 16, "used": 16}
    assert report["supply"][f"{ZONE_A}/on-demand"] == {"supply": None, "used": 16}


def test_stockout_window_refills(gke: GkeEmulator, api: GkeNodePoolAPI, clock: FakeClock) -> None:
    gke.set_capacity(ZONE_A, "spot", 0, until=1200)
    api.create_node_pool(CLUSTER, spec("early", spot=True), why="test")
    finish(gke, clock)
    assert status(api, "early")[0] == "ERROR"
    api.delete_node_pool(CLUSTER, "early", why="recycle")
    clock.now += 1200
    api.create_node_pool(CLUSTER, spec("early", spot=True), why="retry after the window")
    finish(gke, clock)
    assert status(api, "early") == ("RUNNING", "")


def test_capacity_is_taken_at_create_done_and_given_back_at_delete(
    gke: GkeEmulator, api: GkeNodePoolAPI, clock: FakeClock
) -> None:
    gke.set_capacity(ZONE_A, "on-demand", 16)
    api.create_node_pool(CLUSTER, spec("first"), why="test")
    api.create_node_pool(CLUSTER, spec("second"), why="test")
    finish(gke, clock)  # both finish together: the first one takes the chips
    assert [status(api, n)[0] for n in ("first", "second")] == ["RUNNING", "ERROR"]
    api.delete_node_pool(CLUSTER, "first", why="done")
    finish(gke, clock)
    api.create_node_pool(CLUSTER, spec("third"), why="test")
    finish(gke, clock)
    assert status(api, "third")[0] == "RUNNING"


def test_capacity_window_runs_on_wall_time() -> None:
    seed = ClusterSeed.from_path(CLUSTER, locations=(ZONE_A, ZONE_B))
    with GkeEmulator([seed], op_delay=0) as gke:
        api = GkeNodePoolAPI(endpoint=gke.url, timeout=5.0)
        # Wide enough for the first create to land inside it on a loaded machine.
        gke.set_capacity(ZONE_A, "on-demand", 0, until=1.5)
        api.create_node_pool(CLUSTER, spec("early"), why="test")
        assert status(api, "early")[0] == "ERROR"
        time.sleep(1.6)
        api.create_node_pool(CLUSTER, spec("late"), why="test")
        assert status(api, "late")[0] == "RUNNING"


def test_quota_refusal_is_a_synchronous_403_with_gke_text(gke: GkeEmulator, api: GkeNodePoolAPI) -> None:
    gke.set_quota("us-central2", "v5e", 16, preemptible=True)
    api.create_node_pool(CLUSTER, spec("one", spot=True), why="test")
    # GKE's 403 for a quota is this attempt's capacity (shared.cloud.errors decides it once).
    with pytest.raises(CapacityUnavailableError) as caught:
        api.create_node_pool(CLUSTER, spec("two", spot=True), why="test")
    assert "Insufficient regional quota to satisfy request" in str(caught.value)
    assert 'resource "PREEMPTIBLE_TPU_LITE_PODSLICE_V5"' in str(caught.value)
    assert is_quota_error(str(caught.value))
    assert [p.name for p in api.list_node_pools(CLUSTER)] == ["one"]
    api.create_node_pool(CLUSTER, spec("two"), why="on-demand quota is separate")


def test_reservation_is_consumed_and_refusals_are_synchronous(
    gke: GkeEmulator, api: GkeNodePoolAPI, clock: FakeClock
) -> None:
    gke.add_reservation("res-a", ZONE_A, 4, "ct5lp-hightpu-4t")
    gke.set_capacity(ZONE_A, "on-demand", 0)
    api.create_node_pool(CLUSTER, spec("reserved", reservation="res-a"), why="test")
    finish(gke, clock)
    assert status(api, "reserved") == ("RUNNING", "")
    assert gke.capacity_report()["reservations"]["res-a"]["used"] == 4
    # Compute's answers about a specific reservation (a 429 full, a 404 missing in the zone) are the
    # attempt's capacity too.
    with pytest.raises(CapacityUnavailableError, match="Reservation does not have enough resources"):
        api.create_node_pool(CLUSTER, spec("more", reservation="res-a", nodes=1), why="test")
    with pytest.raises(
        CapacityUnavailableError, match='reservation "res-a" not found for node pool "zone-b"'
    ):
        api.create_node_pool(CLUSTER, spec("zone-b", ZONE_B, reservation="res-a"), why="test")
    with pytest.raises(CapacityUnavailableError, match='reservation "nope" not found'):
        api.create_node_pool(CLUSTER, spec("unknown", reservation="nope"), why="test")
    api.delete_node_pool(CLUSTER, "reserved", why="done")
    finish(gke, clock)
    assert gke.capacity_report()["reservations"]["res-a"]["used"] == 0


def test_flex_start_pool_runs_empty_then_gets_its_whole_slice(
    gke: GkeEmulator, api: GkeNodePoolAPI, clock: FakeClock
) -> None:
    ready: list[dict[str, Any]] = []
    gke.on_pool_ready(lambda cluster, pool: ready.append(pool))
    gke.set_capacity(ZONE_A, "flex-start", 8)  # half the slice: nothing happens
    api.create_node_pool(CLUSTER, spec("flex", flex_start=True), why="test")
    finish(gke, clock)
    info = api.get_node_pool(CLUSTER, "flex")
    assert (info.status, info.flex_start, info.node_count) == ("RUNNING", True, 4)
    assert gke.pool_nodes(CLUSTER, "flex") == {}
    assert [node_manifests("regional", pool_from_gke(pool)) for pool in ready] == [[]]

    gke.set_capacity(ZONE_A, "flex-start", 16)
    gke.state.advance()  # the ticker's step
    assert gke.pool_nodes(CLUSTER, "flex") == {ZONE_A: 4}
    nodes = node_manifests("regional", pool_from_gke(ready[-1]))
    assert len(ready) == 2 and len(nodes) == 4
    assert {n["metadata"]["labels"][FLEX_START] for n in nodes} == {"true"}
    assert {n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes} == {ZONE_A}
    assert gke.capacity_report()["supply"][f"{ZONE_A}/flex-start"] == {"supply": 16, "used": 16}


def test_ordinary_pool_nodes_are_reported_per_zone(
    gke: GkeEmulator, api: GkeNodePoolAPI, clock: FakeClock
) -> None:
    api.create_node_pool(CLUSTER, spec("plain"), why="test")
    assert gke.pool_nodes(CLUSTER, "plain") == {}  # not created yet
    finish(gke, clock)
    assert gke.pool_nodes(CLUSTER, "plain") == {ZONE_A: 4}
