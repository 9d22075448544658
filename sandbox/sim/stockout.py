"""A stockout in virtual time: one JobSet whose slices meet exhausted capacity, hours compressed.

The real ``Provisioner`` and ``Reconciler`` run against ``SimGke`` with a ``CapacityModel`` on the
simulation clock: Spot capacity in the zone is empty for ``outage_minutes`` and then refills;
on-demand capacity is available or not. The scheduler repeats FailedScheduling for each pending
pod every 5 minutes, reconcile sweeps every 5 minutes, and each finished node-pool operation reaches
the product's resume entry point after the export delay, as the cluster's audit log does. What is
measured is what a user pays and waits: accepted creates per slice, when each slice landed, and on
which capacity.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging

from sandbox.emulators.gke.capacity import CapacityModel
from sandbox.jobsets import tpu_jobset
from sandbox.sim.engine import Simulation
from sandbox.sim.gke import SimGke
from sandbox.sim.push_delivery import SimSubscription
from sandbox.sim.scheduler import schedule
from sandbox.testing.fakes import FakeKube
from shared.core import labels, logs
from shared.core.errors import TransientError
from shared.core.settings import Settings
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods

ZONE = "us-central2-b"


@dataclasses.dataclass(frozen=True)
class StockoutConfig:
    """One simulated stockout."""

    policy: str = ""  # the JobSet's tpuprov.dev/capacity-policy ("" = none)
    select_spot: bool = True  # the pods select cloud.google.com/gke-spot=true
    slices: int = 1
    outage_minutes: float = 20.0  # Spot in ZONE is empty this long, then unlimited
    on_demand: bool = True  # on-demand capacity in ZONE (False: empty for the whole run)
    op_minutes: float = 2.0  # how long a create or delete runs in GKE
    failed_scheduling_every: float = 300.0
    reconcile_period: float = 300.0
    export_delay: float = 5.0
    horizon_hours: float = 6.0
    seed: int = 1


@dataclasses.dataclass(frozen=True)
class StockoutResult:
    """What the run cost and when the JobSet landed."""

    config: StockoutConfig
    creates: int  # creates GKE accepted
    creates_first_hour: int
    landed_at: float | None  # seconds until every slice's pool was RUNNING (None: never)
    kinds: tuple[str, ...]  # the capacity of every accepted create, in order
    landed_on: tuple[str, ...]  # the capacity the RUNNING pools use
    max_pools_per_slice: int


def run(config: StockoutConfig) -> StockoutResult:
    """Simulate the stockout (decision logs are dropped: thousands of lines)."""
    logs.configure(stream=io.StringIO(), level=logging.ERROR)
    try:
        return _run(config)
    finally:
        logs.configure()


def _run(config: StockoutConfig) -> StockoutResult:
    sim = Simulation()
    settings = Settings(
        unlimited_spending=True,
        project_id="sim",
        location=ZONE,
        cluster_name="sim",
        create_concurrency=1,
        cordon_settle_seconds=0,
        node_locations=(ZONE,),
    )
    capacity = CapacityModel(sim.clock)
    capacity.set(ZONE, "spot", 0, until=config.outage_minutes * 60.0, then=None)
    if not config.on_demand:
        capacity.set(ZONE, "on-demand", 0)
    kube = FakeKube()
    selectors = {labels.SPOT: "true"} if config.select_spot else None
    annotations = {labels.CAPACITY_POLICY: config.policy} if config.policy else None
    jobset = tpu_jobset(
        "scarce",
        replicas=config.slices,
        accelerator="tpu-v5-lite-podslice",
        topology="2x4",
        selectors=selectors,
        annotations=annotations,
    )
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    most = [0]

    def finished(operation: str, pool: str) -> None:
        subscription.publish(("op-finished", pool))

    base = config.op_minutes * 60.0
    gke = SimGke(
        sim, 100, lambda rng: base * (1 + rng.uniform(-0.2, 0.2)), config.seed, 0.5, finished, capacity, "sim"
    )
    provisioner = Provisioner(
        Services(settings, gke, kube, known_pool_ttl=30.0, clock=sim.clock, wall_clock=sim.clock)
    )
    reconciler = Reconciler(Services(settings, gke, kube, wall_clock=sim.clock))

    def deliver(message: tuple[str, ...]) -> None:
        if message[0] == "pod":
            provisioner.handle_pending_pod(message[1], message[2], None)
        else:
            provisioner.resume(message[1])
        most[0] = max(most[0], _pools_per_slice(gke))

    subscription = SimSubscription(sim, deliver, delay=config.export_delay)

    def sweep() -> None:
        with contextlib.suppress(TransientError):
            reconciler.sweep()
        most[0] = max(most[0], _pools_per_slice(gke))
        sim.after(config.reconcile_period, sweep)

    schedule(sim, kube, gke, pods, subscription.publish, config.failed_scheduling_every)
    sim.at(config.reconcile_period, sweep)

    def landed() -> bool:
        return sum(1 for p in gke.pools.values() if p.status == "RUNNING") >= config.slices

    sim.run(config.horizon_hours * 3600.0, stop=landed)
    placements = gke.stats.placements
    return StockoutResult(
        config=config,
        creates=len(placements),
        creates_first_hour=sum(1 for p in placements if p.asked < 3600.0),
        landed_at=sim.now if landed() else None,
        kinds=tuple(p.kind for p in placements),
        landed_on=tuple(
            sorted(
                "spot" if p.spot else "flex-start" if p.flex_start else "on-demand"
                for p in gke.pools.values()
            )
        ),
        max_pools_per_slice=most[0],
    )


def _pools_per_slice(gke: SimGke) -> int:
    # Pool names are per slice, so two pools of one slice at once would need two names: count pools
    # per owner slice label to catch that.
    seen: dict[tuple[str, str], int] = {}
    for pool in gke.pools.values():
        key = (pool.labels.get(labels.OWNER_REPLICATED_JOB, ""), pool.labels.get(labels.OWNER_JOB_INDEX, ""))
        seen[key] = seen.get(key, 0) + 1
    return max(seen.values(), default=0)


__all__ = ["StockoutConfig", "StockoutResult", "run"]
