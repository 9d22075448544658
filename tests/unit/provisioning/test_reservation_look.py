"""Look before buying, through the real services: a create on a reservation goes where Compute says
there is room, and a reservation without room costs no create at all."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.clock import FakeClock
from sandbox.testing.compute import FakeReservations
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.errors import CapacityUnavailableError, TransientError
from shared.provisioning.admission.check import AdmissionChecker
from shared.provisioning.create.reservations import CLAIM_TTL_SECONDS, ReservationLook
from shared.provisioning.outcomes import CREATED, FAILED, REFUSED
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_PROVISIONING, NodePoolInfo, NodePoolSpec, Reservation
from shared.tpu.pods import Pod
from shared.tpu.reservations import BlockView, ReservationView, SubBlockView
from tests.unit.provisioning.stockouts import SETTINGS, T0, failed_events, pending, record
from tests.unit.provisioning.test_admission_check import workload

ZONE = "us-east5-b"
MACHINE = "ct6e-standard-4t"  # the default JobSet's: v6e 4x4, 4 VMs per slice


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def compute() -> FakeReservations:
    return FakeReservations()


def reservation(
    name: str, *blocks: BlockView, vms: int = 0, in_use: int = 0, project: str = "p"
) -> ReservationView:
    total = sum(b.vms for b in blocks) if blocks else vms
    return ReservationView(name, project, ZONE, MACHINE, total, in_use, "READY", blocks)


def provisioner(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock, policy: str
) -> Provisioner:
    settings = SETTINGS.with_overrides(capacity_policy=policy)
    look = ReservationLook(settings, compute, clock=clock)
    return Provisioner(Services(settings, gke, kube, wall_clock=clock, reservations=look))


def submit(kube: FakeKube, name: str = "a", replicas: int = 1, **selectors: str) -> list[dict[str, Any]]:
    jobset = tpu_jobset(name, "team-a", replicas=replicas, selectors=selectors or None)
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    return pods


def created_values(gke: FakeGke) -> list[str]:
    return [s.reservation.value if s.reservation else "-" for s in gke.specs.values()]


def test_a_full_reservation_costs_no_create_and_the_next_one_with_room_is_bought(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock
) -> None:
    compute.add(reservation("res-full", vms=8, in_use=8))
    compute.add(reservation("res-room", vms=8, in_use=2))
    provision = provisioner(
        gke, kube, compute, clock, "reservation:res-full, reservation:res-room, on-demand"
    )
    pods = submit(kube)
    # One delivery: the full reservation's attempt is refused by the look (nothing doomed is sent
    # to GKE) and the slice goes on to the next option at once, not at a redelivery.
    assert pending(provision, pods[0]) == CREATED
    assert (gke.count("create"), created_values(gke)) == (1, ["res-room"])
    [entry] = record(kube).values()
    assert (entry["option"], entry["next"]) == (
        f"reservation:res-full@{ZONE}",
        f"reservation:res-room@{ZONE}",
    )
    [failed] = failed_events(kube)
    assert "reservation res-full: 0 free VMs of 8, the slice needs 4" in failed["message"]
    requested = [e["message"] for e in kube.events if e["reason"] == labels.REASON_REQUESTED]
    assert any("reservation res-room: 6 free VMs, the slice takes 4" in m for m in requested), requested


def test_the_slices_of_one_jobset_never_count_the_same_room_twice(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock
) -> None:
    # Two blocks with room for one 4-VM slice each, a third with room for none: Compute shows no
    # use yet while GKE creates, so the second slice must count the first one's claim.
    compute.add(reservation("dense", BlockView("b1", 8, 4), BlockView("b2", 8, 3), BlockView("b3", 8, 6)))
    provision = provisioner(gke, kube, compute, clock, "reservation:dense")
    pods = submit(kube, replicas=2)
    assert pending(provision, pods[0]) == CREATED
    assert sorted(created_values(gke)) == ["dense/reservationBlocks/b1", "dense/reservationBlocks/b2"]


def test_a_sub_block_is_targeted_and_an_unhealthy_one_skipped(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock
) -> None:
    subs = (SubBlockView("s1", 16, 0, health="DEGRADED"), SubBlockView("s2", 16, 10))
    compute.add(reservation("dense", BlockView("b1", 32, 10, sub_blocks=subs)))
    provision = provisioner(gke, kube, compute, clock, "reservation:dense")
    pods = submit(kube)
    assert pending(provision, pods[0]) == CREATED
    assert created_values(gke) == ["dense/reservationBlocks/b1/reservationSubBlocks/s2"]


def test_a_shared_reservation_the_functions_cannot_read_is_refused_naming_the_permission(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock
) -> None:
    compute.add(reservation("theirs", vms=8, project="owner-proj"))
    compute.deny("owner-proj")
    provision = provisioner(gke, kube, compute, clock, "reservation:projects/owner-proj/reservations/theirs")
    pods = submit(kube)
    with pytest.raises(TransientError, match=r"compute\.reservations\.get"):
        pending(provision, pods[0])
    assert compute.calls == [f"projects/owner-proj/zones/{ZONE}/reservations/theirs"]
    assert gke.count("create") == 0


def test_a_missing_reservation_is_an_attempt_refused_without_a_create(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock
) -> None:
    provision = provisioner(gke, kube, compute, clock, "reservation:gone, on-demand")
    pods = submit(kube)
    assert pending(provision, pods[0]) == CREATED
    assert created_values(gke) == ["-"]  # the one create: on demand, no reservation named
    assert "reservation gone not found in zone us-east5-b" in failed_events(kube)[0]["message"]


def test_every_reservation_full_backs_off_after_one_delivery_without_a_create(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock
) -> None:
    compute.add(reservation("res-a", vms=4, in_use=4))
    compute.add(reservation("res-b", vms=8, in_use=6))
    provision = provisioner(gke, kube, compute, clock, "reservation:res-a, reservation:res-b")
    pods = submit(kube)
    # Both looks in the one delivery; no option left, so the slice backs off (no redelivery asked).
    assert pending(provision, pods[0]) == FAILED
    assert gke.count("create") == 0
    [entry] = record(kube).values()
    assert (entry["attempts"], entry["option"], entry.get("next")) == (2, f"reservation:res-b@{ZONE}", None)
    said = [e["message"] for e in failed_events(kube)]
    assert any("reservation res-a: 0 free VMs of 4" in m for m in said), said
    assert any("reservation res-b: 2 free VMs of 8, the slice needs 4" in m for m in said), said


def test_a_next_reservation_its_tenant_may_not_use_is_left_to_the_redelivery_and_refused_there(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock
) -> None:
    compute.add(reservation("res-full", vms=4, in_use=4))
    compute.add(reservation("res-other", vms=8))
    tenants = '{"team-a": {"chips": 64, "reservations": ["res-full"]}}'
    settings = SETTINGS.with_overrides(
        capacity_policy="reservation:res-full, reservation:res-other",
        tenants=tenants,
        unlimited_spending=False,
    )
    look = ReservationLook(settings, compute, clock=clock)
    provision = Provisioner(Services(settings, gke, kube, wall_clock=clock, reservations=look))
    pods = submit(kube)
    with pytest.raises(TransientError, match="falling back to reservation:res-other"):
        pending(provision, pods[0])
    assert gke.count("create") == 0
    outcome = provision.provision_pod(Pod.parse(pods[0]), gke.list_node_pools(settings.cluster_path))
    assert outcome.result == REFUSED and "does not list reservation res-other" in outcome.why, outcome
    assert gke.count("create") == 0


def spec(name: str, vms: int = 4) -> NodePoolSpec:
    return NodePoolSpec(name, MACHINE, vms, (ZONE,), {}, {}, reservation=Reservation("dense"))


def test_claims_come_from_provisioning_pools_and_own_creates_until_listed_or_expired(
    compute: FakeReservations, clock: FakeClock
) -> None:
    compute.add(reservation("dense", BlockView("b1", 8, 0)))
    look = ReservationLook(SETTINGS, compute, clock=clock)
    creating = NodePoolInfo(
        "other", STATUS_PROVISIONING, MACHINE, 4, {}, (ZONE,), reservation="dense", reservation_place="b1"
    )
    placed = look.place(spec("one"), [creating])
    assert placed.spec.reservation == Reservation("dense", block="b1")
    with pytest.raises(CapacityUnavailableError, match="block b1 0 free"):
        look.place(spec("two"), [creating])  # "other" and "one" hold the block's 8 VMs
    listed_running = NodePoolInfo("one", "RUNNING", MACHINE, 4, {}, (ZONE,), reservation="dense")
    # Once listed, a pool is counted by Compute (running) or by its PROVISIONING status, not twice.
    assert look.place(spec("two"), [listed_running]).spec.reservation == Reservation("dense", block="b1")
    look.forget("two")
    clock.now += CLAIM_TTL_SECONDS + 1
    assert look.place(spec("three", 8), []).spec.reservation == Reservation("dense", block="b1")


def test_the_admission_check_buys_every_slice_on_the_reservation_with_room_in_one_pass(
    gke: FakeGke, kube: FakeKube, compute: FakeReservations, clock: FakeClock
) -> None:
    # Kueue's QuotaReserved comes once: the slices must not wait for a later sweep to fall back.
    compute.add(reservation("res-full", vms=8, in_use=8))
    compute.add(reservation("res-room", vms=16))
    settings = SETTINGS.with_overrides(capacity_policy="reservation:res-full, reservation:res-room")
    look = ReservationLook(settings, compute, clock=clock)
    checker = AdmissionChecker(Services(settings, gke, kube, wall_clock=clock, reservations=look))
    jobset = tpu_jobset("a", "team-a", replicas=2)
    jobset["spec"]["suspend"] = True
    kube.add_jobset(jobset)
    kube.flavors["vlp"] = {"metadata": {"name": "vlp"}, "spec": {"nodeLabels": {}}}
    wl = workload(jobset)
    kube.add_workload(wl)
    result = checker.handle("team-a", wl["metadata"]["name"], "QuotaReserved")
    assert result.state == "Pending" and len(result.created) == 2, result
    assert created_values(gke) == ["res-room", "res-room"]
    assert {e["option"] for e in record(kube).values()} == {f"reservation:res-full@{ZONE}"}
