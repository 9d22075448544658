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
from shared.core.names import SliceId, pool_name, workload_policy_name
from shared.core.settings import Settings
from shared.tpu import capacity, catalog, selectors
from shared.tpu.capacity import CapacityOption
from shared.tpu.jobsets import JobSet, JobSetLike
from shared.tpu.nodepools import ClusterInfo, NodePoolSpec, Placement, Reservation
from shared.tpu.pods import Pod

# GKE's flex-start page lists v5e and v6e (GKE 1.33+) and excludes v3 and v4; Google's XPK also makes
# flex-start Ironwood (tpu7x) pools. v5p is named nowhere, so it is not offered.
FLEX_START_GENERATIONS = ("v5e", "v6e", "tpu7x")


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
    flex_start: bool = False  # the pod selects cloud.google.com/gke-flex-start=true
    # Every selector of the pod (shared.tpu.selectors checks the pool's nodes can match each one).
    selected: Mapping[str, str] = dataclasses.field(default_factory=dict)
    pod_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # for COPY_POD_LABELS
    # Node label keys the pod requires, each with its source (selectors.topology_key_problem).
    topology_keys: tuple[tuple[str, str], ...] = ()

    @property
    def demand(self) -> capacity.Demand:
        """What the pod's selectors require of its slice's capacity."""
        return _demand(self.spot, self.reservation, self.flex_start, self.zone)

    @property
    def pool_name(self) -> str:
        """The deterministic pool name of this slice."""
        return pool_name(self.slice_id)


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _capacity_selection(selected: Mapping[str, str]) -> tuple[bool, Reservation | None, bool]:
    """Spot, reservation and flex-start as the selectors ask for them; Refused for combinations no
    pool can have."""
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
    flex_start = _truthy(selected.get(labels.FLEX_START, ""))
    if flex_start and (spot or reservation is not None):
        # Flex-start is its own provisioning model: its VMs are neither Spot VMs nor reserved ones.
        other = (
            f"{labels.SPOT}=true"
            if spot
            else f"{labels.RESERVATION_NAME}={reservation.value if reservation else ''}"
        )
        raise Refused(
            f"pod selects both {labels.FLEX_START}=true and {other}: flex-start VMs are neither Spot "
            "nor reserved capacity; select one or the other"
        )
    return spot, reservation, flex_start


def _demand(spot: bool, reservation: Reservation | None, flex_start: bool, zone: str) -> capacity.Demand:
    if reservation is not None:
        return capacity.Demand(capacity.RESERVATION, reservation, zone)
    kind = capacity.SPOT if spot else capacity.FLEX_START if flex_start else ""
    return capacity.Demand(kind, None, zone)


