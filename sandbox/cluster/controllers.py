"""A simulated JobSet controller working directly on the sandbox Kubernetes API's state.

It does what the parts of the real JobSet (and Job) controllers the product depends on do:

* creates the pods of every Job, labelled exactly as the real controllers label them
  (``shared.tpu.jobsets.expand_pods``), Pending and without conditions (the scheduler sets those),
  owned by the JobSet so that deleting the JobSet garbage-collects them;
* honours ``spec.suspend`` (pods deleted, ``Suspended`` condition) and resumes;
* when every pod of the current attempt Succeeded: ``Completed=True`` and an ``AllJobsCompleted``
  Event; when a pod Failed: a restart while ``spec.failurePolicy.maxRestarts`` allows (pods
  deleted, ``status.restarts`` + 1, pods recreated with the next restart attempt), otherwise
  ``Failed=True`` and a ``FailedJobs`` (or ``ReachedMaxRestarts``) Event.
"""

from __future__ import annotations

from typing import Any

from sandbox.cluster.common import JOBSET_API, Loop, SimContext, is_true, jobset_pods, ref, with_condition
from shared.core import labels
from shared.tpu.jobsets import expand_pods

COMPONENT = "jobset"
_TERMINAL_PHASES = ("Succeeded", "Failed")


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def exclusive_placement(pod: dict[str, Any], topology_key: str) -> None:
    """Add what JobSet's pod webhook adds under ``alpha.jobset.sigs.k8s.io/exclusive-topology``.

    Pods of one Job must share a topology domain (a node pool) and no pod of another Job may be in
    it: required pod affinity to the own job key, anti-affinity to every other job key.
    """
    job_key = pod["metadata"]["labels"][labels.JOB_KEY]
    pod["metadata"].setdefault("annotations", {})[labels.EXCLUSIVE_TOPOLOGY] = topology_key
    own = {"matchExpressions": [{"key": labels.JOB_KEY, "operator": "In", "values": [job_key]}]}
    others = {
        "matchExpressions": [
            {"key": labels.JOB_KEY, "operator": "Exists"},
            {"key": labels.JOB_KEY, "operator": "NotIn", "values": [job_key]},
        ]
    }
    pod["spec"]["affinity"] = {
        **(pod["spec"].get("affinity") or {}),
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": own, "topologyKey": topology_key, "namespaceSelector": {}}
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": others, "topologyKey": topology_key, "namespaceSelector": {}}
            ]
        },
    }


