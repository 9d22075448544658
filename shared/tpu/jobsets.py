"""JobSet helpers: the pods a JobSet's controller creates, and the plan of pools a JobSet gets.

``expand_pods`` mirrors what the JobSet and Job controllers put on each pod (labels, annotations,
nodeSelector, requests), so ``tpuprov plan``, the sandbox's simulated controller and the tests all
derive pools through the very code path the provision function runs on real pods.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from shared.core import labels
from shared.core.settings import Settings
from shared.tpu.slices import NotEligible, Refused, build_node_pool, slice_request


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def expand_pods(
    jobset: dict[str, Any], restart_attempt: int = 0, pending: bool = True
) -> list[dict[str, Any]]:
    """The pods of every Job of ``jobset`` (one per completion index), as pending-unschedulable pods."""
    meta = jobset.get("metadata") or {}
    name = str(meta.get("name", ""))
    namespace = str(meta.get("namespace") or "default")
    uid = str(meta.get("uid", ""))
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
            job_key = hashlib.sha256(f"{namespace}/{job_name}".encode()).hexdigest()
            for completion in range(parallelism):
                tmeta = pod_template.get("metadata") or {}
                pod_labels = {
                    **(tmeta.get("labels") or {}),
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
                    **(tmeta.get("annotations") or {}),
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


@dataclasses.dataclass(frozen=True)
class PlannedPool:
    """One line of ``tpuprov plan``: a pool the JobSet would get, or why a Job gets none."""

    slice: str
    pool: str = ""
    machine_type: str = ""
    node_count: int = 0
    topology: str = ""
    total_chips: int = 0
    placement: str = ""
    note: str = ""


def plan(jobset: dict[str, Any], settings: Settings) -> list[PlannedPool]:
    """The pools ``jobset`` would get, one per slice, derived exactly as the provision function does."""
    seen: dict[str, PlannedPool] = {}
    result: list[PlannedPool] = []
    for pod in expand_pods(jobset):
        pod_labels = pod["metadata"]["labels"]
        slice_desc = f"{pod_labels[labels.REPLICATED_JOB_NAME]}[{pod_labels[labels.JOB_INDEX]}]"
        try:
            request = slice_request(pod)
            spec, shape = build_node_pool(settings, request)
        except (NotEligible, Refused) as exc:
            if slice_desc not in seen:
                seen[slice_desc] = PlannedPool(slice=slice_desc, note=exc.why)
                result.append(seen[slice_desc])
            continue
        if slice_desc in seen:
            continue
        placement = ""
        if spec.placement:
            placement = spec.placement.policy_name or f"{spec.placement.type} {spec.placement.tpu_topology}"
        planned = PlannedPool(
            slice=slice_desc,
            pool=spec.name,
            machine_type=spec.machine_type,
            node_count=spec.node_count,
            topology=shape.topology,
            total_chips=shape.total_chips,
            placement=placement,
            note=" ".join(
                part
                for part in (
                    "spot" if spec.spot else "",
                    f"reservation {spec.reservation.value}" if spec.reservation else "",
                )
                if part
            ),
        )
        seen[slice_desc] = planned
        result.append(planned)
    return result
