"""What becomes of each node selector a TPU pod makes, on the pool the product builds for it.

A pod lands only on a node carrying every label it selects (nodeSelector, and the single-valued
required node-affinity terms ``of_pod_spec`` reads). Each selected key has one of three fates:

* set by GKE: GKE labels every node of a pool from the pool's own configuration (its name, machine
  type, TPU topology, Spot / flex-start / reservation, zone); the product builds that
  configuration from the selector, and the value the pod selects must be the one GKE will set;
* set by the product: the key goes into the pool's node labels (``config.labels``), which GKE
  copies onto every node. GKE takes any valid key there except under its own and Kubernetes'
  prefixes;
* refused: no pool the product can build would carry it (a key GKE reserves, a value GKE never
  sets, an ownership key of the product's). The pod gets a ``TPUSliceRefused`` Event naming the
  key, and no pool is created that the pod could never run on.

Sources: GKE labels each node with its pool (``cloud.google.com/gke-nodepool``), TPU accelerator,
topology and chip count, ``cloud.google.com/gke-spot=true`` on Spot VMs and
``cloud.google.com/gke-flex-start=true`` on flex-start VMs, the reservation a node consumes, and the
well-known Kubernetes zone / region / instance-type / OS labels. GKE refuses node labels under
``cloud.google.com/`` ("Node labels with key ... are managed by GKE or Kubernetes and must not be
manually specified", a 400 quoted in hashicorp/terraform-provider-google PR 19677) and under
``kubernetes.io/`` / ``k8s.io/`` (reserved by Kubernetes core; terraform's node_config docs),
but takes ``cloud.google.com/gke-tpu-ici-resiliency`` and ``cloud.google.com/gke-location-hint``,
which Google's own tpu-provisioner (ai-on-gke) copies from TPU pods to their pools.

Everything here is pure, so one whole-object table test covers every key the product knows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from shared.core import labels
from shared.core.errors import Refused
from shared.core.names import label_key_problem, label_value_problem
from shared.tpu import catalog
from shared.tpu.nodepools import NodePoolInfo, NodePoolSpec

GKE = "set by GKE"
PRODUCT = "set by the product"
REFUSED = "refused"

REGION = "topology.kubernetes.io/region"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
OS = "kubernetes.io/os"

# Keys GKE sets on every node of a pool, and the part of the pool's configuration each comes from.
GKE_SET: Mapping[str, str] = {
    labels.NODEPOOL: "the node pool's name",
    labels.TPU_ACCELERATOR: "config.machineType",
    labels.TPU_TOPOLOGY: "placementPolicy.tpuTopology",
    labels.ACCELERATOR_COUNT: "config.machineType (chips per VM)",
    labels.SPOT: "config.spot",
    labels.FLEX_START: "config.flexStart",
    labels.PLACEMENT_POLICY_NAME: "placementPolicy.policyName",
    labels.RESERVATION_NAME: "config.reservationAffinity",
    labels.RESERVATION_PROJECT: "config.reservationAffinity (shared reservation)",
    labels.ZONE: "locations",
    REGION: "locations",
    INSTANCE_TYPE: "config.machineType",
    OS: "every GKE Linux node (linux)",
}
# cloud.google.com/ keys GKE accepts as a pool's node labels (its reserved prefix's exceptions).
GKE_ACCEPTED = (labels.ICI_RESILIENCY, labels.LOCATION_HINT)

# Prefixes whose keys GKE refuses as node labels: its own, and those Kubernetes core reserves (with
# any subdomain of theirs, e.g. node-role.kubernetes.io/).
_GKE_DOMAINS = ("cloud.google.com",)
_KUBERNETES_DOMAINS = ("kubernetes.io", "k8s.io")


def of_pod_spec(spec: Mapping[str, Any]) -> dict[str, str]:
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


# Where a required node label key comes from, in a refusal's words.
FROM_EXCLUSIVE = "its JobSet's exclusive topology"
FROM_AFFINITY = "a required pod-affinity term"
FROM_KUEUE_TAS = "Kueue's required topology"


def required_topology_keys(
    spec: Mapping[str, Any], annotations: Mapping[str, str]
) -> tuple[tuple[str, str], ...]:
    """The node label keys a pod cannot be scheduled without, each with where it comes from:

    * JobSet's exclusive-placement key, which its pod webhook turns into a required pod-affinity
      term on each Job's leader pod (JobSet v0.10.1 pkg/webhooks/pod_mutating_webhook.go; not with
      the node-selector strategy);
    * the topology key of each required pod-affinity term (the scheduler's InterPodAffinity filter
      fails a node lacking one: "All topology labels must exist on the node", kubernetes
      pkg/scheduler/framework/plugins/interpodaffinity/filtering.go);
    * the level Kueue's topology-aware scheduling must place the pods within
      (``kueue.x-k8s.io/podset-required-topology`` and ``podset-slice-required-topology``, Kueue
      v0.19.2 apis/kueue/v1beta2/topology_types.go): Kueue admits such a podset only onto nodes
      carrying that level's label and pins its pods there with node selectors.

    Anti-affinity terms and Kueue's preferred topology are left out: a node without their key
    still takes the pod."""
    keys: dict[str, str] = {}
    exclusive = annotations.get(labels.EXCLUSIVE_TOPOLOGY, "").strip()
    if exclusive and labels.NODE_SELECTOR_STRATEGY not in annotations:
        keys.setdefault(exclusive, FROM_EXCLUSIVE)
    affinity = ((spec.get("affinity") or {}).get("podAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    for term in affinity if isinstance(affinity, list) else []:
        key = term.get("topologyKey") if isinstance(term, Mapping) else None
        if key:
            keys.setdefault(str(key), FROM_AFFINITY)
    for annotation in (labels.KUEUE_REQUIRED_TOPOLOGY, labels.KUEUE_SLICE_REQUIRED_TOPOLOGY):
        level = annotations.get(annotation, "").strip()
        if level:
            keys.setdefault(level, f"{FROM_KUEUE_TAS}, {annotation}")
    return tuple(keys.items())


def pod_selectors(pod: Mapping[str, Any]) -> dict[str, str]:
    """A pod's nodeSelector and single-valued required node-affinity terms (what it needs of a node)."""
    return of_pod_spec(pod.get("spec") or {})


