"""What the operator's settings and GCE's label rules allow a create to be: the guardrails.

Each check answers "why this pool must not be requested" ("" when it may): the pool's labels,
the settings' allowlists and size limit, and the chip budget over the product's pools.
"""

from __future__ import annotations

import re

from shared.core.names import label_key_problem, label_value_problem
from shared.core.settings import Settings
from shared.tpu import catalog
from shared.tpu.nodepools import STATUS_STOPPING, NodePoolInfo, NodePoolSpec
from shared.tpu.slices import SliceRequest

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


def managed_chips(pools: list[NodePoolInfo]) -> int:
    """Chips held by the product's pools (those stopping are on their way out and not counted)."""
    total = 0
    for pool in pools:
        if not pool.managed or pool.status == STATUS_STOPPING:
            continue
        chips = catalog.machine_type_chips(pool.machine_type) or 0
        total += chips * pool.node_count
    return total


def over_chip_budget(s: Settings, in_use: int, chips: int) -> str:
    """Why ``chips`` more would exceed CHIP_BUDGET with ``in_use`` held ("" when within it or unset)."""
    if s.chip_budget and in_use + chips > s.chip_budget:
        return (
            f"chip budget exceeded: {in_use} chips in managed pools + {chips} requested "
            f"> CHIP_BUDGET {s.chip_budget}"
        )
    return ""
