"""An API object's metadata as the product reads it: one frozen view, parsed once per object.

Nodes, listed pods and JobSets are decided on by their name, namespace, uid, labels and
annotations; ``Meta.of`` reads those from the API's JSON so that the decisions never walk the raw
dict. (A pod being provisioned has its own, fuller view: ``shared.tpu.pods.Pod``.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Meta:
    """``metadata`` of one object; absent fields read as "" (the namespace as "default")."""

    name: str = ""
    namespace: str = "default"
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    deleting: bool = False  # deletionTimestamp is set
    created: str = ""  # creationTimestamp as the API writes it (RFC 3339, sorts in time order)

    @classmethod
    def of(cls, obj: Mapping[str, Any] | None) -> Meta:
        """The metadata of ``obj`` (an empty view for None)."""
        meta = (obj or {}).get("metadata") or {}
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or "default"),
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
            annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
            deleting=bool(meta.get("deletionTimestamp")),
            created=str(meta.get("creationTimestamp") or ""),
        )