def allowed_node_label(key: str, allowed: tuple[str, ...]) -> bool:
    """Whether NODE_LABEL_KEYS (``allowed``: exact keys, or prefixes ending in "/") lets a pod's
    selector key become a node label of its pool."""
    return any(key == entry or (entry.endswith("/") and key.startswith(entry)) for entry in allowed)


def gke_refusal(key: str) -> str:
    """GKE's 400 text for ``key`` as a node label of a pool, "" when GKE accepts the key."""
    domain = key.rpartition("/")[0]
    if key in GKE_ACCEPTED or not domain:
        return ""
    reserved = domain in _GKE_DOMAINS or any(
        domain == d or domain.endswith(f".{d}") for d in _KUBERNETES_DOMAINS
    )
    if reserved:
        return (
            f'Node labels with key "{key}" are managed by GKE or Kubernetes and must not be manually '
            "specified."
        )
    return ""


@dataclasses.dataclass(frozen=True)
class Fate:
    """What happens to one selector: GKE sets it, the product sets it, or the pod is refused."""

    key: str
    value: str
    fate: str  # GKE | PRODUCT | REFUSED
    detail: str  # GKE: the pool field it comes from; PRODUCT: where it goes; REFUSED: why

    @property
    def refused(self) -> bool:
        return self.fate == REFUSED

    def describe(self) -> str:
        """``key=value: set by GKE from config.spot`` (what ``tpuprov plan`` / ``why`` print)."""
        if self.fate == GKE:
            return f"{self.key}={self.value}: set by GKE from {self.detail}"
        if self.fate == PRODUCT:
            return f"{self.key}={self.value}: set by the product as a node label"
        return f"{self.key}={self.value}: refused: {self.detail}"


