"""Field-level checks of a Kueue queue configuration; every problem is collected, none raised.

``shared.kueue.config.validate`` drives these over the whole document and raises one error listing all
problems. Flavors are checked against ``shared.tpu.catalog``: the accelerator must be known and the
topology must be a slice some machine type of that generation can form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.core import labels, names
from shared.kueue.model import (
    BORROW_POLICIES,
    MAX_DESCRIPTION,
    MAX_PRIORITY,
    PREEMPTION_ENUMS,
    PRIORITY_KINDS,
    QUANTITY,
    QUEUEING_STRATEGIES,
    QUOTA_KEYS,
    TPU_LABELS,
    ClusterQueue,
    Flavor,
    FlavorQuota,
    PriorityClass,
)
from shared.tpu import catalog


class Problems:
    """Collects every problem with a location prefix instead of stopping at the first."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, what: str) -> None:
        """Record one problem found at ``where``."""
        self.items.append(f"{where}: {what}")

    def unknown_keys(self, where: str, item: Mapping[str, Any], allowed: Sequence[str]) -> None:
        """Record every key of ``item`` that is not in ``allowed`` (typos must not pass silently)."""
        for key in item:
            if key not in allowed:
                self.add(where, f"unknown field {key!r} (allowed: {', '.join(allowed)})")


def location(section: str, index: int, item: Any) -> str:
    """``section[index] (name)``: how problems point at an entry."""
    name = item.get("name") if isinstance(item, Mapping) else None
    return f"{section}[{index}]" + (f" ({name})" if isinstance(name, str) and name else "")


def str_field(
    item: Mapping[str, Any], key: str, where: str, problems: Problems, required: bool = True
) -> str:
    """A string field; records a problem when it is missing (and required) or not a string."""
    value = item.get(key)
    if value is None or value == "":
        if required:
            problems.add(where, f"{key} is required")
        return ""
    if not isinstance(value, str):
        problems.add(where, f"{key} must be a string, not {type(value).__name__}")
        return ""
    return value


def name_field(item: Mapping[str, Any], key: str, where: str, problems: Problems, label: bool = False) -> str:
    """A Kubernetes object name: DNS-1123 subdomain, or label when ``label`` is set."""
    value = str_field(item, key, where, problems)
    if value and not (names.is_dns1123_label(value) if label else names.is_dns1123_subdomain(value)):
        form = "DNS-1123 label (lowercase alphanumerics and '-', <= 63)" if label else "DNS-1123 subdomain"
        problems.add(where, f"{key} {value!r} is not a valid {form}")
    return value


