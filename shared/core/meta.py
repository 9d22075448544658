"""An API object's metadata as the product reads it: one frozen view, parsed once per object.

Nodes, listed pods and JobSets are decided on by their name, namespace, uid, labels and
annotations; ``Meta.of`` reads those from the API's JSON so that the decisions never walk the raw
dict. (A pod being provisioned has its own, fuller view: ``shared.tpu.pods.Pod``.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


def _text(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key)
    return value if isinstance(value, str) else ""


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


@dataclasses.dataclass(frozen=True)
class Meta:
    """``metadata`` of one object; absent fields read as "" (the namespace as "default", or as the
    caller's ``default_namespace``)."""

    name: str = ""
    namespace: str = "default"
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    deleting: bool = False  # deletionTimestamp is set
    created: str = ""  # creationTimestamp as the API writes it (RFC 3339, sorts in time order)
    generation: int | None = None  # the spec's generation (None when the object has none)

    @classmethod
    def of(cls, obj: Mapping[str, Any] | None, default_namespace: str = "default") -> Meta:
        """The metadata of ``obj`` (an empty view for None). ``default_namespace`` is what an absent
        namespace reads as: "" for cluster-scoped objects and for a manifest document that names
        none; an Event's own namespace in a log entry is checked only when it is there.

        Reads what the API writes and nothing else: a field of another JSON type (only a malformed
        log entry has one) reads as absent.
        """
        meta = (obj or {}).get("metadata")
        if not isinstance(meta, Mapping):
            meta = {}
        generation = meta.get("generation")
        return cls(
            name=_text(meta, "name"),
            namespace=_text(meta, "namespace") or default_namespace,
            uid=_text(meta, "uid"),
            resource_version=_text(meta, "resourceVersion"),
            labels=_strings(meta.get("labels")),
            annotations=_strings(meta.get("annotations")),
            deleting=bool(meta.get("deletionTimestamp")),
            created=_text(meta, "creationTimestamp"),
            generation=generation
            if isinstance(generation, int) and not isinstance(generation, bool)
            else None,
        )
