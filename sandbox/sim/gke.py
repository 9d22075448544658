"""GKE in virtual time: a ``NodePoolAPI`` whose node-pool operations take minutes and are limited per cluster.

Creates and deletes start an operation that holds one of the cluster's ``op_limit`` slots for a
duration drawn from ``durations`` (seeded); beyond the limit a create is answered the way the
adapter reports GKE's "too many operations" (a ``TransientError``), and counted as wasted. Each
call adds ``latency`` seconds to the calling delivery's virtual duration. When an operation ends the
pool turns RUNNING (or disappears) and ``on_finished`` is told, which is where the finished-operation
log entries of a real cluster come from.

With a ``CapacityModel`` on the sim clock (``CapacityModel(sim.clock)``) TPU capacity is scarce the
way the HTTP emulator makes it (``sandbox.emulators.gke.capacity``): a create is refused at once
for quota (a ``RejectedError`` with code 403, as the adapter reports GKE's 403) or a reservation
(404 ``NotFoundError`` / 429 ``TransientError``); a create finishing without the chips leaves the
pool in ERROR with GKE's stockout text as ``status_message``; a flex-start pool is RUNNING with
``current_nodes=0`` until its whole slice fits (checked every ``flex_poll`` virtual seconds).
``stats.placements`` records, per accepted create, the kind and zones it asked for and its outcome.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable, Mapping

from sandbox.emulators.gke.capacity import (
    FLEX_START,
    ON_DEMAND,
    RESERVATION,
    SPOT,
    CapacityModel,
    Demand,
)
from sandbox.emulators.gke.quota import RequestQuota
from sandbox.emulators.gke.rules import TPU_MACHINES, ApiError
from sandbox.sim.engine import Simulation
from shared.cloud.errors import from_status
from shared.core.errors import (
    AlreadyExistsError,
    NotFoundError,
    TransientError,
)
from shared.tpu.nodepools import (
    STATUS_ERROR,
    STATUS_PROVISIONING,
    STATUS_RUNNING,
    STATUS_STOPPING,
    ClusterInfo,
    ClusterListing,
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
class Placement:
    """One accepted create under a capacity model: what it asked for and how it ended."""

    pool: str
    kind: str  # "on-demand", "spot", "flex-start" or "reservation"
    zones: tuple[str, ...]
    # "pending", then "running" or "stockout"; a flex-start pool "waiting", then "obtained" (or
    # "released" when deleted before it got its nodes)
    outcome: str = "pending"
    at: float = 0.0  # virtual time of the latest outcome
    asked: float = 0.0  # virtual time the create was accepted


def demand_for_spec(spec: NodePoolSpec, project: str = "") -> Demand | None:
    """The capacity a product ``NodePoolSpec`` asks for; None for a non-TPU machine type."""
    tpu = TPU_MACHINES.get(spec.machine_type)
    if tpu is None:
        return None
    if spec.flex_start:
        kind = FLEX_START
    elif spec.reservation is not None:
        kind = RESERVATION
    else:
        kind = SPOT if spec.spot else ON_DEMAND
    return Demand(
        pool=spec.name,
        kind=kind,
        zones=spec.node_locations,
        vms=spec.node_count,
        chips_per_vm=tpu.chips_per_vm,
        machine_type=spec.machine_type,
        generation=tpu.generation,
        project=project,
        reservation=spec.reservation.value if spec.reservation else "",
    )


@dataclasses.dataclass
class GkeStats:
    """What the simulated GKE saw."""

    creates: int = 0
    creates_accepted: int = 0
    wasted: int = 0  # creates answered with the operation-limit error
    deletes: int = 0
    max_in_flight: int = 0
    refused: int = 0  # creates refused by the capacity model (quota, reservation)
    placements: list[Placement] = dataclasses.field(default_factory=list)


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
        capacity: CapacityModel | None = None,
        project: str = "sim",
        flex_poll: float = 30.0,
        requests_per_minute: int = 0,
    ) -> None:
        """``requests_per_minute`` > 0 holds the project to GKE's API quota in virtual time (every
        call counted, as the HTTP emulator counts them; 0: no quota)."""
        self.sim = sim
        self.quota = RequestQuota(sim.clock, requests_per_minute)
        self.op_limit = op_limit
        self.durations = durations
        self.rng = random.Random(seed)
        self.latency = latency
        self.on_finished = on_finished
        self.pools: dict[str, NodePoolInfo] = {}
        self.running_at: dict[str, float] = {}
        self.in_flight: dict[str, str] = {}  # operation -> pool
        self.stats = GkeStats()
        self.capacity = capacity
        self.project = project
        self.flex_poll = flex_poll
        self._placement: dict[str, Placement] = {}
        self._polling = False
        self.spent = 0.0  # virtual seconds of API latency since the delivery started
        self._ops = itertools.count(1)

    def _call(self) -> None:
        self.spent += self.latency
        try:
            self.quota.admit(self.project)
        except ApiError as err:  # the adapter's translation of the 429 (not the operation limit)
            raise TransientError(f"GKE: {err.message}") from err

    def _too_many(self, cluster: str) -> str:
        text = TOO_MANY_OPERATIONS.format(cluster=cluster.rsplit("/", 1)[-1], limit=self.op_limit)
        return f"GKE create node pool: 429 {text}"

    def get_cluster(self, cluster: str) -> ClusterInfo:
        """A fixed cluster description."""
        self._call()
        return ClusterInfo(
            name=cluster.rsplit("/", 1)[-1], location="", endpoint="127.0.0.1", ca_certificate=""
        )

    def list_clusters(self, project: str) -> ClusterListing:
        """The simulator serves one cluster, found by name, never by a listing."""
        self._call()
        return ClusterListing()

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
            raise from_status(429, self._too_many(cluster))
        self._admit(cluster, spec)
        self.stats.creates_accepted += 1
        self.pools[spec.name] = NodePoolInfo(
            name=spec.name,
            status=STATUS_PROVISIONING,
            machine_type=spec.machine_type,
            node_count=spec.node_count,
            labels=dict(spec.labels),
            node_locations=spec.node_locations,
            tpu_topology=spec.placement.tpu_topology if spec.placement else "",
            placement_policy=spec.placement.policy_name if spec.placement else "",
            spot=spec.spot,
            reservation=spec.reservation.base if spec.reservation else "",
            reservation_place=spec.reservation.place if spec.reservation else "",
            flex_start=spec.flex_start,
        )

        def ready() -> None:
            if spec.name not in self.pools:
                return
            error = self._settle(cluster, spec.name)
            if error:
                self.pools[spec.name] = dataclasses.replace(
                    self.pools[spec.name], status=STATUS_ERROR, status_message=error
                )
                return
            current = 0 if spec.flex_start else None
            self.pools[spec.name] = dataclasses.replace(
                self.pools[spec.name], status=STATUS_RUNNING, current_nodes=current
            )
            self.running_at[spec.name] = self.sim.now

        return self._start(spec.name, ready)

    def delete_node_pool(self, cluster: str, name: str, why: str) -> str:
        """Start a delete (404 when the pool is unknown; 429 when no slot is free)."""
        self._call()
        if name not in self.pools:
            raise NotFoundError(f"404 node pool {name} not found")
        if len(self.in_flight) >= self.op_limit:
            raise from_status(429, self._too_many(cluster))
        self.stats.deletes += 1
        self.pools[name] = dataclasses.replace(self.pools[name], status=STATUS_STOPPING)

        def gone() -> None:
            self.pools.pop(name, None)
            if self.capacity is not None:
                self.capacity.release(f"{cluster}/nodePools/{name}")
            placement = self._placement.get(name)
            if placement is not None and placement.outcome in ("waiting", "pending"):
                placement.outcome, placement.at = "released", self.sim.now

        return self._start(name, gone)

    def set_node_pool_labels(
        self,
        cluster: str,
        name: str,
        labels: Mapping[str, str],
        why: str,
        resource_labels: Mapping[str, str] | None = None,
    ) -> str:
        """Replace the pool's node labels at once, holding a slot until the update operation ends
        (404 when the pool is unknown; 429 when no slot is free), as the HTTP emulator's UpdateNodePool."""
        self._call()
        if name not in self.pools:
            raise NotFoundError(f"404 node pool {name} not found")
        if len(self.in_flight) >= self.op_limit:
            raise from_status(429, self._too_many(cluster))
        self.pools[name] = dataclasses.replace(self.pools[name], labels=dict(labels))
        return self._start(name, lambda: None)

    def get_operation(self, operation: str) -> OperationInfo:
        """RUNNING while the operation holds its slot, DONE after."""
        self._call()
        return OperationInfo(name=operation, status="RUNNING" if operation in self.in_flight else "DONE")

    # -- capacity ---------------------------------------------------------------------------------

    def _admit(self, cluster: str, spec: NodePoolSpec) -> None:
        demand = demand_for_spec(spec, self.project)
        if self.capacity is None or demand is None:
            return
        try:
            self.capacity.admit(f"{cluster}/nodePools/{spec.name}", demand)
        except ApiError as err:
            self.stats.refused += 1
            # The adapter's translation of the same HTTP answer (shared.cloud.errors, one mapping).
            why = f"GKE create node pool {spec.name} in {cluster}: {err.message}"
            raise from_status(err.code, why, err.message) from err
        placement = Placement(spec.name, demand.kind, demand.zones, at=self.sim.now, asked=self.sim.now)
        self._placement[spec.name] = placement
        self.stats.placements.append(placement)

    def _settle(self, cluster: str, name: str) -> str:
        if self.capacity is None:
            return ""
        key = f"{cluster}/nodePools/{name}"
        error = self.capacity.settle(key) or ""
        placement = self._placement.get(name)
        if placement is not None:
            waiting = self.capacity.holding(key) == "waiting"
            placement.outcome = "stockout" if error else ("waiting" if waiting else "running")
            placement.at = self.sim.now
            if waiting:
                self._grant(cluster)
        return error

    def _grant(self, cluster: str) -> None:
        """Give waiting flex-start pools their nodes when the model has room; poll while any wait."""
        if self.capacity is None:
            return
        for key in self.capacity.poll():
            name = key.rsplit("/nodePools/", 1)[-1]
            demand = self.capacity.demand(key)
            if name in self.pools and demand is not None:
                self.pools[name] = dataclasses.replace(
                    self.pools[name], current_nodes=demand.vms, node_locations=demand.zones
                )
            placement = self._placement.get(name)
            if placement is not None:
                placement.outcome, placement.at = "obtained", self.sim.now
        waiting = any(p.outcome == "waiting" for p in self._placement.values())
        if waiting and not self._polling:
            self._polling = True

            def again() -> None:
                self._polling = False
                self._grant(cluster)

            self.sim.after(self.flex_poll, again)
