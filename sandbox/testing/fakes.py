"""Stateful in-memory fakes of two ports of ``shared.cloud.ports``, speaking the real error vocabulary.

``FakeGke`` is a ``NodePoolAPI`` and ``FakeKube`` a ``KubeAPI`` (the workload-policy fake is in
``sandbox.testing.compute``). Used for fast service-level tests and by the virtual-time simulation
(``sandbox.sim``); wire-level tests use the HTTP emulators instead. The fakes keep state (a created
pool is listed, a deleted one is gone) and raise the same ``shared.core.errors`` the adapters raise
for 404, 409, 429 and GKE's "incompatible operation".
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import threading
from collections.abc import Callable, Mapping
from typing import Any

from shared.cloud.errors import from_status
from shared.core import labels as keys
from shared.core.errors import (
    AlreadyExistsError,
    ConflictError,
    NotFoundError,
    RejectedError,
    TransientError,
)
from shared.tpu.drift import config_of
from shared.tpu.jobsets import JobSet, expand_jobs
from shared.tpu.nodepools import (
    STATUS_PROVISIONING,
    STATUS_RECONCILING,
    STATUS_STOPPING,
    ClusterInfo,
    ClusterListing,
    NodePoolInfo,
    NodePoolSpec,
    OperationInfo,
)
from shared.tpu.nodes import Node
from shared.tpu.owners import Job
from shared.tpu.pods import Pod
from shared.tpu.workloads import MultiKueueClusterView, WorkloadView, parse_workload

# GKE's own texts (see sandbox/emulators/gke/state.py for where they come from).
_TOO_MANY = (
    '429 Too many operations: cluster "c" hits the concurrent operations quota 5, please try again later.'
)
_INCOMPATIBLE = "400 Cluster is running incompatible operation operation-1234."
# GKE's answer to a create beyond the project's resource quota (403 PERMISSION_DENIED).
_QUOTA = (
    '403 Insufficient regional quota to satisfy request: resource "TPU_V6E": request requires '
    "'16.0' and is short '8.0'. project has a quota of '8.0' with '8.0' available."
)
# Compute's answers about a specific reservation, as GKE passes them on (see the GKE emulator's
# sandbox/emulators/gke/capacity.py for where the wording comes from).
_RESERVATION_SHORT = (
    '429 Reservation does not have enough resources for the request: specific reservation "tpu-res" '
    'is insufficient for node pool "p" at zone "us-east5-b": required 4 and short of 4 VM count of '
    "machine type ct6e-standard-4t."
)
_RESERVATION_MISSING = (
    '404 Google Compute Engine: reservation "tpu-res" not found for node pool "p" at zone "us-east5-b".'
)


class FakeGke:
    """``NodePoolAPI`` over a dict of pools; ``fail(method, kind, times)`` queues faults.

    ``on_call(method, target)`` (optional) runs before each call is answered, e.g. to advance a fake
    clock the way a slow GKE would.
    """

    def __init__(
        self,
        release_channel: str = "REGULAR",
        locations: tuple[str, ...] = (),
        on_call: Callable[[str, str], None] | None = None,
    ) -> None:
        """``release_channel`` "" models a cluster outside release channels (new clusters are REGULAR)."""
        self.release_channel = release_channel
        self.locations = locations
        self.on_call = on_call
        self.pools: dict[str, dict[str, NodePoolInfo]] = {}
        self.specs: dict[str, NodePoolSpec] = {}
        self.calls: list[tuple[str, str]] = []
        self.relabels: list[tuple[str, dict[str, str], str]] = []
        self.billing: dict[str, dict[str, str]] = {}  # each pool's resource labels (create, relabel)
        self.listings: dict[str, ClusterListing] = {}  # project -> what list_clusters answers
        self.before_delete: Callable[[str], None] | None = None  # runs as a delete call arrives
        self._faults: dict[str, list[Exception]] = {}
        self._ops = itertools.count(1)
        self._lock = threading.Lock()

    def fail(self, method: str, kind: str, times: int = 1) -> None:
        """Fail the next ``times`` calls of ``method``: 429, incompatible, rejected, quota, unavailable,
        reservation-full or reservation-missing (GKE's answers as the adapter raises them)."""
        # Each as the adapter's one mapping (shared.cloud.errors) turns GKE's answer into an error.
        errors: dict[str, Callable[[], Exception]] = {
            "429": lambda: from_status(429, _TOO_MANY),
            "incompatible": lambda: from_status(400, _INCOMPATIBLE),
            "unavailable": lambda: from_status(503, "503 Service Unavailable"),
            "rejected": lambda: from_status(400, "400 Invalid machine type"),
            "quota": lambda: from_status(403, _QUOTA),
            "reservation-full": lambda: from_status(429, _RESERVATION_SHORT),
            "reservation-missing": lambda: from_status(404, _RESERVATION_MISSING),
        }
        self._faults.setdefault(method, []).extend(errors[kind]() for _ in range(times))

    def _enter(self, method: str, target: str) -> None:
        self.calls.append((method, target))
        if self.on_call is not None:
            self.on_call(method, target)
        queue = self._faults.get(method)
        if queue:
            raise queue.pop(0)

    def count(self, method: str) -> int:
        """How many times ``method`` was called (faulted calls included)."""
        return sum(1 for m, _ in self.calls if m == method)

    def add(self, cluster: str, pool: NodePoolInfo) -> None:
        """Seed a pool directly (e.g. an unmanaged one, or one in ERROR)."""
        self.pools.setdefault(cluster, {})[pool.name] = pool

    def list_clusters(self, project: str) -> ClusterListing:
        """The project's listing as seeded in ``listings`` (none: no cluster)."""
        self._enter("list_clusters", project)
        return self.listings.get(project, ClusterListing())

    def get_cluster(self, cluster: str) -> ClusterInfo:
        """A fixed cluster description."""
        self._enter("get_cluster", cluster)
        name = cluster.rsplit("/", 1)[-1]
        return ClusterInfo(
            name=name,
            location="",
            endpoint="127.0.0.1",
            ca_certificate="",
            locations=self.locations,
            release_channel=self.release_channel,
        )

    def list_node_pools(self, cluster: str) -> list[NodePoolInfo]:
        """Pools of the cluster, in name order."""
        with self._lock:
            self._enter("list", cluster)
            return [copy.copy(p) for _, p in sorted(self.pools.get(cluster, {}).items())]

    def get_node_pool(self, cluster: str, name: str) -> NodePoolInfo:
        """One pool or NotFoundError."""
        with self._lock:
            self._enter("get", name)
            try:
                return self.pools[cluster][name]
            except KeyError:
                raise NotFoundError(f"404 node pool {name} not found") from None

    def create_node_pool(self, cluster: str, spec: NodePoolSpec, why: str) -> str:
        """Record the pool as PROVISIONING; 409 if it exists."""
        with self._lock:
            self._enter("create", spec.name)
            pools = self.pools.setdefault(cluster, {})
            if spec.name in pools:
                raise AlreadyExistsError(f"409 node pool {spec.name} already exists")
            if self.release_channel and not spec.auto_upgrade:
                # GKE's own wording (see sandbox/emulators/gke/rules.py).
                raise RejectedError(
                    f"400 Auto_upgrade cannot be false when release_channel {self.release_channel} is set.",
                    400,
                )
            pools[spec.name] = NodePoolInfo(
                name=spec.name,
                status=STATUS_PROVISIONING,
                machine_type=spec.machine_type,
                node_count=spec.node_count,
                labels=dict(spec.labels),
                node_locations=spec.node_locations,
                tpu_topology=spec.placement.tpu_topology if spec.placement else "",
                placement_policy=spec.placement.policy_name if spec.placement else "",
                spot=spec.spot,
                reservation=spec.reservation.base if spec.reservation else "",
                reservation_place=spec.reservation.place if spec.reservation else "",
                flex_start=spec.flex_start,
                config=config_of(spec),
            )
            self.specs[spec.name] = spec
            self.billing[spec.name] = dict(spec.resource_labels)
            return f"operation-{next(self._ops)}"

    def delete_node_pool(self, cluster: str, name: str, why: str) -> str:
        """Remove the pool; 404 if it does not exist."""
        with self._lock:
            self._enter("delete", name)
            if self.before_delete is not None:
                self.before_delete(name)
            if name not in self.pools.get(cluster, {}):
                raise NotFoundError(f"404 node pool {name} not found")
            del self.pools[cluster][name]
            return f"operation-{next(self._ops)}"

    def set_node_pool_labels(
        self,
        cluster: str,
        name: str,
        labels: Mapping[str, str],
        why: str,
        resource_labels: Mapping[str, str] | None = None,
    ) -> str:
        """Replace the pool's node labels (and resource labels when given); 404 if missing, GKE's
        busy error while it is being deleted."""
        with self._lock:
            self._enter("set_labels", name)
            pool = self.pools.get(cluster, {}).get(name)
            if pool is None:
                raise NotFoundError(f"404 node pool {name} not found")
            if pool.status in (STATUS_STOPPING, STATUS_RECONCILING):
                raise TransientError(_INCOMPATIBLE)
            self.pools[cluster][name] = dataclasses.replace(pool, labels=dict(labels))
            self.relabels.append((name, dict(labels), why))
            if resource_labels is not None:
                self.billing[name] = dict(resource_labels)
            return f"operation-{next(self._ops)}"

    def mark(self, cluster: str, name: str, status: str, message: str = "") -> None:
        """Change a pool's status (RUNNING, ERROR, STOPPING...)."""
        pool = self.pools[cluster][name]
        self.pools[cluster][name] = dataclasses.replace(pool, status=status, status_message=message)

    def get_operation(self, operation: str) -> OperationInfo:
        """Every fake operation is DONE at once."""
        self._enter("get_operation", operation)
        return OperationInfo(name=operation, status="DONE")

    def managed_names(self, cluster: str) -> list[str]:
        """Names of pools that are not being deleted."""
        return sorted(n for n, p in self.pools.get(cluster, {}).items() if p.status != STATUS_STOPPING)


def _field_match(obj: Mapping[str, Any], selector: str) -> bool:
    """``spec.nodeName`` / ``status.phase`` field selectors with =, == and != terms, ANDed by commas."""
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        negate = "!=" in term
        field, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        if field not in ("spec.nodeName", "status.phase", "metadata.name", "metadata.namespace"):
            raise RejectedError(f'400 field label not supported: "{field}"', 400)
        node: Any = obj
        for part in field.split("."):
            node = (node or {}).get(part) if isinstance(node, Mapping) else None
        if (str(node or "") == value) == negate:
            return False
    return True


def _label_match(obj_labels: Mapping[str, str], selector: str) -> bool:
    """``key`` (exists) and ``key=value`` label selector terms, ANDed by commas."""
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        key, eq, value = term.partition("=")
        if key not in obj_labels or (eq and obj_labels[key] != value):
            return False
    return True


def _merge_annotations(
    meta: dict[str, Any], annotations: Mapping[str, str | None], resource_version: str, what: str
) -> None:
    """A JSON merge patch of ``meta``'s annotations, as the API server applies one with a
    resourceVersion: 409 Conflict in its words when that is stale (None removes a key; every write
    bumps the version, "1" when the object had none)."""
    current = str(meta.setdefault("resourceVersion", "1"))
    if resource_version and resource_version != current:
        raise ConflictError(
            f"409 Operation cannot be fulfilled on {what}: the object has been modified; please apply "
            "your changes to the latest version and try again"
        )
    merged = dict(meta.get("annotations") or {})
    for key, value in annotations.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    meta["annotations"] = merged
    meta["resourceVersion"] = str(int(current) + 1)


class FakeKube:
    """``KubeAPI`` over dicts of pods, JobSets and Nodes; records Events aggregated like the recorder.

    ``arrivals`` models the scheduler racing a release: ``schedule()`` binds each queued
    ``(namespace, pod, node)`` pending pod to its node if (and only if) the node is schedulable,
    exactly as kube-scheduler never binds a new pod to a cordoned node. Tests call it at the worst
    moment, e.g. from ``FakeGke.before_delete``.
    """

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.jobsets: dict[tuple[str, str], dict[str, Any]] = {}
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.namespace_labels: dict[str, dict[str, str]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.arrivals: list[tuple[str, str, str]] = []
        self.cordons: list[tuple[str, bool, str]] = []
        self.annotations: list[tuple[str, str, dict[str, str | None], str]] = []
        self.before_annotate: Callable[[str, str], None] | None = None  # runs as an annotate arrives
        self.workloads: dict[tuple[str, str], dict[str, Any]] = {}
        self.flavors: dict[str, dict[str, Any]] = {}
        self.cluster_queues: dict[str, dict[str, Any]] = {}
        self.multikueue_clusters: dict[str, dict[str, Any]] = {}  # name -> object (a manager's)
        self.admission_checks: dict[str, str] = {}  # AdmissionCheck name -> its Active message ("" unset)
        self.check_writes: list[tuple[str, str, dict[str, Any]]] = []
        self.reads = 0
        self.down = False

    def _read(self) -> None:
        if self.down:
            raise TransientError("Kubernetes API unreachable: connection refused")
        self.reads += 1

    def add_pod(self, pod: dict[str, Any]) -> None:
        """Store a pod."""
        meta = pod["metadata"]
        self.pods[(meta.get("namespace", "default"), meta["name"])] = pod

    def add_jobset(self, jobset: dict[str, Any], jobs: bool = True) -> None:
        """Store a JobSet (with a resourceVersion, as the API server gives every object) and, unless
        ``jobs`` is False, the Jobs its controller creates (``expand_jobs``: the uids the pods of
        ``expand_pods`` name)."""
        meta = jobset["metadata"]
        meta.setdefault("resourceVersion", "1")
        self.jobsets[(meta.get("namespace", "default"), meta["name"])] = jobset
        if jobs:
            for job in expand_jobs(jobset):
                self.add_job(job)

    def add_job(self, job: dict[str, Any]) -> None:
        """Store a batch/v1 Job."""
        meta = job["metadata"]
        self.jobs[(meta.get("namespace", "default"), meta["name"])] = job

    def add_pool_nodes(self, pool: NodePoolInfo, cluster_name: str = "c") -> list[str]:
        """Register the Nodes GKE would for ``pool`` (one per VM, labelled with the pool's labels)."""
        names = []
        for index in range(pool.node_count):
            name = f"gke-{cluster_name}-{pool.name}-{index}"
            node_labels = {**pool.labels, keys.NODEPOOL: pool.name, "kubernetes.io/hostname": name}
            self.nodes[name] = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": node_labels},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},  # as its kubelet reports
            }
            names.append(name)
        return names

    def bind(self, namespace: str, pod: str, node: str) -> None:
        """Bind a pod to a node and mark it Running (what the scheduler and kubelet do)."""
        stored = self.pods[(namespace, pod)]
        stored.setdefault("spec", {})["nodeName"] = node
        stored["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}

    def get_pod(self, namespace: str, name: str) -> Pod:
        """One pod (parsed, as the adapter returns it) or NotFoundError."""
        self._read()
        try:
            return Pod.parse(self.pods[(namespace, name)])
        except KeyError:
            raise NotFoundError(f"404 pods {name!r} not found") from None

    def list_pods(
        self, namespace: str | None = None, label_selector: str = "", field_selector: str = ""
    ) -> list[Pod]:
        """Pods, filtered by namespace, label selector and field selector (parsed, as the adapter
        returns them)."""
        self._read()
        found = [
            Pod.parse(p)
            for (ns, _), p in sorted(self.pods.items())
            if (namespace is None or ns == namespace)
            and _label_match(p["metadata"].get("labels") or {}, label_selector)
            and _field_match(p, field_selector)
        ]
        return found

    def schedule(self) -> None:
        """Bind every queued arrival whose node is schedulable; the others keep waiting."""
        waiting = []
        for namespace, pod, node in self.arrivals:
            target = self.nodes.get(node)
            if target is None or (target.get("spec") or {}).get("unschedulable"):
                waiting.append((namespace, pod, node))
                continue
            self.bind(namespace, pod, node)
        self.arrivals = waiting

    def list_nodes(self, label_selector: str = "") -> list[Node]:
        """Nodes filtered by a label selector (parsed, as the adapter returns them)."""
        self._read()
        return [
            Node.parse(n)
            for _, n in sorted(self.nodes.items())
            if _label_match(n["metadata"].get("labels") or {}, label_selector)
        ]

    def set_unschedulable(self, node: str, unschedulable: bool, why: str) -> None:
        """Cordon or uncordon a node (with the product's annotation); 404 for a missing node."""
        if self.down:
            raise TransientError("Kubernetes API unreachable: connection refused")
        stored = self.nodes.get(node)
        if stored is None:
            raise NotFoundError(f'404 nodes "{node}" not found')
        annotations = stored["metadata"].setdefault("annotations", {})
        if unschedulable:
            stored.setdefault("spec", {})["unschedulable"] = True
            annotations[keys.CORDONED] = why
        else:
            stored.setdefault("spec", {}).pop("unschedulable", None)
            annotations.pop(keys.CORDONED, None)
        self.cordons.append((node, unschedulable, why))

    def get_jobset(self, namespace: str, name: str) -> JobSet:
        """One JobSet (parsed, as the adapter returns it) or NotFoundError."""
        self._read()
        try:
            return JobSet.parse(copy.deepcopy(self.jobsets[(namespace, name)]))
        except KeyError:
            raise NotFoundError(f"404 jobsets {name!r} not found") from None

    def get_namespace_labels(self, name: str) -> dict[str, str]:
        """A Namespace's labels (every namespace exists here; ``namespace_labels`` sets some)."""
        self._read()
        return dict(self.namespace_labels.get(name, {}))

    def get_job(self, namespace: str, name: str) -> Job:
        """One Job (parsed, as the adapter returns it) or NotFoundError."""
        self._read()
        try:
            return Job.parse(self.jobs[(namespace, name)])
        except KeyError:
            raise NotFoundError(f'404 jobs.batch "{name}" not found') from None

    def list_jobsets(self, namespace: str | None = None) -> list[JobSet]:
        """JobSets, optionally in one namespace (parsed, as the adapter returns them)."""
        self._read()
        return [
            JobSet.parse(copy.deepcopy(j))
            for (ns, _), j in sorted(self.jobsets.items())
            if namespace in (None, ns)
        ]

    def annotate_jobset(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        resource_version: str,
        why: str,
    ) -> JobSet:
        """Merge-patch a JobSet's annotations; 409 Conflict when ``resource_version`` is stale.

        Stored JobSets without a resourceVersion get "1"; every write bumps it, as the API server's.
        ``before_annotate`` (optional) runs first, e.g. to model a concurrent writer.
        """
        if self.before_annotate is not None:
            self.before_annotate(namespace, name)
        if self.down:
            raise TransientError("Kubernetes API unreachable: connection refused")
        stored = self.jobsets.get((namespace, name))
        if stored is None:
            raise NotFoundError(f'404 jobsets.jobset.x-k8s.io "{name}" not found')
        _merge_annotations(
            stored["metadata"], annotations, resource_version, f'jobsets.jobset.x-k8s.io "{name}"'
        )
        self.annotations.append((namespace, name, dict(annotations), why))
        return JobSet.parse(copy.deepcopy(stored))

    def touch_jobset(self, namespace: str, name: str) -> None:
        """Bump a JobSet's resourceVersion, as any other writer (e.g. its controller) would."""
        meta = self.jobsets[(namespace, name)]["metadata"]
        meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 1) + 1)

    def record_event(
        self, involved: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        """Keep the Event for assertions; a repeat of (object, reason, message) bumps its count."""
        meta = involved.get("metadata") or {}
        event = {
            "kind": involved.get("kind"),
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid", ""),
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
        }
        for existing in self.events:
            if {k: existing[k] for k in event} == event:
                existing["count"] += 1
                return
        self.events.append({**event, "count": 1})

    def reasons(self) -> list[str]:
        """The reasons of all recorded Events, in order."""
        return [e["reason"] for e in self.events]

    # -- Kueue (admission check) ---------------------------------------------------------------------

    def add_workload(self, workload: dict[str, Any]) -> None:
        """Store a Kueue Workload."""
        meta = workload["metadata"]
        self.workloads[(meta.get("namespace", "default"), meta["name"])] = workload

    def get_workload(self, namespace: str, name: str) -> WorkloadView:
        """One Workload's view or NotFoundError."""
        self._read()
        try:
            return parse_workload(self.workloads[(namespace, name)])
        except KeyError:
            raise NotFoundError(f'404 workloads.kueue.x-k8s.io "{name}" not found') from None

    def list_workloads(self, namespace: str | None = None) -> list[WorkloadView]:
        """Workloads' views, optionally in one namespace."""
        self._read()
        return [parse_workload(w) for (ns, _), w in sorted(self.workloads.items()) if namespace in (None, ns)]

    def get_multikueue_cluster(self, name: str) -> MultiKueueClusterView:
        """One MultiKueueCluster or NotFoundError."""
        self._read()
        try:
            return MultiKueueClusterView.parse(copy.deepcopy(self.multikueue_clusters[name]))
        except KeyError:
            raise NotFoundError(f'404 multikueueclusters.kueue.x-k8s.io "{name}" not found') from None

    def annotate_multikueue_cluster(
        self, name: str, annotations: Mapping[str, str | None], resource_version: str, why: str
    ) -> None:
        """Merge-patch its annotations; 409 Conflict when ``resource_version`` is stale."""
        if self.down:
            raise TransientError("Kubernetes API unreachable: connection refused")
        stored = self.multikueue_clusters.get(name)
        if stored is None:
            raise NotFoundError(f'404 multikueueclusters.kueue.x-k8s.io "{name}" not found')
        meta = stored.setdefault("metadata", {"name": name})
        _merge_annotations(meta, annotations, resource_version, f'multikueueclusters.kueue.x-k8s.io "{name}"')

    def get_cluster_queue(self, name: str) -> dict[str, Any]:
        """One ClusterQueue or NotFoundError."""
        self._read()
        try:
            return copy.deepcopy(self.cluster_queues[name])
        except KeyError:
            raise NotFoundError(f'404 clusterqueues.kueue.x-k8s.io "{name}" not found') from None

    def get_resource_flavor(self, name: str) -> dict[str, Any]:
        """One ResourceFlavor or NotFoundError."""
        self._read()
        try:
            return copy.deepcopy(self.flavors[name])
        except KeyError:
            raise NotFoundError(f'404 resourceflavors.kueue.x-k8s.io "{name}" not found') from None

    def set_admission_check_state(self, namespace: str, name: str, state: Mapping[str, Any]) -> None:
        """Replace the Workload's check entry of that name (as a server-side apply of a list map does)."""
        if self.down:
            raise TransientError("Kubernetes API unreachable: connection refused")
        stored = self.workloads.get((namespace, name))
        if stored is None:
            raise NotFoundError(f'404 workloads.kueue.x-k8s.io "{name}" not found')
        checks = stored.setdefault("status", {}).setdefault("admissionChecks", [])
        kept = [c for c in checks if c.get("name") != state.get("name")]
        stored["status"]["admissionChecks"] = [*kept, dict(state)]
        self.check_writes.append((namespace, name, dict(state)))

    def set_admission_check_active(self, name: str, message: str) -> None:
        """Record that the AdmissionCheck was marked Active."""
        if name not in self.admission_checks:
            raise NotFoundError(f'404 admissionchecks.kueue.x-k8s.io "{name}" not found')
        self.admission_checks[name] = message
