"""The admission check's pools: what each slice's pool looks like, recycling failed ones, creating
the missing ones at once (``shared.provisioning.admission.check`` decides and writes the state)."""

from __future__ import annotations

import datetime
import logging
import math
from collections.abc import Mapping

from shared.cloud.retry import Budget
from shared.core import labels, logs
from shared.core.errors import (
    NotFoundError,
    TransientError,
)
from shared.provisioning.admission.decide import MISSING, CheckVerdict, SliceState, decide
from shared.provisioning.create import backoff
from shared.provisioning.create.engine import SliceGroupEngine, SliceRefused
from shared.provisioning.create.groups import Specs
from shared.provisioning.release.guard import MANAGED_NODES
from shared.provisioning.release.occupancy import Occupant, pool_shape, spec_shape
from shared.provisioning.release.releaser import is_managed, owned_by
from shared.provisioning.services import Services
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import STATUS_ERROR, STATUS_RUNNING, NodePoolInfo
from shared.tpu.workloads import RETRY, WorkloadSlice

log = logging.getLogger(__name__)


def _identity(jobset: JobSet) -> tuple[str, str, str]:
    meta = jobset.meta
    return (meta.namespace, meta.name, meta.uid)


def _kept_idle(jobset: JobSet, listing: list[NodePoolInfo]) -> list[NodePoolInfo]:
    """Running managed pools a release keeps idle for a queued JobSet (``IDLE_SINCE``), not this one's."""
    return [
        p
        for p in listing
        if is_managed(p)
        and p.status == STATUS_RUNNING
        and p.labels.get(labels.IDLE_SINCE)
        and not owned_by(p, *_identity(jobset))
    ]


