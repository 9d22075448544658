"""The admission check controller: a Workload's TPU slices, all of them, before Kueue admits it.

Kueue reserves quota for a Workload in a ClusterQueue whose ``admissionChecksStrategy`` names the
product's AdmissionCheck (``ADMISSION_CHECK_NAME``, controllerName ``tpuprov.dev/tpu-slices``), then
waits for the check's state in ``status.admissionChecks``. :meth:`AdmissionChecker.handle` (on
Kueue's ``QuotaReserved`` Event, on each finished node-pool operation, and from reconcile's sweep)
reads the Workload and its JobSet, derives every slice exactly as provision does
(``shared.tpu.workloads``), requests every missing pool at once (fan-out within GKE's operation
slots and the delivery's deadline, as provision does) and sets the state
``shared.provisioning.admission.decide`` decides. Every state change is an Event on the Workload
and on the JobSet and a decision log line (``admission.<state>``).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

from shared.core import labels, logs
from shared.core.errors import NotFoundError, Refused
from shared.provisioning.admission.decide import CheckVerdict, decide
from shared.provisioning.admission.pools import SlicePools
from shared.provisioning.services import Services
from shared.provisioning.tenancy.guardrails import guardrail
from shared.tpu import catalog
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import ClusterInfo
from shared.tpu.workloads import (
    PENDING,
    READY,
    REJECTED,
    RETRY,
    CheckState,
    WorkloadSlice,
    WorkloadView,
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
    # Every pool is RUNNING and only Nodes are not Ready (or still not-ready tainted) yet: worth
    # another look within seconds.
    waiting_for_nodes: bool = False


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class AdmissionChecker:
    """Provisions the slices of Workloads that wait for the product's admission check."""

    def __init__(self, services: Services) -> None:
        """``services``: the instance's one service graph (the same slot and quota account, backoff,
        fallback and releaser as provision's)."""
        self.services = services
        self.settings = services.settings
        self.gke = services.gke
        self.kube = services.kube
        self.policies = services.policies
        self.check = self.settings.admission_check_name
        self.backoff = services.backoff
        self.fallback = services.fallback
        self.pools = SlicePools(services)
        self.multikueue = services.multikueue

    def cluster(self) -> ClusterInfo:
        return self.services.cluster()

    # -- entry points ---------------------------------------------------------------------------

    def handle(self, namespace: str, name: str, trigger: str = "") -> CheckResult:
        """Look at one Workload (e.g. on its QuotaReserved Event) and move its check on."""
        try:
            workload = self.kube.get_workload(namespace, name)
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
        for workload in listed:
            state = workload.check(self.check)
            # A Workload deactivated, evicted or finished is not the check's any more, even while Kueue
            # is still evicting it (quota still reserved, the check reset to Pending): left alone.
            waiting = state is not None and state.state == PENDING and workload.has("QuotaReserved")
            if waiting and not workload.done:
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
        placed = self.multikueue.verdict(
            workload,
            lambda jobset: self._slices(workload, jobset),
        )
        if placed is not None:  # a MultiKueue worker's copy: Ready in the one worker chosen
            return CheckVerdict(placed.state, placed.message), ()
        if workload.owner_kind != "JobSet":
            return CheckVerdict(READY, f"owned by a {workload.owner_kind or 'nothing'}: no TPU slices"), ()
        try:
            jobset = self.kube.get_jobset(workload.namespace, workload.owner_name)
        except NotFoundError:
            return CheckVerdict(REJECTED, f"JobSet {workload.owner_name} does not exist"), ()
        if workload.owner_uid and jobset.meta.uid != workload.owner_uid:
            # Kueue names its Workload's owner by uid: a JobSet recreated under the name is another.
            why = (
                f"JobSet {workload.owner_name} was recreated (uid {jobset.meta.uid}, "
                f"the Workload's is {workload.owner_uid})"
            )
            return CheckVerdict(REJECTED, why), ()
        try:
            slices = self._slices(workload, jobset)
            refusal = self._guardrail(slices)
        except Refused as exc:
            return decide([], exc.why), ()
        if refusal:
            return decide([], refusal), ()
        # Release keeps a suspended JobSet's pools while its Workload's check is Pending or Ready with
        # quota reserved (read from the Workload's status, which Kueue and this check write and no
        # tenant can): nothing is recorded on the JobSet, which its owner could rewrite.
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
            if created and self.settings.idle_pool_seconds:
                self.pools.withdraw_offers(jobset, created)
        if verdict.state == READY:
            return _with_updates(verdict, self._pod_set_updates(slices)), created
        return verdict, created

    def _slices(self, workload: WorkloadView, jobset: JobSet) -> list[WorkloadSlice]:
        """The Workload's TPU slices, derived from ``jobset`` with the flavors assigned here."""
        return workload_slices(
            jobset, workload.pod_sets, self._flavor_labels(workload), self.settings.max_vms_per_jobset
        )

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
