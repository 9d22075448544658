"""The reservation adapter against the Compute emulator: the real compute_v1 clients over HTTP read
a dense reservation's blocks and sub-blocks, and Compute's refusals come back as the product's errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.emulators.compute.emulator import ComputeEmulator
from sandbox.emulators.iam import Iam
from sandbox.emulators.reservations import Block, ReservationBook, SubBlock
from shared.cloud.reservations import ComputeReservationAPI
from shared.core.errors import NotFoundError, PermissionDeniedError
from shared.tpu.reservations import BlockView, ReservationView, SubBlockView

ZONE = "us-east5-b"
MACHINE = "tpu7x-standard-4t"


@pytest.fixture
def book() -> ReservationBook:
    book = ReservationBook()
    subs = [SubBlock("s1", 16), SubBlock("s2", 16, health="DEGRADED")]
    book.add(
        "dense",
        ZONE,
        0,
        MACHINE,
        project="proj-a",
        blocks=[Block("b1", 32, sub_blocks=subs), Block("b2", 16)],
    )
    book.add("plain", ZONE, 8, MACHINE, project="proj-a")
    return book


@pytest.fixture
def emulator(book: ReservationBook) -> Iterator[ComputeEmulator]:
    with ComputeEmulator(reservations=book) as compute:
        yield compute


def test_a_dense_reservation_reads_with_its_blocks_sub_blocks_and_use(
    emulator: ComputeEmulator, book: ReservationBook
) -> None:
    api = ComputeReservationAPI(endpoint=emulator.url, timeout=5.0)
    book.consume(
        "k1", "dense/reservationBlocks/b1/reservationSubBlocks/s1", "proj-a", (ZONE,), 2, MACHINE, "p1"
    )
    book.start("k1")  # running: Compute counts it
    book.consume("k2", "dense/reservationBlocks/b2", "proj-a", (ZONE,), 4, MACHINE, "p2")  # still creating
    assert api.get_reservation("proj-a", ZONE, "dense") == ReservationView(
        "dense",
        "proj-a",
        ZONE,
        MACHINE,
        48,
        2,
        "READY",
        (
            BlockView(
                "b1",
                32,
                2,
                "READY",
                "HEALTHY",
                (
                    SubBlockView("s1", 16, 2, "READY", "HEALTHY"),
                    SubBlockView("s2", 16, 0, "READY", "DEGRADED"),
                ),
            ),
            BlockView("b2", 16, 0, "READY", "HEALTHY"),
        ),
    )
    # A plain reservation costs one read: no blocks are listed for it.
    before = emulator.count("list_blocks")
    assert api.get_reservation("proj-a", ZONE, "plain").blocks == ()
    assert emulator.count("list_blocks") == before


def test_a_missing_reservation_is_not_found(emulator: ComputeEmulator) -> None:
    api = ComputeReservationAPI(endpoint=emulator.url, timeout=5.0)
    with pytest.raises(NotFoundError, match=f"projects/proj-a/zones/{ZONE}/reservations/other"):
        api.get_reservation("proj-a", ZONE, "other")


def test_reading_needs_the_permissions_in_the_owner_project(emulator: ComputeEmulator) -> None:
    iam = Iam("proj-b")
    principal = iam.principal_of("provision")
    iam.grant(principal, ["compute.reservations.get", "compute.reservationBlocks.list"], "proj-a")
    emulator.iam = iam
    api = ComputeReservationAPI(endpoint=emulator.url, timeout=5.0, access_token=iam.token_for("provision"))
    with pytest.raises(PermissionDeniedError) as denied:
        api.get_reservation("proj-a", ZONE, "dense")  # its blocks have sub-blocks to list
    assert denied.value.permission == "compute.reservationSubBlocks.list"
    iam.grant(principal, ["compute.reservationSubBlocks.list"], "proj-a")
    assert len(api.get_reservation("proj-a", ZONE, "dense").blocks) == 2
