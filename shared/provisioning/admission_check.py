"""The admission check controller: a Workload's TPU slices, all of them, before Kueue admits it.

Kueue reserves quota for a Workload in a ClusterQueue whose ``admissionChecksStrategy`` names the
product's AdmissionCheck (``ADMISSION_CHECK_NAME``, controllerName ``tpuprov.dev/tpu-slices``), then
waits for the check's state in ``status.admissionChecks``. :meth:`AdmissionChecker.handle` (on
Kueue's ``QuotaReserved`` Event, on each finished node-pool operation, and from reconcile's sweep)
reads the Workload and its JobSet, derives every slice exactly as provision does
(``shared.tpu.workloads``), requests every missing pool at once (fan-out within GKE's operation
slots and the delivery's deadline, as provision does) and sets the state ``shared.provisioning.admission``
decides. Every state change is an Event on the Workload and on the JobSet and a decision log line
(``admission.<state>``).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import ConflictError, NotFoundError, Refused
from shared.core.meta import Meta
from shared.core.settings import Settings
from shared.provisioning import backoff
from shared.provisioning.admission import CheckVerdict, decide
from shared.provisioning.admission_pools import SlicePools
from shared.provisioning.fallback import Fallback
from shared.provisioning.guardrails import guardrail
from shared.provisioning.policies import WorkloadPolicies
from shared.tpu import catalog
from shared.tpu.nodepools import ClusterInfo
from shared.tpu.workloads import (
    PENDING,
    READY,
    REJECTED,
    RETRY,
    CheckState,
    WorkloadSlice,
    WorkloadView,
    parse_workload,
    workload_slices,
)

log = logs.get("admission")

CONTROLLER_NAME = f"{labels.PRODUCT_DOMAIN}/tpu-slices"
REASONS = {
    PENDING: "TPUSlicesPending",
    READY: "TPUSlicesReady",
    RETRY: "TPUSlicesRetry",
    REJECTED: "TPUSlicesRejected",
}


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """What one look at a Workload did: the state set ("" when the check did not act) and why."""

    workload: str
    state: str
    why: str
    created: tuple[str, ...] = ()
    # Every pool is RUNNING and only Nodes are not Ready yet: worth another look within seconds.
    waiting_for_nodes: bool = False


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class AdmissionChecker:
    """Provisions the slices of Workloads that wait for the product's admission check."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        wall_clock: Callable[[], float] = time.time,
        policies: WorkloadPolicies | None = None,
    ) -> None:
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.policies = policies
        self.check = settings.admission_check_name
        self.backoff = backoff.Backoff(settings, kube, wall_clock)
        self.fallback = Fallback(settings, gke, kube, self.backoff, self.cluster)
        self._cluster: ClusterInfo | None = None
        self.pools = SlicePools(settings, gke, kube, self.backoff, self.fallback, self.cluster, policies)

    def cluster(self) -> ClusterInfo:
        if self._cluster is None:
            self._cluster = self.gke.get_cluster(self.settings.cluster_path)
        return self._cluster

    # -- entry points ---------------------------------------------------------------------------

    def handle(self, namespace: str, name: str, trigger: str = "") -> CheckResult:
        """Look at one Workload (e.g. on its QuotaReserved Event) and move its check on."""
        try:
            workload = parse_workload(self.kube.get_workload(namespace, name))
        except NotFoundError:
            return self._skip(f"{namespace}/{name}", "Workload no longer exists")
        return self.evaluate(workload, trigger)

    def sweep(self, trigger: str = "reconcile sweep") -> list[CheckResult]:
        """Every Workload whose check by this product is Pending with quota reserved (the safety net
        for a lost QuotaReserved Event; also what turns Pending into Ready once pools are up)."""
        results = []
        try:
            listed = self.kube.list_workloads()
        except NotFoundError:
            return []  # Kueue is not installed: no Workload waits for the check
        for obj in listed:
            workload = parse_workload(obj)
            state = workload.check(self.check)
            if state is not None and state.state == PENDING and workload.has("QuotaReserved"):
                results.append(self.evaluate(workload, trigger))
        return results

    def keep_active(self) -> bool:
        """Set the AdmissionCheck's Active condition (False when the cluster has no such check)."""
        try:
            self.kube.set_admission_check_active(
                self.check, f"{CONTROLLER_NAME} provisions every TPU slice of a Workload before admission"
            )
        except NotFoundError:
            return False
        return True

    # -- one Workload -----------------------------------------------------------------------------

    def evaluate(self, workload: WorkloadView, trigger: str = "") -> CheckResult:
        """Decide and write the check state of ``workload`` (already read)."""
        state = workload.check(self.check)
        if state is None and workload.has("QuotaReserved") and self._queue_uses_check(workload):
            # Kueue adds the checks' entries just after reserving quota; the Event can be first.
            state = CheckState(self.check, PENDING)
        if state is None:
            return self._skip(workload.key, f"its ClusterQueue does not use admission check {self.check}")
        if state.state in (READY, REJECTED, RETRY):
            return self._skip(workload.key, f"check is {state.state} already")
        if workload.done:
            return self._skip(workload.key, f"Workload is {workload.done}")
        if not workload.has("QuotaReserved"):
            return self._skip(workload.key, "no quota reserved yet")
        with logs.bound(workload=workload.key, jobset=f"{workload.namespace}/{workload.owner_name}"):
            verdict, created = self._verdict(workload)
            self._write(workload, state.state, state.message, state.last_transition, verdict, trigger)
            return CheckResult(workload.key, verdict.state, verdict.message, created, verdict.nodes_only)

    def _queue_uses_check(self, workload: WorkloadView) -> bool:
        try:
            queue = self.kube.get_cluster_queue(workload.cluster_queue)
        except NotFoundError:
            return False
        spec = queue.get("spec") or {}
        strategy = (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []
        assigned = {f for a in workload.assignments for f in a.flavors.values()}
        # onFlavors: the check applies only to Workloads assigned one of them (empty: to all).
        return any(
            c.get("name") == self.check and (not c.get("onFlavors") or assigned & set(c.get("onFlavors")))
            for c in strategy
        )

    def _verdict(self, workload: WorkloadView) -> tuple[CheckVerdict, tuple[str, ...]]:
        if workload.owner_kind != "JobSet":
            return CheckVerdict(READY, f"owned by a {workload.owner_kind or 'nothing'}: no TPU slices"), ()
        try:
            jobset = self.kube.get_jobset(workload.namespace, workload.owner_name)
        except NotFoundError:
            return CheckVerdict(REJECTED, f"JobSet {workload.owner_name} does not exist"), ()
        try:
            slices = workload_slices(jobset, workload.pod_sets, self._flavor_labels(workload))
            refusal = self._guardrail(slices)
        except Refused as exc:
            return decide([], exc.why), ()
        if refusal:
            self._mark(jobset, "")
            return decide([], refusal), ()
        # Before any pool exists: release must not take a suspended JobSet's fresh pools for unused.
        jobset = self._mark(jobset, PENDING)
        pools = {p.name: p for p in self.gke.list_node_pools(self.settings.cluster_path)}
        states = self.pools.states(jobset, slices, pools)
        verdict = decide(states)
        created: tuple[str, ...] = ()
        # Idle pools of the same shape first (handover), then create what is still missing.
        missing = set(verdict.create) if verdict.state == PENDING else set()
        if missing and self.pools.take_idle(jobset, slices, missing, list(pools.values())):
            pools = {p.name: p for p in self.gke.list_node_pools(self.settings.cluster_path)}
            verdict = decide(self.pools.states(jobset, slices, pools))
        if verdict.state == PENDING and verdict.create:
            created, verdict = self.pools.create(jobset, slices, verdict, list(pools.values()))
        if verdict.state == READY:
            self._mark(jobset, READY)
            return _with_updates(verdict, self._pod_set_updates(slices)), created
        if verdict.state == RETRY:
            self._mark(jobset, RETRY, int(self.backoff.clock()) + int(verdict.requeue_after or 0))
        elif verdict.state == REJECTED:
            self._mark(jobset, "")
        return verdict, created

    def _mark(self, jobset: dict[str, Any], state: str, at: int | None = None) -> dict[str, Any]:
        """Record the check's state on the JobSet (``labels.ADMISSION_CHECK``, read by release's
        verdicts); "" removes it. Best effort: a lost write costs nothing until the next look."""
        meta = Meta.of(jobset)
        current = meta.annotations.get(labels.ADMISSION_CHECK, "")
        now = int(self.backoff.clock())
        stamp = now if at is None else at
        if not state:
            if not current:
                return jobset
            value: str | None = None
        else:
            known, _, when = current.partition("@")
            fresh = when.isdigit() and now - int(when) < self.settings.suspend_grace_seconds // 3
            if known == state and (fresh or state == RETRY):
                return jobset
            value = f"{state}@{stamp}"
        why = f"admission check of its Workload: {state or 'done'}"
        namespace, name, version = meta.namespace, meta.name, meta.resource_version
        for _ in range(3):
            try:
                return self.kube.annotate_jobset(
                    namespace, name, {labels.ADMISSION_CHECK: value}, version, why
                )
            except ConflictError:
                # Written since it was read (e.g. the stockout record just now): only this annotation
                # is ours to set, so read the new version and set it again.
                try:
                    jobset = self.kube.get_jobset(namespace, name)
                except NotFoundError:
                    return jobset
                version = Meta.of(jobset).resource_version
            except NotFoundError as exc:
                logs.decision(
                    log, "admission.unmarked", f"could not record {why}: {exc.why}", logging.WARNING
                )
                return jobset
        logs.decision(log, "admission.unmarked", f"could not record {why}: kept changing", logging.WARNING)
        return jobset

    def _flavor_labels(self, workload: WorkloadView) -> dict[str, dict[str, str]]:
        """Per pod set, the node labels of the flavor its TPU chips were assigned (Kueue writes them
        into the pod template only on admission; the slices must be known before)."""
        found: dict[str, dict[str, str]] = {}
        cache: dict[str, dict[str, str]] = {}
        for assignment in workload.assignments:
            flavor = assignment.flavors.get(labels.TPU_RESOURCE, "")
            if not flavor:
                continue
            if flavor not in cache:
                try:
                    obj = self.kube.get_resource_flavor(flavor)
                except NotFoundError:
                    raise Refused(f"ResourceFlavor {flavor} does not exist") from None
                node_labels = (obj.get("spec") or {}).get("nodeLabels") or {}
                cache[flavor] = {str(k): str(v) for k, v in node_labels.items()}
            found[assignment.name] = cache[flavor]
        return found

    def _guardrail(self, slices: list[WorkloadSlice]) -> str:
        for item in slices:
            request = item.request
            try:
                shape = catalog.resolve(request.accelerator, request.topology, request.chips_per_vm)
            except catalog.UnsupportedShape as exc:
                return str(exc)
            why = guardrail(self.settings, request, shape.total_chips)
            if why:
                return f"{request.slice_id.describe()}: {why}"
        return ""

    def _pod_set_updates(self, slices: list[WorkloadSlice]) -> dict[str, dict[str, str]]:
        """nodeSelector entries each pod set needs and its template lacks (the flavor's labels)."""
        updates: dict[str, dict[str, str]] = {}
        for item in slices:
            if item.missing_selector:
                updates.setdefault(item.pod_set, {}).update(item.missing_selector)
        return updates

    # -- writing the state -----------------------------------------------------------------------

    def _write(
        self,
        workload: WorkloadView,
        previous: str,
        previous_message: str,
        previous_time: str,
        verdict: CheckVerdict,
        trigger: str,
    ) -> None:
        changed = verdict.state != previous
        if not changed and verdict.message == previous_message:
            return  # nothing new to say: no write, no Event
        entry: dict[str, Any] = {
            "name": self.check,
            "state": verdict.state,
            "message": verdict.message[:32768],
            # Kueue counts requeueAfterSeconds from the transition: keep it unless the state moves.
            "lastTransitionTime": _now() if changed or not previous_time else previous_time,
        }
        if verdict.requeue_after is not None:
            entry["requeueAfterSeconds"] = int(verdict.requeue_after)
        updates = _updates_of(verdict)
        if updates:
            entry["podSetUpdates"] = [{"name": k, "nodeSelector": v} for k, v in sorted(updates.items())]
        self.kube.set_admission_check_state(workload.namespace, workload.name, entry)
        level = logging.WARNING if verdict.state in (RETRY, REJECTED) else logging.INFO
        logs.decision(
            log,
            "admission.ready"
            if verdict.state == READY
            else "admission.retry"
            if verdict.state == RETRY
            else "admission.rejected"
            if verdict.state == REJECTED
            else "admission.pending",
            f"Workload {workload.key}: {verdict.message}" + (f" ({trigger})" if trigger else ""),
            level,
            check=self.check,
            requeue_after=verdict.requeue_after,
        )
        if changed or verdict.state == PENDING:
            warning = verdict.state in (RETRY, REJECTED)
            reason = REASONS[verdict.state]
            self.kube.record_event(workload.ref, reason, verdict.message, warning=warning)
            if workload.owner_kind == "JobSet":
                self.kube.record_event(workload.jobset_ref, reason, verdict.message, warning=warning)

    def _skip(self, key: str, why: str) -> CheckResult:
        logs.decision(log, "admission.skipped", f"Workload {key}: {why}", logging.DEBUG)
        return CheckResult(key, "", why)


def _with_updates(verdict: CheckVerdict, updates: dict[str, dict[str, str]]) -> CheckVerdict:
    pairs = tuple(sorted((name, tuple(sorted(selector.items()))) for name, selector in updates.items()))
    return dataclasses.replace(verdict, pod_set_updates=pairs)


def _updates_of(verdict: CheckVerdict) -> dict[str, dict[str, str]]:
    return {name: dict(pairs) for name, pairs in verdict.pod_set_updates}
