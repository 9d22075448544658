"""GKE's "TPU Multislice with JobSet and Kueue" flow on the real components (``RealStack``).

The product's ``setup_cluster`` installs the pinned JobSet and Kueue releases (a setup message on
its topic), ``apply_kueue`` applies the packaged default queues (one ``vlp-24`` flavor of v5e 2x4
slices, 24 chips in ``cluster-queue``, the ``multislice-queue`` LocalQueue, published to its
topic), then three multislice JobSets of v5e 2x4 slices are queued: 3 slices, which take the
whole quota, then 1 and 2 slices, which the real Kueue admits once the first completes. The real
scheduler reports the pods it cannot place, the sinks export that, ``provision`` creates pools,
KWOK runs the pods on the pools' Nodes, the real JobSet controller completes the JobSets and
``release`` hands pools over or deletes them. The same JobSets and queues as the stand-in's
``tpuprov demo --scenario kueue``; the pods a pool deletion killed come from the real pods.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Any, TextIO

from sandbox.jobsets import tpu_jobset
from sandbox.realstack.core import RealStack
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from sandbox.stack.summary import StackSummary
from sandbox.stack.timeline import TimelineEntry
from sandbox.stack.wiring import TOPIC_PREFIX, wiring
from shared.core import labels
from shared.kueue.config import DEFAULT_CONFIG, parse_config
from shared.kueue.render import render

NAMESPACE = "default"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
LOCAL_QUEUE = "multislice-queue"
ACCELERATOR = "tpu-v5-lite-podslice"
TOPOLOGY = "2x4"
JOBSETS = (("multislice-3", 3), ("multislice-1", 1), ("multislice-2", 2))
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the flow ended."""

    states: dict[str, str]
    summary: StackSummary
    problems: list[str]
    seconds: dict[str, float]  # setup, kueue, jobsets: wall time of each phase


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
    """Publish a queue configuration to apply_kueue's topic and wait until its ClusterQueues exist."""
    topic = stack.publisher.topic_path(stack.config.project, wiring("apply_kueue").topic(TOPIC_PREFIX))
    stack.publisher.publish(topic, text.encode()).result(timeout=30)
    stack.timeline.add("user", "published a Kueue configuration to apply_kueue's topic")
    api = stack.kube_cluster.client()
    queues = [str(o["metadata"]["name"]) for o in render(parse_config(text)) if o["kind"] == "ClusterQueue"]
    stack.wait_for(
        lambda: all(api.get(f"{KUEUE_API}/clusterqueues/{q}") for q in queues), timeout, "the Kueue queues"
    )


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
        stack.wait_for(lambda: not stack.managed_pools(), left(), "every TPU pool to be deleted")
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


def main(run_seconds: float = 5.0, timeout: float = 420.0, width: int = 160, out: TextIO = sys.stdout) -> int:
    """``tpuprov demo --real``: the flow above with the live timeline; 0 when it ends clean."""
    lock = threading.Lock()
    quiet = threading.Event()  # once the summary prints, late timeline lines would interleave

    def show(entry: TimelineEntry) -> None:
        line = entry.render()
        with lock:
            if quiet.is_set():
                return
            print(line if len(line) <= width else line[: width - 3] + "...", file=out, flush=True)

    print(
        "tpuprov demo --real: etcd, kube-apiserver, scheduler, controller manager, KWOK, JobSet and", file=out
    )
    print(
        "Kueue controllers, GKE + Compute emulators, Pub/Sub emulator, the functions (loopback only)",
        file=out,
    )
    started = time.monotonic()
    config = StackConfig(functions=ALL_FUNCTIONS, gke_op_delay=1.0)
    with RealStack(config) as stack:
        print(f"started in {stack.startup_seconds:.1f}s; API server {stack.kube_cluster.server}", file=out)
        stack.timeline.listen(show)
        outcome = run(stack, run_seconds=run_seconds, timeout=timeout)
        quiet.set()
        summary = outcome.summary
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in outcome.seconds.items())
        print("\nSummary (real Kubernetes components)", file=out)
        print(f"  JobSets:        {', '.join(f'{n} {s}' for n, s in outcome.states.items())}", file=out)
        print(
            f"  node pools:     created {summary.pools_created}, handed over {summary.pools_adopted}, "
            f"deleted {summary.pools_deleted}, leaked {len(summary.pools_leaked)}",
            file=out,
        )
        print(
            f"  pods killed by a pool deletion (pod GC's DisruptionTarget): {summary.pods_killed}", file=out
        )
        print(f"  phases:         {phases}", file=out)
    print(f"  wall time:      {time.monotonic() - started:.1f}s (stack up and down included)", file=out)
    for problem in outcome.problems:
        print(f"  PROBLEM: {problem.splitlines()[0]}", file=out)
    if outcome.problems:
        return 1
    print("  result:         OK", file=out)
    return 0
