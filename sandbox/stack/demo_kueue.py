"""``tpuprov demo --scenario kueue``: GKE's "TPU Multislice with JobSet and Kueue" flow, locally.

The packaged default queue configuration (one ``vlp-24`` flavor of v5e 2x4 slices, 24 chips in
``cluster-queue``, the ``multislice-queue`` LocalQueue) is applied the way the product applies it
(``sandbox.stack.kueue``). Then three multislice JobSets of v5e 2x4 slices (2 VMs x 4 chips each)
are queued: 3 slices first, which takes the whole quota, then 1 and 2 slices, which Kueue admits
together once the first one completes. The simulated Kueue suspends, admits and unsuspends them;
the product provisions and releases pools for whatever runs.

The run ends with pools created, handed over (``TPUSliceAdopted`` Events), deleted and leaked,
and the pods a pool deletion killed. A pod is killed when the product deletes a pool that a later
JobSet's pod has been scheduled onto (slices of one shape are interchangeable to the scheduler);
that count must be 0 and the run fails while it is not.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sandbox.cluster.kueue_objects import QUEUE_NAME_LABEL
from sandbox.jobsets import tpu_jobset
from sandbox.stack.core import Stack
from sandbox.stack.kueue import apply_kueue
from sandbox.stack.summary import StackSummary
from shared.core import labels

NAMESPACE = "default"
LOCAL_QUEUE = "multislice-queue"  # the packaged default configuration's LocalQueue
ACCELERATOR = "tpu-v5-lite-podslice"
TOPOLOGY = "2x4"
# (name, slices), in submission order: the 3-slice JobSet fills the 24-chip queue and runs first.
JOBSETS = (("multislice-3", 3), ("multislice-1", 1), ("multislice-2", 2))


@dataclasses.dataclass(frozen=True)
class KueueOutcome:
    """How the scenario ended."""

    states: dict[str, str]
    summary: StackSummary
    problems: list[str]


def queued_jobset(name: str, slices: int, run_seconds: float) -> dict[str, Any]:
    """A multislice v5e 2x4 JobSet in the default LocalQueue, one slice per node pool."""
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


def run_kueue_scenario(stack: Stack, run_seconds: float, timeout: float) -> KueueOutcome:
    """Apply the default queues, run the three JobSets to the end and wait for every pool to go."""
    deadline = time.monotonic() + timeout
    problems: list[str] = []

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    def admitted(name: str) -> bool:
        jobset = stack.jobset(NAMESPACE, name) or {}
        return (jobset.get("spec") or {}).get("suspend") is False

    def finished(name: str) -> bool:
        return stack.jobset_state(NAMESPACE, name) in ("Completed", "Failed")

    try:
        apply_kueue(stack, timeout=left())
        first, first_slices = JOBSETS[0]
        stack.submit(queued_jobset(first, first_slices, run_seconds))
        stack.wait_for(lambda: admitted(first), left(), f"Kueue to admit {first}")
        for name, slices in JOBSETS[1:]:
            stack.submit(queued_jobset(name, slices, run_seconds))
        for name, _ in JOBSETS:
            stack.wait_for(lambda n=name: finished(n), left(), f"JobSet {name} to finish")  # type: ignore[misc]
        stack.wait_for(lambda: not stack.managed_pools(), left(), "every TPU pool to be deleted")
    except TimeoutError as exc:
        problems.append(str(exc).splitlines()[0])
    summary = stack.summary()
    states = {name: stack.jobset_state(NAMESPACE, name) for name, _ in JOBSETS}
    for name, state in states.items():
        if state != "Completed":
            problems.append(f"JobSet {name} ended {state}")
    if summary.pools_leaked:
        problems.append(f"leaked pools: {', '.join(summary.pools_leaked)}")
    if summary.pods_killed:
        problems.append(f"{summary.pods_killed} pod(s) killed by a node-pool deletion")
    return KueueOutcome(states, summary, problems)
