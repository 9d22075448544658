"""GKE in virtual time: a ``NodePoolAPI`` whose node-pool operations take minutes and are limited per cluster.

Creates and deletes start an operation that holds one of the cluster's ``op_limit`` slots for a
duration drawn from ``durations`` (seeded); beyond the limit a create is answered the way the
adapter reports GKE's "too many operations" (a ``TransientError``), and counted as wasted. Each
call adds ``latency`` seconds to the calling delivery's virtual duration. When an operation ends the
pool turns RUNNING (or disappears) and ``on_finished`` is told, which is where the finished-operation
log entries of a real cluster come from.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable

from sandbox.sim.engine import Simulation
from shared.core.errors import AlreadyExistsError, NotFoundError, OperationLimitError
from shared.tpu.nodepools import (
    STATUS_PROVISIONING,
    STATUS_RUNNING,
    STATUS_STOPPING,
    ClusterInfo,
    NodePoolInfo,
    NodePoolSpec,
    OperationInfo,
)

# GKE's answer beyond the quota (the text sandbox/emulators/gke/state.py sends), as the adapter raises it.
TOO_MANY_OPERATIONS = (
    'Too many operations: cluster "{cluster}" hits the concurrent operations quota {limit}, '
    "please try again later."
)


@dataclasses.dataclass
class GkeStats:
    """What the simulated GKE saw."""

    creates: int = 0
    creates_accepted: int = 0
    wasted: int = 0  # creates answered with the operation-limit error
    deletes: int = 0
    max_in_flight: int = 0


class SimGke:
    """``NodePoolAPI`` over virtual time."""

    def __init__(
        self,
        sim: Simulation,
        op_limit: int,
        durations: Callable[[random.Random], float],
        seed: int = 1,
        latency: float = 0.5,
        on_finished: Callable[[str, str], None] | None = None,
    ) -> None:
        self.sim = sim
        self.op_limit = op_limit
        self.durations = durations
        self.rng = random.Random(seed)
        self.latency = latency
        self.on_finished = on_finished
        self.pools: dict[str, NodePoolInfo] = {}
        self.running_at: dict[str, float] = {}
        self.in_flight: dict[str, str] = {}  # operation -> pool
        self.stats = GkeStats()
        self.spent = 0.0  # virtual seconds of API latency since the delivery started
        self._ops = itertools.count(1)

    def _call(self) -> None:
        self.spent += self.latency

    def _too_many(self, cluster: str) -> str:
        text = TOO_MANY_OPERATIONS.format(cluster=cluster.rsplit("/", 1)[-1], limit=self.op_limit)
        return f"GKE create node pool: 429 {text}"

    def get_cluster(self, cluster: str) -> ClusterInfo:
        """A fixed cluster description."""
        self._call()
        return ClusterInfo(
            name=cluster.rsplit("/", 1)[-1], location="", endpoint="127.0.0.1", ca_certificate=""
        )

    def list_node_pools(self, cluster: str) -> list[NodePoolInfo]:
        """Every pool, in name order."""
        self._call()
        return [self.pools[name] for name in sorted(self.pools)]

    def get_node_pool(self, cluster: str, name: str) -> NodePoolInfo:
        """One pool or NotFoundError."""
        self._call()
        if name not in self.pools:
            raise NotFoundError(f"404 node pool {name} not found")
        return self.pools[name]

    def _start(self, pool: str, finish: Callable[[], None]) -> str:
        operation = f"operation-{next(self._ops)}"
        self.in_flight[operation] = pool
        self.stats.max_in_flight = max(self.stats.max_in_flight, len(self.in_flight))

        def done() -> None:
            del self.in_flight[operation]
            finish()
            if self.on_finished is not None:
                self.on_finished(operation, pool)

        self.sim.after(self.durations(self.rng), done)
        return operation

    def create_node_pool(self, cluster: str, spec: NodePoolSpec, why: str) -> str:
        """Start a create, unless the pool exists (409) or every operation slot is taken (429)."""
        self._call()
        self.stats.creates += 1
        if spec.name in self.pools:
            raise AlreadyExistsError(f"409 node pool {spec.name} already exists")
        if len(self.in_flight) >= self.op_limit:
            self.stats.wasted += 1
            raise OperationLimitError(self._too_many(cluster))
        self.stats.creates_accepted += 1
        self.pools[spec.name] = NodePoolInfo(
            name=spec.name,
            status=STATUS_PROVISIONING,
            machine_type=spec.machine_type,
            node_count=spec.node_count,
            labels=dict(spec.labels),
            node_locations=spec.node_locations,
            tpu_topology=spec.placement.tpu_topology if spec.placement else "",
        )

        def ready() -> None:
            if spec.name in self.pools:
                self.pools[spec.name] = dataclasses.replace(self.pools[spec.name], status=STATUS_RUNNING)
                self.running_at[spec.name] = self.sim.now

        return self._start(spec.name, ready)

    def delete_node_pool(self, cluster: str, name: str, why: str) -> str:
        """Start a delete (404 when the pool is unknown; 429 when no slot is free)."""
        self._call()
        if name not in self.pools:
            raise NotFoundError(f"404 node pool {name} not found")
        if len(self.in_flight) >= self.op_limit:
            raise OperationLimitError(self._too_many(cluster))
        self.stats.deletes += 1
        self.pools[name] = dataclasses.replace(self.pools[name], status=STATUS_STOPPING)
        return self._start(name, lambda: self.pools.pop(name, None))

    def get_operation(self, operation: str) -> OperationInfo:
        """RUNNING while the operation holds its slot, DONE after."""
        self._call()
        return OperationInfo(name=operation, status="RUNNING" if operation in self.in_flight else "DONE")
