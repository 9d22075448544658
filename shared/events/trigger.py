"""Which cluster a setup message asks for.

The setup topic receives either a manual message naming a cluster --
``{"cluster": "projects/P/locations/L/clusters/C"}`` or ``{"project", "location", "cluster"}`` --
or, through a log sink, the GKE Admin Activity audit entry of ``CreateCluster``. Only the last
entry of the creation operation means the cluster is ready; the first one (operation started)
and failed creations are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.core.errors import InvalidInputError, Skip
from shared.events.fields import AUDIT_LOG_TYPE, ClusterId, clip, cluster_from_labels

CREATE_CLUSTER_METHODS = (
    "google.container.v1.ClusterManager.CreateCluster",
    "google.container.v1beta1.ClusterManager.CreateCluster",
)


def _cluster_from_message(doc: Mapping[str, Any]) -> ClusterId:
    cluster = doc.get("cluster")
    if not isinstance(cluster, str) or not cluster:
        raise InvalidInputError('setup message must name "cluster"')
    if "/" in cluster:
        extra = sorted(set(doc) & {"project", "location"})
        if extra:
            raise InvalidInputError(f"give either a cluster path or {extra} with a cluster name, not both")
        return ClusterId.from_path(cluster)
    try:
        return cluster_from_labels(
            {"project_id": doc.get("project"), "location": doc.get("location"), "cluster_name": cluster}
        )
    except Skip as skip:
        # Speak in the message's field names, not in the monitored-resource label names.
        reason = skip.reason.replace("resource label ", "").replace("project_id", "project")
        raise InvalidInputError(f"setup message: {reason.replace('cluster_name', 'cluster')}") from None


def _cluster_from_audit(entry: Mapping[str, Any]) -> tuple[ClusterId | None, str]:
    proto = entry["protoPayload"]
    if not isinstance(proto, Mapping) or proto.get("@type") != AUDIT_LOG_TYPE:
        raise InvalidInputError("protoPayload is not an AuditLog")
    method = proto.get("methodName")
    if method not in CREATE_CLUSTER_METHODS:
        return None, f"audit entry for {clip(method)}, not a cluster creation"
    operation = entry.get("operation")
    if not isinstance(operation, Mapping) or operation.get("last") is not True:
        return None, "cluster creation is still running (not the operation's last entry)"
    status = proto.get("status")
    code = status.get("code", 0) if isinstance(status, Mapping) else 0
    if code:
        return None, f"cluster creation failed (status code {clip(code)})"
    resource = entry.get("resource")
    labels = resource.get("labels") if isinstance(resource, Mapping) else None
    if isinstance(labels, Mapping) and labels.get("cluster_name"):
        try:
            return cluster_from_labels(labels), ""
        except Skip as skip:
            raise InvalidInputError(skip.reason) from None
    name = proto.get("resourceName")
    if isinstance(name, str):
        # v1 audit entries may still name the cluster by zone: projects/P/zones/Z/clusters/C.
        return ClusterId.from_path(name.replace("/zones/", "/locations/", 1)), ""
    raise InvalidInputError("cluster creation audit entry names no cluster")


# The Pub/Sub message attribute naming the cluster a queue configuration is for (apply_kueue):
# ``gcloud pubsub topics publish TOPIC --message-file=F``
# ``--attribute=cluster=projects/P/locations/L/clusters/C``.
# Without it the configuration is the managed cluster's.
KUEUE_CLUSTER_ATTRIBUTE = "cluster"


def parse_setup_payload(payload: bytes) -> tuple[ClusterId | None, str]:
    """The cluster to set up, or (None, why the message is ignored); malformed -> InvalidInputError."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        raise InvalidInputError("setup message is not JSON") from None
    if not isinstance(doc, Mapping):
        raise InvalidInputError(f"setup message is a JSON {type(doc).__name__}, not an object")
    if "protoPayload" in doc:
        return _cluster_from_audit(doc)
    return _cluster_from_message(doc), ""
