"""The benchmark's MultiKueue part: one region stocked out, the other has the capacity.

A ``RealStack`` of three control planes runs Kueue v0.19.2's real MultiKueue: the managed cluster
is the manager and ``west`` and ``central`` are its workers (``sandbox.realstack.multikueue``), with
``MULTIKUEUE_MANAGER`` set as deployed. ``west`` comes first in the fleet's order but has no
on-demand v5e. A 2-slice JobSet is submitted to the manager. GKE's operations take ``D`` seconds,
and GKE says a zone is stocked out only when the create operation ends.

The physical floor is therefore ``2 x D``: one failed attempt, which must run for ``D`` before GKE
says no, then one ``D`` for the creates in ``central``.

Measured:
- seconds from submission until every slice's pool is RUNNING in the worker that ran the job
  (the GKE emulator's pool-ready hook);
- create requests per worker (the emulator's call log);
- pool-seconds spent in the worker that did not run the job, sampled every 0.25 s from GKE's
  listing;
- pools leaked and pods killed;
- then a second JobSet of the same shape, with ``west`` still stocked out: seconds until its slices
  are RUNNING (floor ``1 x D``: the fleet remembers the shape short in ``west`` on the manager's
  MultiKueueCluster, so no attempt is spent there) and its creates in ``west`` (goal 0).

For comparison: where both workers have the capacity, a provisioning check in every worker that
bought before admission would run ``slices`` slices in the losing worker for at least a create and
a delete (``2 x D`` each) before throwing them away. That figure is computed, not run, because the
product does not buy for a worker's copy. In the stocked-out case here, such a check would cost
the same failed attempt in ``west`` as the product does, and be ``D`` faster.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from sandbox.realstack import multikueue as mk
from sandbox.realstack.core import RealStack
from sandbox.realstack.demo import NAMESPACE, queued_jobset
from sandbox.stack.config import ALL_FUNCTIONS, REPO_ROOT, StackConfig
from shared.app.deployment import RetryPolicy

WORKERS = (("us-west4-a", "west"), ("us-central1-a", "central"))
SHORT, STOCKED = "west", "central"
MANAGER = "manager"
CHECK_CONFIG = REPO_ROOT / "examples" / "kueue" / "tpu-slices-check.yaml"
JOB = "mk-bench"
NEXT = "mk-next"  # the second job of the shape
# Kueue's dispatch and the events' route (log sink, Pub/Sub, the check) on top of the 2 x D floor.
OVERHEAD_SECONDS = 20.0


@dataclasses.dataclass(frozen=True)
class MultiKueueShape:
    """How many slices and how long GKE's operations take."""

    slices: int = 2
    op_seconds: float = 10.0
    timeout: float = 300.0


@dataclasses.dataclass
class MultiKueueResult:
    """What one run measured (see the module docstring)."""

    shape: MultiKueueShape
    ran_in: str = ""
    seconds_to_ready: float | None = None
    creates: dict[str, int] = dataclasses.field(default_factory=dict)
    loser_pool_seconds: float = 0.0
    pools_leaked: list[str] = dataclasses.field(default_factory=list)
    pods_killed: int = 0
    next_seconds_to_ready: float | None = None
    next_creates_in_short: int | None = None
    setup_seconds: float = 0.0
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def floor_seconds(self) -> float:
        return 2 * self.shape.op_seconds

    @property
    def naive_loser_pool_seconds(self) -> float:
        """The computed reference: a check buying in every worker (one loser here)."""
        return (len(WORKERS) - 1) * self.shape.slices * 2 * self.shape.op_seconds


def _config(shape: MultiKueueShape) -> StackConfig:
    base = StackConfig(functions=ALL_FUNCTIONS, gke_op_delay=shape.op_seconds)
    return dataclasses.replace(
        base,
        cluster_name=MANAGER,
        fleet=WORKERS,
        retry=RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4),
        max_delivery_attempts=60,
        function_env={
            "MULTIKUEUE_MANAGER": f"projects/{base.project}/locations/{base.location}/clusters/{MANAGER}"
        },
    )


def _no_pools(stack: RealStack, path: str) -> Callable[[], bool]:
    return lambda: not stack.managed_pools(path)


