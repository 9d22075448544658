"""Pure decisions about a managed pool its owner no longer needs: who runs on it, and what happens.

A pod picks nodes by accelerator, topology and a few selectors only, so any idle pool of the right
shape can take *another* JobSet's pods (a Kueue-admitted JobSet, a preemptor, a recreated JobSet
of the same name). The owner's verdict alone must therefore never delete a pool: these functions
look at who actually occupies it and decide between

* ``DELETE`` - nobody live runs there and nobody waiting needs this exact shape (or the handover
  window is over);
* ``KEEP``   - the owner still needs it, or the owner's own pods still run there, or an occupant
  cannot be recorded as the new owner;
* ``ADOPT``  - a live JobSet other than the owner runs there, or (when the JobSet being released
  ran there last) that JobSet: the pool becomes that JobSet's, node and billing labels alike;
* ``OFFER``  - idle, but a waiting JobSet needs exactly this shape: kept (uncordoned) for at most
  ``IDLE_POOL_SECONDS`` so its pods can land on it instead of paying for a delete and a create.

No I/O here; ``shared.provisioning.release.releaser`` gathers the facts and carries the decision out.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from shared.core import labels
from shared.core.errors import NotEligible, Refused
from shared.core.names import label_value_problem
from shared.core.settings import Settings
from shared.tpu import capacity, catalog
from shared.tpu.capacity import CapacityOption
from shared.tpu.declared import declaration_problem, declared_request, replicated_jobs, total_vms_problem
from shared.tpu.jobsets import JobSet, is_suspended, terminal_condition
from shared.tpu.nodepools import SERVING, NodePoolInfo, NodePoolSpec
from shared.tpu.nodes import Node
from shared.tpu.owners import Chain
from shared.tpu.pods import Pod
from shared.tpu.slices import SliceRequest, build_node_pool, policy_of, slice_options

# Kueue manages a job that names a LocalQueue with this label (Kueue's constants.QueueLabel).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

DELETE = "delete"
KEEP = "keep"
ADOPT = "adopt"
OFFER = "offer"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether the pool's owner lets it go, and why (the owner's side only; occupancy comes after)."""

    delete: bool
    why: str


@dataclasses.dataclass(frozen=True)
class Occupant:
    """A live JobSet with at least one non-terminal pod on the pool's nodes."""

    namespace: str
    name: str
    uid: str
    replicated_job: str
    job_index: str
    pods: int

    def describe(self) -> str:
        """``namespace/name`` for logs and Events."""
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class Shape:
    """What makes two TPU pools interchangeable for a pod: everything it can select on."""

    machine_type: str
    node_count: int
    topology: str
    capacity: str  # the capacity option's key: kind, reservation and (single) zone, e.g. spot@us-east5-b
    extra_labels: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Demand:
    """A slice some waiting JobSet needs (``who`` names it for logs).

    ``shapes``: every pool shape the slice may run on, one per option of its capacity policy (the
    pod's own choice without one), so a Spot pool made by a ``spot, on-demand`` policy is held for
    a queued JobSet with that policy even though its pods select nothing.
    """

    shapes: tuple[Shape, ...]
    namespace: str
    name: str
    uid: str
    who: str
    # Admitted by Kueue a moment ago (``JUST_ADMITTED_SECONDS``), its pods perhaps not bound yet:
    # no pool is kept idle for it, but none of its shape is deleted before its pods had a chance.
    just_admitted: bool = False


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do with the pool, why, and (for ADOPT) who takes it."""

    action: str
    why: str
    adopter: Occupant | None = None


def _copied(pool_labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    # The product's own keys (ownership, idle stamp) say nothing about what a pod can select.
    return tuple(
        sorted((k, v) for k, v in pool_labels.items() if not k.startswith(f"{labels.PRODUCT_DOMAIN}/"))
    )


def spec_shape(spec: NodePoolSpec) -> Shape:
    """The shape of a pool the product would create."""
    return Shape(
        machine_type=spec.machine_type,
        node_count=spec.node_count,
        topology=spec.placement.tpu_topology if spec.placement else "",
        capacity=capacity.key_of_spec(spec),
        extra_labels=_copied(spec.labels),
    )


def pool_shape(pool: NodePoolInfo) -> Shape:
    """The shape of an existing pool as GKE lists it."""
    return Shape(
        machine_type=pool.machine_type,
        node_count=pool.node_count,
        topology=pool.tpu_topology,
        capacity=capacity.key_of_pool(pool),
        extra_labels=_copied(pool.labels),
    )


def is_live(jobset: JobSet | None) -> bool:
    """A JobSet that exists, is not being deleted and has no Completed/Failed condition."""
    if jobset is None or jobset.meta.deleting:
        return False
    return terminal_condition(jobset) is None


PodKey = tuple[str, str]  # (namespace, name) of a pod


def _running_on(pool: NodePoolInfo, nodes: Iterable[Node], pods: Iterable[Pod]) -> Iterator[Pod]:
    """The pods bound to one of the pool's nodes that have not finished."""
    names = {n.name for n in nodes if n.pool == pool.name}
    for pod in pods:
        if pod.node_name in names and not pod.finished:
            yield pod


