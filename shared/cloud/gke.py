"""``NodePoolAPI`` over the real ``google.cloud.container_v1.ClusterManagerClient``.

Production uses the default gRPC transport with Application Default Credentials; tests and the
sandbox point the adapter at ``http://127.0.0.1:PORT`` (the GKE emulator), which switches to the REST
transport with anonymous credentials. The Google client is imported and built on first use only:
importing it costs far more than a cold start should pay for a message that never reaches GKE.

Library exceptions never leave this module: ``shared.cloud.errors`` (the one mapping GKE, Compute
Engine and Kubernetes share) turns each into ``shared.core.errors`` once, here.
The client library's own retries are switched off: Pub/Sub redelivery is the product's retry, and a
call must fit in the few seconds an Eventarc delivery has.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from shared.cloud.errors import from_google
from shared.cloud.gke_messages import (
    cluster_to_info,
    listing_of,
    node_pool_to_info,
    operation_to_info,
    spec_to_node_pool,
)
from shared.core.errors import RejectedError
from shared.tpu.nodepools import ClusterInfo, ClusterListing, NodePoolInfo, NodePoolSpec, OperationInfo

if TYPE_CHECKING:
    from google.cloud.container_v1 import ClusterManagerClient

_log = logging.getLogger("tpuprov.gke")

_CLUSTER_PATH = re.compile(r"^projects/([^/]+)/locations/([^/]+)/clusters/[^/]+$")


def _location_parent(cluster: str) -> str:
    match = _CLUSTER_PATH.match(cluster)
    if match is None:
        raise RejectedError(f"{cluster!r} is not a cluster path projects/P/locations/L/clusters/C", 400)
    return f"projects/{match.group(1)}/locations/{match.group(2)}"


def _raise_translated(exc: Exception, what: str) -> NoReturn:
    """Re-raise a client-library failure as the product's error (``shared.cloud.errors``)."""
    raise from_google(exc, "GKE", what) from exc


def emulator_credentials(access_token: str) -> Any:
    """Credentials for a local emulator endpoint: the given bearer token (the sandbox's per-function
    identity, which the emulators authorize as Google would a service account), else anonymous."""
    if access_token:
        from google.oauth2.credentials import Credentials

        return Credentials(token=access_token)
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()


class GkeNodePoolAPI:
    """The production ``NodePoolAPI``: thin calls, error translation, nothing else."""

    def __init__(self, endpoint: str = "", timeout: float = 8.0, access_token: str = "") -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self.access_token = access_token
        self._client: ClusterManagerClient | None = None
        self._client_lock = threading.Lock()

    @property
    def client(self) -> ClusterManagerClient:
        """The underlying client, built (and the library imported) on first use."""
        with self._client_lock:
            if self._client is None:
                self._client = self._build_client()
            return self._client

    def _build_client(self) -> ClusterManagerClient:
        from google.cloud import container_v1 as gke

        if not self.endpoint:
            return gke.ClusterManagerClient()
        # The REST transport keeps an explicit "http://" in api_endpoint (it only adds https:// when no
        # scheme is given), which is what a plain-HTTP local emulator needs.
        return gke.ClusterManagerClient(
            transport="rest",
            client_options={"api_endpoint": self.endpoint},
            credentials=emulator_credentials(self.access_token),
        )

    def _call(self, what: str, method: str, **request: Any) -> Any:
        try:
            return getattr(self.client, method)(retry=None, timeout=self.timeout, **request)
        except Exception as exc:
            _raise_translated(exc, what)

    def get_cluster(self, cluster: str) -> ClusterInfo:
        """Fetch the cluster. Raises NotFoundError."""
        return cluster_to_info(self._call(f"get cluster {cluster}", "get_cluster", name=cluster))

    def list_clusters(self, project: str) -> ClusterListing:
        """Every cluster of the project (location "-": all zones and regions)."""
        parent = f"projects/{project}/locations/-"
        return listing_of(self._call(f"list clusters of {parent}", "list_clusters", parent=parent), project)

    def list_node_pools(self, cluster: str) -> list[NodePoolInfo]:
        """All node pools of the cluster."""
        response = self._call(f"list node pools of {cluster}", "list_node_pools", parent=cluster)
        return [node_pool_to_info(pool) for pool in response.node_pools]

    def get_node_pool(self, cluster: str, name: str) -> NodePoolInfo:
        """One node pool. Raises NotFoundError."""
        path = f"{cluster}/nodePools/{name}"
        return node_pool_to_info(self._call(f"get node pool {path}", "get_node_pool", name=path))

    def create_node_pool(self, cluster: str, spec: NodePoolSpec, why: str) -> str:
        """Start creating a pool and return its operation path; never waits for it."""
        parent = _location_parent(cluster)
        _log.info(
            "creating node pool %s in %s: %s",
            spec.name,
            cluster,
            why,
            extra={
                "fields": {"event": "gke.create_node_pool", "pool": spec.name, "cluster": cluster, "why": why}
            },
        )
        operation = self._call(
            f"create node pool {spec.name} in {cluster}",
            "create_node_pool",
            parent=cluster,
            node_pool=spec_to_node_pool(spec),
        )
        return operation_to_info(operation, parent).name

    def delete_node_pool(self, cluster: str, name: str, why: str) -> str:
        """Start deleting a pool and return its operation path; never waits for it."""
        parent = _location_parent(cluster)
        path = f"{cluster}/nodePools/{name}"
        _log.info(
            "deleting node pool %s in %s: %s",
            name,
            cluster,
            why,
            extra={"fields": {"event": "gke.delete_node_pool", "pool": name, "cluster": cluster, "why": why}},
        )
        operation = self._call(f"delete node pool {path}", "delete_node_pool", name=path)
        return operation_to_info(operation, parent).name

    def set_node_pool_labels(
        self,
        cluster: str,
        name: str,
        labels: Mapping[str, str],
        why: str,
        resource_labels: Mapping[str, str] | None = None,
    ) -> str:
        """Replace the pool's node labels (and resource labels) through ``UpdateNodePool``; return the
        operation path.

        ``UpdateNodePoolRequest.labels`` (a ``NodeLabels``) replaces every node label of the pool and
        GKE applies them to the running nodes without recreating them. ``resource_labels`` (a
        ``ResourceLabels``, the labels GKE puts on the pool's Compute Engine resources, which billing
        exports group by) goes in the same request, so a handover is one operation: GKE runs one at a
        time per pool, and a second call right after the first would be refused as incompatible. Only
        a location change must be sent alone (the field's documentation); nothing else is sent.
        """
        from google.cloud import container_v1 as gke

        parent = _location_parent(cluster)
        path = f"{cluster}/nodePools/{name}"
        _log.info(
            "relabelling node pool %s in %s: %s",
            name,
            cluster,
            why,
            extra={
                "fields": {"event": "gke.set_node_pool_labels", "pool": name, "cluster": cluster, "why": why}
            },
        )
        request = gke.UpdateNodePoolRequest(name=path, labels=gke.NodeLabels(labels=dict(labels)))
        if resource_labels is not None:
            request.resource_labels = gke.ResourceLabels(labels=dict(resource_labels))
        operation = self._call(f"relabel node pool {path}", "update_node_pool", request=request)
        return operation_to_info(operation, parent).name

    def get_operation(self, operation: str) -> OperationInfo:
        """Fetch an operation by its resource path."""
        parent = operation.rsplit("/operations/", 1)[0]
        return operation_to_info(
            self._call(f"get operation {operation}", "get_operation", name=operation), parent
        )
