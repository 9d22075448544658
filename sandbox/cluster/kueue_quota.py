"""Kueue's admission decisions as a pure function: which pending Workloads fit, which get preempted.

``plan(queues, flavors, workloads)`` does one scheduling pass of the sandbox's Kueue simulation
(``sandbox.cluster.kueue``) over plain dataclasses, so the quota rules are table-testable without a
cluster. What it follows from Kueue's ClusterQueue documentation and flavor assigner (v0.19):

* Pending Workloads of a ClusterQueue are taken by priority, then creation time. ``StrictFIFO``
  stops at the first one that cannot be admitted; ``BestEffortFIFO`` lets later ones that fit go.
* A Workload fits a flavor when its ``google.com/tpu`` total is within the flavor's unused nominal
  quota, or, in a cohort, within the cohort's unused quota and the queue's ``borrowingLimit``.
  Flavors are tried in the queue's order; a flavor whose ``nodeLabels`` contradict the pods'
  nodeSelector is skipped.
* A Workload that fits no flavor may preempt: ``withinClusterQueue: LowerPriority`` (or
  ``LowerOrNewerEqualPriority``) picks admitted Workloads of its own queue; ``reclaimWithinCohort``
  (``LowerPriority`` / ``Any``) picks Workloads of borrowing queues of the cohort, when the
  preemptor fits its own nominal quota. Candidates go borrowing queues first, lowest priority
  first, most recently admitted first, and only as many as needed, with Workloads already being
  evicted ahead of all others. An evicted Workload keeps its quota until its JobSet has stopped
  (Kueue's job reconciler clears the reservation only once the job is no longer active), so the
  preemptor is admitted in a later pass, once the victims have given their quota back; meanwhile
  it is not preempted for again.

Differences from real Kueue: only ``google.com/tpu`` is accounted (cpu/memory quotas are
ignored), a Workload takes one flavor for all its pod sets, there is no fair sharing,
``lendingLimit``, flavor fungibility tuning, partial admission or admission checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from shared.core import labels

INFINITE = 1 << 62
WITHIN_POLICIES = ("LowerPriority", "LowerOrNewerEqualPriority")
RECLAIM_POLICIES = ("LowerPriority", "Any")
IN_CLUSTER_QUEUE = "InClusterQueue"
IN_COHORT_RECLAMATION = "InCohortReclamation"
HUMAN_REASONS = {
    IN_CLUSTER_QUEUE: "prioritization in the ClusterQueue",
    IN_COHORT_RECLAMATION: "reclamation within the cohort",
}


@dataclasses.dataclass(frozen=True)
class FlavorQuota:
    """Nominal TPU quota of one flavor in a ClusterQueue (``borrowing_limit`` None: unlimited)."""

    flavor: str
    nominal: int
    borrowing_limit: int | None = None


@dataclasses.dataclass(frozen=True)
class Queue:
    """The parts of a ClusterQueue admission depends on."""

    name: str
    flavors: tuple[FlavorQuota, ...]
    cohort: str = ""
    strategy: str = "BestEffortFIFO"
    within: str = "Never"
    reclaim: str = "Never"

    def quota(self, flavor: str) -> FlavorQuota | None:
        """This queue's quota of ``flavor``."""
        return next((q for q in self.flavors if q.flavor == flavor), None)

    @property
    def path(self) -> str:
        """``/cohort/queue`` as Kueue's preemption messages name a queue."""
        return "/" + "/".join(part for part in (self.cohort, self.name) if part)


@dataclasses.dataclass
class Workload:
    """One JobSet's Workload: what it asks for, where it queues and what it was given."""

    key: str  # namespace/name of the Workload
    uid: str
    job_uid: str
    queue: str  # ClusterQueue name ("" while its LocalQueue is missing)
    priority: int
    created: tuple[str, int]  # creationTimestamp, then arrival order for equal timestamps
    chips: int
    pod_set: str  # first pod set's name, for messages
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flavor: str | None = None  # set while quota is reserved
    admitted_order: int = 0
    evicting: bool = False  # evicted, still holding its quota until its JobSet has stopped


@dataclasses.dataclass
class Preemption:
    """``victim`` is evicted so that ``preemptor`` can be admitted."""

    victim: Workload
    preemptor: Workload
    reason: str
    message: str


@dataclasses.dataclass
class Plan:
    """The outcome of one pass."""

    admit: list[tuple[Workload, str]] = dataclasses.field(default_factory=list)
    preempt: list[Preemption] = dataclasses.field(default_factory=list)
    pending: dict[str, str] = dataclasses.field(default_factory=dict)  # workload key -> why


