"""Scarce TPU capacity: zonal supply per provisioning model, reservations and regional quota.

A pure, thread-safe model with an injected clock (no HTTP): the GKE emulator (``state.py``, through
``pool_capacity.py``) and the virtual-time ``SimGke`` both drive it. Everything is counted in TPU
chips; a pool needs ``nodes x chips per VM`` chips in each of its zones.

Supply, per (zone, kind) with kind one of ``on-demand``, ``spot``, ``flex-start``: unlimited until
set. ``set(zone, kind, chips)`` fixes it from now on; ``set(zone, kind, 0, until=1200, then=None)``
says "empty for 20 minutes, then unlimited again"; ``schedule(zone, kind, [(0, 0), (600, 16)])``
gives any list of (seconds from now, chips or None) steps. Supply is the zone's total for that
kind: chips held by running pools count against it, and lowering it never takes chips back from a
pool that already runs (no preemption is modelled).

What a create goes through (GKE's order as far as the docs tell it):

1. ``admit`` at the request, synchronously: a pool consuming a SPECIFIC reservation needs the
   reservation to exist in its zone (else 404) with room for the pool (else 429) -- once any
   reservation was added; before that every reservation is taken to exist, unlimited; any other TPU
   pool needs regional Compute Engine quota (else 403 "Insufficient regional quota to satisfy
   request"). Reserved capacity uses no quota (GKE "Troubleshoot TPUs"); on-demand uses the TPU
   family's chips quota; spot and flex-start use the preemptible one (Cloud TPU "flex-start": flex-
   start VMs use preemptible quota). An admitted create holds its quota (and reservation chips)
   until the pool is deleted or its create fails.
2. ``settle`` when the create operation is DONE: an on-demand or spot pool takes its chips if the
   zone has them now, else the create ends in ERROR with the stockout text; a reservation pool
   always gets its chips (they were set aside at admission); a flex-start pool is RUNNING with no
   nodes and waits.
3. ``poll`` (on every tick): each waiting flex-start pool whose whole slice fits now gets all its
   chips at once (a multi-host slice is provisioned atomically, GKE "About TPUs in GKE"), oldest
   first. No GKE-level timeout for a waiting non-queued flex-start pool was found in the docs, so
   none is modelled.
4. ``release`` when the pool is deleted: chips, quota and reservation share go back.

``report()`` and ``events`` show what happened (for assertions such as "landed on on-demand after
one spot stockout").
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sandbox.emulators.gke.rules import ApiError
from sandbox.emulators.reservations import Block, ReservationBook

ON_DEMAND, SPOT, FLEX_START, RESERVATION = "on-demand", "spot", "flex-start", "reservation"
KINDS = (ON_DEMAND, SPOT, FLEX_START)

# GKE "Troubleshoot node pools" lists both the code and this sentence for a zone out of capacity; a
# create operation's error carries them together.
STOCKOUT = (
    "ZONE_RESOURCE_POOL_EXHAUSTED: The zone '{zone}' does not have enough resources available to "
    "fulfill the request. Try a different zone, or try again later."
)
# The shape of GKE's 403 (quoted for other Compute metrics in many public reports, e.g.
# "resource \"SSD_TOTAL_GB\": request requires '300.0' and is short '100.0'. project has a quota of
# '500.0' with '200.0' available").
QUOTA = (
    'Insufficient regional quota to satisfy request: resource "{metric}": request requires '
    "'{need:.1f}' and is short '{short:.1f}'. project has a quota of '{limit:.1f}' with "
    "'{available:.1f}' available. View and manage quotas at "
    "https://console.cloud.google.com/iam-admin/quotas?usage=USED&project={project}."
)
# Compute Engine regional quota metrics per TPU generation: (on-demand, preemptible). The v5e names
# are the ones `gcloud compute regions describe` lists; the others were not found in the docs (v6e
# and tpu7x are counted under "TPUs per TPU family") and are named in the same style.
QUOTA_METRICS: dict[str, tuple[str, str]] = {
    "v4": ("TPU_PODSLICE_V4", "PREEMPTIBLE_TPU_PODSLICE_V4"),
    "v5e": ("TPU_LITE_PODSLICE_V5", "PREEMPTIBLE_TPU_LITE_PODSLICE_V5"),
    "v5p": ("TPU_PODSLICE_V5P", "PREEMPTIBLE_TPU_PODSLICE_V5P"),
    "v6e": ("TPUS_PER_TPU_FAMILY_CT6E", "PREEMPTIBLE_TPUS_PER_TPU_FAMILY_CT6E"),
    "tpu7x": ("TPUS_PER_TPU_FAMILY_TPU7X", "PREEMPTIBLE_TPUS_PER_TPU_FAMILY_TPU7X"),
}


def quota_metric(generation: str, preemptible: bool = False) -> str:
    """The Compute quota metric a TPU generation's pools count against."""
    on_demand, spot = QUOTA_METRICS.get(generation, (f"TPU_{generation.upper()}", ""))
    return (spot or f"PREEMPTIBLE_{on_demand}") if preemptible else on_demand