def as_int(value: Any) -> int | None:
    """``value`` when it is a real integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def quantity(value: Any, where: str, what: str, problems: Problems) -> str | int | None:
    """A non-negative Kubernetes quantity (int or string like ``96`` / ``384Gi``), else None."""
    if value is None:
        return None
    number = as_int(value)
    if number is not None:
        if number < 0:
            problems.add(where, f"{what} quota must not be negative ({number})")
            return None
        return number
    if isinstance(value, str) and QUANTITY.match(value.strip()):
        return value.strip()
    problems.add(where, f"{what} quota {value!r} is not a non-negative Kubernetes quantity")
    return None


def section_items(doc: Mapping[str, Any], key: str, problems: Problems) -> list[Any]:
    """The list under ``key`` (missing -> empty)."""
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.add(key, f"must be a list, not {type(value).__name__}")
        return []
    return value


def entries(
    doc: Mapping[str, Any], section: str, problems: Problems, allowed: Sequence[str]
) -> list[tuple[str, Mapping[str, Any]]]:
    """(location, mapping) of each entry of a section, after checking shape and keys."""
    out = []
    for index, item in enumerate(section_items(doc, section, problems)):
        where = location(section, index, item)
        if not isinstance(item, Mapping):
            problems.add(where, f"must be a mapping, not {type(item).__name__}")
            continue
        problems.unknown_keys(where, item, allowed)
        out.append((where, item))
    return out


def duplicates(keys: list[tuple[str, str]], section: str, problems: Problems) -> None:
    """Record every key already seen earlier in ``keys`` (pairs of location and key)."""
    seen: dict[str, str] = {}
    for where, key in keys:
        if not key:
            continue
        if key in seen:
            problems.add(where, f"duplicate {section} {key!r} (also {seen[key]})")
        else:
            seen[key] = where


def flavor(where: str, item: Mapping[str, Any], problems: Problems, allowed: tuple[str, ...]) -> Flavor:
    """One ``flavors`` entry, checked against the TPU catalog."""
    name = name_field(item, "name", where, problems)
    accelerator = str_field(item, "accelerator", where, problems)
    topology = str_field(item, "topology", where, problems)
    chips, normalized = 0, topology
    known = {info.accelerator for info in catalog.accelerators()}
    if accelerator and accelerator not in known:
        problems.add(where, f"unknown TPU accelerator {accelerator!r} (known: {', '.join(sorted(known))})")
    elif accelerator and allowed and accelerator not in allowed:
        problems.add(where, f"accelerator {accelerator!r} is not in ALLOWED_ACCELERATORS")
    elif accelerator and topology:
        try:
            # Only the shape is known here; any machine type that can form it makes it valid.
            options = catalog.chips_per_vm_options(accelerator, topology)
            if not options:
                raise catalog.UnsupportedShape(f"no machine type forms a {topology} slice")
            shape = catalog.resolve(accelerator, topology, options[0])
            chips, normalized = shape.total_chips, shape.topology
        except catalog.UnsupportedShape as exc:
            problems.add(where, str(exc))
    extra: dict[str, str] = {}
    node_labels = item.get("nodeLabels") or {}
    if not isinstance(node_labels, Mapping):
        problems.add(where, "nodeLabels must be a mapping of label key to value")
        node_labels = {}
    for key, value in node_labels.items():
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        problem = names.label_key_problem(str(key)) or (
            names.label_value_problem(text) if text is not None else f"label {key!r} needs a string value"
        )
        if key in TPU_LABELS:
            problem = f"nodeLabels must not set {key}; it comes from accelerator/topology"
        if problem:
            problems.add(where, problem)
        else:
            extra[str(key)] = str(text)
    spot = item.get("spot", False)
    if not isinstance(spot, bool):
        problems.add(where, "spot must be true or false")
    elif spot:
        extra[labels.SPOT] = "true"
    return Flavor(name, accelerator, normalized, chips, extra)


def preemption(value: Any, where: str, problems: Problems) -> dict[str, Any]:
    """A ClusterQueue ``preemption`` block, with the CRD's enums and cross-field rule."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.add(where, "preemption must be a mapping")
        return {}
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in PREEMPTION_ENUMS:
            if item not in PREEMPTION_ENUMS[key]:
                problems.add(
                    where, f"preemption.{key} {item!r} is not one of {', '.join(PREEMPTION_ENUMS[key])}"
                )
            else:
                out[key] = item
        elif key == "borrowWithinCohort":
            borrow = item if isinstance(item, Mapping) else {}
            policy, threshold = borrow.get("policy", "Never"), borrow.get("maxPriorityThreshold")
            if not isinstance(item, Mapping) or set(borrow) - {"policy", "maxPriorityThreshold"}:
                problems.add(where, "preemption.borrowWithinCohort takes policy and maxPriorityThreshold")
            elif policy not in BORROW_POLICIES:
                problems.add(
                    where, f"preemption.borrowWithinCohort.policy {policy!r} is not Never or LowerPriority"
                )
            elif threshold is not None and as_int(threshold) is None:
                problems.add(where, "preemption.borrowWithinCohort.maxPriorityThreshold must be an integer")
            else:
                out[key] = dict(borrow)
        else:
            problems.add(where, f"unknown preemption field {key!r}")
    borrow_policy = (out.get("borrowWithinCohort") or {}).get("policy", "Never")
    if out.get("reclaimWithinCohort", "Never") == "Never" and borrow_policy != "Never":
        problems.add(where, "preemption.borrowWithinCohort needs reclaimWithinCohort other than Never")
    return out