class _Usage:
    """TPU chips reserved per (ClusterQueue, flavor), with the cohort arithmetic of Kueue."""

    def __init__(self, queues: Mapping[str, Queue], workloads: Sequence[Workload]) -> None:
        self.queues = queues
        self.used: dict[tuple[str, str], int] = {}
        for wl in workloads:
            if wl.flavor is not None:
                self.add(wl.queue, wl.flavor, wl.chips)

    def add(self, queue: str, flavor: str, chips: int) -> None:
        key = (queue, flavor)
        self.used[key] = self.used.get(key, 0) + chips

    def of(self, queue: str, flavor: str) -> int:
        return self.used.get((queue, flavor), 0)

    def _members(self, queue: Queue) -> list[Queue]:
        if not queue.cohort:
            return [queue]
        return [q for q in self.queues.values() if q.cohort == queue.cohort]

    def available(self, queue: Queue, flavor: str, borrow: bool = True) -> int:
        """Chips ``queue`` may still take in ``flavor`` (beyond its nominal quota only if ``borrow``)."""
        quota = queue.quota(flavor)
        if quota is None:
            return 0
        own = quota.nominal - self.of(queue.name, flavor)
        if not queue.cohort:
            return own
        members = self._members(queue)
        cohort_left = sum((m.quota(flavor) or FlavorQuota(flavor, 0)).nominal for m in members) - sum(
            self.of(m.name, flavor) for m in members
        )
        if not borrow:
            return min(own, cohort_left)
        limit = INFINITE if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit
        return min(cohort_left, limit - self.of(queue.name, flavor))

    def capacity(self, queue: Queue, flavor: str) -> int:
        """The most ``queue`` could ever hold of ``flavor`` (nominal plus what it may borrow)."""
        quota = queue.quota(flavor)
        if quota is None:
            return 0
        if not queue.cohort:
            return quota.nominal
        cohort = sum((m.quota(flavor) or FlavorQuota(flavor, 0)).nominal for m in self._members(queue))
        limit = INFINITE if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit
        return min(cohort, limit)


def flavor_matches(flavor_labels: Mapping[str, str], node_selector: Mapping[str, str]) -> bool:
    """Whether pods with ``node_selector`` may run on the flavor's nodes (shared keys must agree)."""
    return all(node_selector.get(k, v) == v for k, v in flavor_labels.items())


def _order(wl: Workload) -> tuple[int, str, int]:
    return (-wl.priority, wl.created[0], wl.created[1])


def _prefix(wl: Workload) -> str:
    return f"couldn't assign flavors to pod set {wl.pod_set}: "


def preemption_message(
    victim: Workload, preemptor: Workload, reason: str, queues: Mapping[str, Queue]
) -> str:
    """The Evicted/Preempted condition message Kueue writes on a victim."""

    def path(name: str) -> str:
        queue = queues.get(name)
        return queue.path if queue else f"/{name}"

    return (
        f"Preempted to accommodate a workload (UID: {preemptor.uid}, JobUID: {preemptor.job_uid}) "
        f"due to {HUMAN_REASONS[reason]}; preemptor path: {path(preemptor.queue)}; "
        f"preemptee path: {path(victim.queue)}"
    )