class JobSetController(Loop):
    """Reconciles every JobSet a few times a second, and at once when a JobSet or Pod changes."""

    name = "jobset-controller"

    def __init__(self, ctx: SimContext, interval: float = 0.25) -> None:
        super().__init__(interval)
        self.ctx = ctx
        ctx.api.on_change(self._changed)

    def _changed(self, event_type: str, obj: dict[str, Any]) -> None:
        kind = obj.get("kind")
        if kind == "JobSet":
            if event_type == "DELETED":
                self.ctx.timeline.add("jobset", f"JobSet {ref(obj)} deleted")
            self.wake()
        elif kind == "Pod" and event_type == "MODIFIED":
            self.wake()

    def step(self) -> None:
        """Sync every JobSet once."""
        with self.ctx.lock:
            for jobset in self.ctx.api.list(JOBSET_API, labels.JOBSET_PLURAL):
                self._sync(jobset)

    # -- one JobSet -------------------------------------------------------------------------------

    def _sync(self, jobset: dict[str, Any]) -> None:
        meta = jobset.get("metadata") or {}
        if meta.get("deletionTimestamp") or is_true(jobset, "Completed") or is_true(jobset, "Failed"):
            return
        api = self.ctx.api
        namespace, name = meta.get("namespace", "default"), meta.get("name", "")
        status = dict(jobset.get("status") or {})
        restarts = _int(status.get("restarts"))
        pods = jobset_pods(api, jobset)
        attempt = str(restarts)
        current = [p for p in pods if p["metadata"]["labels"].get(labels.RESTART_ATTEMPT) == attempt]
        for pod in pods:
            if pod not in current:
                self._delete_pod(pod)

        if (jobset.get("spec") or {}).get("suspend"):
            for pod in current:
                self._delete_pod(pod)
            if not is_true(jobset, "Suspended"):
                self._set_condition(jobset, status, "Suspended", True, "SuspendedJobs", "jobset is suspended")
                self._event(jobset, "SuspendedJobs", "jobset is suspended")
            return
        if is_true(jobset, "Suspended"):
            self._set_condition(jobset, status, "Suspended", False, "ResumeJobs", "jobset is resumed")
            self._event(jobset, "ResumeJobs", "jobset is resumed")
            status = dict(
                (api.get(JOBSET_API, labels.JOBSET_PLURAL, namespace, name) or {}).get("status") or {}
            )

        if not current:
            self._create_pods(jobset, restarts)
            return
        failed = [p for p in current if (p.get("status") or {}).get("phase") == "Failed"]
        if failed:
            self._on_failure(jobset, status, current, failed, restarts)
            return
        expected = len(expand_pods(jobset, restarts, pending=False))
        done = [p for p in current if (p.get("status") or {}).get("phase") == "Succeeded"]
        if len(done) == expected:
            status["terminalState"] = "Completed"
            self._set_condition(
                jobset, status, "Completed", True, "AllJobsCompleted", "jobset completed successfully"
            )
            self.ctx.timeline.add("jobset", f"JobSet {ref(jobset)} Completed ({expected} pods succeeded)")
            self._event(jobset, "AllJobsCompleted", "jobset completed successfully")

    def _create_pods(self, jobset: dict[str, Any], restarts: int) -> None:
        meta = jobset["metadata"]
        owner = {
            "apiVersion": JOBSET_API,
            "kind": "JobSet",
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "controller": True,
            "blockOwnerDeletion": True,
        }
        pods = expand_pods(jobset, restarts, pending=False)
        topology_key = (meta.get("annotations") or {}).get(labels.EXCLUSIVE_TOPOLOGY)
        for pod in pods:
            pod["metadata"]["ownerReferences"] = [owner]
            if topology_key:
                exclusive_placement(pod, str(topology_key))
            self.ctx.api.put(pod)
        attempt = f" (restart attempt {restarts})" if restarts else ""
        self.ctx.timeline.add("jobset", f"JobSet {ref(jobset)}: created {len(pods)} pods{attempt}")

    def _on_failure(
        self,
        jobset: dict[str, Any],
        status: dict[str, Any],
        current: list[dict[str, Any]],
        failed: list[dict[str, Any]],
        restarts: int,
    ) -> None:
        policy = (jobset.get("spec") or {}).get("failurePolicy") or {}
        max_restarts = _int(policy.get("maxRestarts"))
        first = ref(failed[0])
        if restarts < max_restarts:
            for pod in current:
                self._delete_pod(pod)
            status["restarts"] = restarts + 1
            self.ctx.api.patch_status(
                JOBSET_API,
                labels.JOBSET_PLURAL,
                jobset["metadata"]["namespace"],
                jobset["metadata"]["name"],
                status,
            )
            self.ctx.timeline.add(
                "jobset", f"JobSet {ref(jobset)}: pod {first} failed, restart {restarts + 1}/{max_restarts}"
            )
            return
        for pod in current:
            if (pod.get("status") or {}).get("phase") not in _TERMINAL_PHASES:
                self._delete_pod(pod)
        if policy:
            reason, message = "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts"
        else:
            reason, message = "FailedJobs", "jobset failed due to one or more job failures"
        status["terminalState"] = "Failed"
        self._set_condition(jobset, status, "Failed", True, reason, message)
        self.ctx.timeline.add("jobset", f"JobSet {ref(jobset)} Failed ({reason}: pod {first} failed)")
        self._event(jobset, reason, message, warning=True)

    # -- writes -----------------------------------------------------------------------------------

    def _set_condition(
        self,
        jobset: dict[str, Any],
        status: dict[str, Any],
        kind: str,
        value: bool,
        reason: str,
        message: str,
    ) -> None:
        status["conditions"] = with_condition(status, kind, value, reason, message)
        meta = jobset["metadata"]
        self.ctx.api.patch_status(JOBSET_API, labels.JOBSET_PLURAL, meta["namespace"], meta["name"], status)

    def _event(self, jobset: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        involved = {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": jobset.get("metadata") or {}}
        self.ctx.record_event(involved, reason, message, warning=warning, component=COMPONENT)

    def _delete_pod(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        self.ctx.api.delete("v1", "pods", meta.get("namespace"), str(meta.get("name", "")))
