"""``tpuprov plan``: the pools a JobSet would get, derived exactly as the provision function does."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.errors import NotEligible, Refused
from shared.core.settings import Settings
from shared.tpu import catalog, declared, selectors
from shared.tpu.jobsets import template_pod
from shared.tpu.selectors import pod_selectors
from shared.tpu.slices import build_node_pool, policy_of, slice_options
from shared.tpu.zones import zone_problem


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
    # Why the pool would likely be refused where it is planned ("" when nothing is known against it).
    warning: str = ""


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
    """The pools ``jobset`` would get, one per slice (one per Job: replicated job and index),
    derived from its spec exactly as the provision function does once a pod proves its Job."""
    result: list[PlannedPool] = []
    too_big = declared.total_vms_problem(jobset, settings.max_vms_per_jobset)
    for rjob in declared.replicated_jobs(jobset):
        for index in range(rjob.replicas):
            result.append(_planned(jobset, rjob, index, settings, too_big))
    return result


def _planned(
    jobset: dict[str, Any], rjob: declared.ReplicatedJob, index: int, settings: Settings, too_big: str
) -> PlannedPool:
    slice_desc = f"{rjob.name}[{index}]"
    pod = template_pod(jobset, _spec_of(jobset, rjob.name), index)
    try:
        request = declared.declared_request(jobset, rjob.name, index)
        options = slice_options(settings, request.demand, policy_of(settings, jobset))
        spec, shape = build_node_pool(settings, request, option=options[0])
        problem = too_big or declared.declaration_problem(rjob, shape)
        if problem:
            raise Refused(problem)
    except (NotEligible, Refused) as exc:
        # NotEligible (a CPU Job, say) is none of the product's business; Refused is a mistake.
        refused = exc.why if isinstance(exc, Refused) else ""
        fates = _refused_fates(pod_selectors(pod), refused) if refused else {}
        return PlannedPool(slice=slice_desc, note=_note(exc, pod), refused=refused, selectors=fates)
    placement = ""
    if spec.placement:
        placement = spec.placement.policy_name or f"{spec.placement.type} {spec.placement.tpu_topology}"
    return PlannedPool(
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
        selectors=_fates(selectors.fates(request.selected, selectors.spec_node_labels(spec, shape.topology))),
        warning=_zone_warning(shape, [o.zone or settings.location for o in options]),
    )


def _zone_warning(shape: catalog.SliceShape, zones: list[str]) -> str:
    """The first zone of the slice's capacity options where its generation is not listed."""
    for zone in dict.fromkeys(zones):
        problem = zone_problem(shape.accelerator, zone, shape.generation)
        if problem:
            return problem
    return ""


def _note(exc: NotEligible | Refused, pod: Mapping[str, Any]) -> str:
    """Why a slice gets no pool, in a manifest's words. A template that selects
    cloud.google.com/gke-nodepool names a pool its author made (at run time the same selector is
    also how JobSet pins an exclusive-placement follower to its leader's pool)."""
    pool = pod_selectors(pod).get(labels.NODEPOOL)
    if isinstance(exc, NotEligible) and pool:
        return f"pinned to your node pool {pool!r} ({labels.NODEPOOL}): nothing to create"
    return exc.why


def _spec_of(jobset: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    return next(
        r
        for r in (jobset.get("spec") or {}).get("replicatedJobs") or []
        if isinstance(r, Mapping) and r.get("name") == name
    )
