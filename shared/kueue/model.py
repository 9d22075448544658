"""The Kueue queue configuration model: validated, immutable, independent of YAML and of Kubernetes.

``shared.kueue.config`` builds these from configuration text (validation in ``shared.kueue.checks``) and
``shared.kueue.render`` turns them into Kueue objects.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from shared.core import labels

QUEUEING_STRATEGIES = ("BestEffortFIFO", "StrictFIFO")
PREEMPTION_ENUMS = {
    "reclaimWithinCohort": ("Never", "LowerPriority", "Any"),
    "withinClusterQueue": ("Never", "LowerPriority", "LowerOrNewerEqualPriority"),
}
BORROW_POLICIES = ("Never", "LowerPriority")
PRIORITY_KINDS = ("PriorityClass", "WorkloadPriorityClass")
# Non-system PriorityClass values must stay at or below one billion.
MAX_PRIORITY = 1_000_000_000
# Kubernetes resource.Quantity, as the Kueue CRDs spell it.
QUANTITY = re.compile(
    r"^[+]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
TPU_LABELS = (labels.TPU_ACCELERATOR, labels.TPU_TOPOLOGY)
MAX_DESCRIPTION = 2048

TOP_KEYS = ("flavors", "clusterQueues", "localQueues", "priorityClasses")
FLAVOR_KEYS = ("name", "accelerator", "topology", "nodeLabels", "spot")
CQ_KEYS = ("name", "queueingStrategy", "cohort", "preemption", "quota", "namespaces", "tpuSlicesCheck")
# The product's admission check (shared.provisioning.admission.check): its AdmissionCheck's name
# (the ADMISSION_CHECK_NAME setting's default) and its controllerName.
TPU_SLICES_CHECK = "tpu-slices"
TPU_SLICES_CONTROLLER = f"{labels.PRODUCT_DOMAIN}/tpu-slices"
LQ_KEYS = ("name", "namespace", "clusterQueue")
PC_KEYS = ("name", "value", "kind", "description", "globalDefault")
QUOTA_KEYS = ("chips", "cpu", "memory")


@dataclasses.dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor selecting nodes of one TPU slice shape."""

    name: str
    accelerator: str
    topology: str  # as GKE labels the nodes
    chips_per_slice: int
    node_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)  # extra labels


@dataclasses.dataclass(frozen=True)
class FlavorQuota:
    """Nominal quota of one flavor in a ClusterQueue; cpu/memory are Kubernetes quantities."""

    flavor: str
    chips: int
    cpu: str | int | None = None
    memory: str | int | None = None


@dataclasses.dataclass(frozen=True)
class ClusterQueue:
    """A ClusterQueue; ``namespaces`` empty means every namespace may use it."""

    name: str
    quotas: tuple[FlavorQuota, ...]
    queueing_strategy: str = "BestEffortFIFO"
    cohort: str = ""
    preemption: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    namespaces: tuple[str, ...] = ()
    # Workloads of these flavors get every TPU slice before admission (the product's admission
    # check); empty: the check is off and the pending-pod path provisions them.
    check_flavors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LocalQueue:
    """A LocalQueue in ``namespace`` feeding ``cluster_queue``."""

    name: str
    namespace: str
    cluster_queue: str


@dataclasses.dataclass(frozen=True)
class PriorityClass:
    """A scheduling.k8s.io PriorityClass or a Kueue WorkloadPriorityClass."""

    name: str
    value: int
    kind: str = "PriorityClass"
    description: str = ""
    global_default: bool = False


@dataclasses.dataclass(frozen=True)
class KueueConfig:
    """A validated queue configuration."""

    flavors: tuple[Flavor, ...] = ()
    cluster_queues: tuple[ClusterQueue, ...] = ()
    local_queues: tuple[LocalQueue, ...] = ()
    priority_classes: tuple[PriorityClass, ...] = ()