def region_of_zone(zone: str) -> str:
    """``us-central2-b`` -> ``us-central2``."""
    return zone.rsplit("-", 1)[0]


@dataclasses.dataclass(frozen=True)
class Demand:
    """What one TPU pool asks for: ``vms`` VMs of ``chips_per_vm`` chips in each of ``zones``."""

    pool: str
    kind: str  # ON_DEMAND, SPOT, FLEX_START or RESERVATION
    zones: tuple[str, ...]
    vms: int
    chips_per_vm: int
    machine_type: str
    generation: str
    project: str = ""
    reservation: str = ""  # the affinity value: "name" or "projects/P/reservations/name"

    @property
    def chips_per_zone(self) -> int:
        """Chips the pool holds in each of its zones."""
        return self.vms * self.chips_per_vm

    @property
    def chips(self) -> int:
        """Chips of the whole pool."""
        return self.chips_per_zone * len(self.zones)

    @property
    def region(self) -> str:
        """The region of the pool's zones."""
        return region_of_zone(self.zones[0]) if self.zones else ""


@dataclasses.dataclass(frozen=True)
class CapacityEvent:
    """One step of a pool's life in the model: accepted, running, stockout, waiting, obtained,
    released, or refused (quota or reservation)."""

    at: float
    key: str
    event: str
    kind: str
    zones: tuple[str, ...]
    chips: int


@dataclasses.dataclass
class _Holding:
    demand: Demand
    state: str  # "pending" (create running), "waiting" (flex-start, no nodes), "held"
    reserved: bool = False  # holds a share of a reservation of the book


