"""The admission check's decision for one Workload: pure, from what each slice's pool looks like.

Kueue's states (``apis/kueue/v1beta2/admissioncheck_types.go``): ``Pending`` while the check works,
``Ready`` to let Kueue admit, ``Retry`` to make Kueue evict the Workload (releasing its quota) and
requeue it after ``requeueAfterSeconds``, ``Rejected`` to deactivate it. The rules:

* Rejected when a slice can never be built (a shape GKE refuses, a guardrail of the settings);
* Retry when any slice failed to provision (its pool in ERROR, or its create refused for capacity)
  and is backing off: the requeue is the longest wait of the failed slices, so Kueue brings the
  Workload back when every slice may be tried again. Pools of the other slices that did land are
  kept (neither deleted nor created further): the JobSet is suspended again by Kueue, and the
  release rules keep a suspended JobSet's pools for ``SUSPEND_GRACE_SECONDS`` and then idle for
  ``IDLE_POOL_SECONDS`` for a queued JobSet of the shape, the Workload's own retry first of all;
* Ready only when every slice's pool is RUNNING and all of its Nodes are Ready;
* Pending otherwise, naming pools ready/total, with the missing pools to create.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from shared.tpu.nodepools import STATUS_RUNNING
from shared.tpu.workloads import PENDING, READY, REJECTED, RETRY

MISSING = ""  # a slice whose pool is not listed


@dataclasses.dataclass(frozen=True)
class SliceState:
    """One slice of the Workload as GKE and the API server show it."""

    pool: str
    status: str = MISSING  # the pool's GKE status; MISSING when not listed
    nodes: int = 0  # VMs of the slice (the pool's node count)
    nodes_ready: int = 0  # its Nodes registered, Ready and free of the not-ready taint (Node.takes_pods)
    failed: str = ""  # GKE's reason when the slice's latest attempt failed
    retry_in: float = 0.0  # seconds until a failed slice may be tried again (0: now)

    @property
    def ready(self) -> bool:
        return self.status == STATUS_RUNNING and self.nodes > 0 and self.nodes_ready >= self.nodes


@dataclasses.dataclass(frozen=True)
class CheckVerdict:
    """What the check sets on the Workload, and which pools to create for it now."""

    state: str
    message: str
    requeue_after: int | None = None  # Retry only
    create: tuple[str, ...] = ()
    # Pending only: every pool is RUNNING, some of their Nodes are not Ready yet (seconds, not minutes).
    nodes_only: bool = False
    # Ready only: (pod set, ((node label, value), ...)) selectors its pods need and do not carry.
    pod_set_updates: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()


def decide(slices: Sequence[SliceState], refusal: str = "") -> CheckVerdict:
    """The check state of a Workload whose slices are ``slices`` (``refusal``: why it can never be)."""
    if refusal:
        return CheckVerdict(REJECTED, refusal)
    if not slices:
        return CheckVerdict(READY, "no TPU slices to provision")
    total = len(slices)
    ready = sum(1 for s in slices if s.ready)
    # A failed slice whose backoff is over is being tried again (its ERROR pool recycled): Pending.
    failed = [s for s in slices if s.failed and s.retry_in > 0]
    if failed:
        wait = max(s.retry_in for s in failed)
        names = ", ".join(f"{s.pool} ({s.failed})" for s in failed)
        return CheckVerdict(
            RETRY,
            f"pools ready {ready}/{total}; could not provision {names}; retry in {math.ceil(wait)}s",
            requeue_after=max(1, math.ceil(wait)),
        )
    if ready == total:
        return CheckVerdict(READY, f"pools ready {total}/{total}")
    missing = tuple(s.pool for s in slices if s.status == MISSING)
    nodes_only = all(s.status == STATUS_RUNNING for s in slices)
    return CheckVerdict(PENDING, f"pools ready {ready}/{total}", create=missing, nodes_only=nodes_only)


__all__ = ["MISSING", "CheckVerdict", "SliceState", "decide"]