def occupants(
    pool: NodePoolInfo,
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    jobsets: Mapping[tuple[str, str], JobSet | None],
    chains: Mapping[PodKey, Chain],
) -> list[Occupant]:
    """The JobSets that hold the pool: each with a non-terminal TPU pod on one of its nodes that
    ``chains`` proves to be its own (controller Job -> JobSet by uid;
    ``shared.provisioning.tenancy.ownership``), while that JobSet is live and not suspended; busiest first.

    Labels prove nothing: a pod that merely names a JobSet, a pod without TPUs (a DaemonSet's, a
    bare pod pinned to the node) and the pods of a suspended JobSet (which runs none of its own)
    hold nothing. A terminating pod still counts (it still runs there). A pool with no nodes yet
    (still provisioning) has no occupant.
    """
    found: dict[tuple[str, str, str], list[Chain]] = {}
    for pod in _running_on(pool, nodes, pods):
        chain = chains.get((pod.namespace, pod.name))
        if chain is None or pod.tpu_chips <= 0:
            continue
        jobset = jobsets.get((chain.namespace, chain.jobset))
        if jobset is None or not is_live(jobset) or is_suspended(jobset):
            continue
        if jobset.meta.uid != chain.jobset_uid:
            continue
        found.setdefault((chain.namespace, chain.jobset, chain.jobset_uid), []).append(chain)
    result = []
    for (namespace, name, uid), held in found.items():
        first = held[0]
        result.append(
            Occupant(
                namespace=namespace,
                name=name,
                uid=uid,
                replicated_job=first.replicated_job,
                job_index=str(first.job_index),
                pods=len(held),
            )
        )
    return sorted(result, key=lambda o: (-o.pods, o.namespace, o.name, o.uid))


def pretenders(
    pool: NodePoolInfo,
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    chains: Mapping[PodKey, Chain],
) -> list[str]:
    """``namespace/name`` of each running pod on the pool's nodes that names a JobSet in its labels
    but that ``chains`` does not prove one of that JobSet's Jobs made: ``occupants`` counts none of
    them, and the release's Event says so (a tenant's bare pod pinned to another team's node)."""
    found = []
    for pod in _running_on(pool, nodes, pods):
        if pod.jobset_value(labels.JOBSET_NAME) and (pod.namespace, pod.name) not in chains:
            found.append(pod.key)
    return sorted(found)


