"""A full reservation in virtual time: what a slice costs when its first capacity option has no room.

A JobSet of ``slices`` v6e slices whose policy is ``reservation:res-full, reservation:res-room``:
``res-full`` is taken by a running pool of someone else, ``res-room`` has room for every slice. The
real ``Provisioner`` runs against ``SimGke`` with a ``CapacityModel`` on the simulation clock, the
scheduler repeats FailedScheduling every 5 minutes and a refused delivery is redelivered with
the subscription's backoff (infra's retry policy). Run two ways:

* ``look=True``, the product as deployed: each create on a reservation is preceded by a read of it
  (``ReservationLook`` over ``SimReservations``: the book's Compute JSON parsed by the production
  adapter's own converters), so no create is sent to a reservation without room, and the slice
  goes on to the next reservation in the same delivery;
* ``look=False``, as before the look: the create names the reservation and GKE's 429 tells.

What is measured is what GKE sees and the user waits: creates GKE refused per slice, creates it
accepted, and when every slice was RUNNING.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
from typing import Any

from sandbox.emulators.gke.capacity import CapacityModel
from sandbox.emulators.reservations import ReservationBook
from sandbox.jobsets import tpu_jobset
from sandbox.sim.engine import Simulation
from sandbox.sim.gke import SimGke
from sandbox.sim.push_delivery import SimSubscription
from sandbox.sim.scheduler import schedule
from sandbox.testing.fakes import FakeKube
from shared.core import labels, logs
from shared.core.errors import NotFoundError
from shared.core.settings import Settings
from shared.provisioning.create.reservations import ReservationLook
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.reservations import ReservationView

ZONE = "us-east5-b"
MACHINE = "ct6e-standard-4t"  # v6e 2x4: 2 VMs per slice
POLICY = "reservation:res-full, reservation:res-room"


class SimReservations:
    """``ReservationAPI`` over a ``ReservationBook``, in process: the book's Compute JSON read back
    through ``google.cloud.compute_v1`` messages and the production adapter's converters."""

    def __init__(self, book: ReservationBook) -> None:
        self.book = book
        self.reads = 0

    def get_reservation(self, project: str, zone: str, name: str) -> ReservationView:
        """The reservation as Compute would answer; NotFoundError when the book has none."""
        from google.cloud import compute_v1

        from shared.cloud.reservations import block_to_view, reservation_to_view, sub_block_to_view

        self.reads += 1
        body = self.book.reservation_json(project, zone, name)
        if body is None:
            raise NotFoundError(
                f"The resource 'projects/{project}/zones/{zone}/reservations/{name}' was not found"
            )
        blocks = []
        for raw in self.book.blocks_json(project, zone, name) or []:
            block: Any = _message(compute_v1.ReservationBlock, raw)
            subs = tuple(
                sub_block_to_view(_message(compute_v1.ReservationSubBlock, s))
                for s in self.book.sub_blocks_json(project, zone, name, block.name) or []
            )
            blocks.append(block_to_view(block, subs))
        return reservation_to_view(_message(compute_v1.Reservation, body), project, zone, tuple(blocks))


def _message(kind: Any, body: dict[str, Any]) -> Any:
    return kind.from_json(json.dumps(body), ignore_unknown_fields=True)


@dataclasses.dataclass(frozen=True)
class ReservedConfig:
    """One run."""

    look: bool = True
    slices: int = 4
    op_minutes: float = 2.0
    export_delay: float = 5.0  # a FailedScheduling entry reaches provision this long after it
    failed_scheduling_every: float = 300.0
    horizon_hours: float = 2.0
    seed: int = 1


@dataclasses.dataclass(frozen=True)
class ReservedResult:
    """What GKE saw and when the JobSet landed."""

    config: ReservedConfig
    refused: int  # creates GKE refused (the full reservation's 429s)
    accepted: int
    reads: int  # reservation reads from Compute
    landed_at: float | None  # seconds until every slice was RUNNING (None: never)

    @property
    def refused_per_slice(self) -> float:
        """GKE's refusals divided by the slices: the issue's figure (goal 0)."""
        return self.refused / max(1, self.config.slices)


def run(config: ReservedConfig) -> ReservedResult:
    """Simulate (decision logs dropped)."""
    logs.configure(stream=io.StringIO(), level=logging.ERROR)
    try:
        return _run(config)
    finally:
        logs.configure()


def _run(config: ReservedConfig) -> ReservedResult:
    sim = Simulation()
    settings = Settings(
        unlimited_spending=True,
        project_id="sim-proj",
        location=ZONE,
        cluster_name="sim",
        cordon_settle_seconds=0,
        node_locations=(ZONE,),
    )
    capacity = CapacityModel(sim.clock)
    book = capacity.reservations
    book.add("res-full", ZONE, 2, MACHINE)
    book.add("res-room", ZONE, 2 * config.slices, MACHINE)
    capacity.admit("someone", _someone())
    capacity.settle("someone")  # running: the full reservation's one slice is taken
    kube = FakeKube()
    jobset = tpu_jobset(
        "reserved", replicas=config.slices, topology="2x4", annotations={labels.CAPACITY_POLICY: POLICY}
    )
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)

    def finished(operation: str, pool: str) -> None:
        subscription.publish(("op-finished", pool))

    base = config.op_minutes * 60.0
    gke = SimGke(
        sim, 100, lambda rng: base * (1 + rng.uniform(-0.2, 0.2)), config.seed, 0.5, finished, capacity, "sim"
    )
    reads = SimReservations(book)
    look = ReservationLook(settings, reads, clock=sim.clock) if config.look else None
    provisioner = Provisioner(
        Services(
            settings, gke, kube, known_pool_ttl=30.0, clock=sim.clock, wall_clock=sim.clock, reservations=look
        )
    )

    def deliver(message: tuple[str, ...]) -> None:  # raising is a nack: redelivered with backoff
        if message[0] == "pod":
            provisioner.handle_pending_pod(message[1], message[2], None)
        else:
            provisioner.resume(message[1])

    subscription = SimSubscription(sim, deliver, delay=config.export_delay)
    schedule(sim, kube, gke, pods, subscription.publish, config.failed_scheduling_every)

    def landed() -> bool:
        return sum(1 for p in gke.pools.values() if p.status == "RUNNING") >= config.slices

    sim.run(config.horizon_hours * 3600.0, stop=landed)
    refused = sum(1 for e in capacity.events if e.event == "refused-reservation")
    return ReservedResult(
        config, refused, gke.stats.creates_accepted, reads.reads, sim.now if landed() else None
    )


def _someone() -> Any:
    from sandbox.emulators.gke.capacity import RESERVATION, Demand

    return Demand("theirs", RESERVATION, (ZONE,), 2, 4, MACHINE, "v6e", "sim-proj", "res-full")


__all__ = ["ReservedConfig", "ReservedResult", "SimReservations", "run"]
