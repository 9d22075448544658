"""Quota reservation to all slices ready under the admission check, in virtual time.

The product's ``AdmissionChecker`` runs against the virtual-time GKE (``sandbox.sim.gke.SimGke``:
pool creates take minutes, at most ``op_limit`` operations run per cluster, 429 beyond) and the
stateful Kubernetes fake holding the Workload, its JobSet and the flavor. The deliveries a cluster
would make are scheduled on the virtual clock: Kueue's ``QuotaReserved`` Event ``sink_delay``
seconds after the reservation, a finished create's audit entry ``sink_delay`` after it ends (the
pool's Nodes register Ready with it), and a redelivery ``redelivery`` seconds after a delivery that
asked for one. The figure is the virtual time from the reservation to the check's ``Ready``.

Three more figures for ``make bench`` (``sandbox.bench.runner``): today's pending-pod path for the
same S (``sandbox.sim.scenario``: pods pending, FailedScheduling through the sink, then creates) to
compare with; the fan-out's pace at ``create_latency`` seconds per CreateNodePool (time to all creates
accepted, the busiest minute's calls against GKE's per-minute API quota, which the simulated GKE
enforces, and the most operations GKE ran at once against its limit, which the product learns from
GKE's refusals); and a stockout of some slices (the Workload's check turns ``Retry``, which is when
Kueue releases its quota).

    python -m sandbox.bench.admission
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import random
import sys
from typing import Any, TextIO

from sandbox.emulators.gke.capacity import CapacityModel
from sandbox.jobsets import tpu_jobset
from sandbox.sim import scenario
from sandbox.sim.engine import Simulation
from sandbox.sim.gke import SimGke
from sandbox.testing.fakes import FakeKube
from shared.core import labels, logs
from shared.core.settings import Settings
from shared.provisioning.admission.check import AdmissionChecker, CheckResult
from shared.provisioning.services import Services

SETTINGS = Settings(
    unlimited_spending=True, project_id="sim", location="us-east5-b", cluster_name="c", create_concurrency=8
)


@dataclasses.dataclass(frozen=True)
class Shape:
    slices: int
    op_limit: int = 20
    create_seconds: tuple[float, float] = (240.0, 360.0)  # a TPU pool create: four to six minutes
    sink_delay: float = 5.0  # Cloud Logging -> Pub/Sub -> function
    redelivery: float = 10.0  # Pub/Sub's minimum backoff in infra
    # Seconds GKE takes to answer one CreateNodePool (0: at once). The product's fan-out sends its
    # creates in rounds (shared.provisioning.create.slots), each waiting for the last, so with equal
    # latencies a call of a delivery's r-th round (from 1) is answered r x latency after it started.
    create_latency: float = 0.0
    stocked_out: int = 0  # slices the zone has no on-demand capacity for (their pools go to ERROR)


@dataclasses.dataclass(frozen=True)
class Result:
    shape: Shape
    seconds_to_ready: float
    creates_accepted: int
    creates_refused: int  # answered "too many operations"
    deliveries: int
    seconds_to_all_accepted: float = math.inf  # reservation until GKE accepted the S-th create
    busiest_minute_calls: int = 0  # CreateNodePool calls in the busiest 60 s window
    seconds_to_retry: float = math.inf  # reservation until the check said Retry (quota released)
    stockout_to_retry: float = math.inf  # the stocked-out pool's ERROR until the check said Retry
    requeue_after: int = 0  # the Retry's requeueAfterSeconds
    deadline_reached: bool = False  # a fan-out call would have started past the delivery's deadline
    quota_refused: int = 0  # calls GKE refused for the project's per-minute API quota
    busiest_minute_requests: int = 0  # every GKE call (reads too) in the busiest 60 s, as GKE counts
    max_operations: int = 0  # the most operations GKE ran at once
    learnt_limit: int | None = None  # the operation limit the product holds at the end
    widest_round: int = 0  # the most creates one round sent


def _workload(slices: int) -> tuple[dict[str, Any], dict[str, Any]]:
    jobset = tpu_jobset(
        "train",
        "team-a",
        replicas=slices,
        topology="2x4",
        accelerator="tpu-v5-lite-podslice",
        chips_per_vm=4,
        uid="js-uid",
    )
    jobset["spec"]["suspend"] = True
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "jobset-train-0",
            "namespace": "team-a",
            "uid": "wl-uid",
            "ownerReferences": [{"kind": "JobSet", "name": "train", "uid": "js-uid", "controller": True}],
        },
        "spec": {"podSets": [{"name": "slice", "count": 2 * slices}]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admission": {
                "clusterQueue": "q",
                "podSetAssignments": [
                    {"name": "slice", "flavors": {labels.TPU_RESOURCE: "vlp"}, "count": 2 * slices}
                ],
            },
            "admissionChecks": [{"name": SETTINGS.admission_check_name, "state": "Pending", "message": ""}],
        },
    }
    return jobset, workload


def run(shape: Shape, seed: int = 1) -> Result:
    """One Workload through the check; its decision lines go nowhere (hundreds of them at S=256)."""
    logs.configure(stream=io.StringIO(), level=logging.ERROR)
    try:
        return _run(shape, seed)
    finally:
        logs.configure()


def _run(shape: Shape, seed: int) -> Result:
    sim = Simulation()
    kube = FakeKube()
    jobset, workload = _workload(shape.slices)
    kube.add_jobset(jobset)
    kube.add_workload(workload)
    kube.flavors["vlp"] = {"spec": {"nodeLabels": {}}}
    deliveries = [0]
    ready_at: list[float] = []
    retry: list[tuple[float, int]] = []
    calls: list[float] = []  # when each CreateNodePool was answered
    accepted: list[float] = []
    past_deadline = [False]

    # One warm function instance: what it learnt from GKE (the operation limit) stays.
    checker: list[AdmissionChecker] = []

    def deliver(look: str) -> None:
        deliveries[0] += 1
        if not checker:
            checker.append(AdmissionChecker(Services(SETTINGS, gke, kube, wall_clock=sim.clock)))
        check = checker[0]
        rounds[0] = check.pools.slots.rounds
        per_round.clear()
        if look == "QuotaReserved":
            results: list[CheckResult] = [check.handle("team-a", "jobset-train-0", look)]
        else:
            results = check.sweep(look)
        if any(r.state == "Ready" for r in results) and not ready_at:
            ready_at.append(sim.now)
        for r in results:
            if r.state == "Retry" and not retry:
                status = kube.workloads[("team-a", "jobset-train-0")]["status"]
                mine = [c for c in status["admissionChecks"] if c["name"] == SETTINGS.admission_check_name]
                retry.append((sim.now, int(mine[0].get("requeueAfterSeconds", 0))))
        # As the provision handler: a finished create whose Workload waits only for Nodes is redelivered.
        if look != "QuotaReserved" and any(r.waiting_for_nodes for r in results):
            sim.after(shape.redelivery, lambda: deliver(look))

    def finished(_operation: str, pool: str) -> None:
        info = gke.pools.get(pool)
        if info is not None and info.status == "RUNNING":
            kube.add_pool_nodes(info)
        sim.after(shape.sink_delay, lambda: deliver(f"CreateNodePool of {pool} finished"))

    rng = random.Random(seed)
    low, high = shape.create_seconds
    gke = SimGke(
        sim,
        shape.op_limit,
        lambda r: r.uniform(low, high),
        seed=rng.randrange(1 << 30),
        on_finished=finished,
        requests_per_minute=GKE_REQUESTS_PER_MINUTE,
    )
    if shape.stocked_out:
        capacity = CapacityModel(sim.clock)
        # A slice of v5e 2x4 is 8 chips: the zone holds every slice but the stocked-out ones.
        capacity.set(SETTINGS.location, "on-demand", 8 * (shape.slices - shape.stocked_out))
        gke.capacity = capacity
    create = gke.create_node_pool

    rounds = [0, 0]  # rounds of this instance when the delivery started; the widest round
    per_round: dict[int, int] = {}

    def timed_create(cluster: str, spec: Any, why: str) -> str:
        # Threads of the product's fan-out call this; its round decides when the call is answered.
        r = checker[0].pools.slots.rounds - rounds[0]
        per_round[r] = per_round.get(r, 0) + 1
        rounds[1] = max(rounds[1], per_round[r])
        started = (r - 1) * shape.create_latency
        past_deadline[0] = past_deadline[0] or started >= SETTINGS.request_deadline_seconds
        answered = sim.now + started + shape.create_latency
        calls.append(answered)
        operation = create(cluster, spec, why)
        accepted.append(answered)
        return operation

    gke.create_node_pool = timed_create  # type: ignore[method-assign]
    sim.after(shape.sink_delay, lambda: deliver("QuotaReserved"))
    sim.run(until=6 * 3600, stop=lambda: bool(ready_at) or bool(retry))
    calls.sort()
    failed = sorted(p.at for p in gke.stats.placements if p.outcome == "stockout")
    busiest = max((sum(1 for t in calls if a <= t < a + 60.0) for a in calls), default=0)
    return Result(
        shape,
        ready_at[0] if ready_at else math.inf,
        gke.stats.creates_accepted,
        gke.stats.wasted,
        deliveries[0],
        seconds_to_all_accepted=sorted(accepted)[shape.slices - 1]
        if len(accepted) >= shape.slices
        else math.inf,
        busiest_minute_calls=busiest,
        seconds_to_retry=retry[0][0] if retry else math.inf,
        stockout_to_retry=retry[0][0] - failed[0] if retry and failed else math.inf,
        requeue_after=retry[0][1] if retry else 0,
        deadline_reached=past_deadline[0],
        quota_refused=gke.quota.refused(),
        busiest_minute_requests=gke.quota.busiest_minute(gke.project),
        max_operations=gke.stats.max_in_flight,
        learnt_limit=checker[0].pools.slots.operation_limit if checker else None,
        widest_round=rounds[1],
    )


def pending_pod_path(slices: int, op_limit: int = 20, seed: int = 1) -> float:
    """Today's path for the same S: first pending pod to all pools RUNNING (pools of 4-6 min)."""
    result = scenario.run(
        scenario.SimConfig(slices=slices, op_limit=op_limit, op_minutes=5.0, seed=seed),
        resume=lambda provisioner: provisioner.resume(),
    )
    return math.inf if result.makespan is None else result.makespan