def adopted_labels(pool: NodePoolInfo, occupant: Occupant) -> dict[str, str]:
    """The pool's node labels once ``occupant`` owns it (copied selectors kept, idle stamp dropped)."""
    new = {k: v for k, v in pool.labels.items() if k != labels.IDLE_SINCE}
    former = pool.owner.name
    if former and (former, pool.owner.uid) != (occupant.name, occupant.uid):
        new[labels.HANDED_OVER_FROM] = former  # a JobSet name is a valid label value (DNS-1123, <= 63)
    new.update(
        {
            labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
            labels.OWNER_NAMESPACE: occupant.namespace,
            labels.OWNER_NAME: occupant.name,
            labels.OWNER_UID: occupant.uid,
            labels.OWNER_REPLICATED_JOB: occupant.replicated_job,
            labels.OWNER_JOB_INDEX: occupant.job_index,
        }
    )
    return new


def last_runs(
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    chains: Mapping[PodKey, Chain],
    namespace: str,
    name: str,
    uid: str,
) -> dict[str, Occupant]:
    """The pools (by name) on whose nodes pods of JobSet ``namespace/name`` (uid ``uid`` when given)
    ran or run, in any phase, as ``chains`` proves them its own: the JobSet being released takes
    over the pools it ran on last.

    ``nodes``: the managed Nodes (each carries its pool's name); ``pods``: candidate pods.
    """
    pool_of = {n.name: n.pool for n in nodes}
    held: dict[str, list[Chain]] = {}
    for pod in pods:
        chain = chains.get((pod.namespace, pod.name))
        if chain is None or (chain.namespace, chain.jobset) != (namespace, name):
            continue
        if uid and chain.jobset_uid != uid:
            continue  # an older JobSet of that name ran there, not this one
        pool = pool_of.get(pod.node_name, "")
        if pool:
            held.setdefault(pool, []).append(chain)
    return {
        pool: Occupant(
            namespace=namespace,
            name=name,
            uid=found[0].jobset_uid,
            replicated_job=found[0].replicated_job,
            job_index=str(found[0].job_index),
            pods=len(found),
        )
        for pool, found in held.items()
    }


def _owner(pool: NodePoolInfo) -> tuple[str, str, str]:
    return (
        pool.owner.namespace,
        pool.owner.name,
        pool.owner.uid,
    )


def decide(
    pool: NodePoolInfo,
    verdict: Verdict,
    found: Sequence[Occupant],
    demand: Sequence[Demand],
    idle_seconds: float,
    settings: Settings,
    last_user: Occupant | None = None,
    may_own: Callable[[NodePoolInfo, Occupant], str] | None = None,
) -> Decision:
    """DELETE, KEEP, ADOPT or OFFER for ``pool`` given its owner's verdict and who runs on it.

    ``idle_seconds``: how long the pool has had no owner that needs it (0 when just now).
    ``last_user``: the JobSet being released, when its (finished) pods ran on the pool after the
    owner's: with no live JobSet on the pool it adopts it, so that its own release deletes it and its
    Events name it. A live occupant always comes first: the pool is its now.
    ``may_own``: why a JobSet may not take the pool (the guardrails and budgets of its namespace;
    "" when it may): such an occupant is not made its owner, and the pool is kept while it runs.
    """
    if not verdict.delete:
        return Decision(KEEP, verdict.why)
    namespace, name, uid = _owner(pool)
    if any((o.namespace, o.name) == (namespace, name) and (not uid or o.uid == uid) for o in found):
        return Decision(KEEP, f"{verdict.why}, but its own pods still run on {pool.name}")
    if found:
        adopter = found[0]
        problem = _ownership_problem(pool, adopter) or (may_own(pool, adopter) if may_own else "")
        if problem:
            # Never delete under a running workload; keeping costs money, deleting costs the run.
            return Decision(KEEP, f"{adopter.describe()} runs on {pool.name} but cannot own it: {problem}")
        others = f" (and {len(found) - 1} more JobSet(s))" if len(found) > 1 else ""
        return Decision(
            ADOPT, f"{verdict.why}; {adopter.describe()} runs {adopter.pods} pod(s) on it{others}", adopter
        )
    # A last user whose name GKE would refuse as a label leaves the owner's name on a pool that goes.
    if (
        last_user is not None
        and (last_user.namespace, last_user.name, last_user.uid) != (namespace, name, uid)
        and not _ownership_problem(pool, last_user)
        and not (may_own(pool, last_user) if may_own else "")
    ):
        ran = f"{last_user.describe()} ran {last_user.pods} pod(s) on it last"
        return Decision(ADOPT, f"{verdict.why}; {ran}", last_user)
    if pool.status not in SERVING:
        return Decision(DELETE, verdict.why)  # only a pool whose nodes serve is worth holding
    taker = waiting_taker(pool, demand)
    if taker is not None and idle_seconds < settings.idle_pool_seconds:
        return Decision(
            OFFER,
            f"{verdict.why}; kept idle for {taker.who}, which needs exactly this shape "
            f"({idle_seconds:.0f}s of the {settings.idle_pool_seconds}s handover window used)",
        )
    if taker is not None:
        return Decision(DELETE, f"{verdict.why}; idle for {idle_seconds:.0f}s, nobody took it")
    return Decision(DELETE, verdict.why)


