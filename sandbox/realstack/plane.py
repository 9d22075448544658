"""One cluster of the real stack: its control plane and what watches it.

A ``RealStack`` serves one cluster, or a fleet of them from the same deployment of the functions.
Each cluster is a ``ClusterPlane``: its own ``RealCluster`` (etcd, kube-apiserver, controller
manager, scheduler, KWOK), its default CPU pool, the log router that turns its Events and audit log
into the LogEntries a sink exports (each naming this cluster in ``resource.labels``), the pod fates
and its locally run JobSet and Kueue releases. What is shared is what a deployment shares: the GKE
and Compute emulators (every call names its cluster), Pub/Sub, the relay and the functions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox.emulators.logging.router import LogRouter
from sandbox.kube import describe, nodes
from sandbox.kube.api import ApiError
from sandbox.kube.cluster import RealCluster
from sandbox.realstack.kubestate import RealKubeState, collection
from sandbox.realstack.pods import PodFates
from sandbox.realstack.releases import ReleaseWiring
from shared.core import labels
from shared.events.fields import ClusterId

JOBSET_API = f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"
DEFAULT_POOL = "default-pool"
NODE_REGISTER_ATTEMPTS = 5
Note = Callable[[str, str], object]


class ClusterPlane:
    """One cluster's components (see the module docstring); started by its ``RealStack``."""

    def __init__(
        self,
        cluster_id: ClusterId,
        zones: Sequence[str],
        workdir: Path,
        roles: Mapping[str, Sequence[str]],
        note: Note,
    ) -> None:
        self.cluster_id = cluster_id
        self.zones = tuple(zones) or (cluster_id.location,)
        self.kube_cluster = RealCluster(workdir, roles=roles)
        self.note = note
        self.kube: RealKubeState | None = None
        self.router: LogRouter | None = None
        self.pods: PodFates | None = None
        self.releases: ReleaseWiring | None = None
        self._lock = threading.Lock()
        self.deleted_pools: list[str] = []

    @property
    def path(self) -> str:
        return self.cluster_id.path

    # -- lifecycle ------------------------------------------------------------------------------

    def start_control_plane(self, cpu_nodes: int) -> None:
        """The control plane, with the default pool's CPU Nodes registered (KWOK plays them)."""
        self.kube_cluster.start()
        cpu = nodes.PoolNodes(DEFAULT_POOL, "e2-standard-4", {self.zones[0]: cpu_nodes})
        nodes.register_pool_nodes(self.kube_cluster.client(), self.cluster_id.name, cpu)

    def start_watchers(self, sinks_dir: Path, sink_topics: Mapping[str, str], publisher: Any) -> LogRouter:
        """Route this cluster's Events and audit log to the sinks' topics, follow its pods, and run
        its releases' controllers once setup_cluster has applied them. Returns the router."""
        admin = self.kube_cluster.client()
        self.kube = RealKubeState(admin, self.kube_cluster.audit_log)
        self.router = LogRouter(self.kube, self.cluster_id, sinks_dir, sink_topics, publisher, self.note)
        self.router.start()
        self.kube.start()
        self.pods = PodFates(admin)
        self.pods.start()
        self.releases = ReleaseWiring(self.kube_cluster)
        self.releases.start()
        return self.router

    def stop_watchers(self) -> list[Callable[[], None]]:
        """The steps that stop what ``start_watchers`` started, in order."""
        return [
            lambda: self.releases.stop() if self.releases else None,
            lambda: self.pods.stop() if self.pods else None,
            lambda: self.kube.stop() if self.kube else None,
        ]

    def stop_router(self) -> None:
        if self.router is not None:
            self.router.stop()

    # -- GKE's node pools, as Nodes ------------------------------------------------------------

    def pool_ready(self, pool: dict[str, Any], topology_of: Callable[[str], Any]) -> None:
        spec = nodes.pool_from_gke(pool, topology_of)
        # The emulator's hook only logs what it raises, and a pool whose Nodes never register leaves
        # its pods pending for good: an API server slow under load gets more tries (the kubelets of a
        # real pool keep trying to register too).
        for attempt in range(1, NODE_REGISTER_ATTEMPTS + 1):
            try:
                names = nodes.register_pool_nodes(self.kube_cluster.client(), self.cluster_id.name, spec)
                break
            except (ApiError, OSError) as exc:
                if isinstance(exc, ApiError) and exc.status < 500 and exc.status != 429:
                    raise
                if attempt == NODE_REGISTER_ATTEMPTS:
                    raise
                self.note("gke", f"pool {spec.pool}: registering its Nodes failed ({exc}); retrying")
                time.sleep(attempt)
        self.note("gke", f"{self.cluster_id.name}: pool {spec.pool} RUNNING: {len(names)} Node(s) registered")

    def pool_updated(self, pool: dict[str, Any], topology_of: Callable[[str], Any]) -> None:
        # GKE applies a pool's new node labels to its existing Nodes (UpdateNodePool).
        spec = nodes.pool_from_gke(pool, topology_of)
        api = self.kube_cluster.client()
        for manifest in nodes.node_manifests(self.cluster_id.name, spec):
            patch = {"metadata": {"labels": manifest["metadata"]["labels"]}}
            try:
                api.patch(f"{nodes.NODES}/{manifest['metadata']['name']}", patch)
            except ApiError as exc:
                if exc.status != 404:
                    raise

    def pool_deleted(self, name: str) -> None:
        with self._lock:
            self.deleted_pools.append(name)
        gone = nodes.delete_pool_nodes(self.kube_cluster.client(), name)
        self.note("gke", f"{self.cluster_id.name}: pool {name} deleted: {len(gone)} Node(s) gone")

    # -- what a user of the cluster does and sees ----------------------------------------------

    def submit(self, jobset: Mapping[str, Any]) -> dict[str, Any]:
        """Create a JobSet as the operator (kubectl create)."""
        obj = {k: v for k, v in jobset.items()}
        obj["metadata"] = {k: v for k, v in jobset["metadata"].items() if k != "uid"}
        ns = str(obj["metadata"].get("namespace", "default"))
        self.note("user", f"{self.cluster_id.name}: submitted JobSet {ns}/{obj['metadata']['name']}")
        return self.kube_cluster.client().create(collection(JOBSET_API, "jobsets", ns), obj)

    def delete_jobset(self, namespace: str, name: str) -> bool:
        self.note("user", f"{self.cluster_id.name}: kubectl delete jobset {namespace}/{name}")
        return self.kube_cluster.client().delete(f"{collection(JOBSET_API, 'jobsets', namespace)}/{name}")

    def jobset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube_cluster.client().get(f"{collection(JOBSET_API, 'jobsets', namespace)}/{name}")

    def jobset_state(self, namespace: str, name: str) -> str:
        """``Completed``, ``Failed``, ``Suspended``, ``Running`` or ``Gone``."""
        jobset = self.jobset(namespace, name)
        if jobset is None:
            return "Gone"
        conditions = (jobset.get("status") or {}).get("conditions") or []
        for state in ("Completed", "Failed", "Suspended"):
            if any(x.get("type") == state and x.get("status") == "True" for x in conditions):
                return state
        return "Running"

    def events(self, reason: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        """Events in this cluster's API server (one namespace's, or all), optionally of one reason."""
        selector = f"reason={reason}" if reason is not None else ""
        return self.kube_cluster.client().list(collection("v1", "events", namespace), field_selector=selector)

    def killed_pods(self) -> list[str]:
        """Pods a pool deletion killed, read from the real pods (``PodFates``)."""
        assert self.pods is not None, "the stack is not started"
        return self.pods.killed()

    def cluster_now(self) -> list[str]:
        """``sandbox.kube.describe.cluster_now`` of this cluster; for a pod bound but still Pending,
        what KWOK's log says about it (KWOK plays a kubelet here: nothing else would run the pod)."""
        api = self.kube_cluster.client()
        lines = describe.cluster_now(api)
        for pod in describe.bound_pending(api)[:3]:
            name = pod.rsplit("/", 1)[-1]
            said = self.kube_cluster.log_lines("kwok", name, limit=8)
            lines += [f"kwok on {pod}:", *(f"  {line}" for line in said or ["(nothing)"])]
        return lines
