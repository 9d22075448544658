"""The benchmark's handover part: N same-shape JobSets through a queue that runs 2 at a time.

One sandbox ``Stack`` (real functions, Pub/Sub and GKE emulators, simulated Kueue, JobSet
controller and scheduler) with a ClusterQueue of one v5e 2x4 flavor whose quota (16 chips) fits
exactly two 1-slice JobSets. N such JobSets are queued at once; Kueue admits two, and each time
one completes it admits the next, whose pods the scheduler binds to the finished JobSet's idle
nodes (pools of one shape are interchangeable). The product then hands the pool over
(``TPUSliceAdopted``) instead of deleting it and creating another, so the whole run should cost
about as many creates as the queue runs at once, not one per JobSet.

Measured: GKE create requests (the emulator's call log), pools adopted, deleted and leaked, pods
killed by a pool deletion, and per JobSet the seconds from admission (the simulated Kueue's
"unsuspended" timeline entry) to Running (its last pod bound, from the scheduler's timeline entry),
split by where the pods ran: on a pool created for that JobSet (without handover) or on one made
for another JobSet (handed over). Nothing is hidden: a JobSet that got a fresh pool after the first
two is counted as fresh, and ``problems`` names whatever went wrong.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from typing import Any

from sandbox.jobsets import tpu_jobset
from sandbox.stack.config import StackConfig
from sandbox.stack.core import Stack
from sandbox.stack.kueue import apply_kueue
from sandbox.testing.stack import FAST, pods_killed, queued
from shared.core import labels

NAMESPACE = "default"
ACCELERATOR = "tpu-v5-lite-podslice"
TOPOLOGY = "2x4"  # 2 VMs x 4 chips: 8 chips of quota per slice
HOSTS = 2
QUEUE = "handover"
CONCURRENT = 2  # JobSets the ClusterQueue's quota admits at once
QUEUES = f"""
flavors:
  - {{name: v5e-2x4, accelerator: {ACCELERATOR}, topology: {TOPOLOGY}}}
clusterQueues:
  - name: handover-cq
    quota: {{v5e-2x4: {8 * CONCURRENT}}}
localQueues:
  - {{name: {QUEUE}, namespace: {NAMESPACE}, clusterQueue: handover-cq}}
