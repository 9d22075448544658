"""A Compute Engine reservation as the product reads it before buying, and where a slice fits in it.

Facts (Compute Engine API v1 reference: ``reservations``, ``reservationBlocks``,
``reservationSubBlocks``):

* A specific reservation reserves ``specificReservation.count`` VMs of one machine type
  (``instanceProperties.machineType``), ``inUseCount`` of them in use; only a ``READY`` reservation
  is "ready for use" (``status``: CREATING, DELETING, INVALID, READY, UPDATING).
* A dense reservation (``deploymentType: DENSE``) is made of blocks: a block's ``count`` is the VMs
  allocated in it and ``inUseCount`` the instances running on it; its ``healthInfo.healthStatus`` is
  HEALTHY or DEGRADED.
* A block may be made of sub-blocks, whose ``count`` is *hosts* (``inUseHostCount`` of them in
  use); a TPU VM is one host.

What the product does with them (``place``): a slice is one node pool, and a pool placed in a block
(or sub-block) must fit there whole. A block or sub-block that is not READY, or not HEALTHY, is
skipped (xpk likewise lists only ``healthInfo.healthStatus=HEALTHY`` sub-blocks before placing a
slice); a slice that fits in a sub-block goes to one, a larger one to its block. Of the places
with room, the fullest is chosen (best fit): a smaller slice fills a hole
before it cuts into the room a larger one needs. A reservation without blocks is taken as a whole.

Compute counts an instance in use once it runs; a pool GKE is still creating holds none yet. The
product therefore adds what it knows is on the way (``claimed``: the VMs of pools it is creating
there) before it says a block has room, so two slices of one delivery never count the same room.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

READY = "READY"
HEALTHY = "HEALTHY"


def _usable(status: str, health: str) -> bool:
    # An absent health report is not a bad one: only a reported DEGRADED (or other) state skips it.
    return status == READY and health in ("", HEALTHY)


@dataclasses.dataclass(frozen=True)
class SubBlockView:
    """One sub-block: ``hosts`` allocated, ``hosts_in_use`` of them running instances."""

    name: str
    hosts: int
    hosts_in_use: int
    status: str = READY
    health: str = ""  # healthInfo.healthStatus; "" when Compute reports none

    @property
    def usable(self) -> bool:
        """READY and not reported unhealthy."""
        return _usable(self.status, self.health)


@dataclasses.dataclass(frozen=True)
class BlockView:
    """One block: ``vms`` allocated, ``vms_in_use`` running; its sub-blocks when it has any."""

    name: str
    vms: int
    vms_in_use: int
    status: str = READY
    health: str = ""
    sub_blocks: tuple[SubBlockView, ...] = ()

    @property
    def usable(self) -> bool:
        """READY and not reported unhealthy."""
        return _usable(self.status, self.health)


@dataclasses.dataclass(frozen=True)
class ReservationView:
    """A specific reservation as Compute Engine reports it (``project`` owns it)."""

    name: str
    project: str
    zone: str
    machine_type: str
    vms: int
    vms_in_use: int
    status: str = READY
    blocks: tuple[BlockView, ...] = ()

    @property
    def path(self) -> str:
        """``projects/P/zones/Z/reservations/NAME``, as Compute names it in its messages."""
        return f"projects/{self.project}/zones/{self.zone}/reservations/{self.name}"


@dataclasses.dataclass(frozen=True)
class Fit:
    """Where a slice of ``vms`` VMs goes: ``block``/``sub_block`` ("" for the reservation as a
    whole), with ``free`` VMs there before it, and a sentence saying so."""

    block: str
    sub_block: str
    free: int
    why: str


@dataclasses.dataclass(frozen=True)
class NoFit:
    """The reservation cannot take the slice now; ``why`` says what each place had."""

    why: str


def target_key(block: str = "", sub_block: str = "") -> str:
    """The key ``claimed`` counts a place under: "" (whole), "B", or "B/S" (``Reservation.place``)."""
    return f"{block}/{sub_block}" if sub_block else block


def _free(total: int, in_use: int, claimed: int) -> int:
    return max(0, total - in_use - claimed)


def place(
    view: ReservationView, vms: int, machine_type: str, claimed: Mapping[str, int] | None = None
) -> Fit | NoFit:
    """Where in ``view`` a pool of ``vms`` VMs of ``machine_type`` fits whole (see the module
    docstring), after the VMs ``claimed`` per place (``target_key``) by pools being created."""
    claimed = claimed or {}
    name = f"reservation {view.name}"
    if view.status != READY:
        return NoFit(f"{name} is {view.status or 'not READY'}, not READY")
    if view.machine_type and machine_type and view.machine_type != machine_type:
        return NoFit(f"{name} reserves {view.machine_type}, not {machine_type}")
    if not view.blocks:
        # Claims under any key belong to the whole reservation when it has no blocks.
        free = _free(view.vms, view.vms_in_use, sum(claimed.values()))
        if free >= vms:
            return Fit("", "", free, f"{name}: {free} free VMs, the slice takes {vms}")
        return NoFit(f"{name}: {free} free VMs of {view.vms}, the slice needs {vms}")
    fits: list[tuple[int, str, str]] = []  # (free, block, sub_block)
    seen: list[str] = []
    for block in view.blocks:
        if not block.usable:
            seen.append(f"block {block.name} {_state(block.status, block.health)}")
            continue
        block_claims = sum(v for k, v in claimed.items() if k == block.name or k.startswith(f"{block.name}/"))
        block_free = _free(block.vms, block.vms_in_use, block_claims)
        if block_free < vms:
            seen.append(f"block {block.name} {block_free} free")
            continue
        if not block.sub_blocks or vms > max(sub.hosts for sub in block.sub_blocks):
            # A slice larger than any sub-block is placed in the block, across its sub-blocks.
            fits.append((block_free, block.name, ""))
            continue
        for sub in block.sub_blocks:
            where = f"block {block.name} sub-block {sub.name}"
            if not sub.usable:
                seen.append(f"{where} {_state(sub.status, sub.health)}")
                continue
            sub_free = min(
                block_free,
                _free(sub.hosts, sub.hosts_in_use, claimed.get(target_key(block.name, sub.name), 0)),
            )
            if sub_free >= vms:
                fits.append((sub_free, block.name, sub.name))
            else:
                seen.append(f"{where} {sub_free} free")
    if not fits:
        return NoFit(f"{name}: no block has {vms} free VMs for the slice ({'; '.join(seen) or 'no blocks'})")
    free, block_name, sub_name = min(fits)
    where = f"block {block_name}" + (f", sub-block {sub_name}" if sub_name else "")
    return Fit(block_name, sub_name, free, f"{name}: {free} free VMs in {where}, the slice takes {vms}")


def _state(status: str, health: str) -> str:
    if status != READY:
        return status or "not READY"
    return health.lower()


__all__ = [
    "HEALTHY",
    "READY",
    "BlockView",
    "Fit",
    "NoFit",
    "ReservationView",
    "SubBlockView",
    "place",
    "target_key",
]
