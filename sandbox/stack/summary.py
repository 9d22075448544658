"""The numbers a sandbox run ends with: pools created, handed over, deleted and leaked, pods killed.

``pools_adopted`` counts the product's ``TPUSliceAdopted`` Events (a pool handed over to another
JobSet instead of being deleted and recreated); ``pods_killed`` counts pods that failed because
the pool under them was deleted, which must stay 0 in every scenario.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sandbox.emulators.eventarc import Delivery
from sandbox.emulators.gke.emulator import Call


@dataclasses.dataclass(frozen=True)
class StackSummary:
    """The demo's closing numbers."""

    pools_created: int
    pools_deleted: int
    pools_leaked: list[str]
    wall_seconds: float
    redeliveries: int
    pools_adopted: int = 0
    pods_killed: int = 0


def created_pool_names(calls: Sequence[Call]) -> set[str]:
    """Pool names GKE was asked to create (whether or not it agreed)."""
    return {
        part.split("=", 1)[1]
        for call in calls
        if call.method == "create"
        for part in call.summary.split()
        if part.startswith("name=")
    }


def summarize(
    calls: Sequence[Call],
    pools: Sequence[dict[str, Any]],
    managed: Sequence[dict[str, Any]],
    deleted: Sequence[str],
    deliveries: Sequence[Delivery],
    wall_seconds: float,
    *,
    adopted_events: int = 0,
    pods_killed: Sequence[str] = (),
) -> StackSummary:
    """Summarize a run from the GKE calls, the pools now, the deletions and the deliveries."""
    # A create GKE refused (a fault) made no pool; count only names that existed at some point.
    existed = {str(p.get("name")) for p in pools} | set(deleted)
    return StackSummary(
        pools_created=len(created_pool_names(calls) & existed),
        pools_deleted=len(set(deleted)),
        pools_leaked=sorted(str(p.get("name")) for p in managed),
        wall_seconds=wall_seconds,
        redeliveries=sum(1 for d in deliveries if d.attempt > 1),
        pools_adopted=adopted_events,
        pods_killed=len(set(pods_killed)),
    )
