"""The Compute Engine reservations the GKE and Compute emulators share: blocks, sub-blocks, use.

GKE's emulator consumes them when it admits a node pool with a specific reservation affinity;
Compute's emulator serves them on the REST reads of ``reservations.get``, ``reservationBlocks.list``
and ``reservationSubBlocks.list``. One book behind both, so what Compute reports is what GKE will
grant, with the one lag the real services have: Compute counts an instance in use once it runs
(``inUseCount``: "instances that are currently in use"), so a pool whose create is still running
holds its room for GKE's admission but shows in no count yet.

Facts (Compute Engine API v1 reference for ``reservations``, ``reservationBlocks`` and
``reservationSubBlocks``; GKE's affinity value forms from the AI Hypercomputer GKE guides):

* a specific reservation reserves ``specificReservation.count`` VMs of one machine type in one
  zone; ``status`` READY when usable;
* a dense one (``deploymentType: DENSE``) has blocks (``count`` VMs) and they may have sub-blocks
  (``count`` hosts; one TPU VM per host); blocks and sub-blocks report ``healthInfo.healthStatus``
  HEALTHY or DEGRADED;
* a pool names ``NAME``, ``NAME/reservationBlocks/B`` or ``NAME/reservationBlocks/B/
  reservationSubBlocks/S``, prefixed ``projects/OWNER/reservations/`` for another project's;
  a block that does not exist is refused like a missing reservation (the 404 quoted in
  GoogleCloudPlatform/cluster-toolkit PR 5043 names the whole value);
* another project consumes a reservation only when it is shared with it (``shareSettings``:
  ``SPECIFIC_PROJECTS`` with a ``projectMap``); otherwise it is not found from there.

A slice is placed whole: an untargeted pool on a dense reservation takes the first block (and
sub-block, when the block has them and the slice fits in one) with room, as a TPU slice's hosts sit
together. Health is reported, never enforced: Compute's docs do not say that a create on a DEGRADED
block is refused, so the product's choice to skip one is the product's.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from sandbox.emulators.gke.rules import ApiError

HEALTHY, DEGRADED = "HEALTHY", "DEGRADED"
READY = "READY"

# Compute's answers about a specific reservation at node-pool create (quoted in
# GoogleCloudPlatform/cluster-toolkit PR 5043 and GoogleCloudPlatform/gsutil issue 1000).
NOT_FOUND = (
    'Google Compute Engine: reservation "{reservation}" not found for node pool "{pool}" at zone "{zone}".'
)
SHORT = (
    "Reservation does not have enough resources for the request: specific reservation "
    '"{reservation}" is insufficient for node pool "{pool}" at zone "{zone}": required {need} and '
    "short of {short} VM count of machine type {machine_type}."
)


@dataclasses.dataclass
class SubBlock:
    """A sub-block of ``hosts`` hosts."""

    name: str
    hosts: int
    health: str = HEALTHY
    status: str = READY


@dataclasses.dataclass
class Block:
    """A block of ``vms`` VMs, made of ``sub_blocks`` when it has any (their hosts add up to it)."""

    name: str
    vms: int
    health: str = HEALTHY
    status: str = READY
    sub_blocks: list[SubBlock] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Entry:
    name: str
    zone: str
    project: str  # "" : the project of whoever asks (the emulated cluster's)
    machine_type: str
    vms: int
    blocks: list[Block]
    shared_with: tuple[str, ...]
    status: str = READY


@dataclasses.dataclass(frozen=True)
class _Use:
    entry: _Entry
    block: str
    sub_block: str
    vms: int
    running: bool


def parse_value(value: str, project: str) -> tuple[str, str, str, str]:
    """(owner project, name, block, sub-block) of a reservation affinity value."""
    rest = value
    if rest.startswith("projects/"):
        parts = rest.split("/", 4)
        if len(parts) >= 4 and parts[2] == "reservations":
            project, rest = parts[1], "/".join(parts[3:])
    name, _, after = rest.partition("/reservationBlocks/")
    block, _, sub_block = after.partition("/reservationSubBlocks/")
    return project, name, block, sub_block


class ReservationBook:
    """Reservations and the pools using them; every method is thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._entries: list[_Entry] = []
        self._uses: dict[str, _Use] = {}  # pool key -> its share

    # -- configuration --------------------------------------------------------------------------

    def add(
        self,
        name: str,
        zone: str,
        vms: int,
        machine_type: str = "",
        project: str = "",
        blocks: list[Block] | None = None,
        shared_with: tuple[str, ...] = (),
    ) -> None:
        """A specific reservation of ``vms`` VMs (with ``blocks``: a dense one, their VMs its
        count); ``project`` owns it ("" : the asking project), ``shared_with`` may consume it too."""
        if vms < 0 or any(b.vms < 0 for b in blocks or []):
            raise ValueError("reservation VMs must be >= 0")
        total = sum(b.vms for b in blocks) if blocks else vms
        with self._lock:
            self._entries = [e for e in self._entries if (e.name, e.project) != (name, project)]
            self._entries.append(
                _Entry(name, zone, project, machine_type, total, list(blocks or []), tuple(shared_with))
            )

    def set_health(self, name: str, block: str, health: str, sub_block: str = "") -> None:
        """Report a block (or one of its sub-blocks) HEALTHY or DEGRADED."""
        with self._lock:
            for entry in self._entries:
                for b in entry.blocks if entry.name == name else []:
                    if b.name != block:
                        continue
                    if not sub_block:
                        b.health = health
                    for s in b.sub_blocks:
                        if s.name == sub_block:
                            s.health = health

    def configured(self) -> bool:
        """Whether any reservation was added (before that, GKE's emulator takes every one to exist)."""
        with self._lock:
            return bool(self._entries)

    # -- GKE: a pool's share --------------------------------------------------------------------

    def consume(
        self,
        key: str,
        value: str,
        project: str,
        zones: tuple[str, ...],
        vms: int,
        machine_type: str,
        pool: str,
    ) -> None:
        """Admit pool ``key`` on the reservation ``value`` names; ApiError 404 (not there, or not
        shared with ``project``) or 429 (no block with room for ``vms`` VMs)."""
        owner, name, block, sub_block = parse_value(value, project)
        zone = zones[0] if zones else ""
        fields = {"reservation": value, "pool": pool, "zone": zone}
        with self._lock:
            entry = next(
                (
                    e
                    for e in self._entries
                    if e.name == name
                    and e.zone == zone
                    and (e.project or project) == owner
                    and (owner == project or project in e.shared_with)
                ),
                None,
            )
            if entry is None or len(zones) != 1:
                raise ApiError(404, "NOT_FOUND", NOT_FOUND.format(**fields))
            place = self._place(entry, block, sub_block, vms)
            if place is None:
                raise ApiError(404, "NOT_FOUND", NOT_FOUND.format(**fields))
            free, block, sub_block = place
            if free < vms:
                short = vms - free
                raise ApiError(
                    429,
                    "RESOURCE_EXHAUSTED",
                    SHORT.format(**fields, need=vms, short=short, machine_type=machine_type),
                )
            self._uses[key] = _Use(entry, block, sub_block, vms, running=False)

    def start(self, key: str) -> None:
        """The pool's instances run: Compute counts them in use from now."""
        with self._lock:
            use = self._uses.get(key)
            if use is not None:
                self._uses[key] = dataclasses.replace(use, running=True)

    def release(self, key: str) -> None:
        """The pool is gone (deleted, or its create failed): its share goes back."""
        with self._lock:
            self._uses.pop(key, None)

    def used(self, name: str) -> int:
        """VMs of ``name`` held by pools, running or being created."""
        with self._lock:
            return sum(u.vms for u in self._uses.values() if u.entry.name == name)

    def report(self) -> dict[str, Any]:
        """Each reservation with its size and use (for tests and logs)."""
        with self._lock:
            return {
                e.name: {"zone": e.zone, "project": e.project, "vms": e.vms, "used": self.used(e.name)}
                for e in self._entries
            }

    def _held(self, entry: _Entry, block: str = "", sub_block: str = "", running_only: bool = False) -> int:
        return sum(
            u.vms
            for u in self._uses.values()
            if u.entry is entry
            and (not block or u.block == block)
            and (not sub_block or u.sub_block == sub_block)
            and (u.running or not running_only)
        )

    def _place(self, entry: _Entry, block: str, sub_block: str, vms: int) -> tuple[int, str, str] | None:
        """(free VMs, block, sub-block) where the pool would go; None when a named place is missing."""
        if not entry.blocks:
            if block:
                return None
            return entry.vms - self._held(entry), "", ""
        candidates = [b for b in entry.blocks if not block or b.name == block]
        if not candidates:
            return None
        best: tuple[int, str, str] = (0, candidates[0].name, "")
        for b in candidates:
            block_free = b.vms - self._held(entry, b.name)
            subs = [s for s in b.sub_blocks if not sub_block or s.name == sub_block]
            if sub_block and not subs:
                return None
            if not b.sub_blocks or (not sub_block and vms > max(s.hosts for s in b.sub_blocks)):
                place = (block_free, b.name, "")
            else:
                place = max(
                    (
                        (min(block_free, s.hosts - self._held(entry, b.name, s.name)), b.name, s.name)
                        for s in subs
                    ),
                    key=lambda p: p[0],
                )
            if place[0] >= vms:
                return place
            best = max(best, place, key=lambda p: p[0])
        return best

    # -- Compute: what it reports ---------------------------------------------------------------

    def find(self, project: str, zone: str, name: str) -> _Entry | None:
        """The reservation ``name`` of ``project`` in ``zone`` (an entry added without a project is
        every project's)."""
        with self._lock:
            return next(
                (
                    e
                    for e in self._entries
                    if e.name == name and e.zone == zone and e.project in ("", project)
                ),
                None,
            )

    def reservation_json(self, project: str, zone: str, name: str) -> dict[str, Any] | None:
        """``compute#reservation`` as the REST get answers it."""
        with self._lock:
            entry = self.find(project, zone, name)
            if entry is None:
                return None
            body: dict[str, Any] = {
                "kind": "compute#reservation",
                "name": entry.name,
                "zone": entry.zone,
                "status": entry.status,
                "specificReservationRequired": True,
                "specificReservation": {
                    "count": str(entry.vms),
                    "inUseCount": str(self._held(entry, running_only=True)),
                    "instanceProperties": {"machineType": entry.machine_type},
                },
                "resourceStatus": {"reservationBlockCount": len(entry.blocks)},
                "shareSettings": (
                    {
                        "shareType": "SPECIFIC_PROJECTS",
                        "projectMap": {p: {"projectId": p} for p in entry.shared_with},
                    }
                    if entry.shared_with
                    else {"shareType": "LOCAL"}
                ),
            }
            if entry.blocks:
                body["deploymentType"] = "DENSE"
            return body

    def blocks_json(self, project: str, zone: str, name: str) -> list[dict[str, Any]] | None:
        """The ``compute#reservationBlock`` items of ``reservationBlocks.list``."""
        with self._lock:
            entry = self.find(project, zone, name)
            if entry is None:
                return None
            return [
                {
                    "kind": "compute#reservationBlock",
                    "name": b.name,
                    "zone": entry.zone,
                    "count": b.vms,
                    "inUseCount": self._held(entry, b.name, running_only=True),
                    "status": b.status,
                    "healthInfo": {"healthStatus": b.health},
                    "reservationSubBlockCount": len(b.sub_blocks),
                    "reservationSubBlockInUseCount": sum(
                        1 for s in b.sub_blocks if self._held(entry, b.name, s.name, running_only=True)
                    ),
                }
                for b in entry.blocks
            ]

    def sub_blocks_json(self, project: str, zone: str, name: str, block: str) -> list[dict[str, Any]] | None:
        """The ``compute#reservationSubBlock`` items of ``reservationSubBlocks.list`` (hosts)."""
        with self._lock:
            entry = self.find(project, zone, name)
            found = next((b for b in entry.blocks if b.name == block), None) if entry else None
            if entry is None or found is None:
                return None
            items = []
            for s in found.sub_blocks:
                in_use = self._held(entry, found.name, s.name, running_only=True)
                items.append(
                    {
                        "kind": "compute#reservationSubBlock",
                        "name": s.name,
                        "zone": entry.zone,
                        "count": s.hosts,
                        "inUseCount": in_use,
                        "inUseHostCount": in_use,
                        "status": s.status,
                        "healthInfo": {"healthStatus": s.health},
                    }
                )
            return items


__all__ = ["DEGRADED", "HEALTHY", "NOT_FOUND", "SHORT", "Block", "ReservationBook", "SubBlock", "parse_value"]
