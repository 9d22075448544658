"""The demo's flows on the real components (``RealStack``); ``demo_cli`` prints them for ``tpuprov demo``.

``run``: GKE's "TPU Multislice with JobSet and Kueue" flow. The product's ``setup_cluster`` installs
the pinned JobSet and Kueue releases (a setup message on its topic), ``apply_kueue`` applies the
packaged default queues (one ``vlp-24`` flavor of v5e 2x4 slices, 24 chips in ``cluster-queue``,
the ``multislice-queue`` LocalQueue, published to its topic), then three multislice JobSets of v5e
2x4 slices are queued: 3 slices, which take the whole quota, then 1 and 2 slices, which the real
Kueue admits once the first completes. The real scheduler reports the pods it cannot place, the
sinks export that, ``provision`` creates pools, KWOK runs the pods on the pools' Nodes, the real
JobSet controller completes the JobSets and ``release`` hands pools over or deletes them; the pods a
pool deletion killed are counted from the real pods.

``run_basic``: the smallest loop, without Kueue: a multislice v6e JobSet (one pool per slice) and a
CPU-only JobSet the product must leave alone.

``run_fleet``: ``run``'s JobSets in two clusters at once, served by one deployment of the functions
(``fleet_config``): the managed cluster and ``west``, in another region, whose FLEET_OVERRIDES give
its pools another disk size. Same namespace and names in both; each cluster's pools must be its own.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from sandbox.jobsets import cpu_jobset, tpu_jobset
from sandbox.realstack.core import RealStack
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from sandbox.stack.summary import StackSummary
from shared.core import labels
from shared.kueue.config import DEFAULT_CONFIG

NAMESPACE = "default"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
LOCAL_QUEUE = "multislice-queue"
ACCELERATOR = "tpu-v5-lite-podslice"
TOPOLOGY = "2x4"
JOBSETS = (("multislice-3", 3), ("multislice-1", 1), ("multislice-2", 2))
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
TPU_JOBSET, CPU_JOBSET = "demo-train", "demo-cpu"
# The fleet's second cluster: a zone of another region offering v5e (Cloud TPU "TPU regions and
# zones", https://cloud.google.com/tpu/docs/regions-zones: us-west4-a lists v5litepod).
WEST_ZONE, WEST_NAME = "us-west4-a", "west"
WEST_DISK_GB = 250  # its FLEET_OVERRIDES
DEFAULT_DISK_GB = 100  # DISK_SIZE_GB's default (docs/settings.md), the managed cluster's


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the flow ended."""

    states: dict[str, str]
    summary: StackSummary
    problems: list[str]
    seconds: dict[str, float]  # setup, kueue, jobsets: wall time of each phase
    # The fleet flow: each cluster's name -> its own numbers (``summary`` is the managed cluster's).
    clusters: dict[str, StackSummary] = dataclasses.field(default_factory=dict)


def fleet_config(**changes: Any) -> StackConfig:
    """The two-cluster stack: the managed cluster and ``west``, with west's disk-size override."""
    base = StackConfig(functions=ALL_FUNCTIONS, gke_op_delay=1.0)
    west = f"projects/{base.project}/locations/{WEST_ZONE}/clusters/{WEST_NAME}"
    env = {"FLEET_OVERRIDES": json.dumps({west: {"DISK_SIZE_GB": WEST_DISK_GB}})}
    return dataclasses.replace(
        base,
        fleet=((WEST_ZONE, WEST_NAME),),
        function_env={**env, **changes.pop("function_env", {})},
        **changes,
    )


def queued_jobset(name: str, slices: int, run_seconds: float) -> dict[str, Any]:
    """A multislice v5e 2x4 JobSet in the default LocalQueue with exclusive placement per pool."""
    jobset = tpu_jobset(
        name,
        NAMESPACE,
        replicas=slices,
        accelerator=ACCELERATOR,
        topology=TOPOLOGY,
        chips_per_vm=4,
        run_seconds=run_seconds,
        annotations={labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL},
    )
    jobset["metadata"].pop("uid", None)
    jobset["metadata"]["labels"] = {QUEUE_NAME_LABEL: LOCAL_QUEUE}
    return jobset


