"""The four PATCH flavours of the Kubernetes API, as pure functions over JSON-like data.

Every function returns a new structure and never mutates its inputs: stored objects are shared
with watch history and responses, so in-place edits would leak into other readers.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = (MERGE_PATCH, STRATEGIC_MERGE_PATCH, JSON_PATCH, APPLY_PATCH)

# Strategic merge merges lists of maps by these keys (first one every item has); else it replaces.
_MERGE_KEYS = ("name", "type", "containerPort", "devicePath", "mountPath", "ip")


class PatchError(ValueError):
    """The patch document is malformed or cannot be applied to the target."""


def json_merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7386 JSON merge patch: maps merge recursively, ``null`` deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def _merge_key(old: Sequence[Any], new: Sequence[Any]) -> str | None:
    items = [*old, *new]
    if not new or not all(isinstance(item, dict) for item in items):
        return None
    for key in _MERGE_KEYS:
        if all(key in item for item in items):
            return key
    return None


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a simplified strategic merge patch.

    Maps merge recursively and ``null`` deletes; lists of maps merge item-wise by a well-known key
    (``name`` for containers/env/volumes, ``type`` for conditions); other lists are replaced.
    ``$patch: replace|delete`` directives are honoured and other ``$``-directives are dropped.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue  # $setElementOrder, $retainKeys, $deleteFromPrimitiveList: ordering hints only
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _strategic_list(result[key], value)
        elif isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _strategic_list(old: list[Any], new: list[Any]) -> list[Any]:
    key = _merge_key(old, new)
    if key is None:
        return copy.deepcopy(new)
    merged = list(old)
    positions = {item[key]: index for index, item in enumerate(merged)}
    deleted: set[Any] = set()
    for item in new:
        if item.get("$patch") == "delete":
            deleted.add(item[key])
        elif item[key] in positions:
            merged[positions[item[key]]] = strategic_merge_patch(merged[positions[item[key]]], item)
        else:
            positions[item[key]] = len(merged)
            merged.append(strategic_merge_patch({}, item))
    return [item for item in merged if item[key] not in deleted]


def apply_merge(target: Any, applied: Any) -> Any:
    """Merge an applied configuration as a simplified server-side apply does.

    Maps merge recursively, lists and scalars replace, and ``null`` means "not specified", so
    manifests that carry ``creationTimestamp: null`` do not erase server-populated fields.
    """
    if not isinstance(applied, dict) or not isinstance(target, dict):
        return copy.deepcopy(applied)
    result = dict(target)
    for key, value in applied.items():
        if value is None:
            continue
        result[key] = apply_merge(result.get(key), value)
    return result


def _decode_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"invalid JSON pointer {pointer!r}: must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in pointer[1:].split("/")]


def _index(container: list[Any], token: str, *, for_insert: bool) -> int:
    if token == "-" and for_insert:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    limit = len(container) if for_insert else len(container) - 1
    if index > limit:
        raise PatchError(f"array index {index} out of range")
    return index


def _resolve(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"path element {token!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_insert=False)]
        else:
            raise PatchError(f"cannot descend into a scalar at {token!r}")
    return node


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _resolve(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_insert=True), value)
    else:
        raise PatchError(f"cannot add to a scalar at {last!r}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> tuple[Any, Any]:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _resolve(doc, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(f"cannot remove missing key {last!r}")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, for_insert=False))
    raise PatchError(f"cannot remove from a scalar at {last!r}")


def json_patch(target: Any, operations: Any) -> Any:
    """Apply an RFC 6902 JSON patch (add, remove, replace, move, copy, test) atomically."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON patch operation: {op!r}")
        kind = op["op"]
        tokens = _decode_pointer(op["path"])
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {kind!r} needs a value")
        if kind == "add":
            doc = _add(doc, tokens, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc, _ = _remove(doc, tokens)
        elif kind == "replace":
            _resolve(doc, tokens)  # the target must exist for a replace
            doc, _ = _remove(doc, tokens) if tokens else (doc, None)
            doc = _add(doc, tokens, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = _decode_pointer(op.get("from", ""))
            if kind == "move":
                if tokens[: len(source)] == source and tokens != source:
                    raise PatchError("cannot move a value into one of its own children")
                doc, value = _remove(doc, source)
            else:
                value = copy.deepcopy(_resolve(doc, source))
            doc = _add(doc, tokens, value)
        elif kind == "test":
            if _resolve(doc, tokens) != op["value"]:
                raise PatchError(f"test operation failed at {op['path']!r}")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}")
    return doc