def _ownership_problem(pool: NodePoolInfo, taker: Occupant) -> str:
    """Why ``taker`` cannot be recorded as the pool's owner (a label value GKE would refuse), or ""."""
    for value in adopted_labels(pool, taker).values():
        problem = label_value_problem(value)
        if problem:
            return problem
    return ""


def _owned_counts(pools: Iterable[NodePoolInfo]) -> dict[tuple[str, str, str, str], int]:
    """Managed pools per (namespace, JobSet, uid, replicated job) as their owner labels say."""
    counts: dict[tuple[str, str, str, str], int] = {}
    for pool in pools:
        if not pool.managed:
            continue
        key = (
            pool.owner.namespace,
            pool.owner.name,
            pool.owner.uid,
            pool.owner.replicated_job,
        )
        counts[key] = counts.get(key, 0) + 1
    return counts


# How long after Kueue admits a JobSet a free pool of its shape is not deleted: JobSet's controller
# creates the Jobs, the Job controller the pods, and the scheduler binds them to any free pool of
# their shape within seconds (made for them or not); a cordon in that gap leaves them Pending, and
# without pools of their own buys new ones. Half a minute covers a loaded control plane; the release asks
# for a redelivery meanwhile instead of holding the pool (``Releaser.dispose``), so nothing is kept
# past it.
JUST_ADMITTED_SECONDS = 30.0


def just_admitted_taker(pool: NodePoolInfo, found: Sequence[Demand]) -> Demand | None:
    """The JobSet admitted a moment ago (``Demand.just_admitted``) whose pods could still land on
    ``pool`` (its shape, not its owner), or None."""
    return _taker(pool, found, just_admitted=True)


def waiting_taker(pool: NodePoolInfo, found: Sequence[Demand]) -> Demand | None:
    """The queued JobSet (not admitted yet) that ``pool`` would be kept idle for, or None."""
    return _taker(pool, found, just_admitted=False)


def _taker(pool: NodePoolInfo, found: Sequence[Demand], just_admitted: bool) -> Demand | None:
    """The first demand of ``pool``'s shape that is not its owner's, among those admitted just now
    (``just_admitted``) or those still queued: the one an idle pool is kept or left for."""
    shape = pool_shape(pool)
    owner = _owner(pool)
    return next(
        (
            d
            for d in found
            if d.just_admitted is just_admitted
            and shape in d.shapes
            and (d.namespace, d.name, d.uid) != owner
        ),
        None,
    )


