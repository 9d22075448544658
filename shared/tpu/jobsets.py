"""All the product's JobSet knowledge: conditions, replicated jobs, a pod's JobSet, the pods it gets.

Pure functions over JSON dicts (no I/O):

* reading a JobSet: ``condition``, ``terminal_condition`` (the one answer to "has it ended"),
  ``replicated_job``, ``replicas_of``, ``jobset_problem``, ``jobset_ref``;
* reading a listed pod's JobSet identity (JobSet labels, or annotations where labels are cut):
  ``pod_jobset_value`` (a pod being provisioned is read through ``shared.tpu.pods.Pod``);
* ``expand_pods`` mirrors what the JobSet and Job controllers put on each pod (labels, annotations,
  nodeSelector, requests), so ``tpuprov plan``, the sandbox's simulated controller and the tests all
  derive pools through the very code path the provision function runs on real pods.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.meta import Meta
from shared.core.names import SliceId


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def pod_jobset_value(pod: Mapping[str, Any], key: str) -> Any:
    """A JobSet identity key of a pod: its label, else its annotation (labels are cut at 63 chars)."""
    meta = Meta.of(pod)
    return meta.labels.get(key) or meta.annotations.get(key)


def expand_pods(
    jobset: dict[str, Any], restart_attempt: int = 0, pending: bool = True
) -> list[dict[str, Any]]:
    """The pods of every Job of ``jobset`` (one per completion index), as pending-unschedulable pods."""
    meta = Meta.of(jobset)
    name, namespace, uid = meta.name, meta.namespace, meta.uid
    pods: list[dict[str, Any]] = []
    global_index = 0
    for rjob in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        rname = str(rjob.get("name", ""))
        replicas = _int(rjob.get("replicas"), 1)
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        parallelism = _int(job_spec.get("parallelism"), 1)
        pod_template = job_spec.get("template") or {}
        for job_index in range(replicas):
            job_name = f"{name}-{rname}-{job_index}"
            # The JobSet controller's job key: SHA-1 of "<namespace>/<job>", 40 hex characters (a
            # label value holds at most 63, so a SHA-256 digest is refused by the API server).
            job_key = hashlib.sha1(f"{namespace}/{job_name}".encode()).hexdigest()
            for completion in range(parallelism):
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
                    labels.JOBSET_NAME: name,
                    labels.REPLICATED_JOB_NAME: rname,
                    labels.JOB_INDEX: str(job_index),
                    labels.JOB_COMPLETION_INDEX: str(completion),
                }
                spec = dict(pod_template.get("spec") or {})
                pod: dict[str, Any] = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{job_name}-{completion}-r{restart_attempt}",
                        "namespace": namespace,
                        "labels": pod_labels,
                        "annotations": pod_annotations,
                    },
                    "spec": spec,
                    "status": {"phase": "Pending"},
                }
                if pending:
                    pod["status"]["conditions"] = [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node "
                            "affinity/selector.",
                        }
                    ]
                pods.append(pod)
            global_index += 1
    return pods


def condition(jobset: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The JobSet's condition of type ``kind`` when its status is True."""
    for cond in (jobset.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


TERMINAL_CONDITIONS = ("Completed", "Failed")


def terminal_condition(jobset: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JobSet's Completed or Failed condition when it has ended (the controller sets one), else None."""
    for kind in TERMINAL_CONDITIONS:
        found = condition(dict(jobset), kind)
        if found:
            return found
    return None


def is_suspended(jobset: Mapping[str, Any]) -> bool:
    """``spec.suspend`` is set: the JobSet (e.g. one Kueue has not admitted) runs no pods for now."""
    return bool((jobset.get("spec") or {}).get("suspend"))


def jobset_ref(jobset: Mapping[str, Any] | None, claimed: SliceId | None = None) -> dict[str, Any]:
    """A JobSet as an Event's involved object: as read, else as a pod claims it (``claimed``)."""
    read = Meta.of(jobset)
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


def replicated_job(jobset: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The spec of the JobSet's replicated job ``name``, or None."""
    rjobs = (jobset.get("spec") or {}).get("replicatedJobs") or []
    return next((dict(r) for r in rjobs if r.get("name") == name), None)


def replicas_of(jobset: dict[str, Any], name: str) -> int:
    """How many Jobs (slices) the JobSet's replicated job ``name`` has; 1 when the spec does not say."""
    try:
        return max(1, int((replicated_job(jobset, name) or {}).get("replicas", 1)))
    except (TypeError, ValueError):
        return 1


def jobset_problem(jobset: dict[str, Any], claimed: SliceId) -> str:
    """Why the JobSet a pod claims (``claimed``) must not get that slice now, or ""."""
    meta = Meta.of(jobset)
    uid, name = meta.uid, meta.name
    if claimed.jobset_uid and uid and uid != claimed.jobset_uid:
        return f"pod claims JobSet uid {claimed.jobset_uid} but JobSet {name} has uid {uid}"
    if meta.deleting:
        return f"JobSet {name} is being deleted"
    ended = terminal_condition(jobset)
    if ended:
        return f"JobSet {name} is already {ended.get('type')}"
    if is_suspended(jobset):
        return f"JobSet {name} is suspended"
    if replicated_job(jobset, claimed.replicated_job) is None:
        return f"JobSet {name} has no replicated job {claimed.replicated_job!r}"
    return ""