class CapacityModel:
    """Supply, reservations, quota and the pools holding them; every method is thread-safe."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, reservations: ReservationBook | None = None
    ) -> None:
        self._lock = threading.RLock()
        self._clock = clock
        self._steps: dict[tuple[str, str], list[tuple[float, int | None]]] = {}
        # Reservations, shared with the Compute emulator that reports them (emulators.reservations).
        self.reservations = reservations or ReservationBook()
        self._quota: dict[tuple[str, str], int] = {}  # (region, metric) -> chips
        self._holdings: dict[str, _Holding] = {}
        self.events: list[CapacityEvent] = []

    # -- configuration --------------------------------------------------------------------------

    def set(
        self, zone: str, kind: str, chips: int | None, until: float | None = None, then: int | None = None
    ) -> None:
        """Supply of ``kind`` in ``zone`` is ``chips`` (None: unlimited) from now; with ``until``,
        it becomes ``then`` (None: unlimited) that many seconds from now."""
        steps: list[tuple[float, int | None]] = [(0.0, chips)]
        if until is not None:
            steps.append((until, then))
        self.schedule(zone, kind, steps)

    def schedule(self, zone: str, kind: str, steps: Sequence[tuple[float, int | None]]) -> None:
        """Replace the supply of ``kind`` in ``zone`` by ``(seconds from now, chips or None)`` steps;
        before the first step the supply is unlimited."""
        _check_kind(kind)
        if any(at < 0 or (chips is not None and chips < 0) for at, chips in steps):
            raise ValueError("steps need at >= 0 and chips >= 0 (or None for unlimited)")
        with self._lock:
            now = self._clock()
            self._steps[(zone, kind)] = sorted((now + at, chips) for at, chips in steps)

    def add_reservation(
        self,
        name: str,
        zone: str,
        vms: int,
        machine_type: str = "",
        project: str = "",
        blocks: list[Block] | None = None,
        shared_with: tuple[str, ...] = (),
    ) -> None:
        """A specific reservation of ``vms`` VMs of ``machine_type`` in ``zone`` (``project`` "":
        the pools' own; ``blocks``: a dense one), in the book Compute's emulator reports."""
        self.reservations.add(name, zone, vms, machine_type, project, blocks, shared_with)

    def set_quota(self, region: str, generation: str, chips: int | None, preemptible: bool = False) -> None:
        """Regional Compute quota for a TPU generation's chips (None: unlimited, the default)."""
        key = (region, quota_metric(generation, preemptible))
        with self._lock:
            if chips is None:
                self._quota.pop(key, None)
            else:
                self._quota[key] = chips

    # -- reads ----------------------------------------------------------------------------------

    def supply(self, zone: str, kind: str) -> int | None:
        """The supply of ``kind`` in ``zone`` now (None: unlimited)."""
        with self._lock:
            now, current = self._clock(), None
            for at, chips in self._steps.get((zone, kind), []):
                if at <= now:
                    current = chips
            return current

    def used(self, zone: str, kind: str) -> int:
        """Chips of ``kind`` in ``zone`` held by pools that have their nodes."""
        with self._lock:
            return sum(
                h.demand.chips_per_zone
                for h in self._holdings.values()
                if h.state == "held" and h.demand.kind == kind and zone in h.demand.zones
            )

    def free(self, zone: str, kind: str) -> int | None:
        """Chips of ``kind`` a new pool could take in ``zone`` now (None: unlimited)."""
        with self._lock:
            supply = self.supply(zone, kind)
            return None if supply is None else max(0, supply - self.used(zone, kind))

    def demand(self, key: str) -> Demand | None:
        """What the pool ``key`` asks for (its zone once a flex-start slice has landed)."""
        with self._lock:
            holding = self._holdings.get(key)
            return holding.demand if holding else None

    def holding(self, key: str) -> str:
        """The state of a pool in the model: pending, waiting, held, or "" when unknown."""
        with self._lock:
            holding = self._holdings.get(key)
            return holding.state if holding else ""

    def report(self) -> dict[str, Any]:
        """Supply, use, reservations, quota and pools, as plain data (for tests and logs)."""
        with self._lock:
            zones = sorted({zone for zone, _ in self._steps} | self._zones_held())
            return {
                "supply": {
                    f"{zone}/{kind}": {"supply": self.supply(zone, kind), "used": self.used(zone, kind)}
                    for zone in zones
                    for kind in KINDS
                },
                "reservations": self.reservations.report(),
                "quota": {
                    f"{region}/{metric}": {"limit": limit, "used": self._quota_used(region, metric)}
                    for (region, metric), limit in self._quota.items()
                },
                "pools": {
                    key: {"kind": h.demand.kind, "zones": list(h.demand.zones), "state": h.state}
                    for key, h in self._holdings.items()
                },
            }

    # -- a pool's life --------------------------------------------------------------------------

    def admit(self, key: str, demand: Demand) -> None:
        """Check a create at request time; raises ``ApiError`` (404/429 reservation, 403 quota)."""
        with self._lock:
            reserved = False
            if demand.kind == RESERVATION:
                reserved = self._admit_reservation(key, demand)
            else:
                self._admit_quota(key, demand)
            self._holdings[key] = _Holding(demand, "pending", reserved)
            self._event(key, "accepted", demand)

    def settle(self, key: str) -> str | None:
        """The create of ``key`` is DONE: None when it runs (a flex-start pool waits for its nodes),
        else the stockout message it fails with (and the pool holds nothing any more)."""
        with self._lock:
            holding = self._holdings.get(key)
            if holding is None or holding.state != "pending":
                return None
            demand = holding.demand
            if demand.kind == FLEX_START:
                holding.state = "waiting"
                self._event(key, "waiting", demand)
                return None
            short = next((zone for zone in demand.zones if not self._fits(zone, demand)), None)
            if demand.kind != RESERVATION and short is not None:
                del self._holdings[key]
                self._event(key, "stockout", demand)
                return STOCKOUT.format(zone=short)
            holding.state = "held"
            if holding.reserved:
                self.reservations.start(key)
            self._event(key, "running", demand)
            return None

    def poll(self) -> list[str]:
        """Give every waiting flex-start pool whose whole slice fits now its chips; their keys.

        A flex-start pool's zones are candidates (location policy ANY): the slice lands whole in the
        first of them that has room, and from then on holds chips there only."""
        obtained = []
        with self._lock:
            for key, holding in self._holdings.items():
                if holding.state != "waiting":
                    continue
                zone = next((z for z in holding.demand.zones if self._fits(z, holding.demand)), None)
                if zone is not None:
                    holding.demand = dataclasses.replace(holding.demand, zones=(zone,))
                    holding.state = "held"
                    obtained.append(key)
                    self._event(key, "obtained", holding.demand)
        return obtained

    def release(self, key: str) -> None:
        """The pool is gone (deleted, or its create failed): everything it held goes back."""
        with self._lock:
            holding = self._holdings.pop(key, None)
            self.reservations.release(key)
            if holding is not None:
                self._event(key, "released", holding.demand)

    # -- internals ------------------------------------------------------------------------------

    def _event(self, key: str, event: str, demand: Demand) -> None:
        self.events.append(CapacityEvent(self._clock(), key, event, demand.kind, demand.zones, demand.chips))

    def _zones_held(self) -> frozenset[str]:
        return frozenset(zone for h in self._holdings.values() for zone in h.demand.zones)

    def _fits(self, zone: str, demand: Demand) -> bool:
        free = self.free(zone, demand.kind)
        return free is None or free >= demand.chips_per_zone

    def _admit_reservation(self, key: str, demand: Demand) -> bool:
        if not self.reservations.configured():
            return False  # no reservation configured: every one exists and is large enough
        try:
            self.reservations.consume(
                key,
                demand.reservation,
                demand.project,
                demand.zones,
                demand.vms,
                demand.machine_type,
                demand.pool,
            )
        except ApiError:
            self._event(key, "refused-reservation", demand)
            raise
        return True

    def _quota_used(self, region: str, metric: str) -> int:
        return sum(
            h.demand.chips
            for h in self._holdings.values()
            if h.demand.kind != RESERVATION
            and h.demand.region == region
            and quota_metric(h.demand.generation, h.demand.kind != ON_DEMAND) == metric
        )

    def _admit_quota(self, key: str, demand: Demand) -> None:
        # A flex-start pool is made empty, yet it is counted for its whole slice from the start: not
        # found in the docs whether GKE checks quota at create or only when the autoscaler scales up.
        metric = quota_metric(demand.generation, preemptible=demand.kind != ON_DEMAND)
        limit = self._quota.get((demand.region, metric))
        if limit is None:
            return
        available = max(0, limit - self._quota_used(demand.region, metric))
        if demand.chips > available:
            self._event(key, "refused-quota", demand)
            raise ApiError(
                403,
                "PERMISSION_DENIED",
                QUOTA.format(
                    metric=metric,
                    need=demand.chips,
                    short=demand.chips - available,
                    limit=limit,
                    available=available,
                    project=demand.project,
                ),
            )


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown capacity kind {kind!r}; use one of {', '.join(KINDS)}")
