"""Label and field selectors with the grammar and the per-resource field support of the real API.

Field selectors are deliberately strict: the real API server answers 400 for fields a resource does
not index, so product code that relies on an unsupported field must fail here too, not only in GKE.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sandbox.emulators.kube.errors import KubeApiError, bad_request

_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(\s*(.*?)\s*\)\s*$")
_CMP_RE = re.compile(rf"^\s*({_KEY})\s*(==|!=|=|>|<)\s*({_VALUE})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")
_VALUE_RE = re.compile(rf"^{_VALUE}$")

# Fields every resource supports, then the extra ones the real API server indexes per resource.
_COMMON_FIELDS = frozenset({"metadata.name", "metadata.namespace"})
_EXTRA_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    ("", "pods"): frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    ("", "events"): frozenset(
        {
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        }
    ),
    ("events.k8s.io", "events"): frozenset(
        {
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "reason",
            "reportingController",
            "type",
        }
    ),
    ("", "nodes"): frozenset({"spec.unschedulable"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("", "secrets"): frozenset({"type"}),
    ("", "replicationcontrollers"): frozenset({"status.replicas"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
    ("certificates.k8s.io", "certificatesigningrequests"): frozenset({"spec.signerName"}),
}
# Field names that are shorthands for a deeper path in the object.
_FIELD_ALIASES = {"source": "source.component"}


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One parsed selector term: ``key`` compared by ``op`` with ``values``."""

    key: str
    op: str  # one of: =, !=, in, notin, exists, !exists, >, <
    values: tuple[str, ...] = ()


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``(...)`` value sets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part for part in parts if part.strip()]


def parse_label_selector(text: str) -> list[Requirement]:
    """Parse a ``labelSelector`` string; raise a 400 ``KubeApiError`` on bad syntax."""
    requirements: list[Requirement] = []
    for term in _split_top_level(text or ""):
        if match := _SET_RE.match(term):
            values = tuple(value.strip() for value in match.group(3).split(",") if value.strip())
            if not values or not all(_VALUE_RE.match(value) for value in values):
                raise bad_request(f"unable to parse requirement: invalid values in {term.strip()!r}")
            requirements.append(Requirement(match.group(1), match.group(2), values))
        elif match := _CMP_RE.match(term):
            op = "=" if match.group(2) == "==" else match.group(2)
            if op in (">", "<") and not match.group(3).lstrip("-").isdigit():
                raise bad_request(f"unable to parse requirement: {term.strip()!r} needs an integer value")
            requirements.append(Requirement(match.group(1), op, (match.group(3),)))
        elif match := _EXISTS_RE.match(term):
            requirements.append(Requirement(match.group(2), "!exists" if match.group(1) else "exists"))
        else:
            raise bad_request(f"unable to parse requirement: found {term.strip()!r}")
    return requirements


def labels_match(requirements: Sequence[Requirement], labels: Mapping[str, str] | None) -> bool:
    """Return whether a label map satisfies every requirement (an empty selector matches all)."""
    labels = labels or {}
    for req in requirements:
        present = req.key in labels
        value = labels.get(req.key)
        if req.op == "exists":
            ok = present
        elif req.op == "!exists":
            ok = not present
        elif req.op == "=":
            ok = present and value == req.values[0]
        elif req.op == "!=":
            ok = value != req.values[0]
        elif req.op == "in":
            ok = present and value in req.values
        elif req.op == "notin":
            ok = value not in req.values
        else:  # > and < compare integers and never match a missing or non-numeric label
            try:
                number = int(value) if value is not None else None
            except ValueError:
                number = None
            limit = int(req.values[0])
            ok = number is not None and (number > limit if req.op == ">" else number < limit)
        if not ok:
            return False
    return True


def parse_field_selector(
    text: str, group: str, plural: str, crd_fields: Sequence[str] = ()
) -> list[Requirement]:
    """Parse a ``fieldSelector`` for one resource; unknown fields are a 400 like on the real API."""
    allowed = _COMMON_FIELDS | _EXTRA_FIELDS.get((group, plural), frozenset()) | frozenset(crd_fields)
    requirements: list[Requirement] = []
    for term in (text or "").split(","):
        if not term.strip():
            continue
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not match:
            raise bad_request(f"invalid selector: {term.strip()!r}; can't understand it")
        field, op, value = match.groups()
        if field not in allowed:
            raise KubeApiError(400, f'field label not supported: "{field}"', "BadRequest")
        requirements.append(Requirement(field, "=" if op == "==" else op, (value,)))
    return requirements


def field_value(obj: Mapping[str, Any], field: str) -> str:
    """Resolve a dotted field path to the string the API server would compare (missing -> "")."""
    node: Any = obj
    for part in _FIELD_ALIASES.get(field, field).split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def fields_match(requirements: Sequence[Requirement], obj: Mapping[str, Any]) -> bool:
    """Return whether the object satisfies every field requirement."""
    for req in requirements:
        actual = field_value(obj, req.key)
        if (actual == req.values[0]) != (req.op == "="):
            return False
    return True