def run(shape: MultiKueueShape | None = None) -> MultiKueueResult:
    """One run (about 2 minutes of setup plus the job)."""
    shape = shape or MultiKueueShape()
    result = MultiKueueResult(shape)
    with RealStack(_config(shape)) as stack:
        started = time.monotonic()
        mk.connect(stack, CHECK_CONFIG.read_text())
        result.setup_seconds = time.monotonic() - started
        planes = {p.cluster_id.name: p for p in stack.fleet}
        stack.gke.set_capacity(planes[SHORT].cluster_id.location, "on-demand", 0)
        ready: dict[tuple[str, str], list[float]] = {}
        lock = threading.Lock()

        def seen(cluster: str, pool: dict[str, Any]) -> None:
            for job in (JOB, NEXT):
                if str(pool.get("name", "")).startswith(f"tpu-{job}-"):
                    with lock:
                        ready.setdefault((job, cluster.rsplit("/", 1)[-1]), []).append(time.monotonic())

        stack.gke.on_pool_ready(seen)
        pool_seconds = {name: 0.0 for name in planes}
        stop = threading.Event()

        def sample(period: float = 0.25) -> None:
            while not stop.wait(period):
                for name, plane in planes.items():
                    held = [
                        p for p in stack.gke.pools(plane.path) if str(p["name"]).startswith(f"tpu-{JOB}-")
                    ]
                    pool_seconds[name] += period * len(held)

        def all_ready(job: str) -> Callable[[], str]:
            def where() -> str:
                with lock:
                    return next((n for (j, n), t in ready.items() if j == job and len(t) >= shape.slices), "")

            return where

        def run_to_the_end(job: str) -> tuple[str, float]:
            submitted = time.monotonic()
            stack.submit(queued_jobset(job, shape.slices, run_seconds=5))
            ran_in = stack.wait_for(
                all_ready(job), shape.timeout, f"every slice of {job} RUNNING in one worker"
            )
            with lock:
                seconds = max(ready[(job, ran_in)][: shape.slices]) - submitted
            stack.wait_for(
                lambda: stack.jobset_state(NAMESPACE, job) == "Completed", shape.timeout, f"{job} to complete"
            )
            for plane in planes.values():
                stack.wait_for(
                    _no_pools(stack, plane.path), shape.timeout, f"{plane.cluster_id.name}'s pools to go"
                )
            return ran_in, seconds

        def creates_in(name: str) -> int:
            return sum(1 for c in stack.gke.calls if c.method == "create" and f"/clusters/{name}/" in c.path)

        sampler = threading.Thread(target=sample, name="pool-seconds", daemon=True)
        sampler.start()
        try:
            result.ran_in, result.seconds_to_ready = run_to_the_end(JOB)
            before = creates_in(SHORT)
            _, result.next_seconds_to_ready = run_to_the_end(NEXT)
            result.next_creates_in_short = creates_in(SHORT) - before
        except TimeoutError as exc:
            result.problems.append(str(exc).splitlines()[0])
        finally:
            stop.set()
            sampler.join(timeout=5)
            stack.gke.set_capacity(planes[SHORT].cluster_id.location, "on-demand", None)
        for name, plane in planes.items():
            result.creates[name] = creates_in(name)
            result.pools_leaked += [f"{name}/{p['name']}" for p in stack.managed_pools(plane.path)]
            result.pods_killed += len(plane.killed_pods())
        result.loser_pool_seconds = sum(s for n, s in pool_seconds.items() if n != result.ran_in)
    return result


def as_dict(result: MultiKueueResult) -> dict[str, Any]:
    """The report's ``multikueue`` section."""
    return {
        "shape": dataclasses.asdict(result.shape),
        "ran_in": result.ran_in,
        "seconds_to_ready": None if result.seconds_to_ready is None else round(result.seconds_to_ready, 2),
        "floor_seconds": result.floor_seconds,
        "creates": result.creates,
        "loser_pool_seconds": round(result.loser_pool_seconds, 1),
        "naive_loser_pool_seconds": result.naive_loser_pool_seconds,
        "pools_leaked": result.pools_leaked,
        "pods_killed": result.pods_killed,
        "next_seconds_to_ready": (
            None if result.next_seconds_to_ready is None else round(result.next_seconds_to_ready, 2)
        ),
        "next_floor_seconds": result.shape.op_seconds,
        "next_creates_in_short": result.next_creates_in_short,
        "setup_seconds": round(result.setup_seconds, 1),
        "problems": result.problems,
    }
