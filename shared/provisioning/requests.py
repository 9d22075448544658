"""Pure helpers of the provision service: pool-spec checks, chip accounting, group state, object refs."""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any

from shared.core import labels
from shared.core.errors import OperationLimitError, TransientError
from shared.core.names import label_key_problem, label_value_problem
from shared.core.settings import Settings
from shared.tpu import catalog
from shared.tpu.jobsets import pod_jobset_value
from shared.tpu.nodepools import STATUS_STOPPING, NodePoolInfo, NodePoolSpec
from shared.tpu.slices import SliceRequest, pool_name

# A pod's claimed replica count is only a hint; a forged huge one must not cost more than this.
_MAX_REPLICAS_HINT = 1024


# GCE resource labels: lowercase letters, digits, "_" and "-"; keys start with a letter.
_RESOURCE_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}\Z")


_RESOURCE_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}\Z")


def label_problem(spec: NodePoolSpec) -> str:
    """Why the pool's labels must not be sent ("" when every key and value is valid).

    Ownership values come from the pod's JobSet labels or annotations, and annotations are free
    text: a value such as ``a,tpuprov.dev/managed-by=x`` must be refused here rather than reach
    GKE, which hands node labels to the kubelet as one comma-separated flag.
    """
    for key, value in spec.labels.items():
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            return f"cannot label the node pool: {problem}"
    for key, value in spec.resource_labels.items():
        if not (_RESOURCE_LABEL_KEY.match(key) and _RESOURCE_LABEL_VALUE.match(value)):
            return f"cannot label the node pool: resource label {key}={value!r} is not a valid GCE label"
    return ""


def managed_chips(pools: list[NodePoolInfo]) -> int:
    """Chips held by the product's pools (those stopping are on their way out and not counted)."""
    total = 0
    for pool in pools:
        if pool.labels.get(labels.MANAGED_BY) != labels.MANAGED_BY_VALUE or pool.status == STATUS_STOPPING:
            continue
        chips = catalog.machine_type_chips(pool.machine_type) or 0
        total += chips * pool.node_count
    return total


@dataclasses.dataclass(frozen=True)
class Create:
    """One pool to request: the slice, the pool spec and its description for logs and Events."""

    request: SliceRequest
    spec: NodePoolSpec
    slice_desc: str


def create_why(item: Create, shape: catalog.SliceShape) -> str:
    return (
        f"{item.slice_desc} pending: {shape.num_vms} x {shape.machine_type} "
        f"({item.request.accelerator} {shape.topology}, {shape.total_chips} chips)"
    )


def group_incomplete(pod: dict[str, Any], request: SliceRequest, pools: list[NodePoolInfo]) -> bool:
    """Whether the listing lacks a pool of the replicated job the pod says it belongs to.

    Only a hint for when to read the JobSet (which then decides); it costs no API call, so a storm
    of events for slices that exist stays at two reads per event.
    """
    try:
        replicas = int(str(pod_jobset_value(pod, labels.REPLICATED_JOB_REPLICAS) or 0))
    except ValueError:
        return False
    names = {p.name for p in pools}
    sid = request.slice_id
    return any(
        pool_name(dataclasses.replace(sid, job_index=index)) not in names
        for index in range(min(replicas, _MAX_REPLICAS_HINT))
    )


def pod_ref(pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod.get("metadata") or {}}


def jobset_ref(request: SliceRequest, jobset: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JobSet of a slice as an Event's involved object (from the pod's claims when not read)."""
    sid = request.slice_id
    meta = (jobset or {}).get("metadata") or {
        "name": sid.jobset,
        "namespace": sid.namespace,
        "uid": sid.jobset_uid,
    }
    return {
        "apiVersion": f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": meta,
    }


def pod_created_at(pod: dict[str, Any]) -> float | None:
    """The pod's creationTimestamp in Unix seconds (None when absent or unreadable)."""
    stamp = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None
    except ValueError:
        return None


def guardrail(s: Settings, request: SliceRequest, chips: int) -> str:
    """Why the settings forbid creating this slice ("" when they allow it)."""
    ns = request.slice_id.namespace
    if s.drain:
        return "drain mode is on: no node pools are created"
    if s.namespace_allowlist and ns not in s.namespace_allowlist:
        return f"namespace {ns!r} is not in NAMESPACE_ALLOWLIST"
    if s.allowed_accelerators and request.accelerator not in s.allowed_accelerators:
        return f"accelerator {request.accelerator!r} is not in ALLOWED_ACCELERATORS"
    if chips > s.max_chips_per_slice:
        return f"slice of {chips} chips exceeds MAX_CHIPS_PER_SLICE {s.max_chips_per_slice}"
    return ""


def deferral(
    wanted: int, accepted: int, failures: list[TransientError], unsent: int, stopped: str
) -> TransientError:
    """The error that sends a partly requested group back for redelivery (OperationLimitError when
    GKE's operation limit stopped it, so the caller's retry policy can tell)."""
    reason = stopped or failures[0].why
    left = unsent + len(failures)
    why = (
        f"{accepted} of {wanted} pools of the replicated job requested, {left} left for redelivery: {reason}"
    )
    limited = any(isinstance(f, OperationLimitError) for f in failures)
    return (OperationLimitError if limited else TransientError)(why)
