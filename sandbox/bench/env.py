"""The benchmark's world: both emulators, settings pointing at them, and the JobSets and deliveries fed in.

Everything the benchmark measures runs against the local GKE emulator and a real kube-apiserver
(etcd + API server alone: ``RealCluster(api_only=True)``, so nothing schedules, runs or
garbage-collects what the bench wrote). The API server's audit log, which records only the
functions' own identities, is the source of every Kubernetes "API calls" figure: the bench writes
its objects as an admin, so the counters only see the product.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.kube import kubeconfig, rbac
from sandbox.kube.cluster import RealCluster
from sandbox.testing.fixtures.kube import KubeHandle, crds, install_crds
from shared.core import labels
from shared.core.settings import Settings, fleet_context
from shared.events import entries as logentries
from shared.events.envelope import ClusterId

REPO_ROOT = Path(__file__).resolve().parents[2]
# Release manifests live in the shared folder beside the repository, never inside it.
JOBSET_MANIFEST = REPO_ROOT.parent / "shared" / "manifests" / "jobset-v0.10.1.yaml"
PROJECT, LOCATION, CLUSTER = "bench-proj", "us-central2-b", "bench-cluster"
CLUSTER_ID = ClusterId(PROJECT, LOCATION, CLUSTER)
NAMESPACES = ("team-a", "team-b")
JOBSET_API = f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"
TOPIC = f"projects/{PROJECT}/topics/tpuprov-bench"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/eventarc-bench"
# Threads writing a bulk load through the API server (it, not the client, is the bottleneck).
LOAD_WORKERS = 16
# GKE request kinds that only read; everything else the emulator counts is a mutation.
GKE_READS = ("get_cluster", "list", "get", "get_operation")


@dataclass(frozen=True)
class Counters:
    """A snapshot of the emulators' request counters (subtract two to get a phase's calls)."""

    gke_creates: int
    gke_deletes: int
    gke_reads: int
    kube_reads: int
    kube_writes: int

    def __sub__(self, other: Counters) -> Counters:
        return Counters(
            self.gke_creates - other.gke_creates,
            self.gke_deletes - other.gke_deletes,
            self.gke_reads - other.gke_reads,
            self.kube_reads - other.kube_reads,
            self.kube_writes - other.kube_writes,
        )

    @property
    def reads(self) -> int:
        """Reads against both APIs."""
        return self.gke_reads + self.kube_reads


@dataclass
class BenchEnv:
    """Started emulators plus the product settings that point at them."""

    gke: GkeEmulator
    kube: KubeHandle
    settings: Settings  # in-process parts run as the provision function (its kubeconfig)
    # Every cluster the settings serve: the managed one, then FLEET_CLUSTERS (``started(fleet=N)``).
    clusters: tuple[ClusterId, ...] = (CLUSTER_ID,)

    def function_env(self, function: str) -> dict[str, str]:
        """Environment variables that configure ``function``'s process like ``settings``, with the
        function's own identity on the API server (its kubeconfig, so RBAC applies as deployed)."""
        s = self.settings
        return {
            "PROJECT_ID": s.project_id,
            "LOCATION": s.location,
            "CLUSTER_NAME": s.cluster_name,
            "GKE_API_ENDPOINT": s.gke_api_endpoint,
            "UNLIMITED_SPENDING": "true",  # stated, as a deployment must
            # A process without a product identity (the cold-start reference) reads as provision.
            "KUBECONFIG": str(
                self.kube.kubeconfig_for(function if function in rbac.FUNCTIONS else "provision")
            ),
        }

    def counters(self) -> Counters:
        """The emulators' request counters right now."""
        calls = self.gke.calls
        requests = self.kube.requests
        return Counters(
            gke_creates=sum(1 for c in calls if c.method == "create"),
            gke_deletes=sum(1 for c in calls if c.method == "delete"),
            gke_reads=sum(1 for c in calls if c.method in GKE_READS),
            kube_reads=sum(1 for method, _ in requests if method == "GET"),
            kube_writes=sum(1 for method, _ in requests if method != "GET"),
        )

    def submit(self, jobset: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Store a JobSet (the API assigns its uid), its Jobs and their pending pods, as the controllers
        would."""
        return self.kube.submit_jobset(jobset, put_many=lambda objects: load(self.kube, objects))

    def complete(self, jobset: dict[str, Any]) -> None:
        """Mark a JobSet Completed, as its controller does when every Job succeeded."""
        meta = jobset["metadata"]
        self.kube.patch_status(
            JOBSET_API,
            "jobsets",
            meta["namespace"],
            meta["name"],
            {
                "conditions": [
                    {
                        "type": "Completed",
                        "status": "True",
                        "reason": "AllJobsCompleted",
                        "message": "jobset completed successfully",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
                "terminalState": "Completed",
            },
        )

    def managed_pools(self) -> list[dict[str, Any]]:
        """Node pools carrying the product's managed-by label."""
        return [
            pool
            for pool in self.gke.pools(self.settings.cluster_path)
            if (pool.get("config") or {}).get("labels", {}).get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE
        ]


def pending_entry(pod: dict[str, Any], cluster: ClusterId = CLUSTER_ID) -> dict[str, Any]:
    """The scheduler's FailedScheduling LogEntry for a pod, as GKE's exporter writes it from
    ``cluster``."""
    meta = pod["metadata"]
    return logentries.pod_event_entry(
        cluster,
        meta["namespace"],
        meta["name"],
        meta.get("uid", ""),
        controller=("JobSet", meta["labels"].get(labels.JOBSET_NAME, "")),
    )


def completion_entry(jobset: dict[str, Any]) -> dict[str, Any]:
    """The JobSet controller's AllJobsCompleted LogEntry."""
    meta = jobset["metadata"]
    return logentries.jobset_event_entry(CLUSTER_ID, meta["namespace"], meta["name"], meta["uid"])


def ignored_entry() -> dict[str, Any]:
    """A LogEntry every function acknowledges without calling any API (no cluster, no event)."""
    return {"logName": f"projects/{PROJECT}/logs/bench", "textPayload": "cold-start probe"}


def binary_delivery(entry: dict[str, Any], message_id: str | None = None) -> tuple[dict[str, str], bytes]:
    """Headers and body of the Eventarc binary-mode CloudEvent carrying ``entry``."""
    message = logentries.pubsub_message(entry, message_id=message_id)
    headers = logentries.binary_cloudevent_headers(message, TOPIC)
    return headers, json.dumps(logentries.eventarc_body(message, SUBSCRIPTION)).encode()


def load(
    kube: KubeHandle, objects: Sequence[dict[str, Any]], workers: int = LOAD_WORKERS
) -> list[dict[str, Any]]:
    """Write ``objects`` through the API server as an admin from a thread pool (in order per call);
    the stored objects. Loading is setup: callers time it apart from what they measure."""
    if len(objects) < 2:
        return [kube.put(obj) for obj in objects]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(kube.put, objects))


