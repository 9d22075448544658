"""A simulated Kueue for the sandbox: queued JobSets wait for quota, start with the flavor's labels.

What it does, as Kueue v0.19 does for JobSets labelled ``kueue.x-k8s.io/queue-name``:

* webhook: such a JobSet is created with ``spec.suspend: true`` (``KubeApiServer.on_create``); a
  queued JobSet that is not admitted and gets unsuspended is suspended again;
* a ``kueue.x-k8s.io/v1beta2`` Workload per JobSet (``jobset-<name>-<hash>``, owned by the JobSet,
  so it goes when the JobSet goes) with its pod sets, priority and conditions: ``QuotaReserved``
  (``Pending`` with Kueue's message while it waits), ``Admitted``, ``Evicted``/``Preempted``,
  ``Finished``; a ``CreatedWorkload`` Event on the JobSet;
* admission by ``sandbox.cluster.kueue_quota.plan``: on admission the JobSet is unsuspended and
  every replicated job's pod template gets the flavor's nodeLabels (and tolerations), with a
  ``Started`` Event ("Admitted by clusterQueue ...");
* preemption: the victim's Workload gets ``Evicted``/``Preempted`` and its JobSet is suspended
  again with its templates restored and a ``Stopped`` Event carrying the preemption message; the
  JobSet controller then deletes its pods. The Workload keeps its quota until then: only once the
  JobSet is suspended and has no running pods does it go back to pending (``QuotaReserved`` False,
  ``Requeued``), and only then is the preemptor admitted. The victim is admitted again when quota
  allows;
* a Completed/Failed JobSet's Workload is ``Finished`` and a deleted JobSet's Workload is gone;
  either way its quota is free on the next pass.

Differences from real Kueue (beyond those of ``kueue_quota``): one pass every ``interval`` or on
a change instead of an event-driven queue manager; no ClusterQueue ``namespaceSelector`` check,
no ``stopPolicy``, no status on ClusterQueues/LocalQueues, no visibility API; all Events come from
the component ``kueue-admission``; Workload conditions carry no ``observedGeneration``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from sandbox.cluster import kueue_objects as ko
from sandbox.cluster.common import (
    JOBSET_API,
    Loop,
    SimContext,
    condition,
    is_true,
    jobset_pods,
    ref,
    with_condition,
)
from sandbox.cluster.kueue_quota import Plan, Preemption, Queue, Workload, plan
from shared.core import labels

COMPONENT = "kueue-admission"


@dataclasses.dataclass
class _Tracked:
    """What the simulation remembers about one queued JobSet."""

    workload: Workload
    namespace: str
    jobset: str
    local_queue: str
    saved_templates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    message: str = ""
    finished: bool = False


class KueueController(Loop):
    """Queues, admits and preempts the JobSets that name a LocalQueue."""

    name = "kueue"

    def __init__(self, ctx: SimContext, interval: float = 0.25) -> None:
        super().__init__(interval)
        self.ctx = ctx
        self._tracked: dict[str, _Tracked] = {}  # by JobSet uid
        self._arrivals = itertools.count()
        self.admissions = 0
        self.preemptions = 0
        ctx.api.on_change(self._changed)
        register = getattr(ctx.api, "on_create", None)
        if register is not None:
            register(self._webhook)

    # -- inputs ---------------------------------------------------------------------------------

    @staticmethod
    def _webhook(api_version: str, kind: str, obj: dict[str, Any]) -> None:
        """Kueue's JobSet defaulting webhook: a queued JobSet starts suspended."""
        queued = ((obj.get("metadata") or {}).get("labels") or {}).get(ko.QUEUE_NAME_LABEL)
        if kind == "JobSet" and api_version.startswith(labels.JOBSET_GROUP + "/") and queued:
            obj.setdefault("spec", {})["suspend"] = True

    def _changed(self, event_type: str, obj: dict[str, Any]) -> None:
        kind = obj.get("kind")
        if kind in ("JobSet", "ClusterQueue", "LocalQueue", "ResourceFlavor", "WorkloadPriorityClass"):
            self.wake()

    def _installed(self) -> bool:
        try:
            self.ctx.api.list(ko.KUEUE_API, "clusterqueues")
        except Exception:  # the Kueue CRDs are not served: nothing to simulate
            return False
        return True

    # -- one pass -------------------------------------------------------------------------------

    def step(self) -> None:
        """Track queued JobSets, plan admissions and preemptions, and write the outcome."""
        with self.ctx.lock:
            if not self._installed():
                return
            api = self.ctx.api
            flavors = {str(f["metadata"]["name"]): f for f in api.list(ko.KUEUE_API, "resourceflavors")}
            queues = {q.name: q for q in map(ko.parse_cluster_queue, api.list(ko.KUEUE_API, "clusterqueues"))}
            local = {
                (str(q["metadata"].get("namespace")), str(q["metadata"]["name"])): str(
                    (q.get("spec") or {}).get("clusterQueue", "")
                )
                for q in api.list(ko.KUEUE_API, "localqueues")
            }
            wpcs = {
                str(c["metadata"]["name"]): int(c.get("value") or 0)
                for c in api.list(ko.KUEUE_API, "workloadpriorityclasses")
            }
            pcs_list = api.list("scheduling.k8s.io/v1", "priorityclasses")
            pcs = {str(c["metadata"]["name"]): int(c.get("value") or 0) for c in pcs_list}
            default = next((int(c.get("value") or 0) for c in pcs_list if c.get("globalDefault")), 0)
            seen: set[str] = set()
            for jobset in api.list(JOBSET_API, labels.JOBSET_PLURAL):
                meta = jobset.get("metadata") or {}
                lq = (meta.get("labels") or {}).get(ko.QUEUE_NAME_LABEL)
                if not lq or meta.get("deletionTimestamp"):
                    continue
                uid = str(meta.get("uid", ""))
                seen.add(uid)
                tracked = self._tracked.get(uid) or self._track(jobset, str(lq), wpcs, pcs, default)
                tracked.workload.queue = local.get((tracked.namespace, tracked.local_queue), "")
                self._observe(jobset, tracked, queues)
            for uid in [u for u in self._tracked if u not in seen]:
                gone = self._tracked.pop(uid)
                if gone.workload.flavor and not gone.finished:
                    self.ctx.timeline.add(
                        "kueue", f"JobSet {gone.namespace}/{gone.jobset} deleted: quota released"
                    )
            active = [
                t.workload for t in self._tracked.values() if not t.finished and t.workload.queue in queues
            ]
            result = plan(
                queues, {n: (f.get("spec") or {}).get("nodeLabels") or {} for n, f in flavors.items()}, active
            )
            self._apply(result, flavors, queues)

    def _track(
        self, jobset: dict[str, Any], lq: str, wpcs: Mapping[str, int], pcs: Mapping[str, int], default: int
    ) -> _Tracked:
        meta = jobset["metadata"]
        sets = ko.pod_sets(jobset)
        priority, class_name = ko.priority_of(jobset, wpcs, pcs, default)
        namespace = str(meta.get("namespace", "default"))
        workload = Workload(
            key=f"{namespace}/{ko.workload_name(jobset)}",
            uid="",
            job_uid=str(meta.get("uid", "")),
            queue="",
            priority=priority,
            created=(str(meta.get("creationTimestamp", "")), next(self._arrivals)),
            chips=ko.chips(sets),
            pod_set=sets[0]["name"] if sets else "",
            node_selector=ko.node_selector(sets),
        )
        tracked = _Tracked(workload, namespace, str(meta.get("name", "")), lq)
        self._tracked[workload.job_uid] = tracked
        stored = self.ctx.api.put(self._workload_object(jobset, tracked, sets, class_name))
        workload.uid = str(stored["metadata"].get("uid", ""))
        self._event(jobset, "CreatedWorkload", f"Created Workload: {workload.key}")
        self.ctx.timeline.add(
            "kueue", f"JobSet {ref(jobset)} queued in {lq}: Workload {workload.key} ({workload.chips} chips)"
        )
        return tracked

    def _observe(self, jobset: dict[str, Any], tracked: _Tracked, queues: Mapping[str, Queue]) -> None:
        """Finish, or keep an unadmitted JobSet suspended and report a missing queue."""
        if tracked.finished:
            return
        for kind, reason in (("Completed", "Succeeded"), ("Failed", "Failed")):
            if is_true(jobset, kind):
                tracked.finished = True
                released = (
                    f", {tracked.workload.chips} chips of {tracked.workload.flavor} released"
                    if tracked.workload.flavor
                    else ""
                )
                message = str((condition(jobset, kind) or {}).get("message", ""))
                self._workload_status(tracked, [("Finished", True, reason, message)])
                self.ctx.timeline.add("kueue", f"Workload {tracked.workload.key} finished ({kind}){released}")
                return
        wl = tracked.workload
        if wl.evicting and self._stopped(jobset):
            self._requeue(tracked)
        if wl.flavor is None and not (jobset.get("spec") or {}).get("suspend"):
            jobset["spec"]["suspend"] = True  # only an admitted Workload's JobSet may run
            self.ctx.api.put(jobset)
        if not wl.queue:
            self._pending(tracked, f"LocalQueue {tracked.local_queue} doesn't exist", "Inadmissible")
        elif wl.queue not in queues:
            self._pending(tracked, f"ClusterQueue {wl.queue} doesn't exist", "Inadmissible")

    # -- outputs --------------------------------------------------------------------------------

    def _apply(
        self, result: Plan, flavors: Mapping[str, dict[str, Any]], queues: Mapping[str, Queue]
    ) -> None:
        by_key = {t.workload.key: t for t in self._tracked.values()}
        for preemption in result.preempt:
            self._preempt(by_key[preemption.victim.key], preemption)
        for wl, flavor in result.admit:
            self._admit(by_key[wl.key], flavors[flavor], queues[wl.queue])
        for key, message in result.pending.items():
            self._pending(by_key[key], message, "Pending")

    def _jobset(self, tracked: _Tracked) -> dict[str, Any] | None:
        return self.ctx.api.get(JOBSET_API, labels.JOBSET_PLURAL, tracked.namespace, tracked.jobset)

    def _admit(self, tracked: _Tracked, flavor: dict[str, Any], queue: Queue) -> None:
        jobset = self._jobset(tracked)
        if jobset is None:
            return
        wl, flavor_name = tracked.workload, str(flavor["metadata"]["name"])
        wl.flavor = flavor_name
        tracked.saved_templates = ko.inject(jobset, flavor)
        tracked.message = ""
        self.admissions += 1
        admission = ko.admission(jobset, queue.name, flavor_name)
        self._workload_status(
            tracked,
            [
                ("QuotaReserved", True, "QuotaReserved", f"Quota reserved in ClusterQueue {queue.name}"),
                ("Admitted", True, "Admitted", "The workload is admitted"),
                ("Evicted", False, "QuotaReserved", "Previously: evicted, now admitted again"),
            ],
            admission=admission,
        )
        self._workload_event(tracked, "QuotaReserved", f"Quota reserved in ClusterQueue {queue.name}")
        self._workload_event(tracked, "Admitted", f"Admitted by ClusterQueue {queue.name}")
        # Kueue's scheduler admits the Workload; its job reconciler then starts the JobSet.
        jobset["spec"]["suspend"] = False
        self.ctx.api.put(jobset)
        self._event(jobset, "Started", f"Admitted by clusterQueue {queue.name}")
        self.ctx.timeline.add(
            "kueue",
            f"Workload {wl.key} admitted by {queue.name}: {wl.chips} chips of flavor {flavor_name}; "
            f"JobSet {ref(jobset)} unsuspended",
        )

    def _stopped(self, jobset: dict[str, Any]) -> bool:
        """Whether a suspended JobSet has stopped: the JobSet controller saw it and no pod is left.

        Kueue waits for the job to be inactive (JobSet: no active child Job) before it gives an
        evicted Workload's quota back; the sandbox's JobSet controller deletes the pods and sets
        ``Suspended`` in one step, so that step is what is waited for.
        """
        return is_true(jobset, "Suspended") and not jobset_pods(self.ctx.api, jobset)

    def _requeue(self, tracked: _Tracked) -> None:
        wl = tracked.workload
        released = f"{wl.chips} chips of {wl.flavor}"
        wl.flavor, wl.evicting = None, False
        self._workload_status(
            tracked,
            [
                ("Requeued", True, "Preempted", tracked.message),
                ("QuotaReserved", False, "Pending", tracked.message),
                ("Admitted", False, "NoReservation", "The workload has no reservation"),
            ],
            admission=None,
        )
        self.ctx.timeline.add("kueue", f"Workload {wl.key} stopped: {released} released, requeued")

    def _preempt(self, tracked: _Tracked, preemption: Preemption) -> None:
        wl = tracked.workload
        wl.evicting = True
        self.preemptions += 1
        tracked.message = preemption.message
        self._workload_status(
            tracked,
            [
                ("Evicted", True, "Preempted", preemption.message),
                ("Preempted", True, preemption.reason, preemption.message),
            ],
        )
        self._workload_event(tracked, "Preempted", preemption.message)
        self._workload_event(tracked, "EvictedDueToPreempted", preemption.message)
        # The scheduler evicts the Workload; the job reconciler then stops the JobSet.
        jobset = self._jobset(tracked)
        if jobset is not None:
            ko.restore(jobset, tracked.saved_templates)
            jobset["spec"]["suspend"] = True
            self.ctx.api.put(jobset)
            self._event(jobset, "Stopped", preemption.message)
        self.ctx.timeline.add(
            "kueue",
            f"Workload {wl.key} preempted for {preemption.preemptor.key} ({preemption.reason}); "
            f"JobSet {tracked.namespace}/{tracked.jobset} suspended; its quota is held until it stops",
        )

    def _pending(self, tracked: _Tracked, message: str, reason: str) -> None:
        if tracked.message == message:
            return  # unchanged: no new write, no new Event
        tracked.message = message
        self._workload_status(tracked, [("QuotaReserved", False, reason, message)])
        self._workload_event(tracked, reason, message, warning=True)
        self.ctx.timeline.add("kueue", f"Workload {tracked.workload.key} pending: {message}")

    # -- writes ---------------------------------------------------------------------------------

    def _workload_object(
        self, jobset: dict[str, Any], tracked: _Tracked, sets: list[dict[str, Any]], class_name: str
    ) -> dict[str, Any]:
        meta = jobset["metadata"]
        spec: dict[str, Any] = {
            "queueName": tracked.local_queue,
            "priority": tracked.workload.priority,
            "active": True,
            "podSets": sets,
        }
        if class_name:
            kind = (
                "WorkloadPriorityClass"
                if class_name in ((meta.get("labels") or {}).get(ko.PRIORITY_CLASS_LABEL),)
                else "PriorityClass"
            )
            group = "kueue.x-k8s.io" if kind == "WorkloadPriorityClass" else "scheduling.k8s.io"
            spec["priorityClassRef"] = {"group": group, "kind": kind, "name": class_name}
        return {
            "apiVersion": ko.KUEUE_API,
            "kind": "Workload",
            "metadata": {
                "name": tracked.workload.key.split("/", 1)[1],
                "namespace": tracked.namespace,
                "labels": {ko.JOB_UID_LABEL: str(meta.get("uid", ""))},
                "ownerReferences": [
                    {
                        "apiVersion": JOBSET_API,
                        "kind": "JobSet",
                        "name": str(meta.get("name", "")),
                        "uid": str(meta.get("uid", "")),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": {},
        }

    def _workload_status(
        self,
        tracked: _Tracked,
        changes: list[tuple[str, bool, str, str]],
        **fields: Any,
    ) -> None:
        name = tracked.workload.key.split("/", 1)[1]
        current = self.ctx.api.get(ko.KUEUE_API, "workloads", tracked.namespace, name)
        if current is None:
            return
        status: dict[str, Any] = dict(current.get("status") or {})
        for kind, value, reason, message in changes:
            if kind == "Evicted" and not value and condition(current, "Evicted") is None:
                continue  # never evicted: nothing to clear
            status["conditions"] = with_condition(status, kind, value, reason, message)
        status.update(fields)
        self.ctx.api.patch_status(ko.KUEUE_API, "workloads", tracked.namespace, name, status)

    def _workload_event(self, tracked: _Tracked, reason: str, message: str, warning: bool = False) -> None:
        name = tracked.workload.key.split("/", 1)[1]
        involved = {
            "apiVersion": ko.KUEUE_API,
            "kind": "Workload",
            "metadata": {"name": name, "namespace": tracked.namespace, "uid": tracked.workload.uid},
        }
        self.ctx.record_event(involved, reason, message, warning=warning, component=COMPONENT)

    def _event(self, jobset: Mapping[str, Any], reason: str, message: str) -> None:
        involved = {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": jobset.get("metadata") or {}}
        self.ctx.record_event(involved, reason, message, component=COMPONENT)

    # -- inspection -----------------------------------------------------------------------------

    def admitted(self) -> dict[str, str]:
        """``namespace/jobset`` -> flavor, for the JobSets holding quota now."""
        return {
            f"{t.namespace}/{t.jobset}": t.workload.flavor
            for t in self._tracked.values()
            if t.workload.flavor and not t.finished
        }

    def when(self, predicate: Callable[[KueueController], bool]) -> bool:
        """Evaluate ``predicate`` under the simulation lock (a consistent view for tests)."""
        with self.ctx.lock:
            return predicate(self)
