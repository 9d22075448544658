"""A Kueue Workload read at the boundary into a small frozen view, and the slices it needs.

Field names are Kueue's ``kueue.x-k8s.io/v1beta2`` (``apis/kueue/v1beta2/workload_types.go`` of the
pinned v0.19.2): ``spec.podSets[{name, count}]``, ``status.admission.{clusterQueue,
podSetAssignments[{name, flavors, count}]}``, ``status.admissionChecks[{name, state, message,
lastTransitionTime, requeueAfterSeconds, podSetUpdates}]`` and ``status.conditions`` (QuotaReserved,
Admitted, Evicted, Finished). ``spec.active: false`` is how Kueue (and a Rejected check) deactivates.

The slices are derived from the JobSet's template (``shared.tpu.declared``), the same derivation the
pending-pod path makes once a pod proves its Job and JobSet: every slice of the Workload gets
exactly the pool name provision would give it, so a pod's event for a slice the admission check
already requested is a no-op.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.errors import NotEligible, Refused
from shared.tpu import catalog
from shared.tpu.declared import (
    GKE_MAX_NODES,
    declaration_problem,
    declared_request,
    replicated_jobs,
    total_vms_problem,
)
from shared.tpu.jobsets import JobSet, JobSetLike
from shared.tpu.slices import SliceRequest

KUEUE_API = "kueue.x-k8s.io/v1beta2"
PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
CHECK_STATES = (PENDING, READY, RETRY, REJECTED)
# Kueue's MultiKueue (v0.19.2, apis/kueue/v1beta2/constants.go and pkg/controller/jobframework):
# the label of every object it creates in a worker, and the annotation on the worker's job that
# names the manager's Workload (prebuilt workload; an annotation while WorkloadIdentifierAnnotations
# is on, as by default in 0.19, a label before).
MULTIKUEUE_ORIGIN_LABEL = "kueue.x-k8s.io/multikueue-origin"
PREBUILT_WORKLOAD = "kueue.x-k8s.io/prebuilt-workload-name"


@dataclasses.dataclass(frozen=True)
class MultiKueueClusterView:
    """A MultiKueue manager's ``MultiKueueCluster`` (cluster-scoped, written by the manager's
    administrators; Kueue ignores annotations on it), as the product reads it: where it keeps what
    the fleet learnt of that worker's capacity."""

    name: str
    annotations: Mapping[str, str]
    resource_version: str

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> MultiKueueClusterView:
        meta = obj.get("metadata") or {}
        return cls(
            str(meta.get("name") or ""),
            {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            str(meta.get("resourceVersion") or ""),
        )


@dataclasses.dataclass(frozen=True)
class CheckState:
    """One entry of ``status.admissionChecks``."""

    name: str
    state: str
    message: str = ""
    last_transition: str = ""


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One ``status.admission.podSetAssignments`` entry: the flavor per resource and the pod count."""

    name: str
    flavors: Mapping[str, str]
    count: int


@dataclasses.dataclass(frozen=True)
class WorkloadView:
    """What the admission check needs of a Workload."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    owner_kind: str  # "JobSet" for the Workloads the product provisions; "" when it has no owner
    owner_name: str
    owner_uid: str
    pod_sets: Mapping[str, int]  # podSet name (a replicated job) -> pod count
    cluster_queue: str  # "" until quota is reserved
    assignments: tuple[Assignment, ...]
    checks: tuple[CheckState, ...]
    conditions: Mapping[str, bool]  # condition type -> status is True
    active: bool
    # status.requeueState.requeueAt in Unix seconds (None: unset): when Kueue brings an evicted
    # Workload back, e.g. after a check's Retry (pkg/workload/admissionchecks.go NeedsRequeueAtUpdate).
    requeue_at: float | None = None
    # Under Kueue's MultiKueue (pkg/controller/admissionchecks/multikueue/workload.go, v0.19.2): a
    # worker's copy carries the manager's origin label (cloneForCreate); the manager's Workload
    # names the workers it was sent to (status.nominatedClusterNames) and, once one admitted it,
    # that one (status.clusterName).
    origin: str = ""
    cluster_name: str = ""
    nominated: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def check(self, name: str) -> CheckState | None:
        """This Workload's state of admission check ``name`` (None: the check is not on it)."""
        return next((c for c in self.checks if c.name == name), None)

    def has(self, condition: str) -> bool:
        return self.conditions.get(condition, False)

    @property
    def done(self) -> str:
        """Why the Workload needs no slices any more ("" while it may): finished, deactivated, evicted."""
        if self.has("Finished"):
            return "finished"
        if not self.active:
            return "deactivated"
        if self.has("Evicted"):
            return "evicted"
        return ""

    @property
    def jobset_ref(self) -> dict[str, Any]:
        """The owning JobSet as an Event's involved object."""
        return {
            "apiVersion": f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}",
            "kind": "JobSet",
            "metadata": {"name": self.owner_name, "namespace": self.namespace, "uid": self.owner_uid},
        }

    @property
    def ref(self) -> dict[str, Any]:
        """The Workload as an Event's involved object."""
        return {
            "apiVersion": KUEUE_API,
            "kind": "Workload",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
        }


