"""What each MultiKueue worker's capacity looks like for one job, from what the fleet knows.

The choice of the worker that runs (and buys for) a manager's Workload is made from data, not the
fleet's order alone. For each worker the job may go to, and each TPU pod set of the job, the
worker's own view is read through its services (its settings, GKE's description of the cluster
and its look at reservations):

* **its capacity policy** for the slice's demand (``slice_options`` with the worker's
  ``CAPACITY_POLICY`` or the JobSet's own annotation, the zones of the worker's cluster): a policy
  that cannot place the slice there (a zone the cluster lacks, FORCE_ON_DEMAND against the pod's
  selector) puts the worker last;
* **a reservation of the policy with room** for every slice of the pod set, read from Compute
  Engine as the engine's look before buying does (``ReservationLook.room``, nothing claimed): the
  worker is preferred, since that capacity is already paid for and a create there will not stock
  out;
* **a shortage of that shape the fleet met there recently**: when some job's slices of the same
  accelerator and topology ran out of every option of its policy in that worker, the product
  records it on the manager's ``MultiKueueCluster`` of the worker (``CAPACITY_SHORT``: per shape,
  when, and the options tried). A job whose options there were all tried then goes elsewhere first,
  without a doomed create of its own. The record sits on a cluster-scoped object that only the
  manager's administrators (and the product) may write: a tenant cannot fake a shortage to steer
  other tenants' jobs, unlike an annotation on its own JobSet. When a pool of the shape comes up
  RUNNING in that worker, GKE has just delivered the capacity, and the record of the shape is
  removed there (``MultiKueuePlacement.capacity_back``); else it expires after
  ``MULTIKUEUE_SHORTAGE_SECONDS``.

A worker's rank is its worst pod set's: ``ROOM`` (a reservation has room), ``OPEN`` (nothing known
against), ``SHORT`` (the shape was short there recently, or every option is a reservation without
room), ``UNPLACEABLE`` (its policy cannot place the slice). The placement adds ``JOB_SHORT`` for
workers where this very job was short, then takes the best rank, the fleet's order breaking ties.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Protocol

from shared.core import labels
from shared.core.errors import PermissionDeniedError, Refused, TransientError
from shared.core.settings import Settings
from shared.provisioning.create.reservations import ReservationLook
from shared.tpu import catalog
from shared.tpu.capacity import CapacityOption
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import ClusterInfo
from shared.tpu.slices import policy_of, slice_options
from shared.tpu.workloads import WorkloadSlice

# On a MultiKueue manager's MultiKueueCluster of a worker: {"<accelerator> <topology>": {"at":
# RFC 3339, "options": [capacity option keys tried there]}}.
CAPACITY_SHORT = f"{labels.PRODUCT_DOMAIN}/capacity-short"

ROOM, OPEN, SHORT, JOB_SHORT, UNPLACEABLE = 0, 1, 2, 3, 4


class PeerCapacity(Protocol):
    """One fleet cluster's own view of its capacity (its instance services satisfy it)."""

    settings: Settings
    reservations: ReservationLook | None

    def cluster(self) -> ClusterInfo: ...


@dataclasses.dataclass(frozen=True)
class Shortage:
    """A shape's recorded shortage in one worker."""

    at: float  # Unix seconds
    options: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Outlook:
    """One worker's rank for a job and the phrase saying why (for Events and ``why``)."""

    worker: str
    rank: int
    why: str


def shape_key(accelerator: str, topology: str) -> str:
    return f"{accelerator} {topology}"


def stamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def shortages_of(annotations: Mapping[str, str], now: float, seconds: float) -> dict[str, Shortage]:
    """The shapes recorded short on a MultiKueueCluster less than ``seconds`` ago (malformed entries,
    and stamps in the future, are ignored: an administrator's hand edit must not block a worker)."""
    try:
        raw = json.loads(annotations.get(CAPACITY_SHORT) or "{}")
    except ValueError:
        return {}
    found: dict[str, Shortage] = {}
    for shape, entry in raw.items() if isinstance(raw, dict) else ():
        if not isinstance(entry, dict):
            continue
        at = parse_time(str(entry.get("at") or ""))
        options = entry.get("options")
        if at is None or not isinstance(options, list) or not 0 <= now - at < seconds:
            continue
        found[str(shape)] = Shortage(at, tuple(str(o) for o in options))
    return found


