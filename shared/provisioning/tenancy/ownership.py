"""A pod's JobSet, proven: the reads that tie a pod to the slice its JobSet declares.

Before the product spends money or deletes anything for a pod, it reads the pod's Job and that
Job's JobSet and checks the chain the controllers wrote (``shared.tpu.owners``); what the slice
needs then comes from the JobSet's template (``shared.tpu.declared``), and the pod's own labels
only have to agree with it. Two reads (the Job, the JobSet) per slice group, not per event: an
event for a slice whose pool exists is answered from the listing before any of this.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from shared.cloud.ports import KubeAPI
from shared.core import labels
from shared.core.errors import NotEligible, NotFoundError, Refused
from shared.core.settings import Settings
from shared.tpu import catalog, declared, owners
from shared.tpu.jobsets import JobSet
from shared.tpu.owners import Chain, Job
from shared.tpu.pods import Pod
from shared.tpu.slices import SliceRequest


class JobSetRefused(Refused):
    """A refusal of what the pod's proven JobSet itself declares: its Event goes on the JobSet too,
    where ``kubectl describe jobset`` shows it (a pod's own word never writes on a JobSet)."""

    def __init__(self, why: str, jobset: JobSet) -> None:
        super().__init__(why)
        self.jobset = jobset


@dataclasses.dataclass(frozen=True)
class Owned:
    """A pod proven to be one of its JobSet's, and the slice the JobSet declares for it."""

    jobset: JobSet  # as read
    chain: Chain
    request: SliceRequest  # from the JobSet's template, for the pod's (replicated job, index)
    replicated_job: declared.ReplicatedJob


def claim_problem(pod: Pod, chain: Chain) -> str:
    """Why the pod's JobSet labels contradict the chain its controllers wrote ("" when they agree)."""
    claims = {
        "JobSet": (pod.jobset_value(labels.JOBSET_NAME), chain.jobset),
        "JobSet uid": (pod.jobset_value(labels.JOBSET_UID), chain.jobset_uid),
        "replicated job": (pod.jobset_value(labels.REPLICATED_JOB_NAME), chain.replicated_job),
        "Job index": (pod.jobset_value(labels.JOB_INDEX), str(chain.job_index)),
    }
    for what, (claimed, real) in claims.items():
        if claimed is not None and claimed != real:
            return f"the pod's labels name {what} {claimed!r}, its Job {chain.job} belongs to {real!r}"
    return ""


class Owners:
    """Reads and checks a pod's Job and JobSet; derives the slice the JobSet declares."""

    def __init__(self, settings: Settings, kube: KubeAPI) -> None:
        self.settings = settings
        self.kube = kube

    def job(self, namespace: str, name: str) -> Job | None:
        try:
            return self.kube.get_job(namespace, name)
        except NotFoundError:
            return None

    def jobset(self, namespace: str, name: str) -> JobSet | None:
        try:
            return self.kube.get_jobset(namespace, name)
        except NotFoundError:
            return None

    def chain(self, namespace: str, controller: owners.OwnerRef | None) -> ChainRead:
        """The chain of a pod in ``namespace`` with controller reference ``controller``, read from the API."""
        if controller is None or controller.kind != "Job":
            problem = owners.pod_chain_problem(namespace, controller, None, None, ())[1]
            return ChainRead(None, None, None, problem, gone=False)
        job = self.job(namespace, controller.name)
        jobset: JobSet | None = None
        if job is not None and job.controller is not None and job.controller.kind == "JobSet":
            jobset = self.jobset(namespace, job.controller.name)
        rjobs = [(r.name, r.replicas) for r in declared.replicated_jobs(jobset or {})]
        chain, problem = owners.pod_chain_problem(namespace, controller, job, jobset, rjobs)
        # A pod whose Job is gone, or whose Job's JobSet is: one of a deleted JobSet, on its way out.
        gone = job is None or (
            job.controller is not None and job.controller.kind == "JobSet" and jobset is None
        )
        return ChainRead(chain, job, jobset, problem, gone=chain is None and gone)

    def of_pod(self, pod: Pod) -> Owned:
        """The pod's JobSet and declared slice. Refused (an Event on the pod says why) when the pod is
        not one of a JobSet's pods, contradicts its chain, or its JobSet declares less than the slice
        would cost; NotEligible (skipped quietly) when its Job or JobSet is gone (a pod of a deleted
        JobSet on its way out) or its replicated job has no TPUs in its template."""
        read = self.chain(pod.namespace, pod.controller)
        chain, jobset = read.chain, read.jobset
        if chain is None or jobset is None:
            if read.gone:
                raise NotEligible(read.problem)
            raise Refused(f"nothing is provisioned for it: {read.problem}")
        contradiction = claim_problem(pod, chain)
        if contradiction:
            raise Refused(f"nothing is provisioned for it: {contradiction}")
        try:
            request = declared.declared_request(jobset, chain.replicated_job, chain.job_index)
        except Refused as exc:  # the JobSet's own template asks for what no pool can be
            raise JobSetRefused(exc.why, jobset) from None
        rjob = next(r for r in declared.replicated_jobs(jobset) if r.name == chain.replicated_job)
        try:
            shape = catalog.resolve(request.accelerator, request.topology, request.chips_per_vm)
        except catalog.UnsupportedShape as exc:
            raise JobSetRefused(str(exc), jobset) from None
        problem = declared.declaration_problem(rjob, shape) or declared.total_vms_problem(
            jobset, self.settings.max_vms_per_jobset
        )
        if problem:
            raise JobSetRefused(problem, jobset)
        if pod.tpu_chips != request.chips_per_vm:
            raise Refused(
                f"the pod requests {pod.tpu_chips} {labels.TPU_RESOURCE}, its JobSet's template "
                f"{request.chips_per_vm}: pools are built from the JobSet"
            )
        return Owned(jobset, chain, request, rjob)


class PodChains:
    """Proves listed pods their JobSets' own, reading each Job once per delivery.

    Release, reconcile and the handover decide who occupies a pool from the pods on its nodes: only
    a pod whose controller Job is controlled by its JobSet (by uid) counts. The Jobs read and the
    JobSets (the caller's cache, by (namespace, name), None for gone) are shared across pools.
    """

    def __init__(self, owners: Owners, jobsets: dict[tuple[str, str], JobSet | None]) -> None:
        self.owners = owners
        self.jobsets = jobsets
        self._jobs: dict[tuple[str, str], Job | None] = {}
        self._reread: set[tuple[str, str]] = set()

    def _job(self, namespace: str, name: str) -> Job | None:
        key = (namespace, name)
        if key not in self._jobs:
            self._jobs[key] = self.owners.job(namespace, name)
        return self._jobs[key]

    def of(self, pods: Iterable[Pod]) -> dict[tuple[str, str], Chain]:
        """The chain of each pod that has one, by (namespace, name)."""
        pods = list(pods)
        for pod in pods:  # read what the pure check needs, each Job and JobSet once
            controller = pod.controller
            if controller is None or controller.kind != "Job" or controller.group != owners.BATCH_GROUP:
                continue
            job = self._job(pod.namespace, controller.name)
            if job is not None and job.controller is not None and job.controller.kind == "JobSet":
                key = (pod.namespace, job.controller.name)
                if key not in self.jobsets:
                    self.jobsets[key] = self.owners.jobset(*key)
                elif not _current(self.jobsets[key], job.controller) and key not in self._reread:
                    # The cache holds another incarnation of that name (or none): the JobSet was
                    # deleted and created again since it was read, and this Job is the new one's.
                    # Judged by the stale read its pods would be pretenders, and the release would
                    # delete the pool they run on. Read once more; every reader checks uids.
                    self._reread.add(key)
                    self.jobsets[key] = self.owners.jobset(*key)
        return chains_of(pods, self._jobs, self.jobsets)


def chains_of(
    pods: Iterable[Pod],
    jobs: Mapping[tuple[str, str], Job | None],
    jobsets: Mapping[tuple[str, str], JobSet | None],
) -> dict[tuple[str, str], Chain]:
    """The chain of each pod that has one, by (namespace, name), from Jobs and JobSets already read
    (by (namespace, name); absent or None: gone). Pure: ``tpuprov status`` lists them and decides
    exactly as release does."""
    found: dict[tuple[str, str], Chain] = {}
    for pod in pods:
        namespace, name, controller = pod.namespace, pod.name, pod.controller
        if controller is None:
            continue
        job = jobs.get((namespace, controller.name))
        jobset = None
        if job is not None and job.controller is not None:
            jobset = jobsets.get((namespace, job.controller.name))
        rjobs = [(r.name, r.replicas) for r in declared.replicated_jobs(jobset or {})]
        chain, _ = owners.pod_chain_problem(namespace, controller, job, jobset, rjobs)
        if chain is not None:
            found[(namespace, name)] = chain
    return found


def _current(jobset: JobSet | None, controller: owners.OwnerRef) -> bool:
    """Whether ``jobset`` (a read by name) is the JobSet that ``controller`` (a Job's reference) names."""
    return jobset is not None and jobset.meta.uid == controller.uid


@dataclasses.dataclass(frozen=True)
class ChainRead:
    """What reading a pod's Job and JobSet found: the chain, or why there is none."""

    chain: Chain | None
    job: Job | None
    jobset: JobSet | None
    problem: str
    gone: bool  # no chain because the pod's Job, or its Job's JobSet, no longer exists


__all__ = ["ChainRead", "Owned", "Owners", "PodChains", "chains_of", "claim_problem"]