# Kueue labels each Workload with the uid of the job it stands for (controller/constants JobUIDLabel).
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def _time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_workload(obj: Mapping[str, Any]) -> WorkloadView:
    """The view of a Workload object (missing fields read as empty; nothing here raises)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    owner: Mapping[str, Any] = next(
        (o for o in meta.get("ownerReferences") or [] if o.get("controller")),
        next(iter(meta.get("ownerReferences") or []), {}),
    )
    admission = status.get("admission") or {}
    return WorkloadView(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        owner_kind=str(owner.get("kind") or ""),
        owner_name=str(owner.get("name") or ""),
        owner_uid=str(owner.get("uid") or ""),
        pod_sets={str(p.get("name")): _int(p.get("count"), 1) for p in spec.get("podSets") or []},
        cluster_queue=str(admission.get("clusterQueue") or ""),
        assignments=tuple(
            Assignment(
                name=str(a.get("name") or ""),
                flavors={str(k): str(v) for k, v in (a.get("flavors") or {}).items()},
                count=_int(a.get("count"), 0),
            )
            for a in admission.get("podSetAssignments") or []
        ),
        checks=tuple(
            CheckState(
                name=str(c.get("name") or ""),
                state=str(c.get("state") or ""),
                message=str(c.get("message") or ""),
                last_transition=str(c.get("lastTransitionTime") or ""),
            )
            for c in status.get("admissionChecks") or []
        ),
        conditions={str(c.get("type")): c.get("status") == "True" for c in status.get("conditions") or []},
        active=spec.get("active", True) is not False,
        requeue_at=_time((status.get("requeueState") or {}).get("requeueAt")),
        origin=str((meta.get("labels") or {}).get(MULTIKUEUE_ORIGIN_LABEL) or ""),
        cluster_name=str(status.get("clusterName") or ""),
        nominated=tuple(str(n) for n in status.get("nominatedClusterNames") or []),
    )


@dataclasses.dataclass(frozen=True)
class WorkloadSlice:
    """One slice of a Workload: the pod set (replicated job) it belongs to and what it needs."""

    pod_set: str
    request: SliceRequest
    missing_selector: Mapping[str, str]  # flavor labels the pod template does not select yet


def with_flavor_labels(jobset: JobSetLike, flavor_labels: Mapping[str, Mapping[str, str]]) -> JobSet:
    """A copy of ``jobset`` whose replicated jobs' pod templates select their flavor's node labels,
    as Kueue writes them into the templates when it admits the Workload (template selectors win)."""
    view = JobSet.of(jobset)
    spec = copy.deepcopy(dict(view.spec))
    for rjob in spec.get("replicatedJobs") or []:
        if not isinstance(rjob, dict):
            continue
        extra = flavor_labels.get(str(rjob.get("name")))
        if not extra:
            continue
        template = rjob.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
        pod_spec = template.setdefault("spec", {})
        pod_spec["nodeSelector"] = {**extra, **(pod_spec.get("nodeSelector") or {})}
    return dataclasses.replace(view, spec=spec)


def workload_slices(
    jobset: JobSetLike,
    pod_sets: Mapping[str, int],
    flavor_labels: Mapping[str, Mapping[str, str]],
    max_vms: int = GKE_MAX_NODES,
) -> list[WorkloadSlice]:
    """Every TPU slice of the JobSet's replicated jobs that are pod sets of the Workload, in order.

    One per Job, ``(replicated job, index)`` for ``index < replicas``, derived from the JobSet's
    template exactly as provision derives the slice of that Job's pods (``declared_request``), once
    per slice and never per pod. Raises ``Refused`` when a slice asks for something no pool can be,
    or the JobSet declares fewer pods per Job than its slices have VMs, or more TPU VMs than
    ``max_vms`` (the check rejects the Workload); pod sets without TPUs are skipped.
    """
    shaped = with_flavor_labels(jobset, flavor_labels)
    problem = total_vms_problem(shaped, max_vms)
    if problem:
        raise Refused(problem)
    found: list[WorkloadSlice] = []
    for rjob in replicated_jobs(shaped):
        if rjob.name not in pod_sets or rjob.replicas == 0:
            continue
        try:
            first = declared_request(shaped, rjob.name, 0)
        except NotEligible:
            continue  # not a TPU pod set (e.g. a CPU coordinator)
        try:
            shape = catalog.resolve(first.accelerator, first.topology, first.chips_per_vm)
        except catalog.UnsupportedShape as exc:
            raise Refused(str(exc)) from None
        problem = declaration_problem(rjob, shape)
        if problem:
            raise Refused(problem)
        template = _template_selector(jobset, rjob.name)
        missing = {k: v for k, v in (flavor_labels.get(rjob.name) or {}).items() if k not in template}
        for index in range(rjob.replicas):
            request = first if index == 0 else declared_request(shaped, rjob.name, index)
            found.append(WorkloadSlice(rjob.name, request, missing))
    return found


def _template_selector(jobset: JobSetLike, rjob_name: str) -> dict[str, str]:
    for rjob in JobSet.of(jobset).replicated_jobs:
        if rjob.get("name") == rjob_name:
            spec = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
            return dict((spec.get("spec") or {}).get("nodeSelector") or {})
    return {}
