"""Look before buying: read a reservation before a create on it, and place the slice where it fits.

GKE answers a create on a specific reservation that has no room with a refusal (429 "Reservation
does not have enough resources for the request"), and on one missing in the zone with a 404; each
such create is an attempt spent and a backoff step. So before a create names a reservation, the
engine asks Compute Engine for the reservation, its blocks and their sub-blocks
(``ReservationAPI``), and ``shared.tpu.reservations.place`` says where the slice fits whole:

* somewhere: the create targets that block or sub-block (GKE's affinity value
  ``NAME/reservationBlocks/B[/reservationSubBlocks/S]``), and the Event says where and how much
  room there was;
* nowhere (full, unhealthy, not READY, another machine type, or missing): the attempt is refused
  here, with Compute's figures, exactly as GKE's refusal would be (``CapacityUnavailableError``):
  the slice falls back to its next capacity option or backs off, and no doomed create is sent.

Room Compute does not show yet: a pool GKE is creating runs no instance, so the reservation's
``inUseCount`` leaves it out. The VMs of pools of the listing that are still PROVISIONING in a
place, and of creates this instance sent there in the last ``CLAIM_TTL_SECONDS`` that the listing
does not show yet, are claimed before the room is counted. Looks at one reservation are serialised
per instance, so the slices of one delivery (sent on several threads) never count the same room.
When Compute and GKE disagree anyway (another tenant's VMs started between the look and the
create), GKE's refusal is handled as before.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

from shared.cloud.ports import ReservationAPI
from shared.core import logs
from shared.core.errors import CapacityUnavailableError, NotFoundError
from shared.core.settings import Settings
from shared.tpu import catalog, reservations
from shared.tpu.nodepools import STATUS_PROVISIONING, NodePoolInfo, NodePoolSpec, Reservation

log = logs.get("reservations")

# How long a create this instance sent counts against its place while GKE's listing may not show
# the pool yet (GKE lists a pool as soon as it accepts the create; this covers the listing the
# delivery read before its own creates).
CLAIM_TTL_SECONDS = 120.0


@dataclasses.dataclass(frozen=True)
class _Claim:
    reservation: str  # Reservation.base
    place: str
    vms: int
    at: float


@dataclasses.dataclass(frozen=True)
class Placed:
    """A create's spec targeted at a place of its reservation, and the sentence saying why."""

    spec: NodePoolSpec
    why: str


class ReservationLook:
    """Reads a reservation before each create on it and targets the create where the slice fits."""

    def __init__(
        self, settings: Settings, api: ReservationAPI, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.api = api
        self.clock = clock
        self._claims: dict[str, _Claim] = {}  # pool name -> its create's claim
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def place(self, spec: NodePoolSpec, pools: Sequence[NodePoolInfo]) -> Placed:
        """``spec`` targeted at a block or sub-block of its reservation with room for it (unchanged
        for a pool that consumes no reservation). Raises CapacityUnavailableError when the
        reservation cannot take the slice now, and what the read raises otherwise (RejectedError,
        PermissionDeniedError naming the permission, TransientError)."""
        wanted = spec.reservation
        if wanted is None:
            return Placed(spec, "")
        project = wanted.project or self.settings.project_id
        zone = spec.node_locations[0] if spec.node_locations else self.settings.location
        with self._lock_of(wanted.base):
            try:
                view = self.api.get_reservation(project, zone, wanted.name)
            except NotFoundError as exc:
                why = f"reservation {wanted.base} not found in zone {zone}: {exc.why}"
                logs.decision(log, "reservation.missing", why, logging.WARNING, pool=spec.name)
                raise CapacityUnavailableError(why) from None
            fit = reservations.place(view, spec.node_count, spec.machine_type, self._claimed(wanted, pools))
            if isinstance(fit, reservations.NoFit):
                logs.decision(log, "reservation.no_room", f"{spec.name}: {fit.why}", pool=spec.name)
                raise CapacityUnavailableError(f"{fit.why}; nothing was sent to GKE")
            target = dataclasses.replace(wanted, block=fit.block, sub_block=fit.sub_block)
            with self._guard:
                self._claims[spec.name] = _Claim(wanted.base, target.place, spec.node_count, self.clock())
        logs.decision(
            log, "reservation.placed", f"{spec.name}: {fit.why}", pool=spec.name, reservation=target.value
        )
        return Placed(dataclasses.replace(spec, reservation=target), fit.why)

    def room(
        self, wanted: Reservation, zone: str, shape: catalog.SliceShape, slices: int
    ) -> tuple[bool, str]:
        """Whether ``slices`` pools of ``shape`` would all fit in ``wanted`` now (each placed as
        ``place`` would, after the ones before it), and Compute's figures for the first; a read only,
        nothing is claimed. Raises what the read raises, except NotFoundError (no room)."""
        project = wanted.project or self.settings.project_id
        zone = zone or self.settings.location
        try:
            view = self.api.get_reservation(project, zone, wanted.name)
        except NotFoundError as exc:
            return False, f"reservation {wanted.base} not found in zone {zone}: {exc.why}"
        claimed = self._claimed(wanted, [])
        said = ""
        for index in range(slices):
            fit = reservations.place(view, shape.num_vms, shape.machine_type, claimed)
            if isinstance(fit, reservations.NoFit):
                return False, fit.why if index == 0 else f"{fit.why} (slice {index + 1} of {slices})"
            key = reservations.target_key(fit.block, fit.sub_block)
            claimed[key] = claimed.get(key, 0) + shape.num_vms
            said = said or fit.why
        return True, f"{said}; room for all {slices} slices" if slices > 1 else said

    def forget(self, pool: str) -> None:
        """The create of ``pool`` was not accepted: its claim holds no room."""
        with self._guard:
            self._claims.pop(pool, None)

    def _lock_of(self, key: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def _claimed(self, wanted: Reservation, pools: Sequence[NodePoolInfo]) -> dict[str, int]:
        """VMs per place of ``wanted`` that pools being created will take and Compute may not count."""
        claimed: dict[str, int] = {}
        listed = {p.name for p in pools}
        for pool in pools:
            if pool.reservation == wanted.base and pool.status == STATUS_PROVISIONING:
                claimed[pool.reservation_place] = claimed.get(pool.reservation_place, 0) + pool.node_count
        now = self.clock()
        with self._guard:
            for name, claim in list(self._claims.items()):
                if now - claim.at > CLAIM_TTL_SECONDS:
                    del self._claims[name]
                elif claim.reservation == wanted.base and name not in listed:
                    claimed[claim.place] = claimed.get(claim.place, 0) + claim.vms
        return claimed


__all__ = ["CLAIM_TTL_SECONDS", "Placed", "ReservationLook"]