def quotas(value: Any, where: str, problems: Problems, flavors: set[str]) -> tuple[FlavorQuota, ...]:
    """A ClusterQueue ``quota`` map: flavor -> chips, or flavor -> {chips, cpu, memory}."""
    if not isinstance(value, Mapping) or not value:
        problems.add(where, "quota must map at least one flavor name to its chip quota")
        return ()
    out = []
    for flavor, item in value.items():
        spot = f"{where} quota[{flavor}]"
        if flavor not in flavors:
            problems.add(spot, f"unknown flavor {flavor!r}")
        parts = item if isinstance(item, Mapping) else {"chips": item}
        problems.unknown_keys(spot, parts, QUOTA_KEYS)
        chips = as_int(parts.get("chips"))
        if chips is None:
            problems.add(spot, f"chips must be an integer, not {parts.get('chips')!r}")
        elif chips < 0:
            problems.add(spot, f"chip quota must not be negative ({chips})")
        cpu = quantity(parts.get("cpu"), spot, "cpu", problems)
        memory = quantity(parts.get("memory"), spot, "memory", problems)
        out.append(FlavorQuota(str(flavor), max(chips or 0, 0), cpu, memory))
    # Kueue needs every flavor of a resource group to list the same resources.
    for resource in ("cpu", "memory"):
        given = [getattr(q, resource) is not None for q in out]
        if any(given) and not all(given):
            problems.add(where, f"{resource} quota must be given for every flavor or for none")
    return tuple(out)


def cluster_queue(where: str, item: Mapping[str, Any], problems: Problems, flavors: set[str]) -> ClusterQueue:
    """One ``clusterQueues`` entry; ``flavors`` are the declared flavor names."""
    name = name_field(item, "name", where, problems)
    strategy = item.get("queueingStrategy", "BestEffortFIFO")
    if strategy not in QUEUEING_STRATEGIES:
        problems.add(where, f"queueingStrategy {strategy!r} is not one of {', '.join(QUEUEING_STRATEGIES)}")
    cohort = name_field(item, "cohort", where, problems) if item.get("cohort") is not None else ""
    namespaces = item.get("namespaces") or []
    if not isinstance(namespaces, list) or not all(
        isinstance(ns, str) and names.is_dns1123_label(ns) for ns in namespaces
    ):
        problems.add(where, "namespaces must be a list of valid namespace names")
        namespaces = []
    queue_quotas = quotas(item.get("quota"), where, problems, flavors)
    check = item.get("tpuSlicesCheck", False)
    # true: every flavor of the queue; a list: those flavors (Kueue's onFlavors).
    if check is True:
        check_flavors = tuple(q.flavor for q in queue_quotas)
    elif check is False or check is None:
        check_flavors = ()
    elif isinstance(check, list) and check and all(isinstance(f, str) for f in check):
        quoted = {q.flavor for q in queue_quotas}
        for flavor in check:
            if flavor not in quoted:
                problems.add(
                    where, f"tpuSlicesCheck names flavor {flavor!r}, which has no quota in this queue"
                )
        check_flavors = tuple(check)
    else:
        problems.add(where, "tpuSlicesCheck must be true, false or a list of this queue's flavors")
        check_flavors = ()
    return ClusterQueue(
        name=name,
        quotas=queue_quotas,
        check_flavors=check_flavors,
        queueing_strategy=str(strategy),
        cohort=cohort,
        preemption=preemption(item.get("preemption"), where, problems),
        namespaces=tuple(namespaces),
    )


def priority_class(where: str, item: Mapping[str, Any], problems: Problems) -> PriorityClass:
    """One ``priorityClasses`` entry."""
    name = name_field(item, "name", where, problems)
    kind = item.get("kind", "PriorityClass")
    if kind not in PRIORITY_KINDS:
        problems.add(where, f"kind {kind!r} is not one of {', '.join(PRIORITY_KINDS)}")
    value = as_int(item.get("value"))
    if value is None:
        problems.add(where, f"value must be an integer, not {item.get('value')!r}")
    elif not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        problems.add(where, f"value {value} is outside [-{MAX_PRIORITY}, {MAX_PRIORITY}]")
    description = str_field(item, "description", where, problems, required=False)
    if len(description) > MAX_DESCRIPTION:
        problems.add(where, f"description is longer than {MAX_DESCRIPTION} characters")
    global_default = item.get("globalDefault", False)
    if not isinstance(global_default, bool):
        problems.add(where, "globalDefault must be true or false")
    elif global_default and kind != "PriorityClass":
        problems.add(where, "globalDefault only applies to kind PriorityClass")
    return PriorityClass(name, value or 0, str(kind), description, global_default is True)
