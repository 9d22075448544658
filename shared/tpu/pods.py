"""A pod as the product reads it: one frozen view parsed once from the API's JSON.

Every decision about a pod (is it a TPU JobSet pod, which slice, whose pool, how long it waited,
does it occupy a node) reads this view: the Kubernetes adapter's ``get_pod`` and ``list_pods`` (a
sweep's pending pods, a pool's occupants) return it, and so does the CLI's ``ClusterView``.
The parse never raises: what it finds wrong in a TPU request is kept as ``tpu_problem`` and refused
by ``shared.tpu.slices.slice_request`` in its turn, after the checks that skip a pod quietly.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.tpu import selectors
from shared.tpu.owners import OwnerRef, controller_of


def _created_at(stamp: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None
    except ValueError:
        return None


def _tpu_chips(spec: Mapping[str, Any]) -> tuple[int, str]:
    # One pod per VM: the pod's TPU request is the VM's chip count. Limits count when requests are
    # omitted (Kubernetes defaults requests to limits for extended resources).
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(labels.TPU_RESOURCE)
        if amount is None:
            amount = (resources.get("limits") or {}).get(labels.TPU_RESOURCE)
        if amount is None:
            continue
        try:
            total += int(str(amount))
        except ValueError:
            return 0, f"container {container.get('name')!r} requests google.com/tpu={amount!r}"
    return total, ""


@dataclasses.dataclass(frozen=True)
class Pod:
    """The fields of a pod the product decides on."""

    name: str
    namespace: str
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    created_at: float | None = None  # creationTimestamp in Unix seconds (None when absent or unreadable)
    deleting: bool = False
    phase: str = "Pending"
    node_name: str = ""
    unschedulable: bool = False  # PodScheduled=False with reason Unschedulable (the scheduler gave up)
    has_scheduled_condition: bool = False  # any PodScheduled condition, whatever its status
    gated: bool = False  # scheduling gates still held
    tpu_chips: int = 0  # google.com/tpu over its containers
    tpu_problem: str = ""  # why the TPU request cannot be read ("" when it can)
    selected: Mapping[str, str] = dataclasses.field(default_factory=dict)  # nodeSelector + affinity
    # Node label keys the pod cannot schedule without (exclusive placement, required pod affinity).
    topology_keys: tuple[tuple[str, str], ...] = ()  # (key, where it comes from)
    # Its controller reference (the Job that made it, for a JobSet's pod): shared.tpu.owners checks
    # it against the Job and the JobSet as read; labels are the pod's own word and prove nothing.
    controller: OwnerRef | None = None

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Pod:
        """The view of a core/v1 Pod as the API returns it."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        conditions = status.get("conditions") or []
        scheduled: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
        chips, problem = _tpu_chips(spec)
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or "default"),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            created_at=_created_at(str(meta.get("creationTimestamp") or "")),
            deleting=bool(meta.get("deletionTimestamp")),
            phase=str(status.get("phase", "Pending")),
            node_name=str(spec.get("nodeName") or ""),
            unschedulable=scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable",
            has_scheduled_condition=bool(scheduled),
            gated=bool(spec.get("schedulingGates")),
            tpu_chips=chips,
            tpu_problem=problem,
            selected=selectors.of_pod_spec(spec),
            topology_keys=selectors.required_topology_keys(
                spec, {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
            ),
            controller=controller_of(meta.get("ownerReferences")),
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def verdict_pending(self) -> bool:
        """Pending, unbound, not being deleted, ungated, and without any PodScheduled condition: the
        scheduler has not written its verdict on this pod yet."""
        return (
            self.phase == "Pending"
            and not (self.node_name or self.deleting or self.gated)
            and not self.has_scheduled_condition
        )

    @property
    def finished(self) -> bool:
        """Succeeded or Failed: the pod holds no node any more."""
        return self.phase in FINISHED_PHASES

    @property
    def orphaned_follower(self) -> str:
        """The exclusive-topology key a follower pod selects with an empty value ("" when it does not).

        JobSet's pod webhook (v0.10.1, ``pkg/webhooks/pod_mutating_webhook.go`` ``topologyFromPod``)
        copies the leader pod's node's topology label into each follower's nodeSelector; when it
        cannot find that node (its cache has not seen it yet, e.g. after an API server restart, or
        the node is gone) it ignores NotFound and writes an empty value (kubernetes-sigs/jobset
        issue 1088). No node carries that, and JobSet's pod controller does not repair it (its
        mismatch check returns an error before it would delete the followers): the pod stays
        Pending for good, and only deleting it (its Job then makes a new one) helps."""
        key = self.annotations.get(labels.EXCLUSIVE_TOPOLOGY, "")
        follower = self.labels.get(labels.JOB_COMPLETION_INDEX, "0") != "0"
        return key if key and follower and self.selected.get(key) == "" else ""

    def jobset_value(self, key: str) -> str | None:
        """A JobSet identity key: its label, else its annotation (labels are cut at 63 characters)."""
        return self.labels.get(key) or self.annotations.get(key)

    def log_field(self) -> dict[str, str]:
        """``{"jobset": "namespace/name"}`` when the pod names a JobSet (label or annotation), else {}."""
        name = self.jobset_value(labels.JOBSET_NAME)
        return {"jobset": f"{self.namespace}/{name[:253]}"} if name else {}  # annotations are unbounded

    def ref(self) -> dict[str, Any]:
        """The pod as an Event's involved object."""
        meta = {"name": self.name, "namespace": self.namespace, "uid": self.uid}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {**meta, "resourceVersion": self.resource_version},
        }


FINISHED_PHASES = ("Succeeded", "Failed")
