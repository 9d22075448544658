"""Whose pod is it: the ownership chain Kubernetes' own controllers write, read instead of labels.

A tenant with ``pods/create`` can put any label or annotation on a pod, JobSet labels included,
and any ``ownerReferences`` too (the API server checks neither that the owner exists nor that it
is the pod's; only the garbage collector notices, later). What a tenant cannot forge is the chain
the controllers build from the JobSet down, because every link is checked against an object read
from the API server:

* the JobSet controller creates Job ``<jobset>-<replicatedJob>-<index>`` for each replica, with a
  controller reference to the JobSet (JobSet v0.10.1 ``pkg/controllers/jobset_controller.go``
  ``constructJob`` / ``SetControllerReference``; the name from ``pkg/util/placement/placement.go``
  ``GenJobName``), and only for ``index < replicas``;
* the Job controller creates the Job's pods with a controller reference to the Job (its uid).

So a pod belongs to slice ``(replicated job, index)`` of JobSet J only when its controller is the
Job of that name whose uid it names, and that Job's controller is J by uid. A Job object names
exactly one (replicated job, index) through its name, which is unique in the namespace, so even a
tenant allowed to create Jobs cannot make a JobSet own more slices than its spec declares: what a
slice needs is read from the JobSet's template (``shared.tpu.jobsets.declared_request``), never
from the pod or the Job.

Pure functions and frozen views; the adapter (``shared.cloud.kube``) parses Jobs into ``Job``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from shared.core import labels
from shared.core.meta import Meta

if TYPE_CHECKING:  # jobsets reads Job names from here: the view is only named, never imported at run time
    from shared.tpu.jobsets import JobSet

BATCH_GROUP = "batch"


@dataclasses.dataclass(frozen=True)
class OwnerRef:
    """The controller entry of an object's ``ownerReferences``."""

    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def group(self) -> str:
        """The API group of the owner ("" for the core group)."""
        return self.api_version.rpartition("/")[0]


def controller_of(owner_references: Any) -> OwnerRef | None:
    """The reference marked ``controller: true`` (an object has at most one), else None."""
    if not isinstance(owner_references, list):
        return None
    for ref in owner_references:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return OwnerRef(
                api_version=str(ref.get("apiVersion") or ""),
                kind=str(ref.get("kind") or ""),
                name=str(ref.get("name") or ""),
                uid=str(ref.get("uid") or ""),
            )
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclasses.dataclass(frozen=True)
class Job:
    """A batch/v1 Job as the product reads it: who controls it."""

    name: str
    namespace: str
    uid: str
    controller: OwnerRef | None
    deleting: bool = False

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Job:
        """The view of a Job as the API returns it (missing fields read as empty)."""
        meta = obj.get("metadata") or {}
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or "default"),
            uid=str(meta.get("uid") or ""),
            controller=controller_of(meta.get("ownerReferences")),
            deleting=bool(meta.get("deletionTimestamp")),
        )


def job_name(jobset: str, replicated_job: str, index: int) -> str:
    """The name the JobSet controller gives the Job of one slice (``GenJobName``)."""
    return f"{jobset}-{replicated_job}-{index}"


def pods_per_job(job_spec: Mapping[str, Any]) -> int:
    """How many pods of one Job run at once: ``parallelism`` (default 1), never more than
    ``completions`` when that is set (the Job controller starts no more pods than it still needs)."""
    parallelism = _int(job_spec.get("parallelism"))
    completions = _int(job_spec.get("completions"))
    running = 1 if parallelism is None else max(0, parallelism)
    return min(running, completions) if completions is not None else running


@dataclasses.dataclass(frozen=True)
class Chain:
    """A pod's place in its JobSet, as the controllers recorded it."""

    namespace: str
    jobset: str
    jobset_uid: str
    replicated_job: str
    job_index: int
    job: str  # the Job's name


def controller_problem(controller: OwnerRef | None) -> str:
    """Why a pod with controller reference ``controller`` cannot be a JobSet's pod before anything is
    read ("" when its controller is a batch/v1 Job, to be checked against the Job itself)."""
    if controller is None or controller.kind != "Job" or controller.group != BATCH_GROUP:
        return "the pod is not controlled by a Job (its ownerReferences name no batch/v1 Job controller)"
    return ""


def pod_chain_problem(
    pod_namespace: str,
    pod_controller: OwnerRef | None,
    job: Job | None,
    jobset: JobSet | Mapping[str, Any] | None,
    replicated_jobs: Iterable[tuple[str, int]],
) -> tuple[Chain | None, str]:
    """Whether a pod is one of JobSet ``jobset``'s pods, and for which slice.

    ``pod_controller``: the pod's controller reference; ``job``: the Job it names, as read (None:
    not found); ``jobset``: the JobSet the Job's controller reference names, as read (None: not
    found); ``replicated_jobs``: that JobSet's (name, replicas). Returns the chain, or None and why
    the pod is none of that JobSet's (a sentence for an Event and the decision line).
    """
    if pod_controller is None or pod_controller.kind != "Job" or pod_controller.group != BATCH_GROUP:
        return (
            None,
            "the pod is not controlled by a Job (its ownerReferences name no batch/v1 Job controller)",
        )
    if job is None:
        return None, f"the pod's Job {pod_controller.name} does not exist"
    if job.uid != pod_controller.uid or job.namespace != pod_namespace:
        return (
            None,
            f"the pod names Job {pod_controller.name} uid {pod_controller.uid}, "
            "which is not the Job of that name",
        )
    owner = job.controller
    if owner is None or owner.kind != "JobSet" or owner.group != labels.JOBSET_GROUP:
        return None, f"Job {job.name} is not controlled by a JobSet"
    if jobset is None:
        return None, f"Job {job.name}'s JobSet {owner.name} does not exist"
    meta = Meta.of(jobset) if isinstance(jobset, Mapping) else jobset.meta
    uid, name = meta.uid, meta.name
    if not uid or owner.uid != uid or owner.name != name:
        return (
            None,
            f"Job {job.name} names JobSet {owner.name} uid {owner.uid}, which is not the JobSet of that name",
        )
    prefix = f"{name}-"
    for rjob, replicas in replicated_jobs:
        head, _, index = job.name[len(prefix) :].rpartition("-")
        if not job.name.startswith(prefix) or head != rjob or not index.isdigit() or index != str(int(index)):
            continue
        if int(index) >= replicas:
            why = f"Job {job.name} is index {index} of replicated job {rjob}, which has {replicas} replica(s)"
            return None, why
        return Chain(job.namespace, name, uid, rjob, int(index), job.name), ""
    return None, f"Job {job.name} is not the Job of any replicated job of JobSet {name}"