def slice_request(pod: Pod | Mapping[str, Any]) -> SliceRequest:
    """Decide whether a pod is a pending TPU JobSet pod and, if so, which slice it needs.

    Takes the pod's view (the API's JSON is parsed into one here). Raises ``NotEligible`` (skip
    quietly, with a reason) or ``Refused`` (the pod asks for something invalid; the reason is
    reported on the pod).
    """
    if not isinstance(pod, Pod):
        pod = Pod.parse(pod)
    if pod.deleting:
        raise NotEligible("pod is being deleted")
    if pod.phase != "Pending" or pod.node_name:
        raise NotEligible(f"pod is {pod.phase} on node {pod.node_name or '-'}")
    if not pod.unschedulable:
        raise NotEligible("pod is not marked Unschedulable by the scheduler")
    if pod.gated:
        raise NotEligible("pod still has scheduling gates")
    if _truthy(pod.labels.get(labels.OPT_OUT)) or _truthy(pod.annotations.get(labels.OPT_OUT)):
        raise NotEligible(f"pod opted out with {labels.OPT_OUT}=true")

    jobset = pod.jobset_value(labels.JOBSET_NAME)
    rjob = pod.jobset_value(labels.REPLICATED_JOB_NAME)
    index = pod.jobset_value(labels.JOB_INDEX)
    if not (jobset and rjob and index is not None):
        raise NotEligible("pod does not belong to a JobSet")
    try:
        job_index = int(index)
    except ValueError:
        raise NotEligible(f"pod has a non-numeric {labels.JOB_INDEX}={index!r}") from None
    jobset_uid = pod.jobset_value(labels.JOBSET_UID) or ""

    if pod.tpu_problem:
        raise Refused(pod.tpu_problem)
    chips = pod.tpu_chips
    if chips <= 0:
        raise NotEligible("pod requests no google.com/tpu")
    selected = pod.selected
    if selected.get(labels.NODEPOOL):
        # Exclusive-placement followers are pinned to the pool their leader landed on; that pool
        # exists or is being made, and a pod must never cause a second one.
        raise NotEligible(
            f"pod is pinned to node pool {selected[labels.NODEPOOL]!r} by its {labels.NODEPOOL} "
            "selector (its author's pool, or its exclusive-placement leader's): nothing to create"
        )
    accelerator = selected.get(labels.TPU_ACCELERATOR, "")
    topology = selected.get(labels.TPU_TOPOLOGY, "")
    dynamic = pod.annotations.get(labels.TPU_SLICE_TOPOLOGY, "").strip()
    if accelerator and not topology and dynamic:
        raise Refused(
            f"pod gives its slice's topology {dynamic} in the annotation {labels.TPU_SLICE_TOPOLOGY}, "
            "which GKE's slice controller reads to form the slice from TPU capacity it already holds "
            "(GKE dynamic slicing and super-slicing, behind Kueue's accelerator.gke.io/slice "
            "admission check); tpu-provisioner builds one node pool per slice from the "
            f"{labels.TPU_TOPOLOGY} node selector: select {labels.TPU_TOPOLOGY}: {dynamic} "
            "instead, or run the workload on GKE's slicing without tpu-provisioner"
        )
    if not accelerator or not topology:
        raise Refused(
            f"pod requests google.com/tpu but does not select both {labels.TPU_ACCELERATOR} "
            f"and {labels.TPU_TOPOLOGY}"
        )

    spot, reservation, flex_start = _capacity_selection(selected)
    extra = selectors.product_labels(selected)  # Refused for a key no pool's nodes could carry
    return SliceRequest(
        slice_id=SliceId(
            namespace=pod.namespace,
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
        flex_start=flex_start,
        selected=selected,
        pod_labels=dict(pod.labels),
        topology_keys=pod.topology_keys,
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
    """The one zone a slice's pool is created in when no capacity policy names one.

    GKE builds a slice in a single zone, and a pool's node count is per zone, so every pool gets
    exactly one. The pod's ``topology.kubernetes.io/zone`` selector wins (it must be a configured
    zone or one of the cluster's); otherwise the first zone of NODE_LOCATIONS (or the zonal
    cluster's own zone). A reservation's zone is not looked up (that needs a Compute call): pods
    consuming a reservation pin its zone with the selector, or it is listed first in NODE_LOCATIONS.
    """
    return _default_zone(settings, request.zone, cluster)


def _default_zone(settings: Settings, zone: str, cluster: ClusterInfo | None) -> str:
    configured = _configured_zones(settings)
    if not zone:
        return configured[0]
    allowed = tuple(dict.fromkeys((*configured, *(cluster.locations if cluster else ()))))
    if zone not in allowed:
        raise Refused(
            f"pod selects {labels.ZONE}={zone}, which is not a zone of this cluster "
            f"(zones: {', '.join(allowed)})"
        )
    return zone


def template_demand(jobset: JobSetLike, replicated_job: str) -> capacity.Demand:
    """What a replicated job's pod template selects of capacity (Kueue writes its flavor's node
    labels there on admission), for decisions made without a pod at hand (reconcile). Refused for
    selections no pod of it could get, as for its pods."""
    for rjob in JobSet.of(jobset).replicated_jobs:
        if rjob.get("name") == replicated_job:
            template = (((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
            selected = selectors.of_pod_spec(template or {})
            return _demand(*_capacity_selection(selected), selected.get(labels.ZONE, "").strip())
    return capacity.Demand()


def policy_of(settings: Settings, jobset: JobSetLike | None) -> tuple[CapacityOption, ...]:
    """The capacity policy of a JobSet's slices: its annotation, else CAPACITY_POLICY.

    A malformed annotation is the user's to fix: Refused, with the parser's reason.
    """
    text = JobSet.of(jobset).meta.annotations.get(labels.CAPACITY_POLICY) if jobset is not None else None
    try:
        return capacity.parse_policy(settings.capacity_policy if text is None else str(text))
    except ValueError as exc:
        where = labels.CAPACITY_POLICY if text is not None else "CAPACITY_POLICY"
        raise Refused(f"{where}: {exc}") from None


def slice_options(
    settings: Settings,
    demand: capacity.Demand,
    policy: tuple[CapacityOption, ...] = (),
    cluster: ClusterInfo | None = None,
) -> tuple[CapacityOption, ...]:
    """The capacity options of a slice whose pods select ``demand``, in the order they are tried.

    Never empty. Zones named by the policy must belong to the cluster (or NODE_LOCATIONS): a pool
    in another zone could not be created, so such a policy is refused rather than tried.
    """
    if settings.force_on_demand:
        capacity.force_on_demand(demand)
        # The operator's switch wins over every policy: only its on-demand entries (zones) remain.
        policy = tuple(o for o in policy if o.kind == capacity.ON_DEMAND)
    choices = capacity.options(policy, demand, _default_zone(settings, demand.zone, cluster))
    allowed = set(settings.node_locations) | set(cluster.locations if cluster else ())
    for option in choices:
        if allowed and option.zone not in allowed:
            raise Refused(
                f"capacity policy names zone {option.zone}, which is not a zone of this cluster "
                f"(zones: {', '.join(sorted(allowed))})"
            )
    return choices


def settings_node_fields(settings: Settings, disk_type: str) -> dict[str, Any]:
    """The node config every pool takes from the settings (a pool's spec and the drift report's
    expectation both build from this, so a new node setting cannot be missed by one of them)."""
    return {
        "service_account": settings.node_service_account,
        "oauth_scopes": settings.oauth_scopes,
        "max_pods_per_node": settings.max_pods_per_node,
        "disk_size_gb": settings.disk_size_gb,
        "disk_type": disk_type,
        "boot_disk_kms_key": settings.boot_disk_kms_key,
        "confidential_storage": settings.confidential_storage,
        "secondary_boot_disks": settings.secondary_boot_disk_modes,
        "additional_networks": settings.additional_network_pairs,
        "secure_boot": settings.shielded_secure_boot,
        "integrity_monitoring": settings.shielded_integrity_monitoring,
        "max_surge": settings.upgrade_max_surge,
        "max_unavailable": settings.upgrade_max_unavailable,
        "tags": settings.network_tags,
        # Every pool runs GKE's metadata server (nodepools.WORKLOAD_METADATA_GKE): without it a
        # tenant pod on a TPU node can read the node service account's token from the Compute
        # metadata server. Sent always, never dropped: the container_v1 reference for
        # WorkloadMetadataConfig.Mode says GKE_METADATA can only be enabled when Workload Identity is
        # on at the cluster level, so on a cluster without it GKE refuses the create and the slice's
        # refusal names the cause; a pool silently created without it would hand tenants that token.
        "workload_metadata": "GKE_METADATA",
    }


def boot_disk(settings: Settings, shape: catalog.SliceShape) -> str:
    """DISK_TYPE, or the machine family's default boot disk; Refused if the family cannot boot from it.

    Refused (an Event on the JobSet) rather than a startup error: one deployment serves every TPU
    generation, and a DISK_TYPE one generation cannot use must not stop the others.
    """
    supported = catalog.boot_disk_types(shape.machine_type)
    chosen = settings.disk_type or supported[0]
    if settings.confidential_storage and chosen != "hyperdisk-balanced":
        # Confidential mode exists for Hyperdisk Balanced only.
        raise Refused(
            f"CONFIDENTIAL_STORAGE needs a hyperdisk-balanced boot disk, and {shape.machine_type} "
            f"({shape.generation}) VMs boot from {chosen}"
        )
    if not settings.disk_type:
        return supported[0]
    if settings.disk_type not in supported:
        raise Refused(
            f"DISK_TYPE={settings.disk_type} is not supported by {shape.machine_type} ({shape.generation}) "
            f"VMs, which boot from {', '.join(supported)}; unset DISK_TYPE to use each generation's default"
        )
    return settings.disk_type


def build_node_pool(
    settings: Settings,
    request: SliceRequest,
    cluster: ClusterInfo | None = None,
    option: CapacityOption | None = None,
) -> tuple[NodePoolSpec, catalog.SliceShape]:
    """The NodePool for a slice. Raises ``Refused`` for shapes GKE would reject.

    ``option`` is the capacity of this attempt (``slice_options``); None means the pod's own choice
    in its default zone, which is what every attempt uses without a capacity policy.

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
        # A pod that selects cloud.google.com/placement-policy-name (xpk's tpu7x workloads) names the
        # policy its author made; the pool is placed by it (the operator's, when set, is checked
        # against the selector instead, and a different name is refused by selectors.check).
        chosen = request.selected.get(labels.PLACEMENT_POLICY_NAME, "").strip()
        if settings.tpu7x_workload_policy:
            name = settings.tpu7x_workload_policy.replace("{topology}", shape.topology.replace("x", "-"))
            placement = Placement(type="", policy_name=name)
        elif chosen:
            placement = Placement(type="", policy_name=chosen)
        else:
            placement = Placement(
                type="", policy_name=workload_policy_name(shape.topology), managed_topology=shape.topology
            )

    if option is None:
        if settings.force_on_demand:
            capacity.force_on_demand(request.demand)
        option = capacity.options((), request.demand, choose_zone(settings, request, cluster))[0]
    flex_start = option.kind == capacity.FLEX_START
    if flex_start and shape.generation not in FLEX_START_GENERATIONS:
        raise Refused(
            f"flex-start capacity is not offered for {shape.generation} TPUs "
            f"(only {', '.join(FLEX_START_GENERATIONS)})"
        )
    for key, value in sorted(request.extra_labels.items()):
        # A selector becomes a node label only when the operator lets that key be one: otherwise any
        # tenant could stamp onto a pool the labels other workloads select, or bill by.
        if key not in selectors.GKE_ACCEPTED and not selectors.allowed_node_label(
            key, settings.node_label_keys
        ):
            raise Refused(
                f"pod selects {key}={value}, which would become a node label of its pool, and "
                "NODE_LABEL_KEYS does not allow that key: ask the operator to add it, or drop the selector"
            )
    # Copied pod labels first: a selector of the same key must win, or the pod could not land.
    copied = selectors.copied_labels(settings.copy_pod_labels, request.pod_labels)
    node_labels = {**copied, **request.extra_labels, **ownership_labels(request.slice_id)}
    resource_labels = labels.billing_labels(request.slice_id.namespace, request.slice_id.jobset)
    spec = NodePoolSpec(
        name=request.pool_name,
        machine_type=shape.machine_type,
        node_count=shape.num_vms,
        node_locations=(option.zone,),
        labels=node_labels,
        resource_labels=resource_labels,
        placement=placement,
        spot=option.kind == capacity.SPOT,
        reservation=option.reservation,
        **settings_node_fields(settings, boot_disk(settings, shape)),
        auto_upgrade=bool(cluster and cluster.release_channel),
        # GKE's flex-start pools are made with auto-repair off (a repair would recreate VMs that
        # flex-start may not get back); everything else keeps it on.
        auto_repair=not flex_start,
        flex_start=flex_start,
    )
    # The last word: a pool some selector of the pod could not match is never built.
    selectors.check(request.selected, spec, shape.topology)
    problem = selectors.topology_key_problem(request.topology_keys, spec, shape.topology)
    if problem:
        raise Refused(problem)  # a pool no pod of the slice could schedule on would bill until deleted
    return spec, shape
