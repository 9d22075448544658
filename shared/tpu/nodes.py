"""A Kubernetes Node as the product reads it: one frozen view, parsed at the adapter.

Release and the admission check decide on a pool's Nodes (which pool each belongs to, whether the
product cordoned it and when, whether it is Ready); the Kubernetes adapter's ``list_nodes`` returns
these views, so nothing above it walks a Node's JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.meta import Meta

# The NoSchedule taints Kubernetes itself puts on a Node for its conditions and its cordon
# (kube-controller-manager v1.36.3, pkg/controller/nodelifecycle, nodeConditionToTaintKeyStatusMap
# and doNoScheduleTaintingPass). The API server's NodeTaint admission plugin puts the not-ready one
# on every Node at registration (plugin/pkg/admission/nodetaint), and the node lifecycle controller
# takes it off only after the Ready condition turns True: in between, a Node is Ready yet the
# scheduler refuses every pod that does not tolerate it (FailedScheduling, "untolerated taint").
LIFECYCLE_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/network-unavailable",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/unschedulable",
    }
)


@dataclasses.dataclass(frozen=True)
class Node:
    """The fields of a Node the product decides on."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unschedulable: bool = False  # spec.unschedulable: cordoned
    ready: bool = False  # its Ready condition is True (its kubelet reports in)
    created: str = ""  # creationTimestamp as the API writes it
    # Keys of its NoSchedule/NoExecute taints that Kubernetes manages (LIFECYCLE_TAINTS).
    lifecycle_taints: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Node:
        """The view of a core/v1 Node as the API returns it (missing fields read as empty)."""
        meta = Meta.of(obj, default_namespace="")
        conditions = (obj.get("status") or {}).get("conditions") or []
        return cls(
            name=meta.name,
            labels=meta.labels,
            annotations=meta.annotations,
            unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
            ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
            created=meta.created,
            lifecycle_taints=frozenset(
                str(t.get("key"))
                for t in (obj.get("spec") or {}).get("taints") or []
                if t.get("key") in LIFECYCLE_TAINTS and t.get("effect") in ("NoSchedule", "NoExecute")
            ),
        )

    @property
    def takes_pods(self) -> bool:
        """Whether the scheduler would place a pod here now: Ready, and none of the taints Kubernetes
        keeps on a Node that is not (still there a moment after Ready turns True)."""
        return self.ready and not self.lifecycle_taints

    @property
    def pool(self) -> str:
        """The GKE node pool it belongs to (GKE labels every node with its pool's name)."""
        return self.labels.get(labels.NODEPOOL, "")

    @property
    def cordoned_by_product(self) -> bool:
        """Unschedulable because the product cordoned it (its annotation says so), not an operator."""
        return self.unschedulable and labels.CORDONED in self.annotations
