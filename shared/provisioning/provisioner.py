"""The provision service: from "this pod is unschedulable" to exactly one TPU node pool per slice.

Per event it reads the pod, then answers from what is known when it can: a pod no Job controls is
refused at once, a slice whose pool this instance saw recently costs nothing more, one whose pool
the cluster's listing shows costs that listing. Only before spending or deleting does it read the
pod's Job and JobSet (two reads per slice group, ``shared.provisioning.tenancy.ownership``); for a pod bound
by then it reads the managed Nodes, plus what adopting a handed-over pool takes (``handover``). It
never waits for GKE's operation, and relies on the deterministic pool name so that duplicates and
concurrent instances converge: a 409 on create is success. The creates themselves go through the
instance's engine (``shared.provisioning.create.engine``).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

from shared.cloud.retry import Budget
from shared.core import labels, logs
from shared.core.errors import (
    NotEligible,
    NotFoundError,
    Refused,
    TransientError,
)
from shared.core.settings import Settings
from shared.provisioning.create import backoff
from shared.provisioning.create.engine import SliceGroupEngine, SliceRefused
from shared.provisioning.create.groups import Create, Group, Specs, deferral, group_incomplete
from shared.provisioning.create.known import group_of
from shared.provisioning.outcomes import CREATED, EXISTS, FAILED, REFUSED, SKIPPED, WAITING, Outcome, logged
from shared.provisioning.release.handover import Handover
from shared.provisioning.release.refit import Refit
from shared.provisioning.services import Services
from shared.provisioning.tenancy.guardrails import guardrail, label_problem
from shared.provisioning.tenancy.ownership import JobSetRefused
from shared.tpu import drift, owners, selectors
from shared.tpu.jobsets import JobSet, jobset_problem, jobset_ref
from shared.tpu.nodepools import (
    STATUS_ERROR,
    STATUS_STOPPING,
    ClusterInfo,
    NodePoolInfo,
    NodePoolSpec,
)
from shared.tpu.pods import Pod
from shared.tpu.slices import SliceRequest, slice_request

log = logs.get("provision")


class Provisioner:
    """Turns pending TPU pods into node-pool create requests, within the guardrails."""

    def __init__(self, services: Services) -> None:
        """``services``: the instance's one service graph (``shared.provisioning.services``), the
        same the admission check, release and reconcile use: one slot and quota account, one
        backoff and fallback record, one memory of known pools."""
        self.services = services
        self.settings = services.settings
        self.gke = services.gke
        self.kube = services.kube
        self.policies = services.policies
        self.known_pools = services.known_pools
        self._clock = services.clock
        self.backoff = services.backoff
        self.fallback = services.fallback
        self.owners = services.owners
        self.spending = services.spending
        # GKE's operation slots and API quota: the instance's one account (only a hint).
        self.slots = services.slots
        self.refit = Refit(self.settings, self.gke, self.kube)
        self.handover = Handover(self.settings, self.gke, self.kube, services.releaser)

    def cluster(self) -> ClusterInfo:
        """The managed cluster (zones, release channel), read from GKE once per instance."""
        return self.services.cluster()

    # -- entry points -----------------------------------------------------------------------------

    def handle_pending_pod(
        self, namespace: str, pod_name: str, event_time: datetime.datetime | None
    ) -> Outcome:
        """Handle a FailedScheduling-style event for ``namespace/pod_name``."""
        if event_time is not None:
            age = (datetime.datetime.now(tz=datetime.UTC) - event_time).total_seconds()
            if age > self.settings.max_event_age_seconds:
                return logged(
                    Outcome(SKIPPED, f"event is {age:.0f}s old (max {self.settings.max_event_age_seconds}s)")
                )
        try:
            pod = self.kube.get_pod(namespace, pod_name)
        except NotFoundError:
            return logged(Outcome(SKIPPED, f"pod {namespace}/{pod_name} no longer exists"))
        if pod.verdict_pending:
            # kube-scheduler records FailedScheduling before it patches the pod's PodScheduled
            # condition (handleSchedulingFailure, pkg/scheduler/schedule_one.go, v1.36), and the
            # Event reaches the sink on its own path: the event can be read before its condition.
            # Acknowledging would leave the pod to the next reconcile sweep (the scheduler's own
            # retries of a still-unschedulable pod repeat the Event as a series, which the sink may
            # not export again), so the delivery comes back; max_event_age_seconds bounds it.
            raise TransientError(
                f"pod {namespace}/{pod_name}: FailedScheduling read before the scheduler's "
                "PodScheduled condition; looking again"
            )
        return self.provision_pod(pod)

    def provision_pod(self, pod: Pod, pools: list[NodePoolInfo] | None = None) -> Outcome:
        """Request the slice a pending pod needs (``pools``: a listing the caller already has)."""
        # Every decision line about this pod carries the JobSet it claims to belong to.
        with logs.bound(**pod.log_field()):
            return self._provision_pod(pod, pools)

    def _provision_pod(self, pod: Pod, pools: list[NodePoolInfo] | None) -> Outcome:
        who = pod.key
        try:
            request = slice_request(pod)
        except NotEligible as exc:
            # Bound by now, maybe to a pool kept idle for its JobSet: that JobSet adopts it.
            return logged(Outcome(SKIPPED, f"pod {who}: {exc.why}{self.handover.claim(pod)}"))
        except Refused as exc:
            return self._refuse(pod, exc.why, "", jobset=self._declaring(pod))
        slice_desc = request.slice_id.describe()
        unowned = owners.controller_problem(pod.controller)
        if unowned:
            # No Job made this pod, whatever its labels say: refused before any read (a forged pod
            # costs no GKE listing).
            return self._refuse(pod, f"nothing is provisioned for it: {unowned}", slice_desc)
        orphaned = pod.orphaned_follower
        if orphaned:
            why = (
                f'JobSet\'s exclusive placement gave this follower pod nodeSelector {orphaned}="" '
                "(its webhook found no node for the Job's leader pod: kubernetes-sigs/jobset issue 1088), "
                f"which no node carries: it can never schedule. Delete it (kubectl delete pod -n "
                f"{pod.namespace} {pod.name}) and its Job makes a new one that follows the leader; "
                "nothing is provisioned for it"
            )
            return self._refuse(pod, why, slice_desc, jobset=self._proven(pod))
        specs = Specs(self.settings, self.cluster())
        try:
            spec, shape = specs.of(request)
        except Refused as exc:
            return self._refuse(pod, exc.why, slice_desc, jobset=self._declaring(pod, specs.of))
        refusal = label_problem(spec) or guardrail(self.settings, request, shape.total_chips)
        if refusal:
            return self._refuse(pod, refusal, slice_desc, spec.name)

        if pools is not None:  # the caller's listing decides (reconcile); no instance memory involved
            return self._request(pod, request, specs, slice_desc, pools)
        # One decision at a time per replicated job in this instance: the first event requests the
        # whole group, the others then find their pool remembered instead of racing to a 409.
        with self.known_pools.single_flight(group_of(request.slice_id)):
            if self.known_pools.known(spec.name, pod.created_at):
                why = f"pool {spec.name} was seen to exist less than {self.known_pools.ttl:.0f}s ago"
                return logged(Outcome(EXISTS, why, spec.name, slice_desc))
            pools = self.gke.list_node_pools(self.settings.cluster_path)
            return self._request(pod, request, specs, slice_desc, pools)

    def _request(
        self,
        pod: Pod,
        claim: SliceRequest,
        specs: Specs,
        slice_desc: str,
        pools: list[NodePoolInfo],
    ) -> Outcome:
        """Create the slice's pool and its siblings unless listed, within the budgets.

        ``claim`` is the slice as the pod's own labels and selectors describe it: enough to answer
        from the listing that its pool exists (nothing is spent or deleted on the pod's word). Every
        other step (a create, a refit, a recycle) first proves the pod is its JobSet's own and then
        works on the slice the JobSet declares (``shared.provisioning.tenancy.ownership``).
        """
        spec, _ = specs.of(claim)  # the pod's own choice, built by the caller
        pools = list(pools)  # extended with what this call creates; the caller's listing stays as given
        existing = _slice_pool(claim, spec.name, pools)
        if existing is not None and existing.status not in (STATUS_ERROR, STATUS_STOPPING):
            fits = not selectors.misfit(claim.selected, existing, spec)
            drift_due = self.settings.replace_drifted_pools and drift_of(existing, spec)
            if fits and not drift_due and not group_incomplete(pod, claim, pools):
                self.known_pools.remember(existing.name)
                why = f"pool {existing.name} already exists ({existing.status})"
                why += _drift_note(existing, spec, self.settings)
                return logged(Outcome(EXISTS, why, existing.name, slice_desc))
        if self.free_slots(pools) == 0 and (existing is None or existing.status != STATUS_ERROR):
            # Every operation slot is taken: nothing could be sent. Acknowledge cheaply (no reads)
            # and let the next finished operation resume the group.
            why = f"waiting for a GKE operation slot (all {self.operation_limit} in use)"
            return logged(Outcome(WAITING, why, spec.name, slice_desc))
        # About to spend money or delete a pool: the pod must be its JobSet's own (Job -> JobSet by
        # uid), and the JobSet's spec (not the pod) says what its slice is. Two reads per slice group.
        try:
            owned = self.owners.of_pod(pod)
        except NotEligible as exc:
            return logged(Outcome(SKIPPED, f"pod {pod.key}: {exc.why}", "", slice_desc))
        except JobSetRefused as exc:
            return self._refuse(pod, exc.why, slice_desc, spec.name, exc.jobset)
        except Refused as exc:
            return self._refuse(pod, exc.why, slice_desc, spec.name)
        request, jobset = owned.request, owned.jobset
        slice_desc = request.slice_id.describe()
        problem = jobset_problem(jobset, request.slice_id)
        if problem:
            return self._refuse(pod, problem, slice_desc, spec.name, jobset)
        try:
            spec, shape = specs.of(request)
            # The pool is the JobSet's; the pod must still be able to land on it.
            selectors.check(pod.selected, spec, shape.topology)
        except Refused as exc:
            return self._refuse(pod, exc.why, slice_desc, spec.name, jobset)
        refusal = (
            label_problem(spec)
            or guardrail(self.settings, request, shape.total_chips)
            or self.spending.kueue_refusal(jobset, request.slice_id.replicated_job)
        )
        if refusal:
            return self._refuse(pod, refusal, slice_desc, spec.name, jobset)
        budget = Budget(self.settings.request_deadline_seconds, clock=self._clock)
        existing = _slice_pool(request, spec.name, pools)
        misfit = selectors.misfit(request.selected, existing, spec) if existing is not None else ""
        if existing is not None and misfit and existing.status not in (STATUS_ERROR, STATUS_STOPPING):
            self.known_pools.forget(existing.name)  # found, but the pod could never land on it
            return self.refit.handle(pod, request, existing, misfit, slice_desc)
        replaced, drifted = self.refit.for_drift(pod, request, existing, spec, slice_desc)
        if replaced is not None:
            self.known_pools.forget(spec.name)
            return replaced
        if existing is not None:
            why = f"pool {existing.name} already exists ({existing.status})"
            why += drifted
            settled = existing.status in (STATUS_ERROR, STATUS_STOPPING)
            if settled:
                self.known_pools.forget(existing.name)  # on its way out: the next event must list again
            else:
                self.known_pools.remember(existing.name)
            if existing.status == STATUS_ERROR:
                failure = self.fallback.report(request, existing)
                if failure is not None and failure.next:
                    why += f"; deleted to fall back to {failure.next}"
                else:
                    why += "; reconcile recycles it once its stockout backoff is over"
            if settled or not _siblings_missing(request, owned.replicated_job.replicas, pools):
                return logged(Outcome(EXISTS, why, existing.name, slice_desc))
            # The pod's own pool exists but its replicated job declares more slices than are listed:
            # an earlier fan-out stopped at GKE's operation limit or the deadline. Finish it.
        failures = backoff.failures(jobset, self.backoff.clock())
        held = self.fallback.held(failures)
        if existing is None and spec.name in held:
            return logged(Outcome(SKIPPED, held[spec.name], spec.name, slice_desc))
        # Every pool of the replicated job is requested together: with exclusive placement any Job may
        # land on any free pool of its shape, so a Job whose "own" pool another Job took must still
        # find one. Requesting them all at once keeps pools == slices whatever the landing order.
        requests = [] if existing is not None else [request]
        # Slices backing off after a stockout or quota failure wait too (reconcile retries them).
        listed = _listed_slices(pools)  # one set, not a scan per sibling (groups of hundreds)
        for index in range(owned.replicated_job.replicas):
            if index == request.slice_id.job_index:
                continue
            sibling = dataclasses.replace(
                request, slice_id=dataclasses.replace(request.slice_id, job_index=index)
            )
            name = sibling.pool_name
            if name in listed or _identity(sibling) in listed or name in held or self.known_pools.known(name):
                continue
            requests.append(sibling)
        engine: SliceGroupEngine = self.services.engine
        try:  # each attempt's capacity: the policy's first option, or the recorded fallback
            wanted = engine.plan(jobset, requests, specs, failures)
        except SliceRefused as exc:
            return self._refuse(pod, exc.why, slice_desc, spec.name, jobset)
        try:
            outcomes = self._create_all(Group(pod, request, jobset, wanted, shape, pools, budget), specs)
        except TransientError:
            # The requesting pod's pool may be known now; forgetting it makes the redelivery list
            # the pools and finish the group instead of answering "known to exist".
            self.known_pools.forget(spec.name)
            raise
        created = tuple(o.pool for o in outcomes if o.result == CREATED)
        # Without an error raised, the pod's own pool (first in ``wanted``) has an outcome.
        own = Outcome(EXISTS, f"pool {spec.name} already exists", spec.name, slice_desc)
        outcome = own if existing is not None else outcomes[0]
        return dataclasses.replace(outcome, requested=created)

    def _create_all(self, group: Group, specs: Specs) -> list[Outcome]:
        """Create the wanted pools through the instance's engine (budgets, slots, fan-out, fallback:
        a reservation found without room moves on to the next option with ``specs`` at once); the
        pod's outcome per pool.

        Raises OperationLimitError / TransientError after recording what GKE accepted when some
        creates could not be made in this delivery; the redelivery (or any pod of a missing slice)
        requests the rest.
        """
        engine: SliceGroupEngine = self.services.engine
        outcomes: dict[str, Outcome] = {}
        charged = engine.charge(group.request.slice_id.namespace, group.wanted, group.pools)
        for item, why in charged.refused:
            outcomes[item.spec.name] = self._refuse(
                group.pod, why, item.slice_desc, item.spec.name, group.jobset
            )
        sent = engine.send(
            group.jobset,
            charged.allowed,
            group.pools,
            group.budget,
            charged.account,
            [group.pod.ref()],
            specs=specs,
        )
        if sent.waiting:
            why = (
                f"waiting for a GKE operation slot: {sent.busy} of {sent.slot_limit} in use; a finished "
                "node-pool operation resumes it"
            )
            for item in sent.waiting:
                outcomes[item.spec.name] = Outcome(WAITING, why, item.spec.name, item.slice_desc)
            sending = len(charged.allowed) - len(sent.waiting)
            logs.decision(log, "provision.waiting", why, waiting=len(sent.waiting), sending=sending)
        failures: list[TransientError] = [error for _, error in sent.transient]
        for item, failure, shortage in sent.capacity:
            outcomes[item.spec.name] = self._capacity_unavailable(item, failure, shortage)
            if failure.next:
                failures.append(TransientError(outcomes[item.spec.name].why))
        for item in sent.exists:
            self.known_pools.remember(item.spec.name)
            why = f"pool {item.spec.name} already exists (409)"
            outcomes[item.spec.name] = logged(Outcome(EXISTS, why, item.spec.name, item.slice_desc))
        for item, error in sent.rejected:
            why = f"GKE rejected pool {item.spec.name}: {error.why}"
            self.kube.record_event(group.pod.ref(), labels.REASON_FAILED, why, warning=True)
            outcomes[item.spec.name] = logged(
                Outcome(FAILED, why, item.spec.name, item.slice_desc), logging.ERROR
            )
        for item in sent.created:
            outcomes[item.spec.name] = self._created(group, item)
        if failures or sent.unsent:
            self._defer(group.wanted, outcomes, failures, sent.unsent, sent.stopped)
        return [outcomes[item.spec.name] for item in group.wanted if item.spec.name in outcomes]

    def _created(self, group: Group, item: Create) -> Outcome:
        """GKE accepted one create: remembered, and the listing updated with it."""
        spec, slice_desc = item.spec, item.slice_desc
        self.known_pools.remember(spec.name)
        group.pools.append(item.listed())
        # How long the slice's pod waited before its pool was requested (a dashboard distribution).
        created_at = group.pod.created_at
        waited = round(max(0.0, time.time() - created_at), 1) if created_at else None
        return logged(Outcome(CREATED, item.why, spec.name, slice_desc), logging.INFO, pending_seconds=waited)

    def _capacity_unavailable(self, item: Create, failure: backoff.Failure, reason: str) -> Outcome:
        """GKE refused a create for quota or its reservation: a failed attempt of the slice (no pool
        was made, recorded by the engine), which falls back by the redelivery the caller raises, or
        backs off."""
        spec = item.spec
        why = f"GKE refused pool {spec.name} (attempt {failure.attempts}): {reason}"
        if failure.next:
            why += f"; falling back to {failure.next}"
        outcome = Outcome(FAILED, why, spec.name, item.slice_desc, fallback=failure.next)
        return logged(outcome, logging.WARNING)

    def _defer(
        self,
        wanted: list[Create],
        outcomes: dict[str, Outcome],
        failures: list[TransientError],
        unsent: list[Create],
        stopped: str,
    ) -> None:
        """Some creates of the group are left for redelivery: log it and raise so that it comes."""
        accepted = sum(1 for o in outcomes.values() if o.result in (CREATED, EXISTS))
        error = deferral(len(wanted), accepted, failures, len(unsent), stopped)
        logs.decision(
            log, "provision.deferred", error.why, logging.WARNING, sent=len(outcomes) + len(failures)
        )
        raise error

    # -- GKE's operation slots -----------------------------------------------------------------------

    @property
    def operation_limit(self) -> int | None:
        """The cluster's operation limit as configured, stated by GKE or learnt (None: unknown)."""
        return self.slots.operation_limit

    def free_slots(self, pools: list[NodePoolInfo]) -> int | None:
        """Creates GKE may accept by the listing, None while the cluster's limit is unknown."""
        return self.slots.free(pools)

    def resume(self, pool: str = "") -> list[str]:
        """A node-pool operation (on ``pool``) finished: report failures, request waiting slices."""
        return self.slots.resume(self.known_pools, self.provision_pod, pool)

    # -- helpers ----------------------------------------------------------------------------------

    def _declaring(self, pod: Pod, build: Callable[[SliceRequest], object] | None = None) -> JobSet | None:
        """The pod's proven JobSet when its own template declares what the pod was refused for
        (GKE's slice-controller key as exclusive topology, one-pod Jobs on a multi-host slice), so
        that the refusal is on the JobSet too: ``build`` (the pool build the pod failed) fails on
        the slice the JobSet declares as well. None when the pod is not proven its JobSet's or the
        JobSet declares a slice that can be built (the pod alone is at fault). Costs the two reads
        of the ownership proof, for a pod that is refused anyway."""
        if pod.controller is None or pod.controller.kind != "Job":
            return None
        try:
            owned = self.owners.of_pod(pod)
        except JobSetRefused as exc:
            return exc.jobset
        except (NotEligible, Refused):
            return None
        if build is None:
            return None
        try:
            build(owned.request)
        except Refused:
            return owned.jobset
        return None

    def _proven(self, pod: Pod) -> JobSet | None:
        """The pod's JobSet when the pod is proven one of its pods (None otherwise)."""
        try:
            return self.owners.of_pod(pod).jobset
        except JobSetRefused as exc:
            return exc.jobset
        except (NotEligible, Refused):
            return None

    def _refuse(
        self, pod: Pod, why: str, slice_desc: str, pool: str = "", jobset: JobSet | None = None
    ) -> Outcome:
        """Refuse the pod's slice with an Event saying why, on the pod and, once the pod is proven
        its JobSet's own (``jobset``), on the JobSet too, where ``kubectl describe jobset`` shows it.
        A pod that merely claims a JobSet never writes on it: a tenant could fill another team's
        JobSet with refusals."""
        self.kube.record_event(pod.ref(), labels.REASON_REFUSED, why, warning=True)
        if jobset is not None:
            self.kube.record_event(jobset_ref(jobset), labels.REASON_REFUSED, why, warning=True)
        return logged(Outcome(REFUSED, why, pool, slice_desc), logging.WARNING)


