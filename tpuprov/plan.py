"""``tpuprov plan``: the pools a JobSet would get, derived exactly as the provision function does."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.errors import NotEligible, Refused
from shared.core.settings import Settings
from shared.tpu import selectors
from shared.tpu.jobsets import expand_pods
from shared.tpu.selectors import pod_selectors
from shared.tpu.slices import build_node_pool, policy_of, slice_options, slice_request


@dataclasses.dataclass(frozen=True)
class PlannedPool:
    """One line of ``tpuprov plan``: a pool the JobSet would get, or why a Job gets none."""

    slice: str
    pool: str = ""
    machine_type: str = ""
    node_count: int = 0
    topology: str = ""
    total_chips: int = 0
    placement: str = ""
    capacity: str = ""  # the capacity options in the order they are tried: "spot@z -> on-demand@z"
    note: str = ""
    refused: str = ""  # why provision would refuse this slice (an Event on the pod); "" when it would not
    # Each node selector of the slice's pods and its fate: "true: set by GKE from config.spot",
    # "ml: set by the product as a node label", "x: refused: ..." (shared.tpu.selectors).
    selectors: Mapping[str, str] = dataclasses.field(default_factory=dict)


def _fates(found: tuple[selectors.Fate, ...]) -> dict[str, str]:
    return {f.key: f.describe().removeprefix(f"{f.key}=") for f in found}


def _refused_fates(selected: Mapping[str, str], why: str) -> dict[str, str]:
    """The fates of a refused slice's selectors: by key, and the one the refusal names is refused."""
    found = []
    for key, value in sorted(selected.items()):
        fate = selectors.classify(key, value)
        named = f"pod selects {key}={value}"
        if why.startswith(named) and not fate.refused:
            fate = selectors.Fate(
                key, value, selectors.REFUSED, why.removeprefix(named).lstrip(":, ").removeprefix("which ")
            )
        found.append(fate)
    return _fates(tuple(found))


def plan(jobset: dict[str, Any], settings: Settings) -> list[PlannedPool]:
    """The pools ``jobset`` would get, one per slice, derived exactly as the provision function does."""
    seen: dict[str, PlannedPool] = {}
    result: list[PlannedPool] = []
    for pod in expand_pods(jobset):
        pod_labels = pod["metadata"]["labels"]
        slice_desc = f"{pod_labels[labels.REPLICATED_JOB_NAME]}[{pod_labels[labels.JOB_INDEX]}]"
        try:
            request = slice_request(pod)
            options = slice_options(settings, request.demand, policy_of(settings, jobset))
            spec, shape = build_node_pool(settings, request, option=options[0])
        except (NotEligible, Refused) as exc:
            if slice_desc not in seen:
                # NotEligible (a CPU Job, say) is none of the product's business; Refused is a mistake.
                refused = exc.why if isinstance(exc, Refused) else ""
                fates = _refused_fates(pod_selectors(pod), refused) if refused else {}
                seen[slice_desc] = PlannedPool(
                    slice=slice_desc, note=exc.why, refused=refused, selectors=fates
                )
                result.append(seen[slice_desc])
            continue
        if slice_desc in seen:
            continue
        placement = ""
        if spec.placement:
            placement = spec.placement.policy_name or f"{spec.placement.type} {spec.placement.tpu_topology}"
        planned = PlannedPool(
            slice=slice_desc,
            pool=spec.name,
            machine_type=spec.machine_type,
            node_count=spec.node_count,
            topology=shape.topology,
            total_chips=shape.total_chips,
            placement=placement,
            capacity=" -> ".join(o.key for o in options),
            note=" ".join(
                part
                for part in (
                    "spot" if spec.spot else "",
                    f"reservation {spec.reservation.value}" if spec.reservation else "",
                    "flex-start" if spec.flex_start else "",
                )
                if part
            ),
            selectors=_fates(
                selectors.fates(request.selected, selectors.spec_node_labels(spec, shape.topology))
            ),
        )
        seen[slice_desc] = planned
        result.append(planned)
    return result
