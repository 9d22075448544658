"""Pure derivation: from a pending pod to the slice it needs, and from a slice to its NodePool.

Nothing here does I/O, so every rule (which pods qualify, machine type and node count, placement,
spot, reservations, copied labels, ownership labels) is covered by whole-object table tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.errors import NotEligible, Refused
from shared.core.names import (
    SliceId,
    label_key_problem,
    label_value_problem,
    pool_name,
    workload_policy_name,
)
from shared.core.settings import Settings
from shared.tpu import catalog
from shared.tpu.jobsets import expand_pods, pod_jobset_value
from shared.tpu.nodepools import ClusterInfo, NodePoolSpec, Placement, Reservation


@dataclasses.dataclass(frozen=True)
class SliceRequest:
    """What one pending TPU pod tells us about the slice its Job needs."""

    slice_id: SliceId
    accelerator: str
    topology: str
    chips_per_vm: int
    spot: bool = False
    reservation: Reservation | None = None
    extra_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    zone: str = ""  # the pod's topology.kubernetes.io/zone selector, if any

    @property
    def pool_name(self) -> str:
        """The deterministic pool name of this slice."""
        return pool_name(self.slice_id)


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _tpu_chips(spec: Mapping[str, Any]) -> int:
    # One pod per VM: the pod's TPU request is the VM's chip count. Limits count when requests are
    # omitted (Kubernetes defaults requests to limits for extended resources).
    total = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(labels.TPU_RESOURCE)
        if amount is None:
            amount = (resources.get("limits") or {}).get(labels.TPU_RESOURCE)
        if amount is None:
            continue
        try:
            total += int(str(amount))
        except ValueError:
            raise Refused(f"container {container.get('name')!r} requests google.com/tpu={amount!r}") from None
    return total


def _selected(spec: Mapping[str, Any]) -> dict[str, str]:
    """nodeSelector plus single-valued required node-affinity terms (how Kueue and users pin TPUs)."""
    chosen = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = affinity.get("nodeSelectorTerms") or []
    if len(terms) == 1:  # with several ORed terms no single value is implied
        for expr in terms[0].get("matchExpressions") or []:
            values = expr.get("values") or []
            if expr.get("operator") == "In" and len(values) == 1:
                chosen.setdefault(str(expr.get("key")), str(values[0]))
    return chosen


def slice_request(pod: Mapping[str, Any]) -> SliceRequest:
    """Decide whether a pod is a pending TPU JobSet pod and, if so, which slice it needs.

    Raises ``NotEligible`` (skip quietly, with a reason) or ``Refused`` (the pod asks for
    something invalid; the reason is reported on the pod).
    """
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    pod_labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}

    if meta.get("deletionTimestamp"):
        raise NotEligible("pod is being deleted")
    if status.get("phase", "Pending") != "Pending" or spec.get("nodeName"):
        raise NotEligible(f"pod is {status.get('phase', 'Pending')} on node {spec.get('nodeName') or '-'}")
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled is None or scheduled.get("status") != "False" or scheduled.get("reason") != "Unschedulable":
        raise NotEligible("pod is not marked Unschedulable by the scheduler")
    if spec.get("schedulingGates"):
        raise NotEligible("pod still has scheduling gates")
    if _truthy(pod_labels.get(labels.OPT_OUT)) or _truthy(annotations.get(labels.OPT_OUT)):
        raise NotEligible(f"pod opted out with {labels.OPT_OUT}=true")

    jobset = pod_jobset_value(pod, labels.JOBSET_NAME)
    rjob = pod_jobset_value(pod, labels.REPLICATED_JOB_NAME)
    index = pod_jobset_value(pod, labels.JOB_INDEX)
    if not (jobset and rjob and index is not None):
        raise NotEligible("pod does not belong to a JobSet")
    try:
        job_index = int(index)
    except ValueError:
        raise NotEligible(f"pod has a non-numeric {labels.JOB_INDEX}={index!r}") from None
    jobset_uid = pod_jobset_value(pod, labels.JOBSET_UID) or ""

    chips = _tpu_chips(spec)
    if chips <= 0:
        raise NotEligible("pod requests no google.com/tpu")
    selected = _selected(spec)
    if selected.get(labels.NODEPOOL):
        # Exclusive-placement followers are pinned to the pool their leader landed on; that pool
        # exists or is being made, and a pod must never cause a second one.
        raise NotEligible(f"pod is pinned to node pool {selected[labels.NODEPOOL]!r} (follower)")
    accelerator = selected.get(labels.TPU_ACCELERATOR, "")
    topology = selected.get(labels.TPU_TOPOLOGY, "")
    if not accelerator or not topology:
        raise Refused(
            f"pod requests google.com/tpu but does not select both {labels.TPU_ACCELERATOR} "
            f"and {labels.TPU_TOPOLOGY}"
        )

    reservation = None
    if selected.get(labels.RESERVATION_NAME):
        reservation = Reservation(
            selected[labels.RESERVATION_NAME], selected.get(labels.RESERVATION_PROJECT, "")
        )
    spot = _truthy(selected.get(labels.SPOT, ""))
    if spot and reservation is not None:
        # Compute Engine never places Spot VMs on reserved capacity, so such a pool could not be built.
        raise Refused(
            f"pod selects both {labels.SPOT}=true and {labels.RESERVATION_NAME}={reservation.value}: "
            "Spot VMs cannot consume reservations; select one or the other"
        )
    extra: dict[str, str] = {}
    for key, value in sorted(selected.items()):
        if key.startswith(labels.RESERVED_LABEL_PREFIXES) or "kubernetes.io/" in key:
            continue
        if key.startswith(f"{labels.PRODUCT_DOMAIN}/"):
            raise Refused(
                f"pod selects {key!r}: keys under {labels.PRODUCT_DOMAIN}/ are reserved for ownership"
            )
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            raise Refused(f"cannot copy nodeSelector to node labels: {problem}")
        extra[key] = value
    return SliceRequest(
        slice_id=SliceId(
            namespace=str(meta.get("namespace") or "default"),
            jobset=str(jobset),
            jobset_uid=str(jobset_uid),
            replicated_job=str(rjob),
            job_index=job_index,
        ),
        accelerator=accelerator,
        topology=topology,
        chips_per_vm=chips,
        spot=spot,
        reservation=reservation,
        extra_labels=extra,
        zone=selected.get(labels.ZONE, "").strip(),
    )


def ownership_labels(slice_id: SliceId) -> dict[str, str]:
    """Node labels linking a pool to the JobSet slice that owns it (what release selects on)."""
    return {
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.OWNER_NAMESPACE: slice_id.namespace,
        labels.OWNER_NAME: slice_id.jobset,
        labels.OWNER_UID: slice_id.jobset_uid,
        labels.OWNER_REPLICATED_JOB: slice_id.replicated_job,
        labels.OWNER_JOB_INDEX: str(slice_id.job_index),
    }


def _configured_zones(settings: Settings) -> tuple[str, ...]:
    if settings.node_locations:
        return settings.node_locations
    # A zonal cluster's location is a zone (region-letter suffix); a regional one needs the setting.
    if settings.location.count("-") >= 2:
        return (settings.location,)
    raise Refused(f"cluster location {settings.location!r} is a region: set NODE_LOCATIONS to the TPU zone")


def choose_zone(settings: Settings, request: SliceRequest, cluster: ClusterInfo | None = None) -> str:
    """The one zone a slice's pool is created in.

    GKE builds a slice in a single zone, and a pool's node count is per zone, so every pool gets
    exactly one. The pod's ``topology.kubernetes.io/zone`` selector wins (it must be a configured
    zone or one of the cluster's); otherwise the first zone of NODE_LOCATIONS (or the zonal
    cluster's own zone). A reservation's zone is not looked up (that needs a Compute call): pods
    consuming a reservation pin its zone with the selector, or it is listed first in NODE_LOCATIONS.
    """
    configured = _configured_zones(settings)
    if not request.zone:
        return configured[0]
    allowed = tuple(dict.fromkeys((*configured, *(cluster.locations if cluster else ()))))
    if request.zone not in allowed:
        raise Refused(
            f"pod selects {labels.ZONE}={request.zone}, which is not a zone of this cluster "
            f"(zones: {', '.join(allowed)})"
        )
    return request.zone


def boot_disk(settings: Settings, shape: catalog.SliceShape) -> str:
    """DISK_TYPE, or the machine family's default boot disk; Refused if the family cannot boot from it.

    Refused (an Event on the JobSet) rather than a startup error: one deployment serves every TPU
    generation, and a DISK_TYPE one generation cannot use must not stop the others.
    """
    supported = catalog.boot_disk_types(shape.machine_type)
    if not settings.disk_type:
        return supported[0]
    if settings.disk_type not in supported:
        raise Refused(
            f"DISK_TYPE={settings.disk_type} is not supported by {shape.machine_type} ({shape.generation}) "
            f"VMs, which boot from {', '.join(supported)}; unset DISK_TYPE to use each generation's default"
        )
    return settings.disk_type


def build_node_pool(
    settings: Settings, request: SliceRequest, cluster: ClusterInfo | None = None
) -> tuple[NodePoolSpec, catalog.SliceShape]:
    """The NodePool for a slice. Raises ``Refused`` for shapes GKE would reject.

    ``cluster`` (from ``get_cluster``) decides upgrades: a cluster enrolled in a release channel
    only accepts pools with auto-upgrade and auto-repair on; without one auto-upgrade stays off so
    that GKE never recreates a running slice's VMs. ``None`` (e.g. ``tpuprov plan``) means unknown
    and is treated as "no release channel".
    """
    try:
        shape = catalog.resolve(request.accelerator, request.topology, request.chips_per_vm)
    except catalog.UnsupportedShape as exc:
        raise Refused(str(exc)) from None

    placement: Placement | None = None
    if shape.placement == "compact":
        placement = Placement(type="COMPACT", tpu_topology=shape.topology)
    elif shape.placement == "workload-policy":
        # GKE "About Ironwood (TPU7x) in GKE": a multi-host tpu7x pool is placed by a workload policy
        # named in the placement policy instead of a TPU topology. The operator's policy wins; without
        # one the pool names the product's own, which the provisioner makes exist before the create.
        if settings.tpu7x_workload_policy:
            name = settings.tpu7x_workload_policy.replace("{topology}", shape.topology.replace("x", "-"))
            placement = Placement(type="", policy_name=name)
        else:
            placement = Placement(
                type="", policy_name=workload_policy_name(shape.topology), managed_topology=shape.topology
            )

    node_labels = {**request.extra_labels, **ownership_labels(request.slice_id)}
    resource_labels = {
        labels.RESOURCE_LABEL_MANAGED_BY: labels.MANAGED_BY_VALUE,
        labels.RESOURCE_LABEL_JOBSET: request.slice_id.jobset[:63].replace(".", "-"),
    }
    spec = NodePoolSpec(
        name=request.pool_name,
        machine_type=shape.machine_type,
        node_count=shape.num_vms,
        node_locations=(choose_zone(settings, request, cluster),),
        labels=node_labels,
        resource_labels=resource_labels,
        placement=placement,
        spot=request.spot,
        reservation=request.reservation,
        service_account=settings.node_service_account,
        oauth_scopes=settings.oauth_scopes,
        max_pods_per_node=settings.max_pods_per_node,
        disk_size_gb=settings.disk_size_gb,
        disk_type=boot_disk(settings, shape),
        tags=settings.network_tags,
        auto_upgrade=bool(cluster and cluster.release_channel),
        auto_repair=True,
    )
    return spec, shape


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
    note: str = ""


def plan(jobset: dict[str, Any], settings: Settings) -> list[PlannedPool]:
    """The pools ``jobset`` would get, one per slice, derived exactly as the provision function does."""
    seen: dict[str, PlannedPool] = {}
    result: list[PlannedPool] = []
    for pod in expand_pods(jobset):
        pod_labels = pod["metadata"]["labels"]
        slice_desc = f"{pod_labels[labels.REPLICATED_JOB_NAME]}[{pod_labels[labels.JOB_INDEX]}]"
        try:
            request = slice_request(pod)
            spec, shape = build_node_pool(settings, request)
        except (NotEligible, Refused) as exc:
            if slice_desc not in seen:
                seen[slice_desc] = PlannedPool(slice=slice_desc, note=exc.why)
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
            note=" ".join(
                part
                for part in (
                    "spot" if spec.spot else "",
                    f"reservation {spec.reservation.value}" if spec.reservation else "",
                )
                if part
            ),
        )
        seen[slice_desc] = planned
        result.append(planned)
    return result