def classify(key: str, value: str) -> Fate:
    """The fate of one selector by its key alone (before any pool is built): GKE's keys are GKE's,
    reserved or invalid keys are refused, every other key becomes a node label."""
    if key in GKE_SET:
        return Fate(key, value, GKE, GKE_SET[key])
    if key.startswith(f"{labels.PRODUCT_DOMAIN}/"):
        why = f"keys under {labels.PRODUCT_DOMAIN}/ are reserved for the product's ownership labels"
        return Fate(key, value, REFUSED, why)
    domain = key.rpartition("/")[0]
    if domain == "gke.io" or domain.endswith(".gke.io"):
        # GKE's node features read labels under gke.io (gVisor sandboxing selects
        # sandbox.gke.io/runtime=gvisor on nodes GKE configured for it): a pool must never carry one
        # because a pod selected it.
        why = f"keys under {domain}/ belong to GKE's node features and are never set from a pod's selector"
        return Fate(key, value, REFUSED, why)
    if key == labels.QUEUED:
        why = (
            "GKE sets it only on the nodes of a queued-provisioning pool, which GKE fills through a "
            "ProvisioningRequest rather than a create (xpk's --flex selects it); for flex-start VMs "
            f"from tpu-provisioner select {labels.FLEX_START}=true instead, or leave the workload to "
            "GKE's queued provisioning (Kueue's ProvisioningRequest admission check) without it"
        )
        return Fate(key, value, REFUSED, why)
    refusal = gke_refusal(key)
    if refusal:
        why = (
            "GKE sets no such label on the nodes of a pool the product builds, and refuses it as a "
            f"node label ({refusal})"
        )
        return Fate(key, value, REFUSED, why)
    problem = label_key_problem(key) or label_value_problem(value)
    if problem:
        return Fate(key, value, REFUSED, f"cannot copy it to the node labels: {problem}")
    return Fate(key, value, PRODUCT, "config.labels")


def product_labels(selected: Mapping[str, str]) -> dict[str, str]:
    """The node labels the product sets for a pod's selectors; Refused naming the first refused key."""
    chosen: dict[str, str] = {}
    for key, value in sorted(selected.items()):
        fate = classify(key, value)
        if fate.refused:
            raise Refused(f"pod selects {key}={value}: {fate.detail}")
        if fate.fate == PRODUCT:
            chosen[key] = value
    return chosen


def copied_labels(wanted: tuple[str, ...], pod_labels: Mapping[str, str]) -> dict[str, str]:
    """The pod labels COPY_POD_LABELS names (exact keys, or prefixes ending in "/"), for node labels."""
    return {
        k: v
        for k, v in sorted(pod_labels.items())
        if k in wanted or any(p.endswith("/") and k.startswith(p) for p in wanted)
    }


def _reservation_labels(value: str) -> dict[str, str]:
    # A shared reservation is projects/P/reservations/NAME: its nodes name both parts.
    if value.startswith("projects/"):
        parts = value.split("/")
        return {labels.RESERVATION_NAME: parts[-1], labels.RESERVATION_PROJECT: parts[1]}
    return {labels.RESERVATION_NAME: value} if value else {}


def _gke_labels(
    name: str,
    machine_type: str,
    topology: str,
    spot: bool,
    flex_start: bool,
    reservation: str,
    zones: tuple[str, ...],
    placement_policy: str,
) -> dict[str, str]:
    found = {labels.NODEPOOL: name, INSTANCE_TYPE: machine_type, OS: "linux"}
    if placement_policy:
        found[labels.PLACEMENT_POLICY_NAME] = placement_policy
    accelerator = catalog.accelerator_for_machine_type(machine_type)
    if accelerator:
        found[labels.TPU_ACCELERATOR] = accelerator
        found[labels.ACCELERATOR_COUNT] = str(catalog.machine_type_chips(machine_type) or "")
    if topology:
        found[labels.TPU_TOPOLOGY] = topology
    if spot:
        found[labels.SPOT] = "true"
    if flex_start:
        found[labels.FLEX_START] = "true"
    found.update(_reservation_labels(reservation))
    if len(zones) == 1:  # one zone per TPU pool: every node carries it
        found[labels.ZONE] = zones[0]
        found[REGION] = zones[0].rsplit("-", 1)[0]
    return found


def spec_node_labels(spec: NodePoolSpec, topology: str) -> dict[str, str]:
    """Every label each node of ``spec`` will carry: GKE's (``topology``: the slice's, which GKE
    also labels single-host nodes with) and the pool's own node labels."""
    reservation = spec.reservation.base if spec.reservation else ""
    policy = spec.placement.policy_name if spec.placement else ""
    gke = _gke_labels(
        spec.name,
        spec.machine_type,
        topology,
        spec.spot,
        spec.flex_start,
        reservation,
        spec.node_locations,
        policy,
    )
    return {**gke, **spec.labels}


