"""Capacity policy: which kind of TPU capacity, in which zone, each attempt at a slice asks GKE for.

A policy is an ordered list, like the priorities of a GKE ComputeClass::

    CAPACITY_POLICY="reservation:tpu-res@us-east5-b, spot@us-east5-b, spot@us-east5-a, on-demand"

Each entry is ``KIND[@ZONE]`` where KIND is ``on-demand``, ``spot``, ``flex-start`` or
``reservation:NAME`` (``reservation:projects/P/reservations/NAME`` for a shared one); an entry
without a zone means the slice's default zone (the pod's zone selector, else the first configured
zone). The first attempt uses the first entry; after a stockout or quota failure the next attempt
uses the next entry at once; after the last one the slice backs off and starts over from the first.

The policy never overrides what a pod asks for. A pod that selects ``cloud.google.com/gke-spot``,
``cloud.google.com/gke-flex-start`` or a reservation can only run on that capacity, and a pod
that selects a zone only in that zone, so entries the pod's selectors exclude are skipped; when no
entry fits, the pod's own choice (on-demand when it makes none) is the only option. Everything
here is pure.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from shared.core.errors import Refused
from shared.tpu.nodepools import NodePoolInfo, NodePoolSpec, Reservation

ON_DEMAND = "on-demand"
SPOT = "spot"
FLEX_START = "flex-start"
RESERVATION = "reservation"
KINDS = (RESERVATION, SPOT, FLEX_START, ON_DEMAND)

# A Compute Engine zone: region plus a one-letter suffix (us-east5-b).
_ZONE = re.compile(r"^[a-z]+-[a-z]+\d+-[a-z]$")
_SHARED = re.compile(
    r"^projects/([a-z][-a-z0-9]{4,28}[a-z0-9])/reservations/([a-z]([-a-z0-9]{0,61}[a-z0-9])?)$"
)
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclasses.dataclass(frozen=True)
class CapacityOption:
    """One way to get a slice's VMs: a kind of capacity in one zone ("" = the slice's default)."""

    kind: str
    zone: str = ""
    reservation: Reservation | None = None

    @property
    def key(self) -> str:
        """Stable text naming the option (what the failure record stores): ``spot@us-east5-a``."""
        reservation = self.reservation.value if self.reservation else ""
        zones = (self.zone,) if self.zone else ()
        return _key(self.kind == SPOT, reservation, self.kind == FLEX_START, zones)

    def describe(self) -> str:
        """How the option reads in Events: ``spot VMs in us-east5-a``."""
        what = {
            ON_DEMAND: "on-demand VMs",
            SPOT: "Spot VMs",
            FLEX_START: "flex-start VMs",
        }.get(self.kind, f"reservation {self.reservation.value if self.reservation else '?'}")
        return f"{what} in {self.zone}" if self.zone else what


@dataclasses.dataclass(frozen=True)
class Demand:
    """What a pod's own selectors require of the capacity its slice runs on."""

    kind: str = ""  # "" = any kind
    reservation: Reservation | None = None
    zone: str = ""  # "" = any zone


def parse_entry(text: str) -> CapacityOption:
    """One ``KIND[@ZONE]`` entry; ValueError says what is wrong with it."""
    kind, _, zone = text.strip().partition("@")
    kind, zone = kind.strip(), zone.strip()
    if zone and not _ZONE.match(zone):
        raise ValueError(f"capacity policy entry {text.strip()!r}: {zone!r} is not a zone (like us-east5-b)")
    if kind.startswith(f"{RESERVATION}:"):
        value = kind.split(":", 1)[1]
        shared = _SHARED.match(value)
        if shared:
            return CapacityOption(RESERVATION, zone, Reservation(shared.group(2), shared.group(1)))
        if not _NAME.match(value):
            raise ValueError(
                f"capacity policy entry {text.strip()!r}: {value!r} is not a reservation name "
                "(or projects/PROJECT/reservations/NAME)"
            )
        return CapacityOption(RESERVATION, zone, Reservation(value))
    if kind not in (ON_DEMAND, SPOT, FLEX_START):
        raise ValueError(
            f"capacity policy entry {text.strip()!r}: kind must be one of on-demand, spot, flex-start, "
            "reservation:NAME"
        )
    return CapacityOption(kind, zone)


