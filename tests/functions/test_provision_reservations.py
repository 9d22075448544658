"""Wire level: provision reads a reservation from Compute Engine before a create on it (real
compute_v1 and container_v1 clients, the Compute and GKE emulators sharing one book of reservations).

What a user sees: a full reservation costs no refused create, the slice goes to the next option in
the same delivery; a
dense reservation's pool names the block and sub-block with room; a shared reservation the functions
may not read is redelivered with the permission named, and served once the role holds it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.emulators.compute.emulator import ComputeEmulator
from sandbox.emulators.iam import Iam
from sandbox.emulators.reservations import Block, ReservationBook, SubBlock
from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.core import labels
from tests.conftest import LOCATION, PROJECT
from tests.functions.deliveries import pending_event, submit

pytestmark = pytest.mark.integration

MACHINE = "ct6e-standard-4t"  # the default JobSet's slice: v6e 4x4, 4 VMs
OWNER = "owner-proj"
READS = ("compute.reservations.get", "compute.reservationBlocks.list", "compute.reservationSubBlocks.list")


@pytest.fixture
def book(gke_emulator: Any) -> ReservationBook:
    reservations: ReservationBook = gke_emulator.capacity.reservations
    return reservations


@pytest.fixture
def compute(book: ReservationBook) -> Iterator[ComputeEmulator]:
    with ComputeEmulator(reservations=book) as emulator:
        yield emulator


@pytest.fixture
def fn(world: Any, compute: ComputeEmulator) -> FunctionClient:
    world.configure(compute_api_endpoint=compute.url)
    return FunctionClient("provision")


def affinity(pool: dict[str, Any]) -> list[str]:
    return list(((pool.get("config") or {}).get("reservationAffinity") or {}).get("values") or [])


def refused_by_gke(gke: Any) -> list[str]:
    return [e.key for e in gke.capacity.events if e.event == "refused-reservation"]


def test_a_full_reservation_costs_no_create_and_the_one_with_room_is_bought(
    world: Any, fn: FunctionClient, book: ReservationBook
) -> None:
    book.add("res-full", LOCATION, 4, MACHINE)
    book.add("res-room", LOCATION, 8, MACHINE)
    book.consume("someone", "res-full", PROJECT, (LOCATION,), 4, MACHINE, "someone-else")
    book.start("someone")  # running: Compute reports the reservation in use
    world.configure(capacity_policy="reservation:res-full, reservation:res-room")
    _, pods = submit(world, tpu_jobset("train", "team-a", replicas=1))
    # One delivery: the look refuses res-full (nothing sent to GKE) and the slice goes on to
    # res-room at once; the refused attempt is on the JobSet for `kubectl describe`.
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    [pool] = world.pools()
    assert affinity(pool) == ["res-room"]
    assert (world.gke.count("create"), refused_by_gke(world.gke)) == (1, [])
    events = world.kube.list("v1", "events", "team-a")
    said = [e.get("message", "") for e in events if e.get("reason") == labels.REASON_FAILED]
    assert any("reservation res-full: 0 free VMs of 4, the slice needs 4" in m for m in said), said


def test_a_dense_reservation_pool_names_the_healthy_sub_block_with_room(
    world: Any, fn: FunctionClient, book: ReservationBook
) -> None:
    subs = [SubBlock("s1", 16, health="DEGRADED"), SubBlock("s2", 16), SubBlock("s3", 16)]
    book.add("dense", LOCATION, 0, MACHINE, blocks=[Block("b1", 48, sub_blocks=subs)])
    book.consume(
        "big", "dense/reservationBlocks/b1/reservationSubBlocks/s3", PROJECT, (LOCATION,), 8, MACHINE, "x"
    )
    book.start("big")  # s3 is fuller than s2: the best fit for 4 VMs
    world.configure(capacity_policy="reservation:dense")
    _, pods = submit(world, tpu_jobset("train", "team-a", replicas=1))
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    [pool] = world.pools()
    assert affinity(pool) == ["dense/reservationBlocks/b1/reservationSubBlocks/s3"]
    assert book.report()["dense"]["used"] == 12
    assert refused_by_gke(world.gke) == []


def test_a_shared_reservation_unreadable_in_its_project_waits_for_the_role_then_is_bought(
    world: Any,
    fn: FunctionClient,
    book: ReservationBook,
    compute: ComputeEmulator,
    caplog: pytest.LogCaptureFixture,
) -> None:
    book.add("theirs", LOCATION, 4, MACHINE, project=OWNER, shared_with=(PROJECT,))
    iam = Iam(PROJECT)
    compute.iam = iam
    iam.grant(iam.principal_of("provision"), READS, PROJECT)  # at home only, not in the owner's
    world.configure(
        capacity_policy=f"reservation:projects/{OWNER}/reservations/theirs",
        emulator_access_token=iam.token_for("provision"),
    )
    _, pods = submit(world, tpu_jobset("train", "team-a", replicas=1))
    denied = fn.post_entry(pending_event(pods[0]))
    # A missing grant is a deployment error: kept for redelivery, nothing created meanwhile.
    assert denied.status_code == 503
    assert f"projects/{OWNER}/zones/{LOCATION}/reservations/theirs" in denied.get_data(as_text=True)
    [denial] = [
        r for r in caplog.records if (getattr(r, "fields", None) or {}).get("event") == "permission.denied"
    ]
    # The fix named is the owner project's binding, not the home role (which holds the reads).
    assert f"holds no role with compute.reservations.get in project {OWNER}" in denial.getMessage()
    assert "reservation_projects" in denial.getMessage()
    assert world.gke.count("create") == 0
    iam.grant(iam.principal_of("provision"), READS, OWNER)
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    [pool] = world.pools()
    assert affinity(pool) == [f"projects/{OWNER}/reservations/theirs"]