def pool_node_labels(pool: NodePoolInfo) -> dict[str, str]:
    """Every label the nodes of an existing pool carry, as far as its listing tells (a single-host
    pool lists no topology: its topology label is then unknown and left out)."""
    gke = _gke_labels(
        pool.name,
        pool.machine_type,
        pool.tpu_topology,
        pool.spot,
        pool.flex_start,
        pool.reservation,
        pool.node_locations,
        pool.placement_policy,
    )
    return {**gke, **pool.labels}


def fates(selected: Mapping[str, str], node_labels: Mapping[str, str]) -> tuple[Fate, ...]:
    """Each selector's fate on nodes carrying ``node_labels`` (``spec_node_labels``), sorted by key.

    A key GKE sets is refused when the pool's nodes carry another value (or none: GKE labels
    only Spot nodes with gke-spot, so ``gke-spot: "false"`` matches no node at all).
    """
    result = []
    for key, value in sorted(selected.items()):
        fate = classify(key, value)
        if fate.fate == GKE and node_labels.get(key) != value:
            carried = node_labels.get(key)
            has = f"{key}={carried}" if carried is not None else f"no {key} label"
            why = f"the pool's nodes carry {has} (GKE sets it from {fate.detail})"
            fate = Fate(key, value, REFUSED, why)
        elif fate.fate == PRODUCT and node_labels.get(key) != value:
            fate = Fate(key, value, REFUSED, "the pool's node labels do not carry it")
        result.append(fate)
    return tuple(result)


def check(selected: Mapping[str, str], spec: NodePoolSpec, topology: str) -> None:
    """Refused naming the first selector the nodes of ``spec`` could not match: no such pool is made."""
    for fate in fates(selected, spec_node_labels(spec, topology)):
        if fate.refused:
            raise Refused(
                f"pod selects {fate.key}={fate.value}, which no node of pool {spec.name} could match: "
                f"{fate.detail}"
            )


# Labels the kubelet puts on every node, whatever its pool (kubernetes.io well-known labels).
_EVERY_NODE = (labels.HOSTNAME, "kubernetes.io/arch", OS)


def topology_key_problem(keys: tuple[tuple[str, str], ...], spec: NodePoolSpec, topology: str) -> str:
    """Why no node of ``spec`` can carry a node label key the pod requires ("" when every one can);
    ``keys`` pairs each key with where it comes from (``required_topology_keys``)."""
    carried = set(spec_node_labels(spec, topology)) | set(_EVERY_NODE)
    for key, where in keys:
        if key in carried:
            continue
        if key == labels.TPU_SLICE or key.startswith(labels.TPU_SLICE_LEVEL_PREFIX):
            return (
                f"the pod requires node label {key} ({where}), which only GKE's slice controller "
                "sets, on TPU capacity it slices dynamically (GKE dynamic slicing, sub-slicing and "
                "super-slicing); no node pool tpu-provisioner creates carries it. Use "
                f"{labels.NODEPOOL} as the exclusive topology (one pool per slice), or GKE's "
                "slicing without tpu-provisioner"
            )
        return (
            f"the pod requires node label {key} ({where}), which no node of pool {spec.name} would "
            f"carry; use {labels.NODEPOOL} as the exclusive topology, or require a label the "
            "pool's nodes get"
        )
    return ""


def misfit(selected: Mapping[str, str], pool: NodePoolInfo, spec: NodePoolSpec) -> str:
    """Why the existing pool of a slice's name cannot run the pod now ("" when it can).

    The pool was built for what the slice's pods selected then; a JobSet whose pods select
    otherwise under the same uid (Kueue re-admitting it under another flavor) no longer fits it.
    """
    if pool.machine_type and pool.machine_type != spec.machine_type:
        return f"pool {pool.name} has {pool.machine_type} VMs, the pod's slice needs {spec.machine_type}"
    for fate in fates(selected, pool_node_labels(pool)):
        unknown = fate.key == labels.TPU_TOPOLOGY and not pool.tpu_topology
        if fate.refused and not unknown:
            return f"the pod selects {fate.key}={fate.value} but {fate.detail}"
    return ""
