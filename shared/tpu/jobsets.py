"""All the product's JobSet knowledge: conditions, replicated jobs, a pod's JobSet, the pods it gets.

The ``JobSet`` view the adapter parses each JobSet into, and pure functions over it (no I/O):

* reading a JobSet: ``JobSet.terminal`` (the one answer to "has it ended"), ``condition``,
  ``replicated_job``, ``replicas_of``, ``jobset_problem``, ``jobset_ref`` (each also takes the API's
  JSON, which it parses);
* ``expand_pods`` mirrors what the JobSet and Job controllers put on each pod (labels, annotations,
  nodeSelector, requests), so ``tpuprov plan``, the sandbox's simulated controller and the tests all
  derive pools through the very code path the provision function runs on real pods.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import uuid
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.meta import Meta
from shared.core.names import SliceId
from shared.tpu import owners


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def job_uid(jobset_uid: str, job: str, restart_attempt: int = 0) -> str:
    """The uid ``expand_jobs`` gives a Job (the API server assigns real ones; tests and ``tpuprov
    plan`` need them stable so that the pods they expand name their Job's uid)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"jobset:{jobset_uid}/{job}/{restart_attempt}"))


def _replicated_jobs(jobset: JobSetLike) -> list[Mapping[str, Any]]:
    return JobSet.of(jobset).replicated_jobs


def _job_spec(rjob: Mapping[str, Any]) -> dict[str, Any]:
    return dict((rjob.get("template") or {}).get("spec") or {})


def expand_jobs(jobset: JobSetLike, restart_attempt: int = 0) -> list[dict[str, Any]]:
    """The Jobs the JobSet controller creates for ``jobset``: one per replica of each replicated job,
    named ``<jobset>-<replicatedJob>-<index>``, controlled by the JobSet (its uid)."""
    meta = JobSet.of(jobset).meta
    jobs = []
    for rjob in _replicated_jobs(jobset):
        rname = str(rjob.get("name", ""))
        for job_index in range(_int(rjob.get("replicas"), 1)):
            name = owners.job_name(meta.name, rname, job_index)
            jobs.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": name,
                        "namespace": meta.namespace,
                        "uid": job_uid(meta.uid, name, restart_attempt),
                        "labels": {
                            labels.JOBSET_NAME: meta.name,
                            labels.JOBSET_UID: meta.uid,
                            labels.REPLICATED_JOB_NAME: rname,
                            labels.JOB_INDEX: str(job_index),
                        },
                        "ownerReferences": [_controller_ref(jobset_api(), "JobSet", meta.name, meta.uid)],
                    },
                    "spec": {**_job_spec(rjob), "suspend": is_suspended(jobset)},
                }
            )
    return jobs


def jobset_api() -> str:
    """``jobset.x-k8s.io/v1alpha2``, the JobSet API version the product reads."""
    return f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"


def _controller_ref(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _exclusive_placement(jobset: JobSet, rjob: Mapping[str, Any]) -> dict[str, str]:
    """The exclusive-placement annotations the JobSet controller copies onto each Job and its pods:
    the JobSet's, overridden by the replicated job's template's (JobSet v0.10.1
    pkg/controllers/jobset_controller.go ``labelAndAnnotateObjects``)."""
    found: dict[str, str] = {}
    for source in (jobset.meta.annotations, Meta.of(rjob.get("template") or {}).annotations):
        if labels.EXCLUSIVE_TOPOLOGY in source:
            found[labels.EXCLUSIVE_TOPOLOGY] = str(source[labels.EXCLUSIVE_TOPOLOGY])
            if labels.NODE_SELECTOR_STRATEGY in source:
                found[labels.NODE_SELECTOR_STRATEGY] = str(source[labels.NODE_SELECTOR_STRATEGY])
    return found


def template_pod(
    jobset: JobSetLike,
    rjob: Mapping[str, Any],
    job_index: int,
    completion: int = 0,
    restart_attempt: int = 0,
    pending: bool = True,
    global_index: int = 0,
) -> dict[str, Any]:
    """Pod ``completion`` of Job ``job_index`` of replicated job ``rjob`` as the JobSet and Job
    controllers make it from the template: their labels and annotations, the template's spec, and
    a controller reference to its Job (the uid ``expand_jobs`` gives it)."""
    meta = JobSet.of(jobset).meta
    name, namespace, uid = meta.name, meta.namespace, meta.uid
    rname = str(rjob.get("name", ""))
    replicas = _int(rjob.get("replicas"), 1)
    pod_template = _job_spec(rjob).get("template") or {}
    job_name = owners.job_name(name, rname, job_index)
    # The JobSet controller's job key: SHA-1 of "<namespace>/<job>", 40 hex characters (a label value
    # holds at most 63, so a SHA-256 digest is refused by the API server).
    job_key = hashlib.sha1(f"{namespace}/{job_name}".encode()).hexdigest()
    tmeta = Meta.of(pod_template)
    pod_labels = {
        **tmeta.labels,
        labels.JOBSET_NAME: name,
        labels.JOBSET_UID: uid,
        labels.REPLICATED_JOB_NAME: rname,
        labels.REPLICATED_JOB_REPLICAS: str(replicas),
        labels.JOB_INDEX: str(job_index),
        labels.JOB_GLOBAL_INDEX: str(global_index),
        labels.JOB_KEY: job_key,
        labels.RESTART_ATTEMPT: str(restart_attempt),
        labels.JOB_COMPLETION_INDEX: str(completion),
        "job-name": job_name,
    }
    pod_annotations = {
        **tmeta.annotations,
        **_exclusive_placement(JobSet.of(jobset), rjob),
        labels.JOBSET_NAME: name,
        labels.REPLICATED_JOB_NAME: rname,
        labels.JOB_INDEX: str(job_index),
        labels.JOB_COMPLETION_INDEX: str(completion),
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{job_name}-{completion}-r{restart_attempt}",
            "namespace": namespace,
            "labels": pod_labels,
            "annotations": pod_annotations,
            "ownerReferences": [
                _controller_ref("batch/v1", "Job", job_name, job_uid(uid, job_name, restart_attempt))
            ],
        },
        "spec": dict(pod_template.get("spec") or {}),
        "status": {"phase": "Pending"},
    }
    if pending:
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
            }
        ]
    return pod