def with_shortage(
    annotations: Mapping[str, str], shape: str, options: Sequence[str], now: float, seconds: float
) -> str:
    """The CAPACITY_SHORT annotation with ``shape`` short now (options merged with a recent record
    of it), and entries older than ``seconds`` dropped."""
    record = shortages_of(annotations, now, seconds)
    tried = tuple(sorted({*options, *(record[shape].options if shape in record else ())}))
    return _render({**record, shape: Shortage(now, tried)})


def without_shortage(annotations: Mapping[str, str], shape: str, now: float, seconds: float) -> str | None:
    """The CAPACITY_SHORT annotation with ``shape`` no longer short (entries older than ``seconds``
    dropped too); None when nothing is left, which removes the annotation."""
    record = shortages_of(annotations, now, seconds)
    left = {s: r for s, r in record.items() if s != shape}
    return _render(left) if left else None


def _render(record: Mapping[str, Shortage]) -> str:
    """The CAPACITY_SHORT annotation's text of ``record`` (the form ``shortages_of`` reads)."""
    entries = {s: {"at": stamp(r.at), "options": list(r.options)} for s, r in record.items()}
    return json.dumps(entries, sort_keys=True)


def _ago(seconds: float) -> str:
    return f"{int(seconds)}s" if seconds < 120 else f"{int(seconds // 60)}m"


def _pod_sets(slices: Sequence[WorkloadSlice]) -> dict[str, tuple[WorkloadSlice, int]]:
    found: dict[str, tuple[WorkloadSlice, int]] = {}
    for piece in slices:
        first, count = found.get(piece.pod_set, (piece, 0))
        found[piece.pod_set] = (first, count + 1)
    return found


def _cluster(peer: PeerCapacity) -> ClusterInfo | None:
    try:
        return peer.cluster()
    except TransientError:
        return None  # GKE unreachable: the policy's zones are checked against the settings alone


def _room(
    peer: PeerCapacity, option: CapacityOption, shape: catalog.SliceShape, count: int
) -> tuple[bool, str] | None:
    """Whether a reservation option has room for ``count`` slices of ``shape``, and Compute's figures;
    None when it is no reservation or cannot be read (then it counts neither way)."""
    if peer.reservations is None or option.reservation is None:
        return None
    try:
        return peer.reservations.room(option.reservation, option.zone, shape, count)
    except (TransientError, PermissionDeniedError):
        return None


def outlook(
    worker: str,
    peer: PeerCapacity,
    jobset: JobSet,
    slices: Sequence[WorkloadSlice],
    short: Mapping[str, Shortage],
    now: float,
) -> Outlook:
    """``worker``'s rank for the job whose TPU ``slices`` are given (see the module docstring)."""
    worst: Outlook | None = None
    for first, count in _pod_sets(slices).values():
        request = first.request
        try:
            shape = catalog.resolve(request.accelerator, request.topology, request.chips_per_vm)
            policy = policy_of(peer.settings, jobset)
            options = slice_options(peer.settings, request.demand, policy, _cluster(peer))
        except (Refused, catalog.UnsupportedShape) as exc:
            return Outlook(worker, UNPLACEABLE, f"its capacity policy cannot place {first.pod_set}: {exc}")
        key = shape_key(shape.accelerator, shape.topology)
        looks = [(o, _room(peer, o, shape, count)) for o in options]
        rooms = [look[1] for _, look in looks if look is not None and look[0]]
        full = [look[1] for _, look in looks if look is not None and not look[0]]
        recorded = short.get(key)
        if rooms:
            found = Outlook(worker, ROOM, rooms[0])
        elif recorded is not None and {o.key for o in options} <= set(recorded.options):
            found = Outlook(worker, SHORT, f"{key} was short there {_ago(now - recorded.at)} ago")
        elif full and len(full) == len(options):
            found = Outlook(worker, SHORT, full[0])
        else:
            found = Outlook(worker, OPEN, options[0].describe())
        if worst is None or found.rank > worst.rank:
            worst = found
    return worst or Outlook(worker, OPEN, "no TPU slices")


__all__ = [
    "CAPACITY_SHORT",
    "JOB_SHORT",
    "OPEN",
    "ROOM",
    "SHORT",
    "UNPLACEABLE",
    "Outlook",
    "PeerCapacity",
    "Shortage",
    "outlook",
    "shape_key",
    "shortages_of",
    "with_shortage",
    "without_shortage",
]
