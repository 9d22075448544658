"""The benchmark's handover part: N same-shape JobSets through a queue that runs 2 at a time.

One ``RealStack`` (the real API server, scheduler, controller manager, JobSet and Kueue
controllers, KWOK nodes; the functions, Pub/Sub and GKE emulators) with a ClusterQueue of one v5e
2x4 flavor whose quota (16 chips) fits exactly two 1-slice JobSets. N such JobSets are queued at
once; Kueue admits two, and each time one completes it admits the next, whose pods the scheduler
binds to the finished JobSet's idle nodes (pools of one shape are interchangeable). The product then
hands the pool over (``TPUSliceAdopted``) instead of deleting it and creating another, so the whole
run should cost about as many creates as the queue runs at once, not one per JobSet.

Measured: GKE create requests (the emulator's call log), pools adopted, deleted and leaked, pods
killed by a pool deletion (read from the real pods), and per JobSet the seconds from admission
(Kueue's ``Admitted`` Event on its Workload) to Running (the scheduler's ``Scheduled`` Event of its
last pod), both taken when the stack's watch delivers them, split by where the pods ran: on a pool
that no JobSet had run on before (fresh: without handover) or on one another JobSet had finished on
(handed over).
Nothing is hidden: a JobSet that got a fresh pool after the first two is counted as fresh, and
``problems`` names whatever went wrong. ``setup_cluster`` installing JobSet and Kueue is part of
the run's ``seconds`` but not of any JobSet's figure.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
import statistics
import threading
import time
from typing import Any

from sandbox.jobsets import tpu_jobset
from sandbox.realstack.core import RealStack
from sandbox.stack.config import StackConfig
from sandbox.testing.stack import REAL_FAST, pods_killed, queued
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
    run_seconds: float = 4.0
    timeout: float = 420.0  # from the stack being up: setup_cluster's installs included

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
    # The stack's whole timeline when anything went wrong ("" otherwise): the only record of which
    # function decided what, as the stack is gone once the run returns.
    timeline: str = ""

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


# The scheduler's message of a bind: "Successfully assigned <ns>/<pod> to <node>".
_ASSIGNED = re.compile(r"^Successfully assigned (\S+)/(\S+) to (\S+)$")


class StoryClock:
    """When the stack's Event watch delivered each JobSet's admission and each of its pods' binds."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self._lock = threading.Lock()
        self.admitted: dict[str, float] = {}
        self.bound: dict[str, dict[str, tuple[float, str]]] = {name: {} for name in names}
        # When the scheduler says it bound each pod (its Event's eventTime): the watch may deliver
        # the Events of two binds out of order, so which JobSet used a pool first is read from these.
        self.bound_at: dict[str, float] = {}

    def _jobset_of(self, prefix: str, object_name: str) -> str | None:
        return next((n for n in self.names if object_name.startswith(f"{prefix}{n}-")), None)

    def seen(self, event_type: str, event: dict[str, Any]) -> None:
        """A Kueue ``Admitted`` (Workload ``jobset-<name>-<hash>``) or scheduler ``Scheduled`` Event."""
        if event_type != "ADDED":
            return
        at = time.monotonic()
        involved = event.get("involvedObject") or {}
        with self._lock:
            if event.get("reason") == "Admitted" and involved.get("kind") == "Workload":
                name = self._jobset_of("jobset-", str(involved.get("name", "")))
                if name is not None:
                    self.admitted.setdefault(name, at)
            match = (
                _ASSIGNED.match(str(event.get("message", ""))) if event.get("reason") == "Scheduled" else None
            )
            if match is not None:
                name = self._jobset_of("", match.group(2))
                if name is not None and len(self.bound[name]) < HOSTS:
                    self.bound[name].setdefault(match.group(2), (at, match.group(3)))
                    self.bound_at.setdefault(match.group(2), _event_time(event, at))

    def timings(self, cluster_name: str) -> list[JobSetTiming]:
        """Per JobSet: first admission, first time all its pods had bound, and whether on a pool
        another JobSet had run on before (handed over) or on a fresh one.

        The pool under a pod is read from its node's name (``gke-<cluster>-<pool>-<index>``). Which
        JobSet a fresh pool was created for does not matter: the real scheduler may place the first
        JobSets' pods on each other's new pools, which costs nothing.
        """
        first_user: dict[str, str] = {}  # pool -> the JobSet whose pod bound there first
        with self._lock:
            binds = sorted(
                (self.bound_at.get(pod, t), name, node)
                for name, pods in self.bound.items()
                for pod, (t, node) in pods.items()
            )
            for _, name, node in binds:
                first_user.setdefault(_pool_of(node, cluster_name), name)
            out = []
            for name in self.names:
                pods = self.bound[name]
                running = max(t for t, _ in pods.values()) if len(pods) >= HOSTS else None
                handed = None
                if running is not None:
                    handed = any(first_user[_pool_of(n, cluster_name)] != name for _, n in pods.values())
                out.append(JobSetTiming(name, self.admitted.get(name), running, handed))
        # In the order Kueue admitted them (JobSets created within one second may be admitted in
        # any order): the first CONCURRENT need fresh pools, the rest should not.
        return sorted(out, key=lambda t: (t.admitted_at is None, t.admitted_at or 0.0, t.name))


def _event_time(event: dict[str, Any], fallback: float) -> float:
    """The Event's own ``eventTime`` (events.k8s.io, microseconds) as Unix seconds; ``fallback``
    (monotonic, only comparable with other fallbacks) when it has none."""
    stamp = str(event.get("eventTime") or "")
    try:
        return (
            datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ")
            .replace(tzinfo=datetime.UTC)
            .timestamp()
        )
    except ValueError:
        return fallback


def _pool_of(node: str, cluster_name: str) -> str:
    """The pool of a GKE node name ``gke-<cluster>-<pool>-<index>``."""
    return node.removeprefix(f"gke-{cluster_name}-").rsplit("-", 1)[0]


def run(shape: HandoverShape, config: StackConfig | None = None) -> HandoverResult:
    """Start a stack, install JobSet and Kueue, queue ``shape.jobsets`` JobSets, wait for all and
    for their pools to go."""
    base = config or REAL_FAST
    names = [_name(i) for i in range(shape.jobsets)]
    clock = StoryClock(names)
    problems: list[str] = []
    started = time.monotonic()
    with RealStack(base) as stack:
        deadline = time.monotonic() + shape.timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        assert stack.kube is not None
        stack.kube.on_change(clock.seen)
        try:
            stack.setup(timeout=left())
            stack.apply_kueue(QUEUES, timeout=left())
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
        found = clock.timings(base.cluster_name)
        timeline = stack.timeline.render()
    problems += [f"JobSet {n} ended {s}" for n, s in states.items() if s != "Completed"]
    if summary.pools_leaked:
        problems.append(f"leaked pools: {', '.join(summary.pools_leaked)}")
    if killed:
        problems.append(f"{len(killed)} pod(s) killed by a node-pool deletion")
    late_fresh = [t.name for t in found[CONCURRENT:] if t.handed_over is False]
    # A late JobSet may be the first on a pool made for an earlier one, when that one's pods bound
    # first to a pool freed meanwhile (the scheduler binds to whichever fits; a create can finish
    # after the first JobSet ran): no pool more, so no handover lost. Only more pools than the queue
    # runs at once mean a late JobSet got a pool of its own.
    if late_fresh and summary.pools_created > CONCURRENT:
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
        timeline=timeline if problems else "",
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
