"""The stateful model behind the GKE emulator: clusters, node pools and long-running operations.

State is kept as raw protobuf messages of ``google.container.v1`` so that the HTTP layer can encode
responses exactly as the real service does (camelCase JSON, string or numeric enums). Operations
advance by the clock: each read (and the emulator's ticker) moves PENDING -> RUNNING -> DONE once
their delay has elapsed, and applies the operation's effect on the pool at DONE.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from google.cloud.container_v1.types import cluster_service as cs

from sandbox.emulators.gke.capacity import CapacityModel
from sandbox.emulators.gke.hooks import PoolDeletedHook, PoolReadyHook, PoolUpdatedHook
from sandbox.emulators.gke.operations import (
    API_BASE,
    OP_METHODS,
    Operation,
    now_rfc3339,
    operation_message,
    to_dict,
)
from sandbox.emulators.gke.pool_capacity import PoolCapacity
from sandbox.emulators.gke.rules import (
    ApiError,
    PolicyLookup,
    check_node_labels,
    check_placement_policy,
    validate_create,
)
from sandbox.emulators.gke.seeds import ClusterSeed
from sandbox.emulators.gke.timing import Draw

_log = logging.getLogger("sandbox.gke")

NodePoolPb: Any = cs.NodePool.pb()
ClusterPb: Any = cs.Cluster.pb()
ListClustersResponsePb: Any = cs.ListClustersResponse.pb()


def label_fingerprint(labels: dict[str, str]) -> str:
    """An 8-hex-digit fingerprint of a label set, shaped as GKE's labelFingerprint ("a9dc16a7")."""
    text = ",".join(f"{key}={labels[key]}" for key in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class GkeState:
    """Clusters, pools and operations; every public method is thread-safe."""

    def __init__(
        self,
        clusters: list[ClusterSeed],
        op_delay: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        capacity: CapacityModel | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._clock = clock
        self.capacity = PoolCapacity(capacity or CapacityModel(clock))
        self._clusters = {seed.path: seed for seed in clusters}
        self._pools: dict[str, dict[str, Any]] = {seed.path: {} for seed in clusters}
        self._labels: dict[str, dict[str, str]] = {seed.path: dict(seed.resource_labels) for seed in clusters}
        self._ops: dict[str, Operation] = {}
        self._busy: dict[tuple[str, str], str] = {}  # (cluster, pool) -> running operation id
        self._op_ids = itertools.count(1)
        self._op_delay = op_delay
        self._op_duration: Draw | None = None
        self._op_limit = 0  # concurrent node-pool operations per cluster; 0 = unlimited
        self._strict = False
        self._ready_hooks: list[PoolReadyHook] = []
        self._deleted_hooks: list[PoolDeletedHook] = []
        self._updated_hooks: list[PoolUpdatedHook] = []
        self._op_hooks: list[Callable[[str, str, str, str], None]] = []
        self._policy_lookup: PolicyLookup | None = None  # off: named placement policies are not checked

    # -- configuration --------------------------------------------------------------------------

    def set_op_delay(self, seconds: float) -> None:
        """Delay for operations started from now on (running ones keep theirs)."""
        if seconds < 0:
            raise ValueError("op delay must be >= 0")
        with self._lock:
            self._op_delay = seconds

    def set_op_durations(self, draw: Draw | None) -> None:
        """Draw each new operation's duration from ``draw`` (None: back to the fixed op delay)."""
        with self._lock:
            self._op_duration = draw

    def set_operation_limit(self, limit: int) -> None:
        """Allow at most ``limit`` running node-pool operations per cluster (0: no limit).

        GKE enforces a per-cluster concurrent-operations quota (historically 5) and answers a
        mutation beyond it with 429 RESOURCE_EXHAUSTED "Too many operations ...".
        """
        if limit < 0:
            raise ValueError("operation limit must be >= 0")
        with self._lock:
            self._op_limit = limit

    def running_operations(self, path: str) -> int:
        """How many operations of the cluster are not DONE yet."""
        self.advance()
        with self._lock:
            return sum(1 for op in self._ops.values() if not op.done and op.cluster.path == path)

    def set_policy_lookup(self, lookup: PolicyLookup | None) -> None:
        """Check that a pool's named placement policy exists, via ``lookup`` (None: no check)."""
        with self._lock:
            self._policy_lookup = lookup

    def set_strict_cluster_ops(self, strict: bool = True) -> None:
        """When strict, any running operation blocks other mutations on the same cluster."""
        with self._lock:
            self._strict = strict

    def on_pool_ready(self, callback: PoolReadyHook) -> None:
        """Call ``callback(cluster_path, pool_json)`` whenever a create operation finishes well."""
        with self._lock:
            self._ready_hooks.append(callback)

    def on_pool_deleted(self, callback: PoolDeletedHook) -> None:
        """Call ``callback(cluster_path, pool_name)`` whenever a pool disappears."""
        with self._lock:
            self._deleted_hooks.append(callback)

    def on_operation_done(self, callback: Callable[[str, str, str, str], None]) -> None:
        """Call ``callback(cluster_path, pool, method, error)`` when any node-pool operation ends.

        ``method`` is the API method ("CreateNodePool", "DeleteNodePool", "UpdateNodePool"); this is
        what GKE's Admin Activity audit log records with ``operation.last`` for the same moment.
        """
        with self._lock:
            self._op_hooks.append(callback)

    def on_pool_updated(self, callback: PoolUpdatedHook) -> None:
        """Call ``callback(cluster_path, pool_json)`` whenever an update operation finishes."""
        with self._lock:
            self._updated_hooks.append(callback)

    # -- reads ----------------------------------------------------------------------------------

    def cluster(self, path: str) -> ClusterSeed:
        """The seed of a known cluster; 404 otherwise."""
        seed = self._clusters.get(path)
        if seed is None:
            raise ApiError(404, "NOT_FOUND", f"Not found: {path}.")
        return seed

    def get_cluster(self, path: str) -> Any:
        """The Cluster message, with its current node pools."""
        self.advance()
        with self._lock:
            return self._cluster_message(self.cluster(path))

    def list_clusters(self, project: str, location: str) -> Any:
        """ListClustersResponse for ``projects/P/locations/L``: "-" matches every zone and region
        (GKE's projects.locations.clusters.list reference); a project without clusters lists none."""
        self.advance()
        with self._lock:
            response = ListClustersResponsePb()
            for seed in self._clusters.values():
                if seed.project == project and location in ("-", seed.location):
                    response.clusters.append(self._cluster_message(seed))
            return response

    def set_resource_labels(self, path: str, labels: dict[str, str], fingerprint: str) -> Any:
        """Replace the cluster's resource labels, as setResourceLabels does: the request must carry
        the fingerprint of the labels it replaces. GKE answers a stale or missing one with a 400
        FAILED_PRECONDITION whose text is quoted in public reports (e.g. crossplane-contrib/
        provider-gcp#477, GoogleCloudPlatform/k8s-config-connector#110)."""
        with self._lock:
            seed = self.cluster(path)
            expected = label_fingerprint(self._labels[path])
            if fingerprint != expected:
                raise ApiError(
                    400,
                    "FAILED_PRECONDITION",
                    "Labels could not be set due to fingerprint mismatch; try again with the proper "
                    f'fingerprint: incorrect fingerprint supplied was "{fingerprint}", the expected '
                    f'one is "{expected}".',
                )
            self._labels[path] = dict(labels)
            op_id = f"operation-{next(self._op_ids)}"
            start = now_rfc3339()
            op = Operation(op_id, seed, cs.Operation.Type.SET_LABELS, "", self._clock(), 0.0, start)
            op.done, op.end_time = True, now_rfc3339()
            self._ops[op_id] = op
            message = operation_message(op, self._clock())
            message.target_link = f"{API_BASE}/{path}"
            return message

    def _cluster_message(self, seed: ClusterSeed) -> Any:
        """The Cluster message of ``seed`` as it stands (called under the lock)."""
        path = seed.path
        cluster = ClusterPb(
            name=seed.name,
            location=seed.location,
            locations=list(seed.locations),
            status=cs.Cluster.Status.RUNNING,
            self_link=f"{API_BASE}/{path}",
            current_master_version="1.31.1-gke.1000000",
            label_fingerprint=label_fingerprint(self._labels[path]),
        )
        cluster.resource_labels.update(self._labels[path])
        cluster.master_auth.cluster_ca_certificate = seed.ca_certificate_b64
        seed.fill_endpoints(cluster)
        if seed.workload_pool:
            cluster.workload_identity_config.workload_pool = seed.workload_pool
        if seed.release_channel:
            # proto-plus enums subclass an untyped base, so mypy cannot see EnumMeta's lookup by name.
            channels: Any = cs.ReleaseChannel.Channel
            cluster.release_channel.channel = channels[seed.release_channel]
        for pool in self._pools[path].values():
            cluster.node_pools.append(pool)
        return cluster

    def list_pools(self, path: str) -> list[Any]:
        """Copies of the cluster's pools in creation order."""
        self.advance()
        with self._lock:
            self.cluster(path)
            return [self._copy(pool) for pool in self._pools[path].values()]

    def get_pool(self, path: str, name: str) -> Any:
        """One pool; 404 when the cluster or the pool is unknown."""
        self.advance()
        with self._lock:
            self.cluster(path)
            pool = self._pools[path].get(name)
            if pool is None:
                raise ApiError(404, "NOT_FOUND", f"Not found: {path}/nodePools/{name}.")
            return self._copy(pool)

    def get_operation(self, project: str, location: str, op_id: str) -> Any:
        """One operation, addressed by ``projects/P/locations/L/operations/O``."""
        self.advance()
        with self._lock:
            op = self._ops.get(op_id)
            if op is None or op.cluster.project != project or op.cluster.location != location:
                raise ApiError(404, "NOT_FOUND", f"Not found: operation {op_id}.")
            return operation_message(op, self._clock())

    def node_counts(self, path: str, name: str) -> dict[str, int]:
        """The pool's current nodes per zone (emulator-internal: GKE's NodePool has no such field)."""
        self.advance()
        return self.capacity.nodes(f"{path}/nodePools/{name}")

    def pools_json(self, path: str) -> list[dict[str, Any]]:
        """The cluster's pools as JSON dicts (for tests and the sandbox)."""
        return [to_dict(pool) for pool in self.list_pools(path)]

    # -- mutations ------------------------------------------------------------------------------

    def create_pool(self, path: str, pool: Any, stockout: Callable[[str], str | None]) -> Any:
        """Validate and start creating ``pool``; ``stockout(machine_type)`` says whether it will fail."""
        self.advance()
        with self._lock:
            seed = self.cluster(path)
            validate_create(pool, seed.location, seed.release_channel, seed.workload_pool)
            if self._policy_lookup is not None:
                check_placement_policy(pool, seed.project, seed.location, self._policy_lookup)
            if pool.name in self._pools[path]:
                raise ApiError(409, "ALREADY_EXISTS", f"Already exists: {path}/nodePools/{pool.name}.")
            self._check_compatible(path, pool.name)
            stored = self._copy(pool)
            if not stored.locations:
                stored.locations.extend(seed.locations)
            if not stored.config.machine_type:
                stored.config.machine_type = "e2-medium"
            # What GKE reports for fields a create left unset (NodeConfig reference: the "default"
            # service account, a 100 GB boot disk; surge upgrades of one node), so config-drift
            # comparisons meet GKE's answers rather than the request echoed back.
            if not stored.config.service_account:
                stored.config.service_account = "default"
            if not stored.config.disk_size_gb:
                stored.config.disk_size_gb = 100
            if not stored.HasField("upgrade_settings"):
                stored.upgrade_settings.max_surge = 1
            stored.status = cs.NodePool.Status.PROVISIONING
            stored.self_link = f"{API_BASE}/{path}/nodePools/{pool.name}"
            stored.version = "1.31.1-gke.1000000"
            self.capacity.admit(f"{path}/nodePools/{pool.name}", stored, seed.project)
            op = self._start(seed, cs.Operation.Type.CREATE_NODE_POOL, pool.name)
            op.error = stockout(stored.config.machine_type) or ""
            if op.error:
                op.error = op.error.replace("{zone}", stored.locations[0] if stored.locations else "")
            self._pools[path][pool.name] = stored
        return self._after_start(op)

    def delete_pool(self, path: str, name: str) -> Any:
        """Start deleting a pool: it goes STOPPING and disappears when the operation is DONE."""
        self.advance()
        with self._lock:
            seed = self.cluster(path)
            pool = self._pools[path].get(name)
            if pool is None:
                raise ApiError(404, "NOT_FOUND", f"Not found: {path}/nodePools/{name}.")
            self._check_compatible(path, name)
            pool.status = cs.NodePool.Status.STOPPING
            pool.status_message = ""
            op = self._start(seed, cs.Operation.Type.DELETE_NODE_POOL, name)
        return self._after_start(op)

    def update_pool(self, path: str, name: str, request: Any) -> Any:
        """Start an ``UpdateNodePool``: the new node (and resource) labels show at once, the pool is
        RECONCILING until the UPGRADE_NODES operation is DONE (then the update hooks relabel the nodes)."""
        self.advance()
        with self._lock:
            seed = self.cluster(path)
            pool = self._pools[path].get(name)
            if pool is None:
                raise ApiError(404, "NOT_FOUND", f"Not found: {path}/nodePools/{name}.")
            if request.HasField("labels"):
                check_node_labels(request.labels.labels)
            self._check_compatible(path, name)
            if request.HasField("labels"):
                # NodeLabels replaces every node label of the pool (it does not merge).
                pool.config.ClearField("labels")
                pool.config.labels.update(dict(request.labels.labels))
            if request.HasField("resource_labels"):
                # ResourceLabels replaces the pool's labels on its Compute Engine resources too.
                pool.config.ClearField("resource_labels")
                pool.config.resource_labels.update(dict(request.resource_labels.labels))
            pool.status = cs.NodePool.Status.RECONCILING
            op = self._start(seed, cs.Operation.Type.UPGRADE_NODES, name)
        return self._after_start(op)

    def finish_operations(self) -> None:
        """Complete every running operation now (for tests that do not want to wait)."""
        with self._lock:
            for op in self._ops.values():
                op.delay = 0.0
        self.advance()

    def advance(self) -> None:
        """Move operations along by the clock and run the hooks of the ones that just finished."""
        fired: list[Callable[[], None]] = []
        with self._lock:
            now = self._clock()
            for op in self._ops.values():
                if not op.done and now - op.started >= op.delay:
                    fired.extend(self._finish(op))
            fired.extend(self._grant_flex_start())
        for hook in fired:
            try:
                hook()
            except Exception:
                _log.exception("GKE emulator hook failed")

    # -- internals ------------------------------------------------------------------------------

    @staticmethod
    def _copy(message: Any) -> Any:
        clone = type(message)()
        clone.CopyFrom(message)
        return clone

    def _after_start(self, op: Operation) -> Any:
        # With no delay the operation is already DONE when the call returns (hooks included).
        self.advance()
        with self._lock:
            return operation_message(op, self._clock())

    def _check_compatible(self, path: str, pool: str) -> None:
        running = self._busy.get((path, pool))
        if running is None and self._strict:
            running = next((op for (cluster, _), op in self._busy.items() if cluster == path), None)
        if running is not None:
            raise ApiError(
                400, "FAILED_PRECONDITION", f"Cluster is running incompatible operation {running}."
            )
        if self._op_limit:
            busy = sum(1 for op in self._ops.values() if not op.done and op.cluster.path == path)
            if busy >= self._op_limit:
                # GKE's wording for the per-cluster concurrent-operations quota (a 429).
                raise ApiError(
                    429,
                    "RESOURCE_EXHAUSTED",
                    f'Too many operations: cluster "{path.rsplit("/", 1)[-1]}" hits the concurrent '
                    f"operations quota {self._op_limit}, please try again later.",
                )

    def _start(self, seed: ClusterSeed, op_type: int, pool: str) -> Operation:
        op_id = f"operation-{next(self._op_ids)}"
        delay = max(0.0, self._op_duration()) if self._op_duration is not None else self._op_delay
        op = Operation(op_id, seed, op_type, pool, self._clock(), delay, now_rfc3339())
        self._ops[op_id] = op
        self._busy[(seed.path, pool)] = op_id
        return op

    def _finish(self, op: Operation) -> list[Callable[[], None]]:
        hooks = self._finish_pool(op)
        method = OP_METHODS.get(op.op_type)
        if method:
            path = op.cluster.path
            hooks += [functools.partial(h, path, op.pool, method, op.error) for h in self._op_hooks]
        return hooks

    def _finish_pool(self, op: Operation) -> list[Callable[[], None]]:
        op.done = True
        op.end_time = now_rfc3339()
        path = op.cluster.path
        self._busy.pop((path, op.pool), None)
        pool = self._pools[path].get(op.pool)
        if pool is None:
            return []
        key = f"{path}/nodePools/{op.pool}"
        if op.op_type == cs.Operation.Type.DELETE_NODE_POOL:
            del self._pools[path][op.pool]
            self.capacity.deleted(key)
            name = op.pool
            return [functools.partial(hook, path, name) for hook in self._deleted_hooks]
        if op.op_type == cs.Operation.Type.UPGRADE_NODES:
            pool.status = cs.NodePool.Status.RUNNING
            updated = self.capacity.snapshot(key, to_dict(pool))
            return [functools.partial(hook, path, dict(updated)) for hook in self._updated_hooks]
        if op.error:
            self.capacity.failed(key)
        else:
            op.error = self.capacity.created(key, pool)
        if op.error:
            pool.status = cs.NodePool.Status.ERROR
            pool.status_message = op.error
            return []
        pool.status = cs.NodePool.Status.RUNNING
        snapshot = self.capacity.snapshot(key, to_dict(pool))
        return [functools.partial(hook, path, dict(snapshot)) for hook in self._ready_hooks]

    def _grant_flex_start(self) -> list[Callable[[], None]]:
        # A flex-start pool that just got its whole slice: the ready hooks see it again, now with nodes.
        hooks: list[Callable[[], None]] = []
        for key in self.capacity.poll():
            path, name = key.split("/nodePools/", 1)
            pool = self._pools.get(path, {}).get(name)
            if pool is not None:
                snapshot = self.capacity.snapshot(key, to_dict(pool))
                hooks += [functools.partial(hook, path, dict(snapshot)) for hook in self._ready_hooks]
        return hooks
