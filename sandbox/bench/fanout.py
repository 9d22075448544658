"""Fan-out under GKE's pace: one pending-pod event of a wide JobSet against a GKE that answers slowly.

The GKE emulator holds every CreateNodePool for ``create_latency`` seconds (real GKE: about 0.5-2 s),
runs operations for minutes (TPU pools) and allows ``op_limit`` running operations per cluster,
answering GKE's 429 beyond it. One pending-pod event is delivered to the provision function
(functions-framework in-process, real clients over HTTP); a non-2xx answer is redelivered at once, as
Pub/Sub would after its backoff. The figure is the time from the first delivery until GKE accepted
every create, and how many creates GKE refused on the way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sandbox.bench import env as bench_env
from sandbox.bench.env import BenchEnv
from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.app import entry

MAX_DELIVERIES = 50


@dataclass(frozen=True)
class FanOutShape:
    """One JobSet of ``slices`` single-host slices; GKE's pace and limit; the product's concurrency."""

    slices: int = 64
    create_latency: float = 0.5
    op_limit: int = 64
    concurrency: int = 8  # CREATE_CONCURRENCY


@dataclass
class FanOutResult:
    """What the fan-out cost."""

    shape: FanOutShape
    deliveries: int  # the first one plus redeliveries until a 2xx
    creates_sent: int
    creates_accepted: int
    too_many_operations: int  # creates answered 429
    incompatible_operation: int  # creates answered 400 FAILED_PRECONDITION
    max_in_flight: int  # creates GKE was serving at the same time, at most
    seconds_to_all_accepted: float  # first delivery until the last create was accepted (inf: never)


def run(env: BenchEnv, shape: FanOutShape) -> FanOutResult:
    """Deliver one pending-pod event of a ``shape.slices``-slice JobSet until the function answers 2xx."""
    _, pods = env.submit(tpu_jobset("wide", "team-a", replicas=shape.slices, topology="2x2", chips_per_vm=4))
    gke = env.gke
    gke.set_operation_limit(shape.op_limit)
    gke.set_op_durations(600.0)  # multi-minute TPU pool operations: no slot frees during the run
    gke.set_latency(shape.create_latency, ("create",))
    entry.reset_runtime(env.settings.with_overrides(create_concurrency=shape.concurrency))
    before_sent, before_ok = gke.count("create"), gke.answered("create", 200)
    try:
        fn = FunctionClient("provision", project=bench_env.PROJECT)
        delivery = bench_env.pending_entry(pods[0])
        started = time.perf_counter()
        accepted_at = float("inf")
        deliveries = 0
        while deliveries < MAX_DELIVERIES:
            deliveries += 1
            status = fn.post_entry(delivery).status_code
            if gke.answered("create", 200) - before_ok >= shape.slices and accepted_at == float("inf"):
                accepted_at = time.perf_counter()
            if 200 <= status < 300:
                break
        return FanOutResult(
            shape=shape,
            deliveries=deliveries,
            creates_sent=gke.count("create") - before_sent,
            creates_accepted=gke.answered("create", 200) - before_ok,
            too_many_operations=gke.answered("create", 429),
            incompatible_operation=gke.answered("create", 400),
            max_in_flight=gke.max_in_flight("create"),
            seconds_to_all_accepted=accepted_at - started,
        )
    finally:
        entry.reset_runtime(None)
        gke.set_latency(None)
        gke.set_operation_limit(0)
        gke.set_op_durations(None)