class _Planner:
    def __init__(
        self,
        queues: Mapping[str, Queue],
        flavors: Mapping[str, Mapping[str, str]],
        workloads: Sequence[Workload],
    ) -> None:
        self.queues = queues
        self.flavors = flavors
        self.workloads = workloads
        self.usage = _Usage(queues, workloads)
        self.result = Plan()
        self.victims: set[str] = set()
        self.admitted: set[str] = set()
        self.next_admitted = max((w.admitted_order for w in workloads), default=0) + 1

    def run(self) -> Plan:
        # Workloads that fit their queue's nominal quota go before any that would borrow, so a
        # queue reclaiming its quota gets it before a neighbour borrows it again.
        for borrow in (False, True):
            for name in sorted(self.queues):
                self._queue(self.queues[name], borrow)
        return self.result

    def _queue(self, queue: Queue, borrow: bool) -> None:
        name = queue.name
        pending = sorted(
            (
                w
                for w in self.workloads
                if w.queue == name and w.flavor is None and w.key not in self.admitted
            ),
            key=_order,
        )
        missing = [q.flavor for q in queue.flavors if q.flavor not in self.flavors]
        for wl in pending:
            if missing:
                self.result.pending[wl.key] = f"ClusterQueue {name} is inactive"
                continue
            if not borrow:
                if not self._fit(queue, wl, borrow=False) and queue.strategy == "StrictFIFO":
                    break  # the head may still get in by borrowing; nobody overtakes it
                continue
            outcome = self._try(queue, wl)
            if outcome == "preempting":
                # What the victims give back is for this Workload; nobody behind takes it first.
                break
            if outcome == "pending" and queue.strategy == "StrictFIFO":
                for later in pending[pending.index(wl) + 1 :]:
                    self.result.pending[later.key] = (
                        f"Workload {wl.key} is ahead in the StrictFIFO ClusterQueue {name}"
                    )
                break

    def _fit(self, queue: Queue, wl: Workload, borrow: bool) -> bool:
        """Admit ``wl`` in the first matching flavor it fits; False when none."""
        for quota in queue.flavors:
            if not flavor_matches(self.flavors[quota.flavor], wl.node_selector):
                continue
            if wl.chips <= self.usage.available(queue, quota.flavor, borrow):
                self.usage.add(queue.name, quota.flavor, wl.chips)
                self.result.admit.append((wl, quota.flavor))
                self.admitted.add(wl.key)
                wl.admitted_order = self.next_admitted
                self.next_admitted += 1
                return True
        return False

    def _try(self, queue: Queue, wl: Workload) -> str:
        """Admit ``wl`` or start preempting for it: ``admitted``, ``preempting`` or ``pending``."""
        if self._fit(queue, wl, borrow=True):
            return "admitted"
        reasons = []
        eligible = []
        for quota in queue.flavors:
            if not flavor_matches(self.flavors[quota.flavor], wl.node_selector):
                reasons.append(f"flavor {quota.flavor} doesn't match node affinity")
                continue
            available = self.usage.available(queue, quota.flavor)
            capacity = self.usage.capacity(queue, quota.flavor)
            if wl.chips > capacity:
                reasons.append(
                    f"insufficient quota for {labels.TPU_RESOURCE} in flavor {quota.flavor}, "
                    f"request > maximum capacity ({wl.chips} > {capacity})"
                )
                continue
            reasons.append(
                f"insufficient unused quota for {labels.TPU_RESOURCE} in flavor {quota.flavor}, "
                f"{wl.chips - available} more needed"
            )
            eligible.append(quota.flavor)
        for flavor in eligible:
            victims = self._victims(queue, wl, flavor)
            if victims:
                for victim, reason in victims:
                    self.victims.add(victim.key)
                    if victim.evicting:
                        continue  # already on its way out: what it gives back is awaited, not asked again
                    message = preemption_message(victim, wl, reason, self.queues)
                    self.result.preempt.append(Preemption(victim, wl, reason, message))
                reasons.append(f"Pending the preemption of {len(victims)} workload(s)")
                self.result.pending[wl.key] = _prefix(wl) + ". ".join([", ".join(reasons[:-1]), reasons[-1]])
                return "preempting"
        self.result.pending[wl.key] = _prefix(wl) + ", ".join(reasons)
        return "pending"

    def _victims(self, queue: Queue, wl: Workload, flavor: str) -> list[tuple[Workload, str]]:
        """The fewest admitted Workloads whose removal lets ``wl`` fit ``flavor`` (empty: none do)."""
        candidates: list[tuple[Workload, str]] = []
        admitted = [w for w in self.workloads if w.flavor == flavor and w.key not in self.victims]
        if queue.within in WITHIN_POLICIES:
            for other in admitted:
                lower = other.priority < wl.priority
                newer_equal = other.priority == wl.priority and other.created > wl.created
                if other.queue == queue.name and (
                    lower or (queue.within == "LowerOrNewerEqualPriority" and newer_equal)
                ):
                    candidates.append((other, IN_CLUSTER_QUEUE))
        quota = queue.quota(flavor)
        fits_nominal = quota is not None and self.usage.of(queue.name, flavor) + wl.chips <= quota.nominal
        if queue.cohort and queue.reclaim in RECLAIM_POLICIES and fits_nominal:
            for other in admitted:
                other_queue = self.queues.get(other.queue)
                if other_queue is None or other.queue == queue.name or other_queue.cohort != queue.cohort:
                    continue
                nominal = (other_queue.quota(flavor) or FlavorQuota(flavor, 0)).nominal
                borrowing = self.usage.of(other.queue, flavor) > nominal
                if borrowing and (queue.reclaim == "Any" or other.priority < wl.priority):
                    candidates.append((other, IN_COHORT_RECLAMATION))
        # Those already evicted, then borrowing queues, the lowest priority, the most recently admitted.
        candidates.sort(
            key=lambda c: (not c[0].evicting, c[0].queue == queue.name, c[0].priority, -c[0].admitted_order)
        )
        chosen: list[tuple[Workload, str]] = []
        for candidate in candidates:
            chosen.append(candidate)
            if self._fits_without(queue, wl, flavor, chosen):
                break
        else:
            return []
        # Give back any victim the preemptor turns out not to need (Kueue minimizes the set too).
        for candidate in list(reversed(chosen[:-1])):
            rest = [c for c in chosen if c is not candidate]
            if self._fits_without(queue, wl, flavor, rest):
                chosen = rest
        return chosen

    def _fits_without(
        self, queue: Queue, wl: Workload, flavor: str, removed: Sequence[tuple[Workload, str]]
    ) -> bool:
        for victim, _ in removed:
            self.usage.add(victim.queue, flavor, -victim.chips)
        try:
            return wl.chips <= self.usage.available(queue, flavor)
        finally:
            for victim, _ in removed:
                self.usage.add(victim.queue, flavor, victim.chips)


def plan(
    queues: Mapping[str, Queue], flavors: Mapping[str, Mapping[str, str]], workloads: Sequence[Workload]
) -> Plan:
    """One admission pass: ``flavors`` maps ResourceFlavor names to their nodeLabels.

    ``workloads`` are the unfinished Workloads; those with ``flavor`` set hold quota. Workloads
    whose ``queue`` is not in ``queues`` are left alone (the caller reports why).
    """
    return _Planner(queues, flavors, workloads).run()