def demand(
    jobsets: Iterable[JobSet],
    pools: Iterable[NodePoolInfo],
    settings: Settings,
    may_spend: Callable[[str, int], str] | None = None,
    now: datetime.datetime | None = None,
) -> list[Demand]:
    """The replicated jobs of live suspended JobSets queued in Kueue (their ``kueue.x-k8s.io/queue-name``
    label: a JobSet its owner suspended is no demand, as no admission will bring its pods) with slices
    that have no pool of
    their own, one entry per replicated job (never per pod or per slice: a JobSet declaring a
    million pods costs what its replicated jobs cost). JobSets the guardrails would refuse (another
    namespace than NAMESPACE_ALLOWLIST's, an accelerator outside ALLOWED_ACCELERATORS, a namespace
    ``may_spend`` says could never hold one slice's chips) are no demand: no pool is held for what
    could never be provisioned for them.

    When Kueue admits such a JobSet its pods appear and bind at once to any idle pool of their shape,
    so an idle pool is worth holding for it. Pods already Pending are deliberately not demand: the
    provision function creates their own pools on their first event, and holding another pool for
    them as well would pay for two.

    With ``now``, the JobSets Kueue admitted at most ``JUST_ADMITTED_SECONDS`` before it are listed
    too, marked ``just_admitted``, whether their slices have pools of their own or not (the
    scheduler binds their pods to any free pool of the shape): ``decide`` holds nothing for them,
    and the release defers deleting a free pool of their shape until their pods had the chance.
    """
    owned = _owned_counts(pools)
    found: list[Demand] = []
    for jobset in jobsets:
        if not is_live(jobset):
            continue
        admitted = not is_suspended(jobset)
        if admitted and (now is None or not jobset.resumed_within(JUST_ADMITTED_SECONDS, now)):
            continue
        meta = jobset.meta
        if not meta.labels.get(KUEUE_QUEUE_LABEL):
            continue  # suspended by its owner, not queued: no admission will bring its pods
        if settings.namespace_allowlist and meta.namespace not in settings.namespace_allowlist:
            continue
        try:
            policy = policy_of(settings, jobset)
        except Refused:
            policy = ()  # its pods will be refused with the reason; hold pools for its own choice only
        too_big = total_vms_problem(jobset, settings.max_vms_per_jobset)
        for rjob in replicated_jobs(jobset):
            missing = rjob.replicas - owned.get((meta.namespace, meta.name, meta.uid, rjob.name), 0)
            # Admitted just now, its pods go to any free pool of their shape, not to the ones made
            # for them (they select the shape's node labels, never a pool): seen on the real stack,
            # a pool of a finished JobSet cordoned for deletion as the leader of a JobSet with pools
            # of its own bound there, and its follower, pinned there by exclusive placement, pending.
            if missing <= 0 and not admitted:
                continue
            try:
                request = declared_request(jobset, rjob.name, 0)
                if settings.allowed_accelerators and request.accelerator not in settings.allowed_accelerators:
                    continue
                shape = catalog.resolve(request.accelerator, request.topology, request.chips_per_vm)
                if declaration_problem(rjob, shape) or too_big:
                    continue  # provision would refuse its slices: no pool is held for them
                if may_spend is not None and may_spend(meta.namespace, shape.total_chips):
                    continue  # its namespace may never hold such a slice: keeping one costs for nothing
                shapes = _shapes(settings, request, policy)
            except (NotEligible, Refused, catalog.UnsupportedShape):
                continue
            if admitted and missing <= 0:
                state = "admitted just now, its pods perhaps not bound yet"
            else:
                state = ("admitted just now, " if admitted else "") + f"{missing} slice(s) without a pool"
            who = f"{meta.namespace}/{meta.name} {rjob.name} ({state})"
            found.append(Demand(shapes, meta.namespace, meta.name, meta.uid, who, admitted))
    return found


def _shapes(
    settings: Settings, request: SliceRequest, policy: tuple[CapacityOption, ...]
) -> tuple[Shape, ...]:
    """The shape of the slice's pool on each capacity option its policy allows it."""
    try:
        choices: tuple[CapacityOption | None, ...] = slice_options(settings, request.demand, policy)
    except Refused:
        choices = (None,)
    return tuple(dict.fromkeys(spec_shape(build_node_pool(settings, request, option=o)[0]) for o in choices))
