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


@dataclasses.dataclass(frozen=True)
class Node:
    """The fields of a Node the product decides on."""

    name: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unschedulable: bool = False  # spec.unschedulable: cordoned
    ready: bool = False  # its Ready condition is True (its kubelet reports in)
    created: str = ""  # creationTimestamp as the API writes it

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
        )

    @property
    def pool(self) -> str:
        """The GKE node pool it belongs to (GKE labels every node with its pool's name)."""
        return self.labels.get(labels.NODEPOOL, "")

    @property
    def cordoned_by_product(self) -> bool:
        """Unschedulable because the product cordoned it (its annotation says so), not an operator."""
        return self.unschedulable and labels.CORDONED in self.annotations
