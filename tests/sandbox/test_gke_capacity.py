"""The GKE emulator's capacity model on its own: supply per zone and kind, reservations, quota, flex-start."""

from __future__ import annotations

import pytest

from sandbox.emulators.gke.capacity import (
    FLEX_START,
    ON_DEMAND,
    RESERVATION,
    SPOT,
    CapacityModel,
    Demand,
)
from sandbox.emulators.gke.rules import ApiError
from sandbox.testing.clock import FakeClock
from shared.cloud.errors import is_resource_quota as is_quota_error

ZONE_A, ZONE_B = "us-central2-a", "us-central2-b"


def demand(
    kind: str = ON_DEMAND,
    zones: tuple[str, ...] = (ZONE_A,),
    vms: int = 4,
    reservation: str = "",
    pool: str = "p",
) -> Demand:
    """A v5e slice of ``vms`` 4-chip VMs (4x4 for 4 VMs)."""
    return Demand(pool, kind, zones, vms, 4, "ct5lp-hightpu-4t", "v5e", "proj", reservation)


@pytest.fixture
def clock() -> FakeClock:
    """A clock the test moves."""
    return FakeClock()


@pytest.fixture
def model(clock: FakeClock) -> CapacityModel:
    """A model on the fake clock."""
    return CapacityModel(clock)


def run(model: CapacityModel, key: str, wanted: Demand) -> str | None:
    """Admit and finish one create; the stockout message or None."""
    model.admit(key, wanted)
    return model.settle(key)


def test_capacity_is_unlimited_until_set(model: CapacityModel) -> None:
    for index, kind in enumerate((ON_DEMAND, SPOT, RESERVATION)):
        assert run(model, f"k{index}", demand(kind, vms=64)) is None
    assert model.used(ZONE_A, ON_DEMAND) == 256
    assert model.free(ZONE_A, ON_DEMAND) is None


def test_empty_kind_stocks_out_while_another_kind_or_zone_has_chips(model: CapacityModel) -> None:
    model.set(ZONE_A, SPOT, 0)
    model.set(ZONE_B, SPOT, 16)
    assert run(model, "spot-a", demand(SPOT)) == (
        f"ZONE_RESOURCE_POOL_EXHAUSTED: The zone '{ZONE_A}' does not have enough resources available to "
        "fulfill the request. Try a different zone, or try again later."
    )
    assert model.holding("spot-a") == ""  # a failed create holds nothing
    assert run(model, "on-demand-a", demand(ON_DEMAND)) is None
    assert run(model, "spot-b", demand(SPOT, zones=(ZONE_B,))) is None
    assert [(e.key, e.event, e.kind) for e in model.events if e.event in ("stockout", "running")] == [
        ("spot-a", "stockout", SPOT),
        ("on-demand-a", "running", ON_DEMAND),
        ("spot-b", "running", SPOT),
    ]


def test_exhausted_window_refills(model: CapacityModel, clock: FakeClock) -> None:
    model.set(ZONE_A, SPOT, 0, until=1200, then=None)
    assert run(model, "early", demand(SPOT)) is not None
    clock.now += 1199
    assert run(model, "still-early", demand(SPOT)) is not None
    clock.now += 1
    assert run(model, "after", demand(SPOT)) is None


def test_schedule_steps(model: CapacityModel, clock: FakeClock) -> None:
    model.schedule(ZONE_A, ON_DEMAND, [(0, 16), (60, 0), (120, None)])
    assert model.supply(ZONE_A, ON_DEMAND) == 16
    clock.now += 60
    assert model.supply(ZONE_A, ON_DEMAND) == 0
    clock.now += 60
    assert model.supply(ZONE_A, ON_DEMAND) is None


def test_running_pools_use_the_supply_until_deleted(model: CapacityModel) -> None:
    model.set(ZONE_A, ON_DEMAND, 16)
    assert run(model, "first", demand()) is None
    assert model.free(ZONE_A, ON_DEMAND) == 0
    assert run(model, "second", demand()) is not None
    model.release("first")
    assert run(model, "third", demand()) is None


QUOTA_CASES = [
    # (id, quota kind (preemptible?), the create's kind, refused)
    ("on-demand-over-on-demand-quota", False, ON_DEMAND, True),
    ("spot-over-preemptible-quota", True, SPOT, True),
    ("flex-start-over-preemptible-quota", True, FLEX_START, True),
    ("spot-not-counted-on-on-demand-quota", False, SPOT, False),
    ("reservation-needs-no-quota", False, RESERVATION, False),
]