"""
# The first CONCURRENT JobSets need fresh pools; the slack covers a create sent for a JobSet whose
# pods then found a handed-over pool first (the create is a real cost, so it is counted, not hidden).
CREATES_SLACK = 2


@dataclasses.dataclass(frozen=True)
class HandoverShape:
    """How many JobSets and how long each runs."""

    jobsets: int = 8
    run_seconds: float = 2.0
    timeout: float = 240.0

    @property
    def slices(self) -> int:
        """Slices the whole workload runs (one per JobSet)."""
        return self.jobsets


@dataclasses.dataclass(frozen=True)
class JobSetTiming:
    """One JobSet: admission to Running, and whether it ran on a handed-over pool."""

    name: str
    admitted_at: float | None
    running_at: float | None
    handed_over: bool | None  # None when its pods never all bound

    @property
    def seconds(self) -> float | None:
        """Admission to Running, or None if either never happened."""
        if self.admitted_at is None or self.running_at is None:
            return None
        return self.running_at - self.admitted_at


@dataclasses.dataclass(frozen=True)
class HandoverResult:
    """What the run cost and how long each JobSet waited."""

    shape: HandoverShape
    creates: int  # create requests GKE received
    pools_created: int
    pools_adopted: int  # TPUSliceAdopted Events
    pools_deleted: int
    pools_leaked: list[str]
    pods_killed: int
    completed: int
    timings: list[JobSetTiming]
    problems: list[str]
    seconds: float
    gke_op_seconds: float  # how long the emulator takes to create a pool

    def split(self, handed_over: bool) -> list[float]:
        """Admission-to-Running seconds of the JobSets that did (not) run on handed-over pools."""
        return [t.seconds for t in self.timings if t.handed_over is handed_over and t.seconds is not None]


def _name(index: int) -> str:
    return f"ho-{index:02d}"


def _jobset(index: int, run_seconds: float) -> dict[str, Any]:
    body = tpu_jobset(
        _name(index),
        NAMESPACE,
        replicas=1,
        accelerator=ACCELERATOR,
        topology=TOPOLOGY,
        chips_per_vm=4,
        run_seconds=run_seconds,
        annotations={labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL},
    )
    body["metadata"].pop("uid", None)
    return queued(body, queue=QUEUE)


_BOUND = re.compile(r"^pod (\S+)/(\S+) bound to (\S+), Running$")


def timings(stack: Stack, names: list[str], cluster_name: str) -> list[JobSetTiming]:
    """Per JobSet, from the stack's timeline: first admission, first time all its pods had bound.

    The pool under a pod is read from its node's name (``gke-<cluster>-<pool>-<index>``); pool
    names start with ``tpu-<jobset>-``, so a pod on another JobSet's pool ran on a handed-over one.
    """
    admitted: dict[str, float] = {}
    bound: dict[str, dict[str, tuple[float, str]]] = {name: {} for name in names}
    for entry in stack.timeline.entries():
        if entry.source == "kueue" and "admitted by" in entry.text:
            for name in names:
                if entry.text.endswith(f"JobSet {NAMESPACE}/{name} unsuspended"):
                    admitted.setdefault(name, entry.t)
        match = _BOUND.match(entry.text) if entry.source == "scheduler" else None
        if match is None:
            continue
        pod, node = match.group(2), match.group(3)
        for name in names:
            if pod.startswith(f"{name}-") and len(bound[name]) < HOSTS:
                bound[name].setdefault(pod, (entry.t, node))
    out = []
    for name in names:
        pods = bound[name]
        running = max(t for t, _ in pods.values()) if len(pods) >= HOSTS else None
        own = f"gke-{cluster_name}-tpu-{name}-"
        handed = None if running is None else not all(node.startswith(own) for _, node in pods.values())
        out.append(JobSetTiming(name, admitted.get(name), running, handed))
    return out


def run(shape: HandoverShape, config: StackConfig | None = None) -> HandoverResult:
    """Start a stack, queue ``shape.jobsets`` JobSets, wait for all and for their pools to go."""
    base = config or dataclasses.replace(FAST, kueue=True, default_run_seconds=shape.run_seconds)
    names = [_name(i) for i in range(shape.jobsets)]
    problems: list[str] = []
    started = time.monotonic()
    with Stack(base) as stack:
        deadline = time.monotonic() + shape.timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        try:
            apply_kueue(stack, QUEUES, timeout=left())
            for index in range(shape.jobsets):
                stack.submit(_jobset(index, shape.run_seconds))
            for name in names:
                stack.wait_for(
                    lambda n=name: stack.jobset_state(NAMESPACE, n) in ("Completed", "Failed"),  # type: ignore[misc]
                    left(),
                    f"JobSet {name} to finish",
                )
            stack.wait_for(lambda: not stack.managed_pools(), left(), "every TPU pool to be deleted")
        except TimeoutError as exc:
            problems.append(str(exc).splitlines()[0])
        summary = stack.summary()
        states = {name: stack.jobset_state(NAMESPACE, name) for name in names}
        creates = sum(1 for call in stack.gke.calls if call.method == "create")
        killed = pods_killed(stack, *names)
        found = timings(stack, names, base.cluster_name)
        errors = [*stack.jobsets.errors, *stack.scheduler.errors]
        if stack.kueue is not None:
            errors += stack.kueue.errors
    problems += [f"JobSet {n} ended {s}" for n, s in states.items() if s != "Completed"]
    problems += [f"simulated controller error: {e}" for e in errors]
    if summary.pools_leaked:
        problems.append(f"leaked pools: {', '.join(summary.pools_leaked)}")
    if killed:
        problems.append(f"{len(killed)} pod(s) killed by a node-pool deletion")
    late_fresh = [t.name for t in found[CONCURRENT:] if t.handed_over is False]
    if late_fresh:
        problems.append(
            f"ran on fresh pools although queued behind same-shape JobSets: {', '.join(late_fresh)}"
        )
    return HandoverResult(
        shape=shape,
        creates=creates,
        pools_created=summary.pools_created,
        pools_adopted=summary.pools_adopted,
        pools_deleted=summary.pools_deleted,
        pools_leaked=summary.pools_leaked,
        pods_killed=len(killed),
        completed=sum(1 for s in states.values() if s == "Completed"),
        timings=found,
        problems=problems,
        seconds=time.monotonic() - started,
        gke_op_seconds=base.gke_op_delay,
    )


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "median_s": None, "max_s": None}
    return {
        "count": len(values),
        "median_s": round(statistics.median(values), 3),
        "max_s": round(max(values), 3),
    }


def as_dict(result: HandoverResult) -> dict[str, Any]:
    """A JSON-safe report."""
    return {
        "shape": dataclasses.asdict(result.shape),
        "concurrent": CONCURRENT,
        "creates": result.creates,
        "pools_created": result.pools_created,
        "pools_adopted": result.pools_adopted,
        "pools_deleted": result.pools_deleted,
        "pools_leaked": result.pools_leaked,
        "pods_killed": result.pods_killed,
        "completed": result.completed,
        "fresh": _stats(result.split(False)),
        "handed_over": _stats(result.split(True)),
        "jobsets": [
            {
                "name": t.name,
                "admission_to_running_s": None if t.seconds is None else round(t.seconds, 3),
                "handed_over": t.handed_over,
            }
            for t in result.timings
        ],
        "problems": result.problems,
        "seconds": round(result.seconds, 2),
        "gke_op_seconds": result.gke_op_seconds,
    }
