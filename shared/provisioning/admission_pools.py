"""The admission check's pools: what each slice's pool looks like, recycling failed ones, creating
the missing ones at once (``shared.provisioning.admission_check`` decides and writes the state)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.cloud.retry import Budget
from shared.core import labels
from shared.core.errors import (
    AlreadyExistsError,
    NotFoundError,
    Refused,
    TransientError,
)
from shared.core.meta import Meta
from shared.core.settings import Settings
from shared.provisioning import backoff, slots
from shared.provisioning.admission import MISSING, CheckVerdict, SliceState, decide
from shared.provisioning.fallback import Attempts, Fallback
from shared.provisioning.groups import Create
from shared.provisioning.guard import MANAGED_NODES
from shared.provisioning.occupancy import Occupant, pool_shape, spec_shape
from shared.provisioning.policies import WorkloadPolicies
from shared.provisioning.releaser import Releaser, is_managed, owned_by
from shared.provisioning.verdicts import judge
from shared.tpu.jobsets import jobset_ref
from shared.tpu.nodepools import STATUS_ERROR, STATUS_RUNNING, ClusterInfo, NodePoolInfo
from shared.tpu.slices import build_node_pool
from shared.tpu.workloads import RETRY, WorkloadSlice


def _node_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _identity(jobset: dict[str, Any]) -> tuple[str, str, str]:
    meta = Meta.of(jobset)
    return (meta.namespace, meta.name, meta.uid)


class SlicePools:
    """Reads, recycles and creates the pools of a Workload's slices."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        tracker: backoff.Backoff,
        fallback: Fallback,
        cluster: Callable[[], ClusterInfo],
        policies: WorkloadPolicies | None = None,
    ) -> None:
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.backoff = tracker
        self.fallback = fallback
        self.cluster = cluster
        self.policies = policies
        # The admission path's account of GKE's operation slots and API quota (a hint, as provision's).
        self.slots = slots.Slots(settings, gke, kube)

    def states(
        self, jobset: dict[str, Any], slices: list[WorkloadSlice], pools: Mapping[str, NodePoolInfo]
    ) -> list[SliceState]:
        failures = backoff.failures(jobset)
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
                        pool_label = Meta.of(node).labels.get(labels.NODEPOOL)
                        if pool_label and _node_ready(node):
                            nodes[pool_label] = nodes.get(pool_label, 0) + 1
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
                pool.labels.get(labels.OWNER_REPLICATED_JOB),
                pool.labels.get(labels.OWNER_JOB_INDEX),
            ) == (sid.replicated_job, str(sid.job_index)):
                return pool
        return None

    def take_idle(
        self,
        jobset: dict[str, Any],
        slices: list[WorkloadSlice],
        missing: set[str],
        listing: list[NodePoolInfo],
    ) -> list[str]:
        """Hand the idle pools release keeps for a queued JobSet of their shape (``IDLE_SINCE``) to the
        missing slices of this one, before creating anything; returns the pools taken.

        The pool is adopted at once (owner and billing labels, a ``TPUSliceAdopted`` Event), so the
        Workload's own end releases it and its former owner's release no longer touches it.
        """
        idle = [
            p
            for p in listing
            if is_managed(p)
            and p.status == STATUS_RUNNING
            and p.labels.get(labels.IDLE_SINCE)
            and not owned_by(p, *_identity(jobset))
        ]
        if not idle or not self.settings.idle_pool_seconds:
            return []
        failures = backoff.failures(jobset)
        releaser = Releaser(self.settings, self.gke, self.kube)
        now = datetime.datetime.now(tz=datetime.UTC)
        taken: list[str] = []
        for item in slices:
            request = item.request
            if request.pool_name not in missing or not idle:
                continue
            try:
                attempts = Attempts(self.fallback.options(request, jobset), failures)
                spec, _ = build_node_pool(
                    self.settings, request, self.cluster(), attempts.option(request.pool_name)
                )
            except Refused:
                continue
            match = next((p for p in idle if pool_shape(p) == spec_shape(spec)), None)
            if match is None:
                continue
            idle.remove(match)
            owner_ns = match.labels.get(labels.OWNER_NAMESPACE, "")
            owner_name = match.labels.get(labels.OWNER_NAME, "")
            try:
                owner = self.kube.get_jobset(owner_ns, owner_name)
            except NotFoundError:
                owner = None
            verdict = judge(match, owner, self.settings, now)
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

    def recycle(self, jobset: dict[str, Any], pool: NodePoolInfo) -> None:
        """Delete a failed pool whose backoff is over (occupancy-safe, as reconcile recycles it)."""
        why = f"GKE could not provision it ({pool.status_message or 'status ERROR'}); its backoff is over"
        if Releaser(self.settings, self.gke, self.kube).recycle(jobset, pool, why, "admission check"):
            self.backoff.recycled(jobset, [pool.name])

    def create(
        self,
        jobset: dict[str, Any],
        slices: list[WorkloadSlice],
        verdict: CheckVerdict,
        pools: list[NodePoolInfo],
    ) -> tuple[tuple[str, ...], CheckVerdict]:
        """Create every missing pool at once (within free operation slots and the deadline)."""
        missing = set(verdict.create)
        wanted: list[Create] = []
        failures = backoff.failures(jobset)
        for item in slices:
            request = item.request
            if request.pool_name not in missing:
                continue
            try:
                attempts = Attempts(self.fallback.options(request, jobset), failures)
                spec, shape = build_node_pool(
                    self.settings, request, self.cluster(), attempts.option(request.pool_name)
                )
            except Refused as exc:
                return (), decide([], f"{request.slice_id.describe()}: {exc.why}")
            wanted.append(Create.of(request, spec, shape, "(admission check of its Workload)"))
        free = self.slots.free(pools)
        sendable = wanted if free is None else wanted[:free]

        def send(item: Create) -> None:
            if self.policies is not None:
                self.policies.ensure_for(item.spec, item.why)
            self.gke.create_node_pool(self.settings.cluster_path, item.spec, item.why)

        budget = Budget(self.settings.request_deadline_seconds)
        result = self.slots.send_all(sendable, send, budget, slots.busy(pools))
        created: list[str] = []
        refused: list[str] = []  # capacity refused with no fallback left: the slice backs off
        rejected: list[str] = []  # GKE will never build it as asked
        wait = 0.0
        for sent, error in result.sent:
            shortage = backoff.capacity_unavailable(error) if error is not None else ""
            if shortage:
                failure = self.fallback.refused(sent.request, jobset, sent.spec, shortage)
                if not failure.next:
                    refused.append(f"{sent.spec.name} ({shortage})")
                    wait = max(wait, backoff.retry_at(self.settings, failure) - self.backoff.clock())
                continue
            if error is None:
                created.append(sent.spec.name)
            elif isinstance(error, TransientError | AlreadyExistsError):
                continue  # made already, or a 429/busy answer: the next finished operation sends it
            else:
                rejected.append(f"GKE rejected pool {sent.spec.name}: {error.why}")
        if created:
            message = f"requested node pools {', '.join(created)} for its Workload's admission check"
            self.kube.record_event(jobset_ref(jobset), labels.REASON_REQUESTED, message)
        if rejected:
            return tuple(created), decide([], "; ".join(rejected))
        if refused:
            seconds = max(1, math.ceil(wait))
            why = f"{verdict.message}; could not provision {', '.join(refused)}; retry in {seconds}s"
            return tuple(created), CheckVerdict(RETRY, why, requeue_after=seconds)
        return tuple(created), verdict
