"""The GKE emulator's side of capacity: which ``CapacityModel`` demand a NodePool message makes, and
how many nodes each pool has.

GKE's ``NodePool`` (v1) has no field for the number of nodes a pool has right now (only
``initialNodeCount`` and the autoscaling bounds), so the current size is kept here, emulator-
internal: ``GkeState.node_counts`` reads it, and the pool dicts handed to the ready/updated hooks
carry it under ``hooks.NODES_KEY`` as ``{zone: nodes}`` (never sent over HTTP). An ordinary pool has
``initialNodeCount`` nodes in each of its zones once its create is DONE; a flex-start pool has none
until the model grants its whole slice.
"""

from __future__ import annotations

import threading
from typing import Any

from sandbox.emulators.gke.capacity import (
    FLEX_START,
    ON_DEMAND,
    RESERVATION,
    SPOT,
    CapacityModel,
    Demand,
)
from sandbox.emulators.gke.hooks import NODES_KEY
from sandbox.emulators.gke.rules import RESERVATION_SPECIFIC, TPU_MACHINES


def demand_for(pool: Any, project: str) -> Demand | None:
    """The capacity a parsed ``NodePool`` message asks for; None for a non-TPU pool."""
    machine_type = pool.config.machine_type
    tpu = TPU_MACHINES.get(machine_type)
    if tpu is None:
        return None
    config = pool.config
    reservation = ""
    if config.flex_start:
        kind = FLEX_START
        # Made empty; the autoscaler's maximum is the slice (GKE's total_* bound the whole pool).
        vms = pool.autoscaling.total_max_node_count or pool.autoscaling.max_node_count
    else:
        vms = pool.initial_node_count
        if config.reservation_affinity.consume_reservation_type == RESERVATION_SPECIFIC:
            kind, reservation = RESERVATION, next(iter(config.reservation_affinity.values), "")
        else:
            kind = SPOT if (config.spot or config.preemptible) else ON_DEMAND
    return Demand(
        pool=pool.name,
        kind=kind,
        zones=tuple(pool.locations),
        vms=vms,
        chips_per_vm=tpu.chips_per_vm,
        machine_type=machine_type,
        generation=tpu.generation,
        project=project,
        reservation=reservation,
    )


class PoolCapacity:
    """Capacity admission, settlement and node counts for the pools of a ``GkeState``."""

    def __init__(self, model: CapacityModel) -> None:
        self.model = model
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, int]] = {}  # pool key -> {zone: nodes}

    def admit(self, key: str, pool: Any, project: str) -> None:
        """Synchronous checks of a create (reservation, quota); raises ``ApiError``."""
        demand = demand_for(pool, project)
        if demand is not None:
            self.model.admit(key, demand)

    def created(self, key: str, pool: Any) -> str:
        """The create of ``pool`` is DONE: "" when it runs, else the stockout message."""
        error = self.model.settle(key)
        if error:
            return error
        demand = self.model.demand(key)
        nodes = {} if demand is not None and demand.kind == FLEX_START else self._initial(pool)
        with self._lock:
            self._nodes[key] = nodes
        return ""

    def failed(self, key: str) -> None:
        """The create ended in ERROR for another reason (an armed stockout fault)."""
        self.model.release(key)

    def deleted(self, key: str) -> None:
        """The pool is gone."""
        self.model.release(key)
        with self._lock:
            self._nodes.pop(key, None)

    def poll(self) -> list[str]:
        """Keys of the flex-start pools that got their nodes just now."""
        granted = []
        for key in self.model.poll():
            demand = self.model.demand(key)
            if demand is None:
                continue
            with self._lock:
                self._nodes[key] = {zone: demand.vms for zone in demand.zones}
            granted.append(key)
        return granted

    def nodes(self, key: str) -> dict[str, int]:
        """The pool's current nodes per zone ({} while it has none)."""
        with self._lock:
            return dict(self._nodes.get(key, {}))

    def snapshot(self, key: str, pool_json: dict[str, Any]) -> dict[str, Any]:
        """A hook payload: the pool's GKE JSON plus its current nodes under ``NODES_KEY``."""
        return {**pool_json, NODES_KEY: self.nodes(key)}

    @staticmethod
    def _initial(pool: Any) -> dict[str, int]:
        return {zone: pool.initial_node_count for zone in pool.locations}
