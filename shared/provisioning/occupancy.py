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

No I/O here; ``shared.provisioning.releaser`` gathers the facts and carries the decision out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.core import labels
from shared.core.errors import NotEligible, Refused
from shared.core.meta import Meta
from shared.core.names import label_value_problem
from shared.core.settings import Settings
from shared.tpu import capacity
from shared.tpu.capacity import CapacityOption
from shared.tpu.jobsets import expand_pods, is_suspended, pod_jobset_value, terminal_condition
from shared.tpu.nodepools import STATUS_RUNNING, NodePoolInfo, NodePoolSpec
from shared.tpu.pods import FINISHED_PHASES
from shared.tpu.slices import SliceRequest, build_node_pool, policy_of, slice_options, slice_request

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


def is_live(jobset: Mapping[str, Any] | None) -> bool:
    """A JobSet that exists, is not being deleted and has no Completed/Failed condition."""
    if jobset is None or Meta.of(jobset).deleting:
        return False
    return terminal_condition(jobset) is None


def occupants(
    pool: NodePoolInfo,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    jobsets: Mapping[tuple[str, str], Mapping[str, Any] | None],
) -> list[Occupant]:
    """The live JobSets with a non-terminal pod on one of the pool's nodes, busiest first.

    A terminating pod still counts (it still runs there). A pod whose JobSet-uid label differs from
    the live JobSet of that name belongs to an older incarnation and does not count for the new one.
    A pool with no nodes yet (still provisioning) has no occupant.
    """
    metas = [Meta.of(n) for n in nodes]
    names = {m.name for m in metas if m.labels.get(labels.NODEPOOL) == pool.name}
    found: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") not in names:
            continue
        if (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        name = pod_jobset_value(pod, labels.JOBSET_NAME)
        if not name:
            continue  # not a JobSet pod (a DaemonSet's, say): it does not hold the pool
        namespace = Meta.of(pod).namespace
        jobset = jobsets.get((namespace, str(name)))
        if jobset is None or not is_live(jobset):
            continue
        uid = Meta.of(jobset).uid
        claimed = str(pod_jobset_value(pod, labels.JOBSET_UID) or "")
        if claimed and uid and claimed != uid:
            continue
        found.setdefault((namespace, str(name), uid), []).append(pod)
    result = []
    for (namespace, name, uid), held in found.items():
        first = held[0]
        result.append(
            Occupant(
                namespace=namespace,
                name=name,
                uid=uid,
                replicated_job=str(pod_jobset_value(first, labels.REPLICATED_JOB_NAME) or ""),
                job_index=str(pod_jobset_value(first, labels.JOB_INDEX) or "0"),
                pods=len(held),
            )
        )
    return sorted(result, key=lambda o: (-o.pods, o.namespace, o.name, o.uid))


def adopted_labels(pool: NodePoolInfo, occupant: Occupant) -> dict[str, str]:
    """The pool's node labels once ``occupant`` owns it (copied selectors kept, idle stamp dropped)."""
    new = {k: v for k, v in pool.labels.items() if k != labels.IDLE_SINCE}
    former = pool.labels.get(labels.OWNER_NAME, "")
    if former and (former, pool.labels.get(labels.OWNER_UID, "")) != (occupant.name, occupant.uid):
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
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], namespace: str, name: str, uid: str
) -> dict[str, Occupant]:
    """The pools (by name) on whose nodes pods of JobSet ``namespace/name`` (uid ``uid`` when given)
    ran or run, in any phase: the JobSet being released takes over the pools it ran on last.

    ``nodes``: the managed Nodes (each carries its pool's name); ``pods``: the JobSet's pods.
    """
    pool_of = {m.name: m.labels.get(labels.NODEPOOL, "") for m in map(Meta.of, nodes)}
    held: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        if Meta.of(pod).namespace != namespace:
            continue
        if pod_jobset_value(pod, labels.JOBSET_NAME) != name:
            continue
        claimed = str(pod_jobset_value(pod, labels.JOBSET_UID) or "")
        if uid and claimed and claimed != uid:
            continue  # an older JobSet of that name ran there, not this one
        pool = pool_of.get(str((pod.get("spec") or {}).get("nodeName") or ""), "")
        if pool:
            held.setdefault(pool, []).append(pod)
    return {
        pool: Occupant(
            namespace=namespace,
            name=name,
            uid=uid or str(pod_jobset_value(found[0], labels.JOBSET_UID) or ""),
            replicated_job=str(pod_jobset_value(found[0], labels.REPLICATED_JOB_NAME) or ""),
            job_index=str(pod_jobset_value(found[0], labels.JOB_INDEX) or "0"),
            pods=len(found),
        )
        for pool, found in held.items()
    }


