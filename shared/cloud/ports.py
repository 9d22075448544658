"""The raw-API ports: what the domain services need from GKE, Compute Engine and Kubernetes.

Adapters (``shared.cloud.gke``, ``shared.cloud.compute``, ``shared.cloud.reservations``,
``shared.cloud.kube``, ``shared.cloud.objects``) implement these Protocols over the Google and
Kubernetes clients; the sandbox's fakes implement them over plain dicts. Every method raises only
``shared.core.errors`` types.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from shared.tpu.nodepools import (
    ClusterInfo,
    ClusterListing,
    NodePoolInfo,
    NodePoolSpec,
    OperationInfo,
    WorkloadPolicyInfo,
)
from shared.tpu.reservations import ReservationView

if TYPE_CHECKING:
    from shared.cloud.objects import KindRegistry
    from shared.tpu.jobsets import JobSet
    from shared.tpu.nodes import Node
    from shared.tpu.owners import Job
    from shared.tpu.pods import Pod
    from shared.tpu.workloads import MultiKueueClusterView, WorkloadView


class NodePoolAPI(Protocol):
    """The raw GKE calls the product makes. Adapters map library errors to ``shared.core.errors``.

    ``cluster`` is always the full resource path ``projects/P/locations/L/clusters/C``. Mutating calls
    return the operation's resource path and never wait for it: a function has seconds, GKE minutes.
    """

    def get_cluster(self, cluster: str) -> ClusterInfo:
        """Fetch the cluster. Raises NotFoundError."""
        ...

    def list_clusters(self, project: str) -> ClusterListing:
        """Every cluster of ``project``, in all its zones and regions."""
        ...

    def list_node_pools(self, cluster: str) -> list[NodePoolInfo]:
        """All node pools of the cluster."""
        ...

    def get_node_pool(self, cluster: str, name: str) -> NodePoolInfo:
        """One node pool. Raises NotFoundError."""
        ...

    def create_node_pool(self, cluster: str, spec: NodePoolSpec, why: str) -> str:
        """Start creating a pool. Raises AlreadyExistsError, RejectedError or TransientError."""
        ...

    def delete_node_pool(self, cluster: str, name: str, why: str) -> str:
        """Start deleting a pool. Raises NotFoundError, RejectedError or TransientError."""
        ...

    def set_node_pool_labels(
        self,
        cluster: str,
        name: str,
        labels: Mapping[str, str],
        why: str,
        resource_labels: Mapping[str, str] | None = None,
    ) -> str:
        """Replace the pool's node labels (GKE relabels its nodes) and, when given, its resource
        (billing) labels, in one operation. Raises NotFoundError, RejectedError or TransientError
        (e.g. another operation runs on the pool)."""
        ...

    def get_operation(self, operation: str) -> OperationInfo:
        """Fetch an operation by its resource path."""
        ...


class WorkloadPolicyAPI(Protocol):
    """The raw Compute Engine calls for workload policies (regional resource policies).

    A workload policy lives in a project and a region; GKE places a multi-host tpu7x pool by naming
    one that exists in the pool's project and region.
    """

    def get(self, project: str, region: str, name: str) -> WorkloadPolicyInfo:
        """One workload policy. Raises NotFoundError, RejectedError (e.g. 403) or TransientError."""
        ...

    def insert(self, project: str, region: str, name: str, accelerator_topology: str, why: str) -> None:
        """Create a HIGH_THROUGHPUT workload policy for ``accelerator_topology`` and return once
        Compute has finished creating it. Raises AlreadyExistsError (409), RejectedError (403, 400)
        or TransientError (429, 5xx, or still being created when the adapter stopped waiting)."""
        ...


class ReservationAPI(Protocol):
    """The raw Compute Engine reads of a specific reservation, its blocks and their sub-blocks.

    A reservation lives in a zone of the project that owns it (another project's, when shared).
    """

    def get_reservation(self, project: str, zone: str, name: str) -> ReservationView:
        """The reservation with its blocks and sub-blocks. Raises NotFoundError, RejectedError (e.g.
        403 naming the permission) or TransientError."""
        ...


class KubeAPI(Protocol):
    """The Kubernetes calls the provision/release/reconcile services make. Pods, Nodes, Jobs, JobSets
    and Workloads come back as the frozen views of ``shared.tpu``, parsed at the adapter; the
    ClusterQueue and ResourceFlavor reads and an Event's involved object stay JSON dicts."""

    def get_pod(self, namespace: str, name: str) -> Pod:
        """One pod, parsed at the adapter into the view every decision reads. Raises NotFoundError."""
        ...

    def list_pods(
        self, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> list[Pod]:
        """Pods, optionally in one namespace and filtered by label and field selectors (server side,
        e.g. ``spec.nodeName=N,status.phase!=Succeeded``), parsed at the adapter like ``get_pod``."""
        ...

    def list_nodes(self, label_selector: str = "") -> list[Node]:
        """Nodes, optionally filtered by a label selector (e.g. ``cloud.google.com/gke-nodepool=P``)."""
        ...

    def set_unschedulable(self, node: str, unschedulable: bool, why: str) -> None:
        """Cordon (True) or uncordon (False) a node; a cordon carries the ``tpuprov.dev/cordoned``
        annotation saying why, an uncordon removes it. Raises NotFoundError for a missing node."""
        ...

    def get_jobset(self, namespace: str, name: str) -> JobSet:
        """One JobSet, parsed at the adapter. Raises NotFoundError."""
        ...

    def get_namespace_labels(self, name: str) -> dict[str, str]:
        """A Namespace's labels (the cluster administrator's, which TENANTS ``label:`` entries
        match). Raises NotFoundError."""
        ...

    def get_job(self, namespace: str, name: str) -> Job:
        """One batch/v1 Job (who controls it: a pod's place in its JobSet is checked through it).
        Raises NotFoundError."""
        ...

    def list_jobsets(self, namespace: str | None = None) -> list[JobSet]:
        """JobSets, optionally in one namespace."""
        ...

    def annotate_jobset(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str,
        why: str,
    ) -> JobSet:
        """Set (None: remove) annotations of a JobSet if it still has ``resource_version``; returns the
        JobSet as stored. Raises ConflictError (written since it was read) or NotFoundError."""
        ...

    def record_event(
        self, involved: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        """Record a core/v1 Event about ``involved`` (an object dict with apiVersion/kind/metadata)."""
        ...

    def get_workload(self, namespace: str, name: str) -> WorkloadView:
        """One Kueue Workload, as its view. Raises NotFoundError."""
        ...

    def list_workloads(self, namespace: str | None = None) -> list[WorkloadView]:
        """Kueue Workloads, optionally in one namespace, as their views."""
        ...

    def get_multikueue_cluster(self, name: str) -> MultiKueueClusterView:
        """One MultiKueueCluster of a MultiKueue manager. Raises NotFoundError."""
        ...

    def annotate_multikueue_cluster(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str, why: str
    ) -> None:
        """Merge-patch a MultiKueueCluster's annotations if unchanged since ``resource_version``
        (ConflictError otherwise; None removes a key)."""
        ...

    def get_cluster_queue(self, name: str) -> dict[str, Any]:
        """One Kueue ClusterQueue (cluster-scoped). Raises NotFoundError."""
        ...

    def get_resource_flavor(self, name: str) -> dict[str, Any]:
        """One Kueue ResourceFlavor (cluster-scoped). Raises NotFoundError."""
        ...

    def set_admission_check_state(self, namespace: str, name: str, state: Mapping[str, Any]) -> None:
        """Set this product's entry of ``status.admissionChecks`` on a Workload (server-side apply of
        the status subresource: the other checks' entries are untouched). Raises NotFoundError."""
        ...

    def set_admission_check_active(self, name: str, message: str) -> None:
        """Set an AdmissionCheck's ``Active`` condition to True (its controller is running); Kueue
        keeps the ClusterQueues using an inactive check inactive. Raises NotFoundError."""
        ...


class ObjectAPI(Protocol):
    """Generic Kubernetes object calls. Objects are JSON dicts; errors are ``shared.core.errors``."""

    kinds: KindRegistry

    def apply(self, obj: Mapping[str, Any], force: bool = True) -> dict[str, Any]:
        """Server-side apply ``obj`` (created when missing) and return the object as stored."""
        ...

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        """One object. Raises NotFoundError."""
        ...

    def list_objects(
        self, api_version: str, kind: str, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Objects of ``kind`` (in every namespace when ``namespace`` is empty), optionally filtered."""
        ...

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "") -> None:
        """Delete one object (dependents in the background). Raises NotFoundError."""
        ...
