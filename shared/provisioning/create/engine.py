"""The one route from a group of slices to their GKE creates, shared by every path that buys.

Provision (a pending pod's replicated job), the Kueue admission check (a Workload's slices) and the
reconcile sweep (through provision) all buy pools the same way, here:

0. ``plan``: each slice's create on the capacity its next attempt uses (the policy's first option,
   or the fallback its failure record names), its spec built once;
1. ``charge``: each create is charged to the budget its namespace spends under (``CHIP_BUDGET`` over
   all pools, the namespace's ``TENANTS`` entry), reserved before anything is sent so that the
   creates of one delivery cannot overshoot together; what a budget cannot pay for is refused;
2. ``send``: as many as GKE has free operation slots for (the rest wait for a finished operation),
   in rounds through the instance's one account of slots and request quota (``Slots``), each after
   the tpu7x workload policy it names exists, and one on a reservation placed in the block or
   sub-block Compute Engine says has room for it (``ReservationLook``: none has room, and the
   attempt is refused without a create and, given the delivery's specs, the slice is sent again
   on its next capacity option in another round of the same delivery);
3. GKE's answers sorted once: accepted, already there (409), refused for capacity (quota, a missing
   or full reservation: the slice's attempt is recorded and falls back or backs off, ``Fallback``),
   rejected for good (4xx), or transient (redelivery);
4. one ``TPUSliceRequested`` Event naming every pool accepted and the budget charged, on the JobSet
   (and on whatever else asked, e.g. the pod).

Each orchestrator maps the ``Sent`` record onto its own answer (provision's outcomes, the check's
state); none of them sends a create any other way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.cloud.retry import Budget
from shared.core import labels
from shared.core.errors import (
    AlreadyExistsError,
    CapacityUnavailableError,
    Refused,
    RejectedError,
    TransientError,
)
from shared.core.settings import Settings
from shared.provisioning.create import backoff, slots
from shared.provisioning.create.fallback import Attempts, Fallback
from shared.provisioning.create.groups import Create, Specs
from shared.provisioning.create.policies import WorkloadPolicies
from shared.provisioning.create.reservations import ReservationLook
from shared.provisioning.create.slots import Slots
from shared.provisioning.tenancy.guardrails import managed_chips, over_chip_budget
from shared.provisioning.tenancy.spending import Spending
from shared.tpu import capacity, catalog
from shared.tpu.jobsets import JobSet, jobset_ref
from shared.tpu.nodepools import ClusterInfo, NodePoolInfo
from shared.tpu.slices import SliceRequest, policy_of, slice_options


def _chips(item: Create) -> int:
    return (catalog.machine_type_chips(item.spec.machine_type) or 0) * item.spec.node_count


def plan(
    settings: Settings,
    cluster: ClusterInfo | None,
    jobset: JobSet | None,
    requests: Sequence[SliceRequest],
    specs: Specs,
    failures: Mapping[str, backoff.Failure],
    note: str = "",
) -> list[Create]:
    """The creates of ``jobset``'s slices ``requests``, in order: each on its next attempt's capacity
    option (``Attempts`` over the replicated job's policy on ``cluster`` and ``failures``), its spec
    from ``specs`` (built once per slice and option); ``note`` ends each create's reason. Raises
    ``SliceRefused`` for the first slice no pool can be built for.

    Pure: the engine plans a delivery's group with it, and ``tpuprov why`` says what the next
    create of a pending pod's slice would be with it, so the two cannot differ."""
    attempts: dict[str, Attempts] = {}  # one per replicated job: its slices share the policy
    wanted: list[Create] = []
    for request in requests:
        rjob = request.slice_id.replicated_job
        try:
            if rjob not in attempts:
                options = slice_options(settings, request.demand, policy_of(settings, jobset), cluster)
                attempts[rjob] = Attempts(options, failures)
            spec, shape = specs.of(request, attempts[rjob].option(request.pool_name))
        except Refused as exc:
            raise SliceRefused(request, exc.why) from exc
        wanted.append(Create.of(request, spec, shape, note))
    return wanted


class SliceRefused(Refused):
    """No pool can be built for one slice of a group (a bad capacity policy or zone): nothing of the
    group is planned. ``slice_desc`` names the slice, ``why`` says what is wrong."""

    def __init__(self, request: SliceRequest, why: str) -> None:
        super().__init__(why)
        self.slice_desc = request.slice_id.describe()


@dataclasses.dataclass(frozen=True)
class Charged:
    """What a group's budgets allow: the creates that may be sent, those refused with why, and the
    budget the allowed ones are charged to (for the Event)."""

    allowed: list[Create]
    refused: list[tuple[Create, str]]
    account: str


@dataclasses.dataclass
class Sent:
    """What sending a group did, each create once."""

    created: list[Create] = dataclasses.field(default_factory=list)
    exists: list[Create] = dataclasses.field(default_factory=list)  # GKE answered 409
    # Refused for this attempt's capacity (quota, reservation): the failure as recorded on the JobSet.
    capacity: list[tuple[Create, backoff.Failure, str]] = dataclasses.field(default_factory=list)
    rejected: list[tuple[Create, RejectedError]] = dataclasses.field(default_factory=list)
    transient: list[tuple[Create, TransientError]] = dataclasses.field(default_factory=list)
    waiting: list[Create] = dataclasses.field(default_factory=list)  # no free operation slot
    unsent: list[Create] = dataclasses.field(default_factory=list)  # stopped (deadline, GKE's refusal)
    stopped: str = ""
    placed: dict[str, str] = dataclasses.field(default_factory=dict)  # pool -> where in its reservation
    slot_limit: int | None = None  # GKE's operation limit as the instance knows it
    busy: int = 0  # operations GKE ran by the listing


class SliceGroupEngine:
    """Charges, sends and sorts the creates of one group of slices (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        slots_account: Slots,
        fallback: Fallback,
        spending: Spending,
        policies: WorkloadPolicies | None,
        cluster: Callable[[], ClusterInfo],
        reservations: ReservationLook | None = None,
    ) -> None:
        """The instance's collaborators (``shared.provisioning.services`` builds one engine with them):
        its one slot and quota account, its capacity fallback, its budgets, its tpu7x policies and
        its look at reservations (None: a create names the reservation and GKE finds the room)."""
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.slots = slots_account
        self.fallback = fallback
        self.spending = spending
        self.policies = policies
        self.cluster = cluster
        self.reservations = reservations

    def plan(
        self,
        jobset: JobSet,
        requests: Sequence[SliceRequest],
        specs: Specs,
        failures: Mapping[str, backoff.Failure],
        note: str = "",
    ) -> list[Create]:
        """``plan`` on the instance's cluster (read once per instance)."""
        return plan(self.settings, self.cluster(), jobset, requests, specs, failures, note)

    def charge(self, namespace: str, items: Sequence[Create], pools: list[NodePoolInfo]) -> Charged:
        """The creates ``namespace`` may pay for now, each reserved against its budgets in order."""
        spending = self.spending
        in_use = managed_chips(pools) if self.settings.chip_budget else 0
        pending: dict[str, int] = {}  # chips granted in this group per TENANTS entry
        allowed: list[Create] = []
        refused: list[tuple[Create, str]] = []
        account = ""
        entry = spending.entry(namespace) if self.settings.tenant_entries else None
        for item in items:
            chips = _chips(item)
            over = over_chip_budget(self.settings, in_use, chips)
            refusal, charged = spending.refusal(namespace, chips, item.spec.reservation, pools, pending)
            if over or refusal:
                refused.append((item, over or refusal))
                continue
            in_use += chips  # reserved before sending, so the group's creates cannot overshoot
            if entry is not None:
                pending[entry.key] = pending.get(entry.key, 0) + chips
            account = charged
            allowed.append(item)
        return Charged(allowed, refused, account)

    def send(
        self,
        jobset: JobSet,
        items: Sequence[Create],
        pools: list[NodePoolInfo],
        budget: Budget,
        account: str,
        also_tell: Sequence[Mapping[str, Any]] = (),
        purpose: str = "",
        specs: Specs | None = None,
    ) -> Sent:
        """Send ``items`` (already charged to ``account``) for ``jobset``'s slices; ``also_tell``:
        objects besides the JobSet whose Event stream names the pools requested; ``purpose`` ends the
        Event's sentence (e.g. "for its Workload's admission check"); ``specs``: the delivery's pool
        specs, with which a slice whose reservation the look found without room goes on to its next
        capacity option in this same delivery (None: by redelivery)."""
        sent = Sent(slot_limit=self.slots.operation_limit, busy=slots.busy(pools))
        queue, listing = list(items), list(pools)
        # Each round's look refusals record an attempt and move the slice one option on, so the
        # rounds end within the policy's length; the bound is a guard against a policy loop.
        for _ in range(_ROUNDS):
            looked = self._send_round(jobset, queue, listing, budget, sent)
            queue = self._next_options(jobset, looked, listing, sent, specs) if specs is not None else []
            if not queue:
                break
            listing = [*pools, *(item.listed() for item in sent.created)]
        if sent.created:
            # One Event per group (or per part of it a delivery got through), naming every pool.
            names = ", ".join(i.spec.name for i in sent.created)
            rjobs = ", ".join(dict.fromkeys(i.request.slice_id.replicated_job for i in sent.created))
            why = f" {purpose}" if purpose else ""
            message = f"requested node pools {names} for {rjobs}{why}, charged to {account}"
            where = [sent.placed[i.spec.name] for i in sent.created if sent.placed.get(i.spec.name)]
            if where:
                message += f" ({'; '.join(dict.fromkeys(where))})"
            sid = sent.created[0].request.slice_id
            self.kube.record_event(jobset_ref(jobset, sid), labels.REASON_REQUESTED, message)
            for involved in also_tell:
                self.kube.record_event(dict(involved), labels.REASON_REQUESTED, message)
        return sent

    def _send_round(
        self, jobset: JobSet, items: Sequence[Create], pools: list[NodePoolInfo], budget: Budget, sent: Sent
    ) -> set[str]:
        """One round of creates into ``sent``; the pools whose attempt the look refused (nothing sent)."""
        slots_account, policies, fallback = self.slots, self.policies, self.fallback
        queue = list(items)
        free = slots_account.free(pools)
        if free is not None and free < len(queue):
            # No point asking GKE for more operations than it runs at once: the rest waits for a
            # finished operation (its audit entry resumes them) instead of collecting 429s.
            queue, waiting = queue[:free], queue[free:]
            sent.waiting.extend(waiting)

        look = self.reservations
        looked: set[str] = set()

        def create(item: Create) -> None:
            spec = item.spec
            if look is not None and spec.reservation is not None:
                try:
                    placed = look.place(spec, pools)
                except CapacityUnavailableError:
                    looked.add(spec.name)  # no room: nothing was sent
                    raise
                spec = placed.spec
                sent.placed[spec.name] = placed.why
            if policies is not None:  # GKE needs the pool's workload policy to exist first
                policies.ensure_for(spec, item.why)
            try:
                self.gke.create_node_pool(self.settings.cluster_path, spec, item.why)
            except Exception:
                if look is not None:
                    look.forget(spec.name)
                raise

        result = slots_account.send_all(queue, create, budget, slots.busy(pools))
        for item, error in result.sent:
            if isinstance(error, CapacityUnavailableError):  # this attempt's capacity: fall back or back off
                failure = fallback.refused(item.request, jobset, item.spec, error.why)
                sent.capacity.append((item, failure, error.why))
            elif error is None:
                sent.created.append(item)
            elif isinstance(error, AlreadyExistsError):
                sent.exists.append(item)
            elif isinstance(error, TransientError):
                sent.transient.append((item, error))
            elif isinstance(error, RejectedError):
                sent.rejected.append((item, error))
            else:
                raise error  # a permanent error the adapter should not raise on create (e.g. 404 cluster)
        sent.unsent.extend(result.unsent)
        sent.stopped = result.stopped or sent.stopped
        return looked

    def _next_options(
        self, jobset: JobSet, looked: set[str], pools: list[NodePoolInfo], sent: Sent, specs: Specs
    ) -> list[Create]:
        """The creates, on their next capacity option, of the slices the look just refused with an
        option left, taken out of ``sent.capacity`` (the refused attempt stays recorded on the
        JobSet, and in its Event). A slice whose next pool cannot be built, or whose next
        reservation its namespace's TENANTS entry does not list, stays refused there: the
        redelivery goes through ``charge`` and says why."""
        again: list[Create] = []
        kept: list[tuple[Create, backoff.Failure, str]] = []
        for entry in sent.capacity:
            item, failure, _ = entry
            if item.spec.name not in looked or not failure.next:
                kept.append(entry)
                continue
            try:
                option = capacity.pick(self.fallback.options(item.request, jobset), failure.next)
                spec, shape = specs.of(item.request, option)
            except Refused:
                kept.append(entry)
                continue
            namespace = item.request.slice_id.namespace
            if spec.reservation is not None and self.spending.reservation_refusal(
                namespace, spec.reservation
            ):
                kept.append(entry)
                continue
            again.append(dataclasses.replace(item, spec=spec, shape=shape))
        sent.capacity[:] = kept
        return again


# A slice's capacity policy has a handful of options; a round per option and one more is plenty.
_ROUNDS = 8


__all__ = ["Charged", "Sent", "SliceGroupEngine", "SliceRefused", "plan"]
