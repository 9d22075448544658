"""The Kueue queue configuration: a short YAML (or JSON) document, its model and its validation.

A configuration names TPU flavors by accelerator and topology, ClusterQueues with a chip quota
per flavor, LocalQueues per namespace, and priority classes. The GKE multislice tutorial's
setup reads::

    flavors:
      - {name: vlp-24, accelerator: tpu-v5-lite-podslice, topology: 2x4}
    clusterQueues:
      - name: cluster-queue
        preemption: {reclaimWithinCohort: Any, withinClusterQueue: LowerPriority}
        quota: {vlp-24: 24}
    localQueues:
      - {name: multislice-queue, namespace: default, clusterQueue: cluster-queue}
    priorityClasses:
      - {name: low-priority, value: 100}

:func:`parse_config` checks everything before anything is rendered and raises one
``InvalidInputError`` that lists every problem found, so a broken configuration is fixed in one
round instead of one error at a time. Rendering lives in ``shared.kueue.render``.

The text comes from a Pub/Sub message anyone with publish rights on the topic can send, so parsing
is bounded: at most :data:`MAX_CONFIG_BYTES`, no YAML anchors or aliases (a few hundred bytes of
nested aliases expand to gigabytes: the "billion laughs"), and every error text is clipped so that
no value is ever repeated back at length.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from shared.core.errors import InvalidInputError
from shared.kueue import checks
from shared.kueue.model import (
    CQ_KEYS,
    FLAVOR_KEYS,
    LQ_KEYS,
    PC_KEYS,
    TOP_KEYS,
    ClusterQueue,
    Flavor,
    FlavorQuota,
    KueueConfig,
    LocalQueue,
    PriorityClass,
)

__all__ = [
    "DEFAULT_CONFIG",
    "ClusterQueue",
    "Flavor",
    "FlavorQuota",
    "KueueConfig",
    "LocalQueue",
    "PriorityClass",
    "load_config",
    "parse_config",
    "parse_text",
    "validate",
]

DEFAULT_CONFIG = Path(__file__).parent / "data" / "kueue-queues.yaml"

# A real configuration is a few KB (the packaged default and examples are under 2 KB); this leaves
# room for hundreds of queues while keeping the parse of one message cheap.
MAX_CONFIG_BYTES = 64 * 1024
# Bounds of an error message: each problem, the problems listed, and the whole text.
MAX_PROBLEM_CHARS = 200
MAX_PROBLEMS_LISTED = 10
MAX_ERROR_CHARS = 2500


def _clip(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    if len(text) <= limit:
        return text
    suffix = f"... ({len(text)} chars)"
    return text[: limit - len(suffix)] + suffix


class _AliasRefused(Exception):
    def __init__(self, what: str, mark: Any) -> None:
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        super().__init__(f"{what}{where}")


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases while composing, before anything is expanded.

    Composition is where an alias would be resolved to the node its anchor names (PyYAML's
    ``Composer.compose_node``); refusing the events there means an alias bomb costs only the bytes
    it was sent as. The pure-Python loader is used on purpose: libyaml's composes in C, out of reach.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _AliasRefused(
                f"YAML alias *{_clip(str(event.anchor), 40)} is not accepted", event.start_mark
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _AliasRefused(f"YAML anchor &{_clip(str(anchor), 40)} is not accepted", event.start_mark)
        return super().compose_node(parent, index)


def validate(doc: Any, allowed_accelerators: tuple[str, ...] = ()) -> KueueConfig:
    """Check a parsed configuration; raise one InvalidInputError listing every problem."""
    problems = checks.Problems()
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise InvalidInputError(f"Kueue configuration must be a mapping, not {type(doc).__name__}")
    problems.unknown_keys("configuration", doc, TOP_KEYS)
    fl_entries = checks.entries(doc, "flavors", problems, FLAVOR_KEYS)
    flavors = [checks.flavor(w, i, problems, allowed_accelerators) for w, i in fl_entries]
    flavor_names = {f.name for f in flavors if f.name}
    cq_entries = checks.entries(doc, "clusterQueues", problems, CQ_KEYS)
    queues = [checks.cluster_queue(w, i, problems, flavor_names) for w, i in cq_entries]
    queue_names = {q.name for q in queues if q.name}
    local = []
    lq_entries = checks.entries(doc, "localQueues", problems, LQ_KEYS)
    for where, item in lq_entries:
        name = checks.name_field(item, "name", where, problems)
        namespace = checks.name_field(
            {"namespace": item.get("namespace", "default")}, "namespace", where, problems, label=True
        )
        target = checks.str_field(item, "clusterQueue", where, problems)
        if target and target not in queue_names:
            problems.add(where, f"clusterQueue {target!r} is not defined in clusterQueues")
        local.append(LocalQueue(name, namespace, target))
    pc_entries = checks.entries(doc, "priorityClasses", problems, PC_KEYS)
    priorities = [checks.priority_class(w, i, problems) for w, i in pc_entries]
    checks.duplicates(
        [(w, f.name) for (w, _), f in zip(fl_entries, flavors, strict=True)], "flavor", problems
    )
    checks.duplicates(
        [(w, q.name) for (w, _), q in zip(cq_entries, queues, strict=True)], "ClusterQueue", problems
    )
    checks.duplicates(
        [(w, f"{q.namespace}/{q.name}") for (w, _), q in zip(lq_entries, local, strict=True)],
        "LocalQueue",
        problems,
    )
    checks.duplicates(
        [(w, f"{p.kind} {p.name}") for (w, _), p in zip(pc_entries, priorities, strict=True)],
        "priority class",
        problems,
    )
    if sum(p.global_default for p in priorities) > 1:
        problems.add("priorityClasses", "at most one PriorityClass may be globalDefault")
    if problems.items:
        count = len(problems.items)
        # Each problem may quote a value from the input: clip it, and list only the first few.
        listed = [_clip(item) for item in problems.items[:MAX_PROBLEMS_LISTED]]
        if count > MAX_PROBLEMS_LISTED:
            listed.append(f"... and {count - MAX_PROBLEMS_LISTED} more")
        raise InvalidInputError(
            _clip(
                f"Kueue configuration has {count} problem{'s' if count > 1 else ''}:\n  - "
                + "\n  - ".join(listed),
                MAX_ERROR_CHARS,
            )
        )
    return KueueConfig(tuple(flavors), tuple(queues), tuple(local), tuple(priorities))


def parse_text(text: str | bytes) -> Any:
    """Parse YAML or JSON text into plain data (InvalidInputError when it is neither, when it is
    larger than MAX_CONFIG_BYTES, nests too deeply, or uses YAML anchors or aliases)."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_CONFIG_BYTES:
        raise InvalidInputError(
            f"Kueue configuration is {size} bytes; at most {MAX_CONFIG_BYTES} are accepted"
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError("Kueue configuration is not UTF-8 text") from None
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # flow-style YAML also starts with "{"
        except RecursionError:
            raise InvalidInputError("Kueue configuration nests too deeply") from None
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass (no arbitrary tags)
    except _AliasRefused as exc:
        raise InvalidInputError(
            f"Kueue configuration: {exc}; write each value out (anchors and aliases can expand a "
            "small message into an enormous document)"
        ) from None
    except RecursionError:
        raise InvalidInputError("Kueue configuration nests too deeply") from None
    except yaml.YAMLError as exc:
        raise InvalidInputError(
            _clip(f"Kueue configuration is neither YAML nor JSON: {exc}", MAX_PROBLEM_CHARS * 2)
        ) from None


def parse_config(text: str | bytes, allowed_accelerators: tuple[str, ...] = ()) -> KueueConfig:
    """Parse and validate configuration text."""
    return validate(parse_text(text), allowed_accelerators)


def load_config(path: str | Path = "", allowed_accelerators: tuple[str, ...] = ()) -> KueueConfig:
    """Load a configuration file (the packaged default when ``path`` is empty)."""
    target = Path(path) if path else DEFAULT_CONFIG
    try:
        text = target.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot read Kueue configuration {target}: {exc.strerror}") from None
    return parse_config(text, allowed_accelerators)