READY_SLICES = (1, 4, 16)  # within GKE's operation limit: one fan-out, one create time
FANOUT_SLICES = (64, 256)
# GKE's "Quotas and limits": the Kubernetes Engine API's default rate limit, per project.
GKE_REQUESTS_PER_MINUTE = 3000
LEARNT_LIMIT = 100  # a GKE operation limit below S, unknown to the product until GKE's 429 names it


def slow_start_rounds(slices: int, settings: Settings = SETTINGS) -> int:
    """Rounds a fan-out of ``slices`` creates takes when GKE accepts every one: the first is
    CREATE_CONCURRENCY wide, each next one twice as wide, none wider than CREATE_CONCURRENCY_MAX."""
    width = min(settings.create_concurrency, settings.create_concurrency_max)
    rounds = 0
    while slices > 0:
        slices -= width
        rounds += 1
        width = min(2 * width, settings.create_concurrency_max)
    return rounds


def measure_all() -> dict[str, Any]:
    """The ``make bench`` part: reservation to Ready vs the pending-pod path, the fan-out's pace at
    1 s per create (GKE's operation limit >= S, so only the product's fan-out bounds it), and one
    stocked-out slice of four. JSON-safe."""
    ready = []
    for slices in READY_SLICES:
        result = run(Shape(slices))
        today = pending_pod_path(slices)
        ready.append(
            {
                "slices": slices,
                "check_s": _finite(result.seconds_to_ready),
                "pending_pod_path_s": _finite(today),
                "creates_accepted": result.creates_accepted,
            }
        )
    fanout = []
    for slices, op_limit in [(s, s) for s in FANOUT_SLICES] + [(FANOUT_SLICES[-1], LEARNT_LIMIT)]:
        result = run(Shape(slices, op_limit=op_limit, create_latency=1.0))
        fanout.append(
            {
                "slices": slices,
                "create_latency_s": 1.0,
                "concurrency": SETTINGS.create_concurrency,
                "widest": SETTINGS.create_concurrency_max,
                "widest_round": result.widest_round,
                "rounds_bound": slow_start_rounds(slices),
                "op_limit": op_limit,
                "learnt_limit": result.learnt_limit,
                "max_operations": result.max_operations,
                "all_accepted_s": _finite(result.seconds_to_all_accepted),
                "busiest_minute_calls": result.busiest_minute_calls,
                "busiest_minute_requests": result.busiest_minute_requests,
                "refused_429": result.creates_refused,
                "quota_refused": result.quota_refused,
                "past_deadline": result.deadline_reached,
            }
        )
    stock = run(Shape(4, stocked_out=1))
    stockout = {
        "slices": 4,
        "stocked_out": 1,
        "reservation_to_retry_s": _finite(stock.seconds_to_retry),
        "stockout_to_retry_s": _finite(stock.stockout_to_retry),
        "requeue_after_s": stock.requeue_after,
        "backoff_step_s": SETTINGS.stockout_backoff_seconds,
        "creates": stock.creates_accepted + stock.creates_refused,
    }
    return {"ready": ready, "fanout": fanout, "stockout": stockout, "shape": dataclasses.asdict(Shape(0))}


def _finite(value: float) -> float | None:
    return round(value, 1) if math.isfinite(value) else None


def main(out: TextIO = sys.stdout) -> int:
    print("slices  op_limit  reservation->Ready  creates accepted  refused (429)  deliveries", file=out)
    for slices in (1, 4, 16, 64):
        result = run(Shape(slices))
        minutes = result.seconds_to_ready / 60
        print(
            f"{slices:6d}  {result.shape.op_limit:8d}  {minutes:15.1f} min  {result.creates_accepted:16d}  "
            f"{result.creates_refused:13d}  {result.deliveries:10d}",
            file=out,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