def expand_pods(jobset: JobSetLike, restart_attempt: int = 0, pending: bool = True) -> list[dict[str, Any]]:
    """The pods of every Job of ``jobset`` (one per completion index), as pending-unschedulable pods.

    One dict per pod: for tests, the sandbox and ``tpuprov plan`` on JobSets of a known size. The
    product itself never expands a JobSet it did not write (a declared million pods would cost a
    million dicts): it reads what it needs per replicated job (``shared.tpu.declared``).
    """
    pods: list[dict[str, Any]] = []
    global_index = 0
    for rjob in _replicated_jobs(jobset):
        parallelism = _int(_job_spec(rjob).get("parallelism"), 1)
        for job_index in range(_int(rjob.get("replicas"), 1)):
            for completion in range(parallelism):
                pods.append(
                    template_pod(jobset, rjob, job_index, completion, restart_attempt, pending, global_index)
                )
            global_index += 1
    return pods


def link_pods(pods: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``pods`` with their Job controller references naming the uids ``jobs`` were stored with (the
    API server assigns its own: the sandbox's loaders create the Jobs first, then their pods)."""
    uids = {(Meta.of(j).namespace, Meta.of(j).name): Meta.of(j).uid for j in jobs}
    linked = []
    for pod in pods:
        meta = Meta.of(pod)
        refs = []
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
            uid = uids.get((meta.namespace, str(ref.get("name"))))
            refs.append({**ref, "uid": uid} if ref.get("kind") == "Job" and uid else ref)
        linked.append({**pod, "metadata": {**pod["metadata"], "ownerReferences": refs}})
    return linked


TERMINAL_CONDITIONS = ("Completed", "Failed")
# The reason JobSet's controller gives the Suspended condition when it resumes a JobSet
# (sigs.k8s.io/jobset pkg/constants/constants.go: JobSetResumedReason).
RESUMED_REASON = "ResumeJobs"


@dataclasses.dataclass(frozen=True)
class Condition:
    """One of a JobSet's ``status.conditions``."""

    type: str
    status: str = ""
    reason: str = ""
    message: str = ""
    last_transition: str = ""  # lastTransitionTime as the API writes it (RFC 3339)


@dataclasses.dataclass(frozen=True)
class JobSet:
    """A JobSet as the product reads it, parsed once at the adapter (``KubeAPI.get_jobset``).

    ``spec`` is the JobSet's spec as its owner wrote it (and Kueue, which writes its flavor's
    selectors into the pod templates on admission): what each slice needs is derived from its
    replicated jobs' templates (``shared.tpu.declared``); everything else is a field.
    """

    meta: Meta
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> JobSet:
        """The view of a JobSet as the API returns it (missing fields read as empty)."""
        spec = obj.get("spec")
        status = obj.get("status") or {}
        return cls(
            meta=Meta.of(obj),
            spec=spec if isinstance(spec, Mapping) else {},
            conditions=tuple(
                Condition(
                    type=str(c.get("type") or ""),
                    status=str(c.get("status") or ""),
                    reason=str(c.get("reason") or ""),
                    message=str(c.get("message") or ""),
                    last_transition=str(c.get("lastTransitionTime") or ""),
                )
                for c in status.get("conditions") or []
                if isinstance(c, Mapping)
            ),
        )

    @classmethod
    def of(cls, jobset: JobSet | Mapping[str, Any]) -> JobSet:
        """``jobset`` as a view (the API's JSON is parsed here; a view is returned as is)."""
        return jobset if isinstance(jobset, JobSet) else cls.parse(jobset)

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def namespace(self) -> str:
        return self.meta.namespace

    @property
    def uid(self) -> str:
        return self.meta.uid

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name)."""
        return (self.meta.namespace, self.meta.name)

    @property
    def suspended(self) -> bool:
        """``spec.suspend`` is set: the JobSet (e.g. one Kueue has not admitted) runs no pods for now."""
        return bool(self.spec.get("suspend"))

    def condition(self, kind: str) -> Condition | None:
        """Its condition of type ``kind`` when that condition's status is True."""
        return next((c for c in self.conditions if c.type == kind and c.status == "True"), None)

    def resumed_within(self, seconds: float, now: datetime.datetime) -> bool:
        """Whether it was resumed (admitted, for a Kueue-queued JobSet) at most ``seconds`` before
        ``now``, so its Jobs and pods may not exist or be bound yet. JobSet's controller marks a
        resume by turning the ``Suspended`` condition False with reason ``ResumeJobs``
        (sigs.k8s.io/jobset pkg/controllers/jobset_controller.go); a JobSet whose spec no longer
        suspends it while that condition still says True was resumed before the controller caught up."""
        if self.suspended:
            return False
        found = next((c for c in self.conditions if c.type == "Suspended"), None)
        if found is None:
            return False  # never suspended: not one a queue admitted
        if found.status == "True":
            return True
        if found.reason != RESUMED_REASON:
            return False
        try:
            then = datetime.datetime.fromisoformat(found.last_transition.replace("Z", "+00:00"))
        except ValueError:
            return False
        return (now - then).total_seconds() <= seconds

    @property
    def terminal(self) -> Condition | None:
        """Its Completed or Failed condition when it has ended (its controller sets one), else None."""
        for kind in TERMINAL_CONDITIONS:
            found = self.condition(kind)
            if found is not None:
                return found
        return None

    @property
    def replicated_jobs(self) -> list[Mapping[str, Any]]:
        """The replicated jobs of its spec, as written."""
        rjobs = self.spec.get("replicatedJobs")
        return [r for r in rjobs if isinstance(r, Mapping)] if isinstance(rjobs, list) else []


JobSetLike = JobSet | Mapping[str, Any]


def condition(jobset: JobSetLike, kind: str) -> Condition | None:
    """The JobSet's condition of type ``kind`` when its status is True."""
    return JobSet.of(jobset).condition(kind)


def terminal_condition(jobset: JobSetLike) -> Condition | None:
    """The JobSet's Completed or Failed condition when it has ended (the controller sets one), else None."""
    return JobSet.of(jobset).terminal


def is_suspended(jobset: JobSetLike) -> bool:
    """``spec.suspend`` is set: the JobSet (e.g. one Kueue has not admitted) runs no pods for now."""
    return JobSet.of(jobset).suspended


def jobset_ref(jobset: JobSetLike | None, claimed: SliceId | None = None) -> dict[str, Any]:
    """A JobSet as an Event's involved object: as read, else as a pod claims it (``claimed``)."""
    read = JobSet.of(jobset).meta if jobset is not None else Meta()
    meta = {
        "name": read.name,
        "namespace": read.namespace,
        "uid": read.uid,
        "resourceVersion": read.resource_version,
    }
    if read == Meta() and claimed is not None:
        meta = {"name": claimed.jobset, "namespace": claimed.namespace, "uid": claimed.jobset_uid}
    return {
        "apiVersion": f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": meta,
    }


def replicated_job(jobset: JobSetLike, name: str) -> dict[str, Any] | None:
    """The spec of the JobSet's replicated job ``name``, or None."""
    return next((dict(r) for r in JobSet.of(jobset).replicated_jobs if r.get("name") == name), None)


def replicas_of(jobset: JobSetLike, name: str) -> int:
    """How many Jobs (slices) the JobSet's replicated job ``name`` has; 1 when the spec does not say."""
    try:
        return max(1, int((replicated_job(jobset, name) or {}).get("replicas", 1)))
    except (TypeError, ValueError):
        return 1


def jobset_problem(jobset: JobSetLike, claimed: SliceId) -> str:
    """Why the JobSet a pod claims (``claimed``) must not get that slice now, or ""."""
    view = JobSet.of(jobset)
    uid, name = view.uid, view.name
    if claimed.jobset_uid and uid and uid != claimed.jobset_uid:
        return f"pod claims JobSet uid {claimed.jobset_uid} but JobSet {name} has uid {uid}"
    if view.meta.deleting:
        return f"JobSet {name} is being deleted"
    ended = view.terminal
    if ended is not None:
        return f"JobSet {name} is already {ended.type}"
    if view.suspended:
        return f"JobSet {name} is suspended"
    if replicated_job(view, claimed.replicated_job) is None:
        return f"JobSet {name} has no replicated job {claimed.replicated_job!r}"
    return ""
