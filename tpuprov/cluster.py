"""Read-only access to a cluster for ``tpuprov status`` and ``why``, through the functions' own adapters.

On a real cluster it uses Application Default Credentials exactly as the functions use their
service identity (GKE looks up the cluster endpoint, the Kubernetes calls carry an OAuth token);
against the sandbox the ``GKE_API_ENDPOINT``/``KUBE_API_ENDPOINT`` that ``tpuprov sandbox up``
prints point both adapters at the emulators. Nothing here writes.
"""

from __future__ import annotations

import argparse
from typing import Any

from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.kube import api_client_for
from shared.cloud.objects import ApiClientObjects
from shared.core import labels
from shared.core.errors import InvalidInputError, NotFoundError
from shared.core.settings import Settings
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import ClusterInfo, NodePoolInfo
from shared.tpu.nodes import Node
from shared.tpu.owners import Job
from shared.tpu.pods import Pod
from shared.tpu.workloads import WorkloadView, parse_workload

JOBSET_API = f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--project/--location/--cluster`` overriding the environment the functions read."""
    parser.add_argument("--project", help="GCP project (default: $PROJECT_ID)")
    parser.add_argument("--location", help="cluster location (default: $LOCATION)")
    parser.add_argument("--cluster", help="cluster name (default: $CLUSTER_NAME)")
    parser.add_argument(
        "--fleet-cluster",
        default="",
        help="another cluster of the deployment's fleet ($FLEET_CLUSTERS, or a cluster of $FLEET_PROJECTS): "
        "its name or projects/P/locations/L/clusters/C; read through its own kubeconfig context",
    )


def fleet_member(settings: Settings, wanted: str) -> Settings:
    """The settings one fleet cluster's services run with (``Settings.for_cluster``), the cluster
    named by its name or path; InvalidInputError when it is not one of the fleet, or when the name
    is ambiguous (the same name in two projects or locations: give the path)."""
    matches = [p for p in settings.fleet_paths if wanted in (p, p.rsplit("/", 1)[-1])]
    if not matches and settings.discoverable(wanted):
        matches = [wanted]  # a FLEET_PROJECTS cluster: in the fleet while it carries the label
    if len(matches) > 1:
        raise InvalidInputError(f"--fleet-cluster {wanted} names {', '.join(matches)}: give the path")
    if not matches:
        fleet = ", ".join(settings.fleet_paths) or "none"
        raise InvalidInputError(f"--fleet-cluster {wanted} is not a cluster of the fleet ({fleet})")
    return settings.for_cluster(matches[0])


def fleet_cluster_paths(settings: Settings) -> list[str]:
    """The path of every cluster the deployment serves, as its functions decide it: the managed
    cluster, FLEET_CLUSTERS, then the clusters of FLEET_PROJECTS that GKE lists with FLEET_LABEL
    now (the product's own ``FleetDirectory``; a project GKE cannot list is left out, and said)."""
    from shared.app.discovery import FleetDirectory

    paths = list(settings.fleet_paths)
    if settings.fleet_projects:
        gke = GkeNodePoolAPI(endpoint=settings.gke_api_endpoint, access_token=settings.emulator_access_token)
        paths += [p for p in FleetDirectory(settings, lambda: gke).members() if p not in paths]
    return paths


def fleet_clusters(settings: Settings) -> list[Settings]:
    """The settings of every cluster of :func:`fleet_cluster_paths`."""
    return [settings.for_cluster(path) for path in fleet_cluster_paths(settings)]


def settings_from(args: argparse.Namespace, narrow: bool = True) -> Settings:
    """The functions' settings from the environment, with the command line's overrides; raises
    InvalidInputError naming the flags still needed when the cluster is not fully named. With
    ``--fleet-cluster`` (and ``narrow``), that fleet cluster's settings."""
    settings = Settings.from_env()
    overrides = {
        "project_id": getattr(args, "project", None),
        "location": getattr(args, "location", None),
        "cluster_name": getattr(args, "cluster", None),
    }
    settings = settings.with_overrides(**{k: v for k, v in overrides.items() if v})
    require_cluster(settings.project_id, settings.location, settings.cluster_name)
    wanted = getattr(args, "fleet_cluster", "")
    return fleet_member(settings, wanted) if wanted and narrow else settings


def require_cluster(project: str, location: str, cluster: str) -> None:
    """Raise InvalidInputError naming the flags (and variables) still needed to name the cluster."""
    missing = [
        f"--{flag} (or ${env})"
        for flag, env, value in (
            ("project", "PROJECT_ID", project),
            ("location", "LOCATION", location),
            ("cluster", "CLUSTER_NAME", cluster),
        )
        if not value
    ]
    if missing:
        raise InvalidInputError(f"which cluster? give {', '.join(missing)}")


class ClusterView:
    """The reads ``status`` and ``why`` need: pools from GKE; JobSets, pods, nodes, Events from Kubernetes.

    Each object comes back as the view the functions' own port returns (``shared.tpu``), parsed here
    once, so the CLI decides on exactly what provision and release decide on."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.gke = GkeNodePoolAPI(
            endpoint=settings.gke_api_endpoint, access_token=settings.emulator_access_token
        )
        self.objects = ApiClientObjects(api_client_for(settings, lambda: self.gke))

    def pools(self) -> list[NodePoolInfo]:
        """Every node pool of the cluster (managed or not)."""
        return self.gke.list_node_pools(self.settings.cluster_path)

    def cluster(self) -> ClusterInfo:
        """The cluster as GKE describes it (its zones and release channel shape a pool's spec)."""
        return self.gke.get_cluster(self.settings.cluster_path)

    def jobsets(self, namespace: str = "") -> list[JobSet]:
        """JobSets, in one namespace or all."""
        return [JobSet.parse(js) for js in self.objects.list_objects(JOBSET_API, "JobSet", namespace)]

    def jobset(self, namespace: str, name: str) -> JobSet | None:
        """One JobSet, or None when it does not exist."""
        try:
            return JobSet.parse(self.objects.get(JOBSET_API, "JobSet", name, namespace))
        except NotFoundError:
            return None

    def pods(self, namespace: str = "", label_selector: str = "") -> list[Pod]:
        """Pods, optionally in one namespace and filtered by labels."""
        return [Pod.parse(p) for p in self.objects.list_objects("v1", "Pod", namespace, label_selector)]

    def pod(self, namespace: str, name: str) -> Pod:
        """One pod (raises NotFoundError)."""
        return Pod.parse(self.objects.get("v1", "Pod", name, namespace))

    def jobs(self, namespace: str = "") -> list[Job]:
        """batch/v1 Jobs, in one namespace or all (a pod's place in its JobSet is proven through them)."""
        return [Job.parse(j) for j in self.objects.list_objects("batch/v1", "Job", namespace)]

    def get_namespace_labels(self, name: str) -> dict[str, str]:
        """A Namespace's labels (TENANTS ``label:`` entries match them); {} when it does not exist."""
        try:
            found = self.objects.get("v1", "Namespace", name)
        except NotFoundError:
            return {}
        return {str(k): str(v) for k, v in ((found.get("metadata") or {}).get("labels") or {}).items()}

    def list_workloads(self, namespace: str | None = None) -> list[WorkloadView]:
        """Kueue Workloads' views, in one namespace or all (as the functions' port gives them)."""
        return [
            parse_workload(w)
            for w in self.objects.list_objects("kueue.x-k8s.io/v1beta2", "Workload", namespace or "")
        ]

    def nodes(self) -> list[Node]:
        """Every node of the cluster."""
        return [Node.parse(n) for n in self.objects.list_objects("v1", "Node")]

    def events_about(self, kind: str, namespace: str, name: str, uid: str = "") -> list[dict[str, Any]]:
        """Events whose involvedObject is the ``kind`` object ``namespace/name`` (and, when both
        sides know it, of uid ``uid``)."""
        found = []
        for event in self.objects.list_objects("v1", "Event", namespace):
            involved = event.get("involvedObject") or {}
            if involved.get("name") != name or involved.get("kind") != kind:
                continue
            if uid and involved.get("uid") and involved.get("uid") != uid:
                continue
            found.append(event)
        return found
