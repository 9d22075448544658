"""What the GKE emulator tells its pool listeners, as a contract the listeners may import.

The simulated cluster's node mirror and the real cluster's node registrar both turn a pool the
emulator reports into Nodes. GKE's ``NodePool`` (v1) has no field for the nodes a pool has right now,
so the pool JSON a ready/updated hook receives carries them under ``NODES_KEY`` (never sent over
HTTP); ``nodes_per_zone`` reads them, so no listener needs the emulator's internals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# The hook-payload key with a pool's current nodes per zone (emulator-internal, not a GKE field).
NODES_KEY = "emulatorNodes"

PoolReadyHook = Callable[[str, dict[str, Any]], None]
PoolDeletedHook = Callable[[str, str], None]
PoolUpdatedHook = Callable[[str, dict[str, Any]], None]


def nodes_per_zone(pool: Mapping[str, Any]) -> dict[str, int]:
    """The nodes each zone of a reported pool has: the emulator's count when the payload carries one
    (a flex-start pool is RUNNING with none until capacity is granted), else GKE's
    ``initialNodeCount`` in each of its locations (the count is per zone)."""
    counted = pool.get(NODES_KEY)
    if counted is not None:
        return {str(zone): int(nodes) for zone, nodes in counted.items()}
    count = int(pool.get("initialNodeCount") or 0)
    return {str(zone): count for zone in list(pool.get("locations") or []) or [""]}