def _identity(request: SliceRequest) -> tuple[str, str, str, str, str]:
    sid = request.slice_id
    return (sid.namespace, sid.jobset, sid.jobset_uid, sid.replicated_job, str(sid.job_index))


def _pool_identity(pool: NodePoolInfo) -> tuple[str, str, str, str, str] | None:
    """The slice a managed pool is labelled for (its full owner), None for any other pool."""
    if not pool.managed:
        return None
    return (
        pool.owner.namespace,
        pool.owner.name,
        pool.owner.uid,
        pool.owner.replicated_job,
        pool.owner.job_index,
    )


def _slice_pool(request: SliceRequest, name: str, pools: list[NodePoolInfo]) -> NodePoolInfo | None:
    """The slice's pool: the one of its name, else a managed pool labelled with its whole identity
    (one handed over to it, or one made under an earlier naming of the same slice)."""
    by_name = next((p for p in pools if p.name == name), None)
    if by_name is not None:
        return by_name
    identity = _identity(request)
    return next((p for p in pools if _pool_identity(p) == identity), None)


def _listed_slices(pools: list[NodePoolInfo]) -> set[Any]:
    """Names and slice identities of the listed pools, for sibling lookups in one pass."""
    found: set[Any] = {p.name for p in pools}
    found.update(i for i in map(_pool_identity, pools) if i is not None)
    return found


def _siblings_missing(request: SliceRequest, replicas: int, pools: list[NodePoolInfo]) -> bool:
    """Whether a slice the JobSet declares for the request's replicated job has no listed pool."""
    listed = _listed_slices(pools)
    for index in range(replicas):
        sibling = dataclasses.replace(
            request, slice_id=dataclasses.replace(request.slice_id, job_index=index)
        )
        if sibling.pool_name not in listed and _identity(sibling) not in listed:
            return True
    return False


def drift_of(pool: NodePoolInfo, spec: NodePoolSpec) -> bool:
    """Whether ``pool`` was built under node settings other than ``spec``'s."""
    return bool(drift.drift(pool, spec))


def _drift_note(pool: NodePoolInfo, spec: NodePoolSpec, settings: Settings) -> str:
    found = drift.summary(drift.drift(pool, spec))
    if not found:
        return ""
    return f"; built under other settings ({found}), reported only (REPLACE_DRIFTED_POOLS=false)"
