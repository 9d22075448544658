"""What a JobSet declares: its replicated jobs and the slice each of their Jobs needs.

The slice a pool is built for is read from the JobSet's spec (the replicated job's pod template,
which Kueue admits and charges, and into which it writes its flavor's selectors on admission),
never from a pod: a pod's labels, selectors and requests are whatever its author wrote. Each slice
is one Job, ``(replicated job, index)`` with ``index < replicas``, derived once per replicated job
and index, never once per pod, so a JobSet that declares a million pods costs no more than its
replicated jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.core.errors import NotEligible, Refused
from shared.tpu import catalog, owners
from shared.tpu.jobsets import JobSet, JobSetLike, template_pod
from shared.tpu.slices import SliceRequest, slice_request

# GKE's largest Standard cluster holds 65,000 nodes (GKE "Plan for large GKE clusters", 1.31 and
# later): a JobSet declaring more TPU VMs than that can never run, whatever it is given.
GKE_MAX_NODES = 65_000


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclasses.dataclass(frozen=True)
class ReplicatedJob:
    """One replicated job of a JobSet as its spec declares it."""

    name: str
    replicas: int
    pods_per_job: int  # pods of one Job running at once (parallelism, at most completions)


def replicated_jobs(jobset: JobSetLike) -> tuple[ReplicatedJob, ...]:
    """The JobSet's replicated jobs (name, replicas, pods per Job), in spec order."""
    found = []
    for rjob in JobSet.of(jobset).replicated_jobs:
        job_spec = (rjob.get("template") or {}).get("spec") or {}
        found.append(
            ReplicatedJob(
                name=str(rjob.get("name") or ""),
                replicas=max(0, _int(rjob.get("replicas"), 1)),
                pods_per_job=owners.pods_per_job(job_spec),
            )
        )
    return tuple(found)


def _spec_of(jobset: JobSetLike, name: str) -> Mapping[str, Any] | None:
    return next((r for r in JobSet.of(jobset).replicated_jobs if r.get("name") == name), None)


def declared_request(jobset: JobSetLike, replicated_job: str, index: int) -> SliceRequest:
    """The slice Job ``index`` of ``replicated_job`` needs, from the JobSet's template alone.

    Raises NotEligible for a replicated job without TPUs (or one the JobSet lacks) and Refused for a
    template no pool can be built for, with the same reasons its pods would get.
    """
    rjob = _spec_of(jobset, replicated_job)
    if rjob is None:
        raise NotEligible(f"the JobSet has no replicated job {replicated_job!r}")
    return slice_request(template_pod(jobset, rjob, index))


def declaration_problem(rjob: ReplicatedJob, shape: catalog.SliceShape) -> str:
    """Why the slices of ``rjob`` would cost more than its JobSet declares ("" when they do not).

    One pod runs per TPU VM, so a Job whose pods are fewer than its slice's VMs leaves VMs nobody
    asked for (and Kueue, which charges the pods' requests, never counted): refused rather than
    bought. Several small Jobs whose pods together fill whole slices (four one-pod workers on a
    four-VM slice) are not built as shared slices either: GKE sets a multi-host slice's
    ``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES`` only for the pods of one Indexed Job with
    parallelism above one (GKE "TPUs in GKE", multi-host slices), so pods of separate Jobs on one
    slice never learn each other, and nothing keeps the scheduler from spreading them over other
    JobSets' pools. The reason says how to declare the same workers as whole-slice Jobs.
    """
    if rjob.pods_per_job >= shape.num_vms:
        return ""
    slice_words = (
        f"a {shape.accelerator} {shape.topology} slice is {shape.num_vms} VMs "
        f"({shape.total_chips} chips, one pod per VM)"
    )
    pods = rjob.replicas * rjob.pods_per_job
    if rjob.replicas > 1 and pods % shape.num_vms == 0:
        # What the user most likely meant: the workers of all those Jobs on whole slices.
        slices = pods // shape.num_vms
        return (
            f"replicated job {rjob.name} runs {rjob.replicas} Jobs of {rjob.pods_per_job} pod(s), "
            f"but {slice_words}; pods of separate Jobs cannot share a slice (GKE gives each Indexed "
            f"Job its own TPU worker ids): declare replicas: {slices} with parallelism and "
            f"completions {shape.num_vms} ({pods} pods on {slices} slice(s)), or select a "
            f"topology of {rjob.pods_per_job} VM(s)"
        )
    return (
        f"replicated job {rjob.name} runs {rjob.pods_per_job} pod(s) per Job, but {slice_words}: "
        f"set parallelism and completions to {shape.num_vms}, or select a topology of "
        f"{rjob.pods_per_job} VM(s)"
    )


def total_vms_problem(jobset: JobSetLike, limit: int) -> str:
    """Why the JobSet declares more TPU VMs than ``limit`` ("" when within it): replicas times VMs
    per slice, over its replicated jobs with TPUs. Costs one shape per replicated job."""
    total = 0
    for rjob in replicated_jobs(jobset):
        if rjob.replicas == 0:
            continue
        try:
            request = declared_request(jobset, rjob.name, 0)
            shape = catalog.resolve(request.accelerator, request.topology, request.chips_per_vm)
        except (NotEligible, Refused, catalog.UnsupportedShape):
            continue  # no TPUs, or refused with its own reason
        total += rjob.replicas * shape.num_vms
    if total > limit:
        return f"the JobSet declares {total} TPU VMs, more than MAX_VMS_PER_JOBSET {limit}"
    return ""