def fleet_clusters(count: int) -> tuple[ClusterId, ...]:
    """The managed cluster and ``count - 1`` more of the same project and zone."""
    return (CLUSTER_ID, *(ClusterId(PROJECT, LOCATION, f"{CLUSTER}-{i}") for i in range(2, count + 1)))


def fleet_kubeconfig(base: Path, clusters: Sequence[ClusterId], out: Path) -> Path:
    """``base`` (one function's kubeconfig) with a context per cluster, each on ``base``'s API
    server and user: one API server plays every cluster's, so what differs between them is only
    what the product keeps per cluster."""
    same = kubeconfig.load(base)
    return kubeconfig.with_contexts(
        base, {fleet_context(c.project, c.location, c.name): same for c in clusters}, out
    )


@contextmanager
def started(op_delay: float = 0.0, manifest: Path = JOBSET_MANIFEST, fleet: int = 1) -> Iterator[BenchEnv]:
    """Start a real API server and the GKE emulator (stopped on exit) with the JobSet CRD and the
    bench namespaces. The cluster starts first: it moves this process into a loopback-only network
    namespace, where the GKE emulator must then listen. ``fleet``: how many clusters the settings
    serve (GKE knows each; one API server answers for all)."""
    if not manifest.is_file():
        raise FileNotFoundError(f"JobSet release manifest {manifest} is missing (the CRD is served from it)")
    users = [rbac.user_name(f) for f in rbac.FUNCTIONS]
    with RealCluster(api_only=True, audit_users=users) as cluster:
        install_crds(cluster, crds(manifest))
        kube = KubeHandle(cluster)
        for ns in NAMESPACES:
            kube.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        clusters = fleet_clusters(fleet)
        seeds = [
            ClusterSeed(c.project, c.location, c.name, endpoint="127.0.0.1", locations=(LOCATION,))
            for c in clusters
        ]
        gke = GkeEmulator(seeds, op_delay=op_delay).start()
        try:
            kubeconfig = kube.kubeconfig_for("provision")
            if fleet > 1:
                kubeconfig = fleet_kubeconfig(
                    kubeconfig, clusters[1:], cluster.dir / "kubeconfig-bench-fleet"
                )
            settings = Settings(
                unlimited_spending=True,
                project_id=PROJECT,
                location=LOCATION,
                cluster_name=CLUSTER,
                gke_api_endpoint=gke.url,
                kubeconfig=str(kubeconfig),
                fleet_clusters=tuple(c.path for c in clusters[1:]),
            )
            kube.clear_requests()
            yield BenchEnv(gke, kube, settings, clusters)
        finally:
            gke.stop()


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct``-th percentile (nearest rank, so p99 of 1,000 samples is the 10th worst)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil without floats drifting
    return float(ordered[int(rank) - 1])


def median(values: Sequence[float]) -> float:
    """The median (0 for no samples)."""
    return float(statistics.median(values)) if values else 0.0