def apply_queues(stack: RealStack, text: str, timeout: float) -> None:
    """Publish a queue configuration to apply_kueue's topic and wait until it is applied."""
    stack.apply_kueue(text, timeout)


def apply_default_queues(stack: RealStack, timeout: float) -> None:
    """The packaged default configuration, as the tutorial's flow applies it."""
    apply_queues(stack, DEFAULT_CONFIG.read_text(), timeout)


def run(stack: RealStack, run_seconds: float = 5.0, timeout: float = 600.0) -> Outcome:
    """Set up, apply the queues, run the three JobSets to the end and wait for every pool to go."""
    deadline = time.monotonic() + timeout
    problems: list[str] = []
    seconds: dict[str, float] = {}

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    def admitted(name: str) -> bool:
        return ((stack.jobset(NAMESPACE, name) or {}).get("spec") or {}).get("suspend") is False

    def finished(name: str) -> bool:
        return stack.jobset_state(NAMESPACE, name) in ("Completed", "Failed")

    try:
        started = time.monotonic()
        stack.setup(timeout=left())
        seconds["setup"] = time.monotonic() - started
        started = time.monotonic()
        apply_default_queues(stack, left())
        seconds["kueue"] = time.monotonic() - started
        started = time.monotonic()
        first, first_slices = JOBSETS[0]
        stack.submit(queued_jobset(first, first_slices, run_seconds))
        stack.wait_for(lambda: admitted(first), left(), f"Kueue to admit {first}")
        for name, slices in JOBSETS[1:]:
            stack.submit(queued_jobset(name, slices, run_seconds))
        for name, _ in JOBSETS:
            stack.wait_for(lambda n=name: finished(n), left(), f"JobSet {name} to finish")  # type: ignore[misc]
        stack.wait_pools_gone(left())
        seconds["jobsets"] = time.monotonic() - started
    except TimeoutError as exc:
        problems.append(str(exc))
    summary = stack.summary()
    states = {name: stack.jobset_state(NAMESPACE, name) for name, _ in JOBSETS}
    problems += [f"JobSet {name} ended {state}" for name, state in states.items() if state != "Completed"]
    if summary.pools_leaked:
        problems.append(f"leaked pools: {', '.join(summary.pools_leaked)}")
    if summary.pods_killed:
        problems.append(f"{summary.pods_killed} pod(s) killed by a node-pool deletion")
    return Outcome(states, summary, problems, seconds)


def run_basic(
    stack: RealStack, slices: int = 2, topology: str = "2x2", run_seconds: float = 5.0, timeout: float = 600.0
) -> Outcome:
    """Set up (the JobSet controller comes with setup_cluster), run a ``slices``-slice v6e JobSet and
    a CPU-only one to the end, and wait for every pool to go; problems name what went wrong."""
    deadline = time.monotonic() + timeout
    problems: list[str] = []
    seconds: dict[str, float] = {}

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    tpu = tpu_jobset(
        TPU_JOBSET,
        NAMESPACE,
        replicas=slices,
        topology=topology,
        run_seconds=run_seconds,
        # One slice per node pool, as multislice training JobSets ask for.
        annotations={labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL},
    )
    cpu = cpu_jobset(CPU_JOBSET, NAMESPACE)
    try:
        started = time.monotonic()
        stack.setup(timeout=left())
        seconds["setup"] = time.monotonic() - started
        started = time.monotonic()
        for jobset in (tpu, cpu):
            jobset["metadata"].pop("uid", None)
            stack.submit(jobset)
        for name in (TPU_JOBSET, CPU_JOBSET):
            stack.wait_for(
                lambda n=name: stack.jobset_state(NAMESPACE, n) in ("Completed", "Failed"),  # type: ignore[misc]
                left(),
                f"JobSet {name} to finish",
            )
        stack.wait_for(
            lambda: not stack.managed_pools() and stack.summary().pools_deleted >= slices,
            left(),
            "every TPU pool to be deleted",
        )
        seconds["jobsets"] = time.monotonic() - started
    except TimeoutError as exc:
        problems.append(str(exc))
    summary = stack.summary()
    states = {name: stack.jobset_state(NAMESPACE, name) for name in (TPU_JOBSET, CPU_JOBSET)}
    problems += [f"JobSet {name} ended {state}" for name, state in states.items() if state != "Completed"]
    if summary.pools_created != slices:
        problems.append(f"expected {slices} pools created, saw {summary.pools_created}")
    if summary.pools_leaked:
        problems.append(f"leaked pools: {', '.join(summary.pools_leaked)}")
    cpu_creates = [
        d for d in stack.decisions("provision.created") if f"/{CPU_JOBSET} " in str(d.get("slice"))
    ]
    if cpu_creates:
        problems.append(f"the CPU JobSet got {len(cpu_creates)} pool(s)")
    if summary.pods_killed:
        problems.append(f"{summary.pods_killed} pod(s) killed by a node-pool deletion")
    return Outcome(states, summary, problems, seconds)


