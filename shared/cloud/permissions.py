"""The IAM permissions each adapter call needs: the one place a function's role in ``infra/`` comes from.

Every method of the raw-API ports (``shared.cloud.ports``) is listed here with what Google checks
before it runs. ``tests/infra`` walks each function's code from its entrypoint, collects the port
calls it can reach and requires that function's role in ``infra/roles.json`` to be exactly the union
of their permissions, so adding a call without its permission (or keeping a permission nothing calls)
fails a test instead of a deployment.

Where the facts come from:

* GKE API (``container.googleapis.com``): GKE's "API permissions" reference names
  ``container.clusters.update`` on the cluster for creating, deleting and updating node pools and
  ``container.clusters.get`` for reading them, ``container.operations.get`` for operations. GKE's
  roles also carry the per-resource ``container.nodePools.*`` permissions, so each node-pool call
  needs both: the role then works whichever of the two the service checks.
* Kubernetes API through GKE's IAM authorizer: a request is allowed when IAM grants
  ``container.<resource>.<verb>``: GET of one object is ``get``, of a collection ``list``, POST
  ``create``, PUT and PATCH ``update``, DELETE ``delete``; every custom resource (JobSet, Kueue's
  kinds) is ``container.thirdPartyObjects``. A server-side apply that creates the object is also a
  ``create``.
* Compute Engine (workload policies): ``compute.resourcePolicies.get/create`` and the insert's
  regional operation, ``compute.regionOperations.get``; (reservations) ``compute.reservations.get``,
  ``compute.reservationBlocks.list`` and ``compute.reservationSubBlocks.list``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# Port method -> permissions. Keys are "<Protocol>.<method>" of shared.cloud.ports.
CALLS: Mapping[str, tuple[str, ...]] = {
    # NodePoolAPI (GKE)
    "NodePoolAPI.get_cluster": ("container.clusters.get",),
    # projects.locations.clusters.list (the fleet's discovery by resource label).
    "NodePoolAPI.list_clusters": ("container.clusters.list",),
    "NodePoolAPI.list_node_pools": ("container.clusters.get", "container.nodePools.list"),
    "NodePoolAPI.get_node_pool": ("container.clusters.get", "container.nodePools.get"),
    "NodePoolAPI.create_node_pool": ("container.clusters.update", "container.nodePools.create"),
    "NodePoolAPI.delete_node_pool": ("container.clusters.update", "container.nodePools.delete"),
    # UpdateNodePool (new node and resource labels of a handed-over pool).
    "NodePoolAPI.set_node_pool_labels": ("container.clusters.update", "container.nodePools.update"),
    "NodePoolAPI.get_operation": ("container.operations.get",),
    # WorkloadPolicyAPI (Compute Engine)
    "WorkloadPolicyAPI.get": ("compute.resourcePolicies.get",),
    "WorkloadPolicyAPI.insert": ("compute.resourcePolicies.create", "compute.regionOperations.get"),
    # ReservationAPI (Compute Engine): the reservation, then its blocks and their sub-blocks
    # (Compute Engine, "Manage host maintenance across reservations", Required permissions).
    "ReservationAPI.get_reservation": (
        "compute.reservations.get",
        "compute.reservationBlocks.list",
        "compute.reservationSubBlocks.list",
    ),
    # KubeAPI (Kubernetes through GKE's IAM authorizer)
    "KubeAPI.get_pod": ("container.pods.get",),
    "KubeAPI.list_pods": ("container.pods.list",),
    "KubeAPI.list_nodes": ("container.nodes.list",),
    "KubeAPI.set_unschedulable": ("container.nodes.update",),  # PATCH of the node (cordon)
    "KubeAPI.get_jobset": ("container.thirdPartyObjects.get",),
    "KubeAPI.get_job": ("container.jobs.get",),
    "KubeAPI.get_namespace_labels": (
        "container.namespaces.get",
    ),  # batch/v1 Jobs: GKE's IAM names them "jobs"
    "KubeAPI.list_jobsets": ("container.thirdPartyObjects.list",),
    "KubeAPI.annotate_jobset": ("container.thirdPartyObjects.update",),  # PATCH (failure record)
    # POST the Event; a repeat meets 409, is read back and its count PATCHed.
    "KubeAPI.record_event": ("container.events.create", "container.events.get", "container.events.update"),
    # Kueue's Workloads, ResourceFlavors and AdmissionChecks are custom resources; a server-side
    # apply of a status subresource is a PATCH (update).
    "KubeAPI.get_workload": ("container.thirdPartyObjects.get",),
    "KubeAPI.list_workloads": ("container.thirdPartyObjects.list",),
    "KubeAPI.get_resource_flavor": ("container.thirdPartyObjects.get",),
    "KubeAPI.get_cluster_queue": ("container.thirdPartyObjects.get",),
    # A MultiKueue manager's MultiKueueCluster: the fleet's record of a worker's capacity shortages.
    "KubeAPI.get_multikueue_cluster": ("container.thirdPartyObjects.get",),
    "KubeAPI.annotate_multikueue_cluster": ("container.thirdPartyObjects.update",),
    "KubeAPI.set_admission_check_state": ("container.thirdPartyObjects.update",),
    "KubeAPI.set_admission_check_active": ("container.thirdPartyObjects.update",),
}

# Any call to the cluster's Kubernetes API: through GKE's DNS-based control-plane endpoint (the
# first choice of shared.cloud.endpoint), Google's front end checks this before the API server sees
# the request; the IP endpoints do not need it, but a role must work on whichever one is picked.
CONNECT: tuple[str, ...] = ("container.clusters.connect",)

# ObjectAPI methods are generic: the permission depends on the kind (see ``object_permissions``).
OBJECT_VERBS: Mapping[str, tuple[str, ...]] = {
    "ObjectAPI.apply": ("create", "update"),  # server-side apply: PATCH, and create when missing
    "ObjectAPI.get": ("get",),
    "ObjectAPI.list_objects": ("list",),
    "ObjectAPI.delete": ("delete",),
}

# Built-in kinds the product touches through ObjectAPI -> the resource name GKE's IAM uses.
BUILTIN_RESOURCES: Mapping[tuple[str, str], str] = {
    ("v1", "Namespace"): "namespaces",
    ("scheduling.k8s.io/v1", "PriorityClass"): "priorityClasses",
}


def object_permissions(method: str, kinds: Iterable[tuple[str, str]]) -> set[str]:
    """Permissions of an ObjectAPI ``method`` ("ObjectAPI.apply"...) over ``(apiVersion, kind)`` pairs:
    built-in kinds by their resource, every other kind as a custom resource (thirdPartyObjects)."""
    verbs = OBJECT_VERBS[method]
    found: set[str] = set()
    for kind in kinds:
        resource = BUILTIN_RESOURCES.get(kind, "thirdPartyObjects")
        found.update(f"container.{resource}.{verb}" for verb in verbs)
    return found


# GKE: `Required "container.clusters.update" permission(s) for "projects/p/locations/l/clusters/c".`
# Kubernetes on GKE: `... is forbidden: User "sa@..." cannot patch resource "nodes" in API group ""
# at the cluster scope: requires one of ["container.nodes.update"] permission(s).`
# Compute Engine: `Required 'compute.resourcePolicies.create' permission for 'projects/...'`.
_PERMISSION_TEXT = (
    re.compile(r"""Required ["']([a-zA-Z]+\.[a-zA-Z]+\.[a-zA-Z]+)["'] permission"""),
    re.compile(r"""requires one of \[["']([a-zA-Z]+\.[a-zA-Z]+\.[a-zA-Z]+)["']"""),
)


# The resource a denial names: Compute's `permission for 'projects/P/...'`, GKE's `for "projects/P/...`.
_DENIED_PROJECT = re.compile(r"""permission(?:\(s\))? for ["']projects/([a-z][-a-z0-9]{4,28}[a-z0-9])[/"']""")


def denied_project(message: str) -> str:
    """The project of the resource a 403 message names ("" when it names none)."""
    match = _DENIED_PROJECT.search(message)
    return match.group(1) if match else ""


def denied_permission(message: str) -> str:
    """The permission a 403 message names ("" when it names none, e.g. a quota refusal)."""
    for pattern in _PERMISSION_TEXT:
        match = pattern.search(message)
        if match:
            return match.group(1)
    return ""


__all__ = [
    "BUILTIN_RESOURCES",
    "CALLS",
    "CONNECT",
    "OBJECT_VERBS",
    "denied_permission",
    "denied_project",
    "object_permissions",
]