class SlicePools:
    """Reads, recycles and creates the pools of a Workload's slices."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.settings = services.settings
        self.gke = services.gke
        self.kube = services.kube
        self.backoff = services.backoff
        self.fallback = services.fallback
        self.cluster = services.cluster
        self.policies = services.policies
        # The instance's one account of GKE's operation slots and API quota, shared with provision.
        self.slots = services.slots
        self.spending = services.spending
        self.releaser = services.releaser

    def states(
        self, jobset: JobSet, slices: list[WorkloadSlice], pools: Mapping[str, NodePoolInfo]
    ) -> list[SliceState]:
        failures = backoff.failures(jobset, self.backoff.clock())
        now = self.backoff.clock()
        nodes: dict[str, int] | None = None
        states = []
        for item in slices:
            name = item.request.pool_name
            pool = pools.get(name) or self._handed(item, pools)
            failure = failures.get(name)
            retry_in = max(0.0, backoff.retry_at(self.settings, failure) - now) if failure else 0.0
            failed = ""
            if pool is not None and pool.status == STATUS_ERROR:
                recorded = self.fallback.report(item.request, pool)
                failed = pool.status_message or "status ERROR"
                if recorded is not None:
                    retry_in = max(0.0, backoff.retry_at(self.settings, recorded) - now)
                    if not recorded.next and retry_in == 0:
                        self.recycle(jobset, pool)  # backoff over: make room for the next attempt
                    if recorded.next or retry_in == 0:
                        failed = ""  # falling back now, or recycled at once: the slice is retried
            elif pool is None and failure is not None and retry_in > 0:
                failed = f"attempt {failure.attempts} failed"
            ready = 0
            if pool is not None and pool.status == "RUNNING":
                if nodes is None:
                    nodes = {}
                    for node in self.kube.list_nodes(MANAGED_NODES):
                        if node.pool and node.takes_pods:
                            nodes[node.pool] = nodes.get(node.pool, 0) + 1
                ready = nodes.get(pool.name, 0)
            states.append(
                SliceState(
                    pool=pool.name if pool is not None else name,
                    status=pool.status if pool is not None else MISSING,
                    nodes=pool.node_count if pool is not None else 0,
                    nodes_ready=ready,
                    failed=failed,
                    retry_in=retry_in,
                )
            )
        return states

    @staticmethod
    def _handed(item: WorkloadSlice, pools: Mapping[str, NodePoolInfo]) -> NodePoolInfo | None:
        """A pool handed over to this very slice (another name, this slice's owner labels)."""
        sid = item.request.slice_id
        for pool in pools.values():
            if owned_by(pool, sid.namespace, sid.jobset, sid.jobset_uid) and (
                pool.owner.replicated_job,
                pool.owner.job_index,
            ) == (sid.replicated_job, str(sid.job_index)):
                return pool
        return None

    def take_idle(
        self,
        jobset: JobSet,
        slices: list[WorkloadSlice],
        missing: set[str],
        listing: list[NodePoolInfo],
    ) -> list[str]:
        """Hand the idle pools release keeps for a queued JobSet of their shape (``IDLE_SINCE``) to the
        missing slices of this one, before creating anything; returns the pools taken.

        The pool is adopted at once (owner and billing labels, a ``TPUSliceAdopted`` Event), so the
        Workload's own end releases it and its former owner's release no longer touches it.
        """
        idle = _kept_idle(jobset, listing)
        if not idle or not self.settings.idle_pool_seconds:
            return []
        failures = backoff.failures(jobset, self.backoff.clock())
        releaser = self.releaser
        now = datetime.datetime.now(tz=datetime.UTC)
        taken: list[str] = []
        specs = Specs(self.settings, self.cluster())  # built as provision builds them, once each
        engine: SliceGroupEngine = self.services.engine
        for item in slices:
            request = item.request
            if request.pool_name not in missing or not idle:
                continue
            try:  # the pool the slice's next attempt would create: an idle one of its shape serves
                [planned] = engine.plan(jobset, [request], specs, failures)
            except SliceRefused:
                continue
            match = next((p for p in idle if pool_shape(p) == spec_shape(planned.spec)), None)
            if match is None:
                continue
            idle.remove(match)
            owner_ns = match.owner.namespace
            owner_name = match.owner.name
            try:
                owner = self.kube.get_jobset(owner_ns, owner_name)
            except NotFoundError:
                owner = None
            verdict = releaser.judge(match, owner, now)
            if not verdict.delete:
                continue  # its owner needs it again
            sid = request.slice_id
            taker = Occupant(
                sid.namespace, sid.jobset, sid.jobset_uid, sid.replicated_job, str(sid.job_index), 0
            )
            outcome = releaser.dispose(
                [(match, verdict)],
                f"admission check of {sid.namespace}/{sid.jobset}",
                # The taker's own verdict decides once it owns the pool: it must be the JobSet as read.
                {(owner_ns, owner_name): owner, (sid.namespace, sid.jobset): jobset},
                listing,
                last_users={match.name: taker},
            )
            if outcome.retry:
                raise TransientError("; ".join(outcome.retry))
            if any(
                p.name == match.name and (t.namespace, t.name) == (sid.namespace, sid.jobset)
                for p, t in outcome.adopted
            ):
                taken.append(match.name)
        return taken

    def withdraw_offers(self, jobset: JobSet, created: tuple[str, ...]) -> None:
        """After creating ``created`` for this JobSet, look at the pools again: a release may have
        stamped a pool of their shape idle for this very JobSet after this delivery listed them
        (``take_idle`` saw none), and nobody else may want it. Each side writes, then reads (the
        release reads again after its stamps), so one of them always sees the other; the pool is
        judged now as reconcile would judge it, and goes unless another queued JobSet waits for it.
        A failure here is logged and left to the release's redelivery or the next reconcile sweep:
        the creates are done and this JobSet's check must not fail for another JobSet's pool."""
        listing = self.gke.list_node_pools(self.settings.cluster_path)
        shapes = {pool_shape(p) for p in listing if p.name in created}
        stale = [p for p in _kept_idle(jobset, listing) if pool_shape(p) in shapes]
        now = datetime.datetime.now(tz=datetime.UTC)
        trigger = f"admission check of {jobset.meta.namespace}/{jobset.meta.name}, which bought its own"
        for pool in stale:
            namespace, name = pool.owner.namespace, pool.owner.name
            try:
                try:
                    owner = self.kube.get_jobset(namespace, name)
                except NotFoundError:
                    owner = None
                verdict = self.releaser.judge(pool, owner, now)
                if not verdict.delete:
                    continue
                outcome = self.releaser.dispose(
                    [(pool, verdict)], trigger, {(namespace, name): owner}, listing
                )
                problems = outcome.retry
            except TransientError as exc:
                problems = [exc.why]
            if problems:
                logs.decision(
                    log,
                    "admission.offer_left",
                    f"{pool.name} kept idle for now, looked at again later: {'; '.join(problems)}",
                    logging.WARNING,
                    pool=pool.name,
                    jobset=f"{jobset.meta.namespace}/{jobset.meta.name}",
                )

    def recycle(self, jobset: JobSet, pool: NodePoolInfo) -> None:
        """Delete a failed pool whose backoff is over (occupancy-safe, as reconcile recycles it)."""
        why = f"GKE could not provision it ({pool.status_message or 'status ERROR'}); its backoff is over"
        if self.releaser.recycle(jobset, pool, why, "admission check"):
            self.backoff.recycled(jobset, [pool.name])

    def create(
        self,
        jobset: JobSet,
        slices: list[WorkloadSlice],
        verdict: CheckVerdict,
        pools: list[NodePoolInfo],
    ) -> tuple[tuple[str, ...], CheckVerdict]:
        """Create every missing pool at once (within free operation slots and the deadline)."""
        missing = set(verdict.create)
        failures = backoff.failures(jobset, self.backoff.clock())
        specs = Specs(self.settings, self.cluster())
        engine: SliceGroupEngine = self.services.engine
        requests = [item.request for item in slices if item.request.pool_name in missing]
        try:
            wanted = engine.plan(jobset, requests, specs, failures, "(admission check of its Workload)")
        except SliceRefused as exc:
            return (), decide([], f"{exc.slice_desc}: {exc.why}")
        # Budgets apply before anything is sent: a Workload whose slices its namespace may not buy now
        # waits (Retry: Kueue releases its quota and brings it back later) instead of half-landing.
        namespace = jobset.meta.namespace
        charged = engine.charge(namespace, wanted, pools)
        if charged.refused:
            seconds = max(1, self.settings.stockout_backoff_seconds)
            refusal = charged.refused[0][1]
            return (), CheckVerdict(
                RETRY, f"{verdict.message}; {refusal}; retry in {seconds}s", requeue_after=seconds
            )
        budget = Budget(self.settings.request_deadline_seconds)
        # Creates beyond GKE's free operation slots wait: the next finished operation sends them.
        sent = engine.send(
            jobset,
            charged.allowed,
            pools,
            budget,
            charged.account,
            purpose="for its Workload's admission check",
            specs=specs,
        )
        created = [item.spec.name for item in sent.created]
        # Capacity refused with no fallback left: the slice backs off (those falling back are retried).
        refused = [f"{item.spec.name} ({why})" for item, failure, why in sent.capacity if not failure.next]
        wait = max(
            (
                backoff.retry_at(self.settings, f) - self.backoff.clock()
                for _, f, _ in sent.capacity
                if not f.next
            ),
            default=0.0,
        )
        # GKE will never build it as asked (409s and transient answers are sent again later).
        rejected = [f"GKE rejected pool {item.spec.name}: {error.why}" for item, error in sent.rejected]
        if rejected:
            return tuple(created), decide([], "; ".join(rejected))
        if refused:
            seconds = max(1, math.ceil(wait))
            why = f"{verdict.message}; could not provision {', '.join(refused)}; retry in {seconds}s"
            return tuple(created), CheckVerdict(RETRY, why, requeue_after=seconds)
        return tuple(created), verdict