def run_fleet(stack: RealStack, run_seconds: float = 5.0, timeout: float = 900.0) -> Outcome:
    """``run``'s flow in every cluster of the stack's fleet at the same time: set each up, give each
    the default queues, queue the three JobSets in all of them, and wait until every JobSet has
    finished and every cluster's pools are gone. Problems name the cluster."""
    deadline = time.monotonic() + timeout
    problems: list[str] = []
    seconds: dict[str, float] = {}
    planes = stack.planes
    ready: list[tuple[str, dict[str, Any]]] = []  # (cluster path, pool) as each reached RUNNING
    stack.gke.on_pool_ready(lambda cluster, pool: ready.append((cluster, pool)))

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    def unfinished() -> list[str]:
        return [
            f"{plane.cluster_id.name}/{name}"
            for plane in planes
            for name, _ in JOBSETS
            if plane.jobset_state(NAMESPACE, name) not in ("Completed", "Failed")
        ]

    try:
        started = time.monotonic()
        for plane in planes:
            stack.setup(timeout=left(), cluster=plane.path)
        seconds["setup"] = time.monotonic() - started
        started = time.monotonic()
        for plane in planes:
            stack.apply_kueue(DEFAULT_CONFIG.read_text(), left(), cluster=plane.path)
        seconds["kueue"] = time.monotonic() - started
        started = time.monotonic()
        for name, slices in JOBSETS:
            for plane in planes:
                plane.submit(queued_jobset(name, slices, run_seconds))
        stack.wait_for(lambda: not unfinished(), left(), "every JobSet of every cluster to finish")
        for plane in planes:
            stack.wait_for(
                lambda p=plane.path: not stack.managed_pools(p),  # type: ignore[misc]
                left(),
                f"{plane.cluster_id.name}'s TPU pools to be deleted",
            )
        seconds["jobsets"] = time.monotonic() - started
    except TimeoutError as exc:
        problems.append(str(exc))
    clusters = {plane.cluster_id.name: stack.summary(plane.path) for plane in planes}
    states = {
        f"{plane.cluster_id.name}/{name}": plane.jobset_state(NAMESPACE, name)
        for plane in planes
        for name, _ in JOBSETS
    }
    problems += [f"JobSet {name} ended {state}" for name, state in states.items() if state != "Completed"]
    for name, summary in clusters.items():
        if summary.pools_leaked:
            problems.append(f"{name}: leaked pools: {', '.join(summary.pools_leaked)}")
        if summary.pods_killed:
            problems.append(f"{name}: {summary.pods_killed} pod(s) killed by a node-pool deletion")
    # Each cluster's pools are built in its own zone with its own settings.
    for plane in planes:
        disk = WEST_DISK_GB if plane.cluster_id.name == WEST_NAME else DEFAULT_DISK_GB
        wrong = sorted(
            str(pool.get("name"))
            for cluster, pool in list(ready)
            if cluster == plane.path
            and (
                tuple(pool.get("locations") or ()) != (plane.cluster_id.location,)
                or (pool.get("config") or {}).get("diskSizeGb") != disk
            )
        )
        if wrong:
            problems.append(f"{plane.cluster_id.name}: pools built with another cluster's settings: {wrong}")
    return Outcome(states, clusters[planes[0].cluster_id.name], problems, seconds, clusters)