def parse_policy(text: str) -> tuple[CapacityOption, ...]:
    """A comma-separated policy (empty: no policy); ValueError names the first bad entry."""
    entries = tuple(parse_entry(part) for part in text.split(",") if part.strip())
    seen: set[str] = set()
    for entry in entries:
        if entry.key in seen:
            raise ValueError(f"capacity policy lists {entry.key!r} twice")
        seen.add(entry.key)
    return entries


def _fits(entry: CapacityOption, demand: Demand) -> bool:
    if demand.zone and entry.zone and entry.zone != demand.zone:
        return False
    if not demand.kind:
        return True
    if entry.kind != demand.kind:
        return False
    return demand.kind != RESERVATION or entry.reservation == demand.reservation


def options(
    policy: tuple[CapacityOption, ...], demand: Demand, default_zone: str
) -> tuple[CapacityOption, ...]:
    """The slice's attempts in order: the policy's entries the pod allows, zones resolved.

    Never empty: without a fitting entry the pod's own choice (on-demand if none) in its zone.
    """
    chosen: dict[str, CapacityOption] = {}
    for entry in policy:
        if _fits(entry, demand):
            resolved = dataclasses.replace(entry, zone=entry.zone or default_zone)
            chosen.setdefault(resolved.key, resolved)
    if chosen:
        return tuple(chosen.values())
    return (CapacityOption(demand.kind or ON_DEMAND, default_zone, demand.reservation),)


def force_on_demand(demand: Demand) -> None:
    """FORCE_ON_DEMAND is on: Refused when the pod selects other capacity than on-demand, because its
    pods could never land on the on-demand nodes the switch allows."""
    if demand.kind:
        what = demand.kind if demand.kind != RESERVATION else "reservation"
        raise Refused(
            f"FORCE_ON_DEMAND is on: every slice gets on-demand VMs, and this pod selects {what} capacity, "
            "whose labels on-demand nodes never carry; remove that selector or turn FORCE_ON_DEMAND off"
        )


def _key(spot: bool, reservation: str, flex_start: bool, locations: Sequence[str]) -> str:
    if reservation:
        head = f"{RESERVATION}:{reservation}"
    else:
        head = SPOT if spot else FLEX_START if flex_start else ON_DEMAND
    zone = locations[0] if len(locations) == 1 else ""
    return f"{head}@{zone}" if zone else head


def key_of_pool(pool: NodePoolInfo) -> str:
    """The option a listed pool was created with (how a failed attempt is named)."""
    return _key(pool.spot, pool.reservation, pool.flex_start, pool.node_locations)


def key_of_spec(spec: NodePoolSpec) -> str:
    """The option a pool about to be created uses."""
    reservation = spec.reservation.base if spec.reservation else ""
    return _key(spec.spot, reservation, spec.flex_start, spec.node_locations)


def pick(choices: tuple[CapacityOption, ...], next_key: str) -> CapacityOption:
    """The option of the next attempt: the recorded fallback if the policy still has it, else the first."""
    return next((c for c in choices if c.key == next_key), choices[0]) if next_key else choices[0]


def after(keys: Sequence[str], tried: str) -> str:
    """The key of the option that follows ``tried`` in this round, "" when the round is over.

    An attempt the policy does not list (the policy changed, or the pod's pool was made another
    way) ends the round: falling back without backoff must never loop.
    """
    keys = list(keys)
    if tried in keys and keys.index(tried) + 1 < len(keys):
        return keys[keys.index(tried) + 1]
    return ""


__all__ = [
    "FLEX_START",
    "KINDS",
    "ON_DEMAND",
    "RESERVATION",
    "SPOT",
    "CapacityOption",
    "Demand",
    "after",
    "force_on_demand",
    "key_of_pool",
    "key_of_spec",
    "options",
    "parse_entry",
    "parse_policy",
    "pick",
]
