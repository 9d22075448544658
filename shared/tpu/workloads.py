"""A Kueue Workload read at the boundary into a small frozen view, and the slices it needs.

Field names are Kueue's ``kueue.x-k8s.io/v1beta2`` (``apis/kueue/v1beta2/workload_types.go`` of the
pinned v0.19.2): ``spec.podSets[{name, count}]``, ``status.admission.{clusterQueue,
podSetAssignments[{name, flavors, count}]}``, ``status.admissionChecks[{name, state, message,
lastTransitionTime, requeueAfterSeconds, podSetUpdates}]`` and ``status.conditions`` (QuotaReserved,
Admitted, Evicted, Finished). ``spec.active: false`` is how Kueue (and a Rejected check) deactivates.

The slices are derived through ``expand_pods`` + ``slice_request``, the same code the pending-pod
path runs on real pods: every slice of the Workload gets exactly the pool name provision would give
it, so a pod's event for a slice the admission check already requested is a no-op.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.errors import NotEligible
from shared.tpu.jobsets import expand_pods
from shared.tpu.pods import Pod
from shared.tpu.slices import SliceRequest, slice_request

KUEUE_API = "kueue.x-k8s.io/v1beta2"
PENDING, READY, RETRY, REJECTED = "Pending", "Ready", "Retry", "Rejected"
CHECK_STATES = (PENDING, READY, RETRY, REJECTED)


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
    )


@dataclasses.dataclass(frozen=True)
class WorkloadSlice:
    """One slice of a Workload: the pod set (replicated job) it belongs to and what it needs."""

    pod_set: str
    request: SliceRequest
    missing_selector: Mapping[str, str]  # flavor labels the pod template does not select yet


def with_flavor_labels(jobset: Mapping[str, Any], flavor_labels: Mapping[str, Mapping[str, str]]) -> dict:
    """A copy of ``jobset`` whose replicated jobs' pod templates select their flavor's node labels,
    as Kueue writes them into the templates when it admits the Workload (template selectors win)."""
    copied = copy.deepcopy(dict(jobset))
    for rjob in (copied.get("spec") or {}).get("replicatedJobs") or []:
        extra = flavor_labels.get(str(rjob.get("name")))
        if not extra:
            continue
        template = rjob.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
        pod_spec = template.setdefault("spec", {})
        pod_spec["nodeSelector"] = {**extra, **(pod_spec.get("nodeSelector") or {})}
    return copied


def workload_slices(
    jobset: Mapping[str, Any], pod_sets: Mapping[str, int], flavor_labels: Mapping[str, Mapping[str, str]]
) -> list[WorkloadSlice]:
    """Every TPU slice of the JobSet's replicated jobs that are pod sets of the Workload, in order.

    One per Job: the slice request of its first pod, exactly as provision derives it from that pod
    when it is pending. Raises ``Refused`` when a slice asks for something no pool can be (the check
    rejects the Workload); pod sets without TPUs are skipped.
    """
    shaped = with_flavor_labels(jobset, flavor_labels)
    seen: set[tuple[str, int]] = set()
    found: list[WorkloadSlice] = []
    for pod in map(Pod.parse, expand_pods(shaped)):
        rjob, index = pod.labels[labels.REPLICATED_JOB_NAME], int(pod.labels[labels.JOB_INDEX])
        if rjob not in pod_sets or (rjob, index) in seen:
            continue
        seen.add((rjob, index))
        try:
            request = slice_request(pod)
        except NotEligible:
            continue  # not a TPU pod set (e.g. a CPU coordinator)
        template = _template_selector(jobset, rjob)
        missing = {k: v for k, v in (flavor_labels.get(rjob) or {}).items() if k not in template}
        found.append(WorkloadSlice(rjob, request, missing))
    return found


def _template_selector(jobset: Mapping[str, Any], rjob_name: str) -> dict[str, str]:
    for rjob in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        if rjob.get("name") == rjob_name:
            spec = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
            return dict((spec.get("spec") or {}).get("nodeSelector") or {})
    return {}
