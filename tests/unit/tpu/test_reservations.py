"""Where a slice fits in a reservation: blocks, sub-blocks, health, claims (``shared.tpu.reservations``)."""

from __future__ import annotations

import pytest

from shared.tpu.nodepools import Reservation, parse_reservation
from shared.tpu.reservations import BlockView, Fit, NoFit, ReservationView, SubBlockView, place

MACHINE = "ct6e-standard-4t"


def dense(*blocks: BlockView, status: str = "READY") -> ReservationView:
    total = sum(b.vms for b in blocks)
    return ReservationView("res", "proj", "us-east5-b", MACHINE, total, 0, status, blocks)


def test_a_plain_reservation_is_taken_as_a_whole_after_what_is_in_use_and_claimed() -> None:
    view = ReservationView("res", "proj", "us-east5-b", MACHINE, vms=8, vms_in_use=2)
    assert place(view, 4, MACHINE) == Fit("", "", 6, "reservation res: 6 free VMs, the slice takes 4")
    assert isinstance(place(view, 4, MACHINE, {"": 3}), NoFit)
    assert place(view, 4, MACHINE, {"": 3}).why == (  # type: ignore[union-attr]
        "reservation res: 3 free VMs of 8, the slice needs 4"
    )


def test_the_fullest_block_with_room_is_chosen_and_a_degraded_one_is_skipped() -> None:
    view = dense(
        BlockView("b1", 16, 4),  # 12 free
        BlockView("b2", 16, 10),  # 6 free: the best fit for 4
        BlockView("b3", 16, 13, health="DEGRADED"),  # 3 free, and degraded anyway
        BlockView("b4", 16, 15),  # 1 free: too small
    )
    fit = place(view, 4, MACHINE)
    assert isinstance(fit, Fit)
    assert (fit.block, fit.sub_block, fit.free) == ("b2", "", 6)
    assert fit.why == "reservation res: 6 free VMs in block b2, the slice takes 4"
    # Claims of pools being created in b2 count before Compute shows them.
    assert isinstance(fit := place(view, 4, MACHINE, {"b2": 4}), Fit) and fit.block == "b1"


def test_a_slice_that_fits_a_sub_block_goes_to_a_healthy_one_and_a_larger_one_to_its_block() -> None:
    subs = (
        SubBlockView("s1", 16, 16),  # full
        SubBlockView("s2", 16, 0, health="DEGRADED"),
        SubBlockView("s3", 16, 8),
    )
    view = dense(BlockView("b1", 48, 24, sub_blocks=subs))
    fit = place(view, 4, MACHINE)
    assert isinstance(fit, Fit) and (fit.block, fit.sub_block, fit.free) == ("b1", "s3", 8)
    assert fit.why == "reservation res: 8 free VMs in block b1, sub-block s3, the slice takes 4"
    # 9 VMs fit no sub-block but 9 < 16 hosts of one: refused, naming each place.
    missing = place(view, 9, MACHINE)
    assert isinstance(missing, NoFit)
    assert missing.why == (
        "reservation res: no block has 9 free VMs for the slice (block b1 sub-block s1 0 free; "
        "block b1 sub-block s2 degraded; block b1 sub-block s3 8 free)"
    )
    # A slice larger than any sub-block is placed in the block across them.
    big = place(dense(BlockView("b1", 48, 0, sub_blocks=(*subs[:1], SubBlockView("s4", 16, 0)))), 20, MACHINE)
    assert isinstance(big, Fit) and (big.block, big.sub_block) == ("b1", "")


@pytest.mark.parametrize(
    ("view", "why"),
    [
        (dense(BlockView("b1", 8, 0), status="CREATING"), "reservation res is CREATING, not READY"),
        (
            ReservationView("res", "proj", "us-east5-b", "ct5lp-hightpu-4t", 8, 0),
            "reservation res reserves ct5lp-hightpu-4t, not ct6e-standard-4t",
        ),
        (
            dense(BlockView("b1", 8, 0, status="CREATING"), BlockView("b2", 8, 6)),
            "reservation res: no block has 4 free VMs for the slice (block b1 CREATING; block b2 2 free)",
        ),
    ],
)
def test_what_cannot_take_the_slice_says_why(view: ReservationView, why: str) -> None:
    assert place(view, 4, MACHINE) == NoFit(why)


@pytest.mark.parametrize(
    "reservation",
    [
        Reservation("res"),
        Reservation("res", "owner"),
        Reservation("res", "", "b1"),
        Reservation("res", "owner", "b1", "s2"),
    ],
)
def test_an_affinity_value_reads_back_as_the_reservation_it_names(reservation: Reservation) -> None:
    assert parse_reservation(reservation.value) == reservation


def test_the_affinity_value_names_the_block_and_sub_block_after_the_reservation() -> None:
    value = Reservation("res", "owner", "b1", "s2").value
    assert value == "projects/owner/reservations/res/reservationBlocks/b1/reservationSubBlocks/s2"
    assert Reservation("res", "owner", "b1").base == "projects/owner/reservations/res"