def _owner(pool: NodePoolInfo) -> tuple[str, str, str]:
    return (
        pool.labels.get(labels.OWNER_NAMESPACE, ""),
        pool.labels.get(labels.OWNER_NAME, ""),
        pool.labels.get(labels.OWNER_UID, ""),
    )


def decide(
    pool: NodePoolInfo,
    verdict: Verdict,
    found: Sequence[Occupant],
    demand: Sequence[Demand],
    idle_seconds: float,
    settings: Settings,
    last_user: Occupant | None = None,
) -> Decision:
    """DELETE, KEEP, ADOPT or OFFER for ``pool`` given its owner's verdict and who runs on it.

    ``idle_seconds``: how long the pool has had no owner that needs it (0 when just now).
    ``last_user``: the JobSet being released, when its (finished) pods ran on the pool after the
    owner's: with no live JobSet on the pool it adopts it, so that its own release deletes it and its
    Events name it. A live occupant always comes first: the pool is its now.
    """
    if not verdict.delete:
        return Decision(KEEP, verdict.why)
    namespace, name, uid = _owner(pool)
    if any((o.namespace, o.name) == (namespace, name) and (not uid or o.uid == uid) for o in found):
        return Decision(KEEP, f"{verdict.why}, but its own pods still run on {pool.name}")
    if found:
        adopter = found[0]
        problem = _ownership_problem(pool, adopter)
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
    ):
        ran = f"{last_user.describe()} ran {last_user.pods} pod(s) on it last"
        return Decision(ADOPT, f"{verdict.why}; {ran}", last_user)
    if pool.status != STATUS_RUNNING:
        return Decision(DELETE, verdict.why)  # only a working pool is worth holding for someone
    shape = pool_shape(pool)
    taker = next(
        (d for d in demand if shape in d.shapes and (d.namespace, d.name, d.uid) != (namespace, name, uid)),
        None,
    )
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


def demand(
    jobsets: Iterable[Mapping[str, Any]], pool_names: Iterable[str], settings: Settings
) -> list[Demand]:
    """The slices of live suspended JobSets (Kueue-queued) that have no pool of their own.

    When Kueue admits such a JobSet its pods appear and bind at once to any idle pool of their shape,
    so an idle pool is worth holding for it. Pods already Pending are deliberately not demand: the
    provision function creates their own pools on their first event, and holding another pool for
    them as well would pay for two.
    """
    existing = set(pool_names)
    found: list[Demand] = []
    seen: set[str] = set()
    for jobset in jobsets:
        if not (is_live(jobset) and is_suspended(jobset)):
            continue
        try:
            policy = policy_of(settings, jobset)
        except Refused:
            policy = ()  # its pods will be refused with the reason; hold pools for its own choice only
        for planned in expand_pods(dict(jobset)):
            try:
                request = slice_request(planned)
                if request.pool_name in seen or request.pool_name in existing:
                    continue
                shapes = _shapes(settings, request, policy)
            except (NotEligible, Refused):
                continue
            seen.add(request.pool_name)
            sid = request.slice_id
            found.append(Demand(shapes, sid.namespace, sid.jobset, sid.jobset_uid, sid.describe()))
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
