"""Render a validated Kueue configuration into the Kubernetes objects to apply.

Objects use the Kueue API version the pinned release stores (``kueue.x-k8s.io/v1beta2``; v1beta1
is deprecated there) with its field names: ``spec.cohortName``, ``resourceGroups[].flavors[]
.resources[].nominalQuota``, LocalQueue ``spec.clusterQueue``, WorkloadPriorityClass top-level
``value``. Every object carries the product's managed-by label, which is what pruning selects on.
The returned list is in apply order: priority classes, flavors, the product's AdmissionCheck (when a
ClusterQueue asks for it with ``tpuSlicesCheck``), ClusterQueues, LocalQueues.
"""

from __future__ import annotations

from typing import Any

import yaml

from shared.core import labels
from shared.kueue.model import (
    TPU_SLICES_CHECK,
    TPU_SLICES_CONTROLLER,
    ClusterQueue,
    Flavor,
    KueueConfig,
    LocalQueue,
    PriorityClass,
)

KUEUE_API = "kueue.x-k8s.io/v1beta2"
SCHEDULING_API = "scheduling.k8s.io/v1"
MANAGED_SELECTOR = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
SPOT_TOLERATION = {"key": labels.SPOT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}

# (apiVersion, kind) of everything this module renders, in apply order; pruning walks it backwards
# so that LocalQueues go before their ClusterQueues and those before their flavors.
MANAGED_KINDS: tuple[tuple[str, str], ...] = (
    (SCHEDULING_API, "PriorityClass"),
    (KUEUE_API, "WorkloadPriorityClass"),
    (KUEUE_API, "ResourceFlavor"),
    (KUEUE_API, "AdmissionCheck"),
    (KUEUE_API, "ClusterQueue"),
    (KUEUE_API, "LocalQueue"),
)


def _metadata(name: str, namespace: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
    return meta


def render_flavor(flavor: Flavor) -> dict[str, Any]:
    """A ResourceFlavor selecting the nodes GKE labels with the flavor's accelerator and topology."""
    node_labels = {labels.TPU_ACCELERATOR: flavor.accelerator, labels.TPU_TOPOLOGY: flavor.topology}
    node_labels.update(flavor.node_labels)
    spec: dict[str, Any] = {"nodeLabels": node_labels}
    if node_labels.get(labels.SPOT) == "true":
        # GKE taints spot nodes; Kueue adds a flavor's tolerations to the pods it admits on it.
        spec["tolerations"] = [SPOT_TOLERATION]
    return {
        "apiVersion": KUEUE_API,
        "kind": "ResourceFlavor",
        "metadata": _metadata(flavor.name),
        "spec": spec,
    }


def render_cluster_queue(queue: ClusterQueue) -> dict[str, Any]:
    """A ClusterQueue with one resource group: TPU chips (plus cpu/memory when given) per flavor."""
    covered = [labels.TPU_RESOURCE]
    for resource in ("cpu", "memory"):
        if any(getattr(quota, resource) is not None for quota in queue.quotas):
            covered.append(resource)
    flavors = []
    for quota in queue.quotas:
        amounts: dict[str, Any] = {labels.TPU_RESOURCE: quota.chips, "cpu": quota.cpu, "memory": quota.memory}
        flavors.append(
            {
                "name": quota.flavor,
                "resources": [{"name": name, "nominalQuota": amounts[name]} for name in covered],
            }
        )
    if queue.namespaces:
        selector: dict[str, Any] = {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(queue.namespaces)}
            ]
        }
    else:
        selector = {}  # empty selector: every namespace (a missing one would match none)
    spec: dict[str, Any] = {"namespaceSelector": selector, "queueingStrategy": queue.queueing_strategy}
    if queue.cohort:
        spec["cohortName"] = queue.cohort
    spec["resourceGroups"] = [{"coveredResources": covered, "flavors": flavors}]
    if queue.preemption:
        spec["preemption"] = dict(queue.preemption)
    if queue.check_flavors:
        spec["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": TPU_SLICES_CHECK, "onFlavors": list(queue.check_flavors)}]
        }
    return {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": _metadata(queue.name), "spec": spec}


def render_admission_check() -> dict[str, Any]:
    """The product's AdmissionCheck; its controller (reconcile) keeps it Active."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "AdmissionCheck",
        "metadata": _metadata(TPU_SLICES_CHECK),
        "spec": {"controllerName": TPU_SLICES_CONTROLLER},
    }


def render_local_queue(queue: LocalQueue) -> dict[str, Any]:
    """A LocalQueue pointing at its ClusterQueue."""
    return {
        "apiVersion": KUEUE_API,
        "kind": "LocalQueue",
        "metadata": _metadata(queue.name, queue.namespace),
        "spec": {"clusterQueue": queue.cluster_queue},
    }


def render_priority_class(priority: PriorityClass) -> dict[str, Any]:
    """A scheduling.k8s.io PriorityClass or a Kueue WorkloadPriorityClass (value is top-level in both)."""
    if priority.kind == "WorkloadPriorityClass":
        obj: dict[str, Any] = {
            "apiVersion": KUEUE_API,
            "kind": "WorkloadPriorityClass",
            "metadata": _metadata(priority.name),
            "value": priority.value,
        }
    else:
        obj = {
            "apiVersion": SCHEDULING_API,
            "kind": "PriorityClass",
            "metadata": _metadata(priority.name),
            "value": priority.value,
            "globalDefault": priority.global_default,
        }
    if priority.description:
        obj["description"] = priority.description
    return obj


def render(config: KueueConfig) -> list[dict[str, Any]]:
    """Every object of ``config`` in apply order."""
    ordered = sorted(config.priority_classes, key=lambda p: p.kind != "PriorityClass")
    return [
        *(render_priority_class(p) for p in ordered),
        *(render_flavor(f) for f in config.flavors),
        *([render_admission_check()] if any(q.check_flavors for q in config.cluster_queues) else []),
        *(render_cluster_queue(q) for q in config.cluster_queues),
        *(render_local_queue(q) for q in config.local_queues),
    ]


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML, as ``kubectl apply -f`` takes it."""
    return yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False, explicit_start=True)
