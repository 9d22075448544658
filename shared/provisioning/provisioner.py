"""The provision service: from "this pod is unschedulable" to exactly one TPU node pool per slice.

Reads at most two things per event (the pod, the cluster's node pools; for a pod bound by then, the
pod and the managed Nodes, plus what adopting a handed-over pool takes: see ``handover``), never
waits for GKE's operation, and relies on the deterministic pool name so that duplicates and
concurrent instances converge: a 409 on create is success.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.cloud.retry import Budget
from shared.core import labels, logs
from shared.core.errors import (
    AlreadyExistsError,
    NotEligible,
    NotFoundError,
    Refused,
    RejectedError,
    TransientError,
)
from shared.core.settings import Settings
from shared.provisioning import backoff, slots
from shared.provisioning.fallback import Attempts, Fallback
from shared.provisioning.groups import Create, Group, Specs, deferral, group_incomplete
from shared.provisioning.guardrails import guardrail, label_problem, managed_chips, over_chip_budget
from shared.provisioning.handover import Handover
from shared.provisioning.known import KnownPools, group_of
from shared.provisioning.outcomes import CREATED, EXISTS, FAILED, REFUSED, SKIPPED, WAITING, Outcome, logged
from shared.provisioning.policies import WorkloadPolicies
from shared.provisioning.refit import Refit
from shared.tpu import selectors
from shared.tpu.jobsets import jobset_problem, jobset_ref, replicas_of
from shared.tpu.nodepools import (
    STATUS_ERROR,
    STATUS_PROVISIONING,
    STATUS_STOPPING,
    ClusterInfo,
    NodePoolInfo,
)
from shared.tpu.pods import Pod
from shared.tpu.slices import SliceRequest, slice_request

log = logs.get("provision")


class Provisioner:
    """Turns pending TPU pods into node-pool create requests, within the guardrails."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        known_pool_ttl: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        policies: WorkloadPolicies | None = None,
    ) -> None:
        """``known_pool_ttl`` > 0 lets the instance skip the listing for pools it saw that recently;
        ``wall_clock`` (Unix seconds) times the stockout backoff; ``policies`` creates the product's
        tpu7x workload policies (None: pools name them and GKE must find them already there)."""
        self.settings = settings
        self.policies = policies
        self.gke = gke
        self.kube = kube
        self.known_pools = KnownPools(known_pool_ttl, clock)
        self._clock = clock
        self.backoff = backoff.Backoff(settings, kube, wall_clock)
        self.fallback = Fallback(settings, gke, kube, self.backoff, self.cluster)
        self.refit = Refit(settings, gke, kube)
        self.handover = Handover(settings, gke, kube)
        self._cluster: ClusterInfo | None = None
        # GKE's operation slots and API quota: what this instance learnt (only a hint) and resume.
        self.slots = slots.Slots(settings, gke, kube, self.known_pools, self.provision_pod, clock=clock)

    def cluster(self) -> ClusterInfo:
        """The managed cluster (zones, release channel), read from GKE once per instance."""
        if self._cluster is None:
            # A failed read raises (TransientError -> redelivery); nothing is cached until one succeeds.
            self._cluster = self.gke.get_cluster(self.settings.cluster_path)
        return self._cluster

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
        return self.provision_pod(pod)

    def provision_pod(self, pod: Pod | Mapping[str, Any], pools: list[NodePoolInfo] | None = None) -> Outcome:
        """Request the slice a pending pod needs (``pools``: a listing the caller already has). A pod
        as the API returned it is parsed into its view here, once."""
        if not isinstance(pod, Pod):
            pod = Pod.parse(pod)
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
            return self._refuse(pod, exc.why, "")
        slice_desc = request.slice_id.describe()
        specs = Specs(self.settings, self.cluster())
        try:
            spec, shape = specs.of(request)
        except Refused as exc:
            return self._refuse(pod, exc.why, slice_desc)
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
        request: SliceRequest,
        specs: Specs,
        slice_desc: str,
        pools: list[NodePoolInfo],
    ) -> Outcome:
        """Create the slice's pool and its siblings unless listed, within the chip budget."""
        spec, shape = specs.of(request)  # the pod's own choice, built by the caller
        budget = Budget(self.settings.request_deadline_seconds, clock=self._clock)
        pools = list(pools)  # extended with what this call creates; the caller's listing stays as given
        existing = next((p for p in pools if p.name == spec.name), None)
        misfit = selectors.misfit(request.selected, existing, spec) if existing is not None else ""
        if existing is not None and misfit and existing.status not in (STATUS_ERROR, STATUS_STOPPING):
            self.known_pools.forget(spec.name)  # found by name, but the pod could never land on it
            return self.refit.handle(pod, request, existing, misfit, slice_desc)
        replaced, drifted = self.refit.for_drift(pod, request, existing, spec, slice_desc)
        if replaced is not None:
            self.known_pools.forget(spec.name)
            return replaced
        if existing is not None:
            why = f"pool {spec.name} already exists ({existing.status})"
            why += drifted
            settled = existing.status in (STATUS_ERROR, STATUS_STOPPING)
            if settled:
                self.known_pools.forget(spec.name)  # on its way out: the next event must list again
            else:
                self.known_pools.remember(spec.name)
            if existing.status == STATUS_ERROR:
                failure = self.fallback.report(request, existing)
                if failure is not None and failure.next:
                    why += f"; deleted to fall back to {failure.next}"
                else:
                    why += "; reconcile recycles it once its stockout backoff is over"
            if settled or not group_incomplete(pod, request, pools):
                return logged(Outcome(EXISTS, why, spec.name, slice_desc))
            # The pod's own pool exists but its replicated job claims more slices than are listed: an
            # earlier fan-out stopped at GKE's operation limit or the deadline. Finish it (the JobSet
            # read below decides, not the pod's claim).
        if self.free_slots(pools) == 0:
            # Every operation slot is taken: nothing could be sent. Acknowledge cheaply (no JobSet read)
            # and let the next finished operation resume the group.
            why = f"waiting for a GKE operation slot (all {self.operation_limit} in use)"
            return logged(Outcome(WAITING, why, spec.name, slice_desc))
        # About to spend money: the JobSet itself (not the pod's claims) decides. This read happens
        # once per slice group, not per event.
        try:
            jobset = self.kube.get_jobset(request.slice_id.namespace, request.slice_id.jobset)
        except NotFoundError:
            return logged(Outcome(SKIPPED, f"JobSet of {slice_desc} does not exist", spec.name, slice_desc))
        problem = jobset_problem(jobset, request.slice_id)
        if problem:
            return self._refuse(pod, problem, slice_desc, spec.name)
        failures = backoff.failures(jobset)
        held = self.fallback.held(failures)
        if existing is None and spec.name in held:
            return logged(Outcome(SKIPPED, held[spec.name], spec.name, slice_desc))
        try:  # each attempt's capacity: the policy's first option, or the recorded fallback
            attempts = Attempts(self.fallback.options(request, jobset), failures)
        except Refused as exc:
            return self._refuse(pod, exc.why, slice_desc, spec.name)
        spec, _ = specs.of(request, attempts.option(spec.name))  # the own spec again when it is that option
        # Every pool of the replicated job is requested together: with exclusive placement any Job may
        # land on any free pool of its shape, so a Job whose "own" pool another Job took must still
        # find one. Requesting them all at once keeps pools == slices whatever the landing order.
        wanted: list[Create] = [] if existing is not None else [Create.of(request, spec, shape)]
        # Slices backing off after a stockout or quota failure wait too (reconcile retries them).
        listed = {p.name for p in pools}  # one set, not a scan per sibling (groups of hundreds)
        for index in range(replicas_of(jobset, request.slice_id.replicated_job)):
            if index == request.slice_id.job_index:
                continue
            sibling = dataclasses.replace(
                request, slice_id=dataclasses.replace(request.slice_id, job_index=index)
            )
            name = sibling.pool_name
            if name in listed or name in held or self.known_pools.known(name):
                continue
            sibling_spec, _ = specs.of(sibling, attempts.option(name))
            wanted.append(Create.of(sibling, sibling_spec, shape))
        try:
            outcomes = self._create_all(Group(pod, request, jobset, wanted, shape, pools, budget))
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

    def _create_all(self, group: Group) -> list[Outcome]:
        """Create the wanted pools within the chip budget, ``CREATE_CONCURRENCY`` at a time.

        Raises OperationLimitError / TransientError after recording what GKE accepted when some
        creates could not be made in this delivery; the redelivery (or any pod of a missing slice)
        requests the rest.
        """
        outcomes: dict[str, Outcome] = {}
        sendable: list[Create] = []
        chips = group.shape.total_chips
        in_use = managed_chips(group.pools) if self.settings.chip_budget else 0
        for item in group.wanted:
            over = over_chip_budget(self.settings, in_use, chips)
            if over:
                outcomes[item.spec.name] = self._refuse(group.pod, over, item.slice_desc, item.spec.name)
                continue
            in_use += chips  # reserved before sending, so concurrent creates cannot overshoot
            sendable.append(item)

        free = self.free_slots(group.pools)
        if free is not None and self.operation_limit is not None and free < len(sendable):
            # No point asking GKE for more operations than it runs at once: the rest waits for a
            # finished operation (its audit entry resumes provisioning) instead of collecting 429s.
            why = (
                f"waiting for a GKE operation slot: {slots.busy(group.pools)} of "
                f"{self.operation_limit} in use; a finished node-pool operation resumes it"
            )
            for item in sendable[free:]:
                outcomes[item.spec.name] = Outcome(WAITING, why, item.spec.name, item.slice_desc)
            logs.decision(log, "provision.waiting", why, waiting=len(sendable) - free, sending=free)
            sendable = sendable[:free]

        def send(item: Create) -> None:
            if self.policies is not None:  # GKE needs the pool's workload policy to exist first
                self.policies.ensure_for(item.spec, item.why)
            self.gke.create_node_pool(self.settings.cluster_path, item.spec, item.why)

        result = self.slots.send_all(sendable, send, group.budget, slots.busy(group.pools))
        failures: list[TransientError] = []
        for item, error in result.sent:
            shortage = backoff.capacity_unavailable(error) if error is not None else ""
            if shortage:  # quota or reservation: this attempt failed; fall back or back off
                outcomes[item.spec.name] = self._capacity_unavailable(item, group.jobset, shortage)
                if outcomes[item.spec.name].fallback:
                    failures.append(TransientError(outcomes[item.spec.name].why))
                continue
            if isinstance(error, TransientError):
                failures.append(error)
                continue
            outcomes[item.spec.name] = self._created(group, item, error)
        wanted = group.wanted
        created = [
            i.spec.name for i in wanted if i.spec.name in outcomes and outcomes[i.spec.name].result == CREATED
        ]
        if created:
            # One Event per group (or per part of it a delivery got through), naming every pool: on
            # the JobSet and on the pod that asked.
            sid = group.request.slice_id
            message = f"requested node pools {', '.join(created)} for {sid.replicated_job}"
            self.kube.record_event(jobset_ref(group.jobset, sid), labels.REASON_REQUESTED, message)
            self.kube.record_event(group.pod.ref(), labels.REASON_REQUESTED, message)
        if failures or result.unsent:
            self._defer(wanted, outcomes, failures, result.unsent, result.stopped)
        return [outcomes[item.spec.name] for item in wanted if item.spec.name in outcomes]

    def _created(self, group: Group, item: Create, error: Exception | None) -> Outcome:
        """Record what GKE answered to one create (None: accepted); the listing is updated with it."""
        spec, slice_desc = item.spec, item.slice_desc
        if isinstance(error, AlreadyExistsError):
            self.known_pools.remember(spec.name)
            why = f"pool {spec.name} already exists (409)"
            return logged(Outcome(EXISTS, why, spec.name, slice_desc))
        if isinstance(error, RejectedError):
            self.kube.record_event(
                group.pod.ref(),
                labels.REASON_FAILED,
                f"GKE rejected pool {spec.name}: {error.why}",
                warning=True,
            )
            return logged(
                Outcome(FAILED, f"GKE rejected pool {spec.name}: {error.why}", spec.name, slice_desc),
                logging.ERROR,
            )
        if error is not None:
            raise error  # a permanent error the adapter should not raise on create (e.g. 404 cluster)
        self.known_pools.remember(spec.name)
        group.pools.append(
            NodePoolInfo(
                name=spec.name,
                status=STATUS_PROVISIONING,
                machine_type=spec.machine_type,
                node_count=spec.node_count,
                labels=dict(spec.labels),
            )
        )
        # How long the slice's pod waited before its pool was requested (a dashboard distribution).
        created_at = group.pod.created_at
        waited = round(max(0.0, time.time() - created_at), 1) if created_at else None
        return logged(Outcome(CREATED, item.why, spec.name, slice_desc), logging.INFO, pending_seconds=waited)

    def _capacity_unavailable(self, item: Create, jobset: dict[str, Any], reason: str) -> Outcome:
        """GKE refused a create for quota or its reservation: a failed attempt of the slice (no pool
        was made), which falls back by the redelivery the caller raises, or backs off."""
        spec = item.spec
        failure = self.fallback.refused(item.request, jobset, spec, reason)
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
        return self.slots.resume(pool)

    # -- helpers ----------------------------------------------------------------------------------

    def _refuse(self, pod: Pod, why: str, slice_desc: str, pool: str = "") -> Outcome:
        self.kube.record_event(pod.ref(), labels.REASON_REFUSED, why, warning=True)
        return logged(Outcome(REFUSED, why, pool, slice_desc), logging.WARNING)
