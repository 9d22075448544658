"""Reading Kueue's API objects and queued JobSets into the admission model of ``kueue_quota``.

Field names follow the Kueue v0.19.2 CRDs (``kueue.x-k8s.io/v1beta2``): ResourceFlavor
``spec.nodeLabels`` / ``spec.tolerations``; ClusterQueue ``spec.cohortName``, ``queueingStrategy``,
``preemption`` and ``resourceGroups[].flavors[].resources[].{nominalQuota,borrowingLimit}``;
LocalQueue ``spec.clusterQueue``; WorkloadPriorityClass top-level ``value``. A JobSet's Workload
name, pod counts and priority are derived as Kueue's JobSet integration derives them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from sandbox.cluster.kueue_quota import FlavorQuota, Queue
from sandbox.cluster.scheduler import tpu_request
from shared.core import labels

KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def _int(value: Any) -> int | None:
    """A whole-number quantity ("24", 24) or None when absent or not a plain number."""
    if value is None:
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def parse_cluster_queue(obj: Mapping[str, Any]) -> Queue:
    """The admission-relevant part of a ClusterQueue object (TPU quota only)."""
    spec = obj.get("spec") or {}
    preemption = spec.get("preemption") or {}
    flavors = []
    for group in spec.get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for resource in flavor.get("resources") or []:
                if resource.get("name") == labels.TPU_RESOURCE:
                    flavors.append(
                        FlavorQuota(
                            str(flavor.get("name", "")),
                            _int(resource.get("nominalQuota")) or 0,
                            _int(resource.get("borrowingLimit")),
                        )
                    )
    return Queue(
        name=str((obj.get("metadata") or {}).get("name", "")),
        flavors=tuple(flavors),
        cohort=str(spec.get("cohortName") or spec.get("cohort") or ""),
        strategy=str(spec.get("queueingStrategy") or "BestEffortFIFO"),
        within=str(preemption.get("withinClusterQueue") or "Never"),
        reclaim=str(preemption.get("reclaimWithinCohort") or "Never"),
    )


def workload_name(jobset: Mapping[str, Any]) -> str:
    """``jobset-<name>-<hash>``: Kueue's deterministic Workload name for a JobSet."""
    meta = jobset.get("metadata") or {}
    name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
    digest = hashlib.sha1(f"JobSet\n{labels.JOBSET_GROUP}\n{name}\n{uid}".encode()).hexdigest()
    return f"{f'jobset-{name}'[:247]}-{digest[:5]}"


def pod_sets(jobset: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One pod set per replicated job: count = replicas x min(parallelism, completions)."""
    result = []
    for rjob in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        per_job = _int(job_spec.get("parallelism"))
        per_job = 1 if per_job is None else per_job
        completions = _int(job_spec.get("completions"))
        if completions is not None and completions < per_job:
            per_job = completions
        replicas = _int(rjob.get("replicas"))
        count = (1 if replicas is None else replicas) * per_job
        result.append(
            {"name": str(rjob.get("name", "")), "count": count, "template": job_spec.get("template") or {}}
        )
    return result


def chips(sets: list[dict[str, Any]]) -> int:
    """Total ``google.com/tpu`` the pod sets request."""
    return sum(int(s["count"]) * tpu_request(s["template"]) for s in sets)


def node_selector(sets: list[dict[str, Any]]) -> dict[str, str]:
    """The pods' nodeSelectors, merged (for matching against flavors' nodeLabels)."""
    merged: dict[str, str] = {}
    for pod_set in sets:
        for key, value in ((pod_set["template"].get("spec") or {}).get("nodeSelector") or {}).items():
            merged.setdefault(str(key), str(value))
    return merged


def priority_of(
    jobset: Mapping[str, Any],
    workload_classes: Mapping[str, int],
    pod_classes: Mapping[str, int],
    default: int,
) -> tuple[int, str]:
    """(priority, class name): the JobSet's WorkloadPriorityClass label, else its pods' PriorityClass."""
    meta_labels = (jobset.get("metadata") or {}).get("labels") or {}
    wpc = meta_labels.get(PRIORITY_CLASS_LABEL)
    if wpc and wpc in workload_classes:
        return workload_classes[wpc], str(wpc)
    for pod_set in pod_sets(jobset):
        name = (pod_set["template"].get("spec") or {}).get("priorityClassName")
        if name and name in pod_classes:
            return pod_classes[name], str(name)
    return default, ""


def admission(jobset: Mapping[str, Any], cluster_queue: str, flavor: str) -> dict[str, Any]:
    """A Workload's ``status.admission``: every pod set's count and chips in ``flavor``."""
    return {
        "clusterQueue": cluster_queue,
        "podSetAssignments": [
            {
                "name": s["name"],
                "count": s["count"],
                "flavors": {labels.TPU_RESOURCE: flavor},
                "resourceUsage": {labels.TPU_RESOURCE: str(chips([s]))},
            }
            for s in pod_sets(jobset)
        ],
    }


def inject(jobset: dict[str, Any], flavor: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Add the flavor's nodeLabels and tolerations to every replicated job's pod template.

    Returns what each template had before, for ``restore`` when the Workload is evicted.
    """
    spec = flavor.get("spec") or {}
    saved = []
    for rjob in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        pod_spec = rjob.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
        pod_spec = pod_spec.setdefault("spec", {})
        saved.append(
            {"nodeSelector": pod_spec.get("nodeSelector"), "tolerations": pod_spec.get("tolerations")}
        )
        pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **(spec.get("nodeLabels") or {})}
        tolerations = list(pod_spec.get("tolerations") or [])
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        if tolerations:
            pod_spec["tolerations"] = tolerations
    return saved


def restore(jobset: dict[str, Any], saved: list[dict[str, Any]]) -> None:
    """Put back the pod templates ``inject`` changed (Kueue restores them when it stops a job)."""
    for rjob, before in zip((jobset.get("spec") or {}).get("replicatedJobs") or [], saved, strict=False):
        pod_spec = rjob["template"]["spec"]["template"].setdefault("spec", {})
        for key in ("nodeSelector", "tolerations"):
            if before.get(key) is None:
                pod_spec.pop(key, None)
            else:
                pod_spec[key] = before[key]
