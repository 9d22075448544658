"""One S-slice JobSet from its first pending pod to all S pools RUNNING, in virtual time.

The real ``Provisioner`` (one warm instance, as Cloud Run keeps one) handles every delivery of the
pending-pods subscription; the real ``Reconciler`` sweeps every ``reconcile_period``; the scheduler
repeats FailedScheduling for each pod whose pool is not RUNNING yet; a pod binds when its pool is
RUNNING. When ``finished_ops`` is on, each finished node-pool operation is published to the
provision path as the cluster's audit log would (after ``export_delay``) and handled by the
product's resume entry point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import math
import random
from collections.abc import Callable
from typing import Any

from sandbox.jobsets import tpu_jobset
from sandbox.sim.engine import Simulation
from sandbox.sim.gke import SimGke
from sandbox.sim.push_delivery import SimSubscription
from sandbox.sim.scheduler import schedule
from sandbox.testing.fakes import FakeKube
from shared.core import logs
from shared.core.errors import TransientError
from shared.core.settings import Settings
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods

PROVISION_TIMEOUT = 60.0  # infra: the provision service's request timeout


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """One simulated run."""

    slices: int
    op_limit: int
    op_minutes: float = 5.0
    op_jitter: float = 0.2  # +- fraction of the duration, uniform (operations do not all take D)
    latency: float = 0.5  # seconds per GKE call
    # kube-scheduler retries an unschedulable pod at least every podMaxInUnschedulablePodsDuration
    # (5 minutes by default) and on cluster changes; each failed attempt is a FailedScheduling.
    failed_scheduling_every: float = 300.0
    reconcile_period: float = 300.0
    export_delay: float = 5.0  # log entry -> sink -> Pub/Sub -> push
    finished_ops: bool = True
    seed: int = 1
    horizon_hours: float = 48.0


@dataclasses.dataclass(frozen=True)
class SimResult:
    """What ``run`` measured."""

    config: SimConfig
    makespan: float | None  # seconds from the first pending pod to all pools RUNNING (None: never)
    lower_bound: float  # ceil(S / C) x D
    creates_accepted: int
    wasted: int  # creates answered "too many operations"
    dead_lettered: int
    deliveries: int
    max_in_flight: int
    longest_delivery: float  # virtual seconds of API latency in one delivery

    @property
    def ratio(self) -> float | None:
        """Makespan over the lower bound."""
        return None if self.makespan is None else self.makespan / self.lower_bound

    @property
    def waves(self) -> int:
        """ceil(S / C): how many rounds of operations the lower bound assumes."""
        return math.ceil(self.config.slices / self.config.op_limit)


def _durations(config: SimConfig) -> Callable[[random.Random], float]:
    base = config.op_minutes * 60.0

    def draw(rng: random.Random) -> float:
        return base * (1.0 + rng.uniform(-config.op_jitter, config.op_jitter))

    return draw


def run(config: SimConfig, resume: Callable[[Provisioner], Any] | None = None) -> SimResult:
    """Simulate; ``resume(provisioner)`` is the product's handler for a finished-operation event."""
    # Thousands of deliveries would print thousands of decision lines: keep only errors, elsewhere.
    logs.configure(stream=io.StringIO(), level=logging.ERROR)
    try:
        return _run(config, resume)
    finally:
        logs.configure()


def _run(config: SimConfig, resume: Callable[[Provisioner], Any] | None) -> SimResult:
    sim = Simulation()
    # Creates go one at a time: in virtual time GKE answers at once, and threads racing a real clock
    # would make the count of refused creates depend on this machine's load. Deployed, a fan-out of
    # CREATE_CONCURRENCY can meet up to that many 429s in the first wave, before the quota is known.
    settings = Settings(
        unlimited_spending=True,
        project_id="sim",
        location="us-central2-b",
        cluster_name="sim",
        create_concurrency=1,
    )
    kube = FakeKube()
    jobset = tpu_jobset("big", replicas=config.slices, accelerator="tpu-v5-lite-podslice", topology="2x2")
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    longest = [0.0]
    provision_sub: SimSubscription

    def finished(operation: str, pool: str) -> None:
        if config.finished_ops and resume is not None:
            provision_sub.publish(("op-finished", operation, pool))

    gke = SimGke(sim, config.op_limit, _durations(config), config.seed, config.latency, finished)
    provisioner = Provisioner(Services(settings, gke, kube, known_pool_ttl=30.0, clock=sim.clock))
    reconciler = Reconciler(Services(settings, gke, kube))

    def timed(call: Callable[[], Any]) -> None:
        gke.spent = 0.0
        try:
            call()
        finally:
            longest[0] = max(longest[0], gke.spent)
        if gke.spent > PROVISION_TIMEOUT:  # Cloud Run cut the request off: Pub/Sub redelivers
            raise TransientError(f"request ran {gke.spent:.0f}s, past the {PROVISION_TIMEOUT:.0f}s timeout")

    def provision(message: tuple[str, str, str]) -> None:
        kind, first, second = message
        if kind == "pod":
            timed(lambda: provisioner.handle_pending_pod(first, second, None))
        elif resume is not None:
            timed(lambda: resume(provisioner))

    provision_sub = SimSubscription(sim, provision, delay=config.export_delay)

    def sweep() -> None:
        with contextlib.suppress(TransientError):  # the scheduler tick comes again anyway
            timed(reconciler.sweep)
        sim.after(config.reconcile_period, sweep)

    schedule(sim, kube, gke, pods, provision_sub.publish, config.failed_scheduling_every)
    sim.at(config.reconcile_period, sweep)

    def all_running() -> bool:
        return len(gke.running_at) >= config.slices

    sim.run(config.horizon_hours * 3600.0, stop=all_running)
    makespan = max(gke.running_at.values()) if all_running() else None
    return SimResult(
        config=config,
        makespan=makespan,
        lower_bound=math.ceil(config.slices / config.op_limit) * config.op_minutes * 60.0,
        creates_accepted=gke.stats.creates_accepted,
        wasted=gke.stats.wasted,
        dead_lettered=provision_sub.stats.dead_lettered,
        deliveries=provision_sub.stats.deliveries,
        max_in_flight=gke.stats.max_in_flight,
        longest_delivery=longest[0],
    )