@pytest.mark.parametrize(
    ("preemptible", "kind", "refused"), [c[1:] for c in QUOTA_CASES], ids=[c[0] for c in QUOTA_CASES]
)
def test_quota_is_checked_at_admission(
    model: CapacityModel, preemptible: bool, kind: str, refused: bool
) -> None:
    model.set_quota("us-central2", "v5e", 24, preemptible=preemptible)
    model.admit("first", demand(kind))  # 16 chips
    if not refused:
        model.admit("second", demand(kind))
        return
    with pytest.raises(ApiError) as caught:
        model.admit("second", demand(kind))
    metric = "PREEMPTIBLE_TPU_LITE_PODSLICE_V5" if preemptible else "TPU_LITE_PODSLICE_V5"
    assert (caught.value.code, caught.value.status) == (403, "PERMISSION_DENIED")
    assert caught.value.message.startswith(
        f"Insufficient regional quota to satisfy request: resource \"{metric}\": request requires '16.0' "
        "and is short '8.0'. project has a quota of '24.0' with '8.0' available."
    )
    assert is_quota_error(caught.value.message)
    model.release("first")
    model.admit("second", demand(kind))


def test_reservation_is_found_by_name_and_zone_and_is_consumed(model: CapacityModel) -> None:
    model.add_reservation("res-a", ZONE_A, 4, "ct5lp-hightpu-4t")
    with pytest.raises(ApiError) as wrong_zone:
        model.admit("b", demand(RESERVATION, zones=(ZONE_B,), reservation="res-a", pool="pool-b"))
    assert (wrong_zone.value.code, wrong_zone.value.message) == (
        404,
        f'Google Compute Engine: reservation "res-a" not found for node pool "pool-b" at zone "{ZONE_B}".',
    )
    with pytest.raises(ApiError, match="not found"):
        model.admit("x", demand(RESERVATION, reservation="other"))
    model.set(ZONE_A, ON_DEMAND, 0)  # reserved chips do not come from the zone's on-demand supply
    assert run(model, "a", demand(RESERVATION, reservation="res-a")) is None
    with pytest.raises(ApiError) as full:
        model.admit("a2", demand(RESERVATION, reservation="res-a", vms=1, pool="pool-a2"))
    assert (full.value.code, full.value.status) == (429, "RESOURCE_EXHAUSTED")
    assert full.value.message == (
        'Reservation does not have enough resources for the request: specific reservation "res-a" is '
        f'insufficient for node pool "pool-a2" at zone "{ZONE_A}": required 1 and short of 1 VM count of '
        "machine type ct5lp-hightpu-4t."
    )
    model.release("a")
    assert model.report()["reservations"]["res-a"]["used"] == 0
    model.admit("a3", demand(RESERVATION, reservation="res-a"))


def test_shared_reservation_is_matched_on_its_project(model: CapacityModel) -> None:
    model.add_reservation("shared", ZONE_A, 4, "ct5lp-hightpu-4t", project="owner", shared_with=("proj",))
    model.admit("ok", demand(RESERVATION, reservation="projects/owner/reservations/shared"))
    with pytest.raises(ApiError, match="not found"):
        model.admit("bad", demand(RESERVATION, reservation="projects/someone/reservations/shared"))


def test_a_reservation_not_shared_with_the_project_is_not_found_from_it(model: CapacityModel) -> None:
    model.add_reservation("theirs", ZONE_A, 4, "ct5lp-hightpu-4t", project="owner", shared_with=("other",))
    with pytest.raises(ApiError, match='reservation "projects/owner/reservations/theirs" not found'):
        model.admit("x", demand(RESERVATION, reservation="projects/owner/reservations/theirs"))


def test_flex_start_waits_then_gets_the_whole_slice_at_once(model: CapacityModel) -> None:
    model.set(ZONE_A, FLEX_START, 8)  # half of a 16-chip slice
    assert run(model, "flex", demand(FLEX_START)) is None
    assert (model.holding("flex"), model.poll()) == ("waiting", [])
    assert model.used(ZONE_A, FLEX_START) == 0  # never a partial slice
    model.set(ZONE_A, FLEX_START, 16)
    assert model.poll() == ["flex"]
    assert (model.holding("flex"), model.used(ZONE_A, FLEX_START)) == ("held", 16)
    assert model.poll() == []


def test_flex_start_lands_in_the_first_zone_with_room(model: CapacityModel) -> None:
    model.set(ZONE_A, FLEX_START, 0)
    model.admit("flex", demand(FLEX_START, zones=(ZONE_A, ZONE_B)))
    model.settle("flex")
    assert model.poll() == ["flex"]  # zone B is unlimited
    landed = model.demand("flex")
    assert landed is not None and landed.zones == (ZONE_B,)
    assert (model.used(ZONE_A, FLEX_START), model.used(ZONE_B, FLEX_START)) == (0, 16)


def test_unknown_kind_is_refused(model: CapacityModel) -> None:
    with pytest.raises(ValueError, match="unknown capacity kind"):
        model.set(ZONE_A, "preemptible", 0)
