"""Build LogEntry dicts as GKE writes them, and wrap them the way Pub/Sub and Eventarc deliver them.

The inverse of ``shared.events.envelope`` (no function builds one): ``tpuprov publish`` writes the
messages a user publishes by hand with them, and the sandbox's log router and the tests produce inputs
indistinguishable from production ones.

Shapes follow the producers:

* Kubernetes Events go through GKE's event exporter, which serializes the core/v1 Event into
  ``jsonPayload`` minus ``count``, ``firstTimestamp`` and ``lastTimestamp`` (the entry's
  ``timestamp`` carries the last occurrence), logs Pod events against ``k8s_pod`` (only when the
  Event's namespace matches the Pod's), Node events against ``k8s_node`` and everything else
  against ``k8s_cluster``, and adds ``logging.gke.io/top_level_controller_*`` labels for pods.
  Events recorded through events.k8s.io/v1 (kube-scheduler, newer JobSet) are read back through
  the core/v1 view, so they appear with ``reportingComponent``/``action``/``eventTime``.
* JobSet deletions are GKE Admin Activity audit entries (``cloudaudit.googleapis.com%2Factivity``).
* Log sinks publish the LogEntry JSON as the Pub/Sub message data with a
  ``logging.googleapis.com/timestamp`` attribute; push and Eventarc bodies repeat ``messageId``
  and ``publishTime`` in snake_case.
"""

from __future__ import annotations

import base64
import copy
import json
import secrets
import string
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from shared.events.envelope import PUBSUB_EVENT_TYPE
from shared.events.fields import ClusterId, format_timestamp, parse_timestamp

EVENTS_LOG_ID = "events"
ACTIVITY_LOG_ID = "cloudaudit.googleapis.com%2Factivity"
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
TTL_CONTROLLER_PRINCIPAL = "system:serviceaccount:jobset-system:jobset-controller-manager"
DEFAULT_FAILED_SCHEDULING_MESSAGE = (
    "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)
INSUFFICIENT_TPU_MESSAGE = (
    "0/4 nodes are available: 4 Insufficient google.com/tpu. "
    "preemption: 0/4 nodes are available: 4 No preemption victims found for incoming pod."
)
# The exporter logs Node events against k8s_node only from namespaces where kubelet and the node
# controller write them.
_NODE_EVENT_NAMESPACES = frozenset({"default", "kube-system", "kube-node-lease"})
_DROPPED_BY_EXPORTER = ("count", "firstTimestamp", "lastTimestamp")
_RECEIVE_DELAY = timedelta(milliseconds=870)

# reason -> (reporting component, recorded through events.k8s.io?, type, default message)
_POD_REASONS: dict[str, tuple[str, bool, str, str]] = {
    "FailedScheduling": ("default-scheduler", True, "Warning", DEFAULT_FAILED_SCHEDULING_MESSAGE),
    "Scheduled": ("default-scheduler", True, "Normal", "Successfully assigned {ns}/{pod} to a node"),
    "NotTriggerScaleUp": (
        "cluster-autoscaler",
        False,
        "Normal",
        "pod didn't trigger scale-up: 2 node(s) didn't match Pod's node affinity/selector",
    ),
    "Pulled": ("kubelet", False, "Normal", "Container image already present on machine"),
}
# Reason -> (type, message) as the JobSet controller records them.
_JOBSET_REASONS: dict[str, tuple[str, str]] = {
    "AllJobsCompleted": ("Normal", "jobset completed successfully"),
    "FailedJobs": ("Warning", "jobset failed due to one or more job failures"),
    "ReachedMaxRestarts": ("Warning", "jobset failed due to reaching max number of restarts"),
    "FailJobSetFailurePolicyAction": ("Warning", "applying FailJobSet failure policy action"),
    "DeadlineExceeded": ("Warning", "JobSet was active for longer than the specified deadline"),
    "SuspendedJobs": ("Normal", "jobset is suspended"),
    "ResumeJobs": ("Normal", "jobset is resumed"),
    "Restarting": ("Warning", "restarting jobset"),
}
_GRPC_CODE_NAMES = {5: "NOT_FOUND", 7: "PERMISSION_DENIED", 9: "FAILED_PRECONDITION", 13: "INTERNAL"}


def _now() -> datetime:
    return datetime.now(UTC)


def _insert_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(14))


def _uid() -> str:
    return str(uuid.uuid4())


def _resource(cluster: ClusterId, type_: str, **extra: str) -> dict[str, Any]:
    labels = {"project_id": cluster.project, "location": cluster.location, "cluster_name": cluster.name}
    labels.update(extra)
    return {"type": type_, "labels": labels}


def _core_view(event: Mapping[str, Any]) -> dict[str, Any]:
    """An events.k8s.io/v1 Event as the core/v1 API (and hence the exporter) presents it."""
    renames = {
        "regarding": "involvedObject",
        "note": "message",
        "reportingController": "reportingComponent",
        "deprecatedSource": "source",
        "deprecatedFirstTimestamp": "firstTimestamp",
        "deprecatedLastTimestamp": "lastTimestamp",
        "deprecatedCount": "count",
    }
    out = {renames.get(key, key): value for key, value in event.items()}
    out["apiVersion"] = "v1"
    out.setdefault("source", {})
    return out


def kube_event_entry(
    cluster: ClusterId,
    event: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
    insert_id: str | None = None,
) -> dict[str, Any]:
    """The LogEntry GKE's exporter writes for one Kubernetes Event (core/v1 or events.k8s.io/v1 dict).

    ``event`` is the API's JSON form (for kubernetes-client objects use
    ``ApiClient().sanitize_for_serialization``). ``labels`` are the entry labels the exporter
    derives from the Pod (its top-level controller).
    """
    payload = copy.deepcopy(dict(event))
    if str(payload.get("apiVersion", "")).startswith("events.k8s.io/"):
        payload = _core_view(payload)
    payload.setdefault("apiVersion", "v1")
    payload.setdefault("kind", "Event")
    obj = payload.get("involvedObject") or {}
    meta = payload.get("metadata") or {}
    series = payload.get("series") or {}
    event_ns = meta.get("namespace", "")
    if obj.get("kind") == "Pod" and event_ns and event_ns == obj.get("namespace"):
        resource = _resource(cluster, "k8s_pod", namespace_name=event_ns, pod_name=obj.get("name", ""))
    elif obj.get("kind") == "Node" and event_ns in _NODE_EVENT_NAMESPACES:
        resource = _resource(cluster, "k8s_node", node_name=obj.get("name", ""))
    else:
        resource = _resource(cluster, "k8s_cluster")
    when = _now()
    for candidate in (
        payload.get("lastTimestamp"),
        series.get("lastObservedTime"),
        payload.get("eventTime"),
        payload.get("firstTimestamp"),
    ):
        parsed = parse_timestamp(candidate)
        if parsed is not None:
            when = parsed
            break
    for key in _DROPPED_BY_EXPORTER:
        payload.pop(key, None)
    entry: dict[str, Any] = {
        "insertId": insert_id or _insert_id(),
        "jsonPayload": payload,
        "logName": f"projects/{cluster.project}/logs/{EVENTS_LOG_ID}",
        "receiveTimestamp": format_timestamp(when + _RECEIVE_DELAY),
        "resource": resource,
        "severity": "WARNING" if payload.get("type") == "Warning" else "INFO",
        "timestamp": format_timestamp(when),
    }
    if labels:
        entry["labels"] = dict(labels)
    return entry


def _event_object(
    *,
    namespace: str,
    regarding: dict[str, Any],
    reason: str,
    message: str,
    type_: str,
    component: str,
    new_api: bool,
    when: datetime,
    action: str,
) -> dict[str, Any]:
    """A Kubernetes Event as its recorder stores it (events.k8s.io/v1 or core/v1 dict)."""
    meta = {
        "name": f"{regarding['name']}.{secrets.token_hex(8)}",
        "namespace": namespace,
        "uid": _uid(),
        "resourceVersion": str(secrets.randbelow(10**8)),
        "creationTimestamp": format_timestamp(when.replace(microsecond=0)),
    }
    if new_api:
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": meta,
            "eventTime": format_timestamp(when),
            "reportingController": component,
            "reportingInstance": f"{component}-{secrets.token_hex(4)}",
            "action": action,
            "reason": reason,
            "regarding": regarding,
            "note": message,
            "type": type_,
        }
    stamp = format_timestamp(when.replace(microsecond=0))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": meta,
        "involvedObject": regarding,
        "reason": reason,
        "message": message,
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "type": type_,
        "eventTime": None,
        "reportingComponent": component,
        "reportingInstance": "",
    }


def pod_event_entry(
    cluster: ClusterId,
    namespace: str,
    pod: str,
    pod_uid: str,
    reason: str = "FailedScheduling",
    message: str | None = None,
    when: datetime | None = None,
    controller: tuple[str, str] | None = None,
    extra_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod Event LogEntry, e.g. the scheduler's FailedScheduling for a pending TPU pod.

    ``controller`` is the pod's top-level controller as GKE labels it, e.g. ``("JobSet", "train")``;
    None means no controller labels. ``extra_labels`` adds further entry labels (GKE also copies
    ``jobset.sigs.k8s.io/jobset-uid`` and ``.../restart-attempt`` for JobSet pods).
    """
    component, new_api, type_, default = _POD_REASONS.get(reason, ("kubelet", False, "Normal", reason))
    regarding = {"kind": "Pod", "namespace": namespace, "name": pod, "apiVersion": "v1"}
    if pod_uid:  # Kubernetes omits empty strings from JSON
        regarding["uid"] = pod_uid
    regarding["resourceVersion"] = str(secrets.randbelow(10**8))
    event = _event_object(
        namespace=namespace,
        regarding=regarding,
        reason=reason,
        message=message if message is not None else default.format(ns=namespace, pod=pod),
        type_=type_,
        component=component,
        new_api=new_api,
        when=when or _now(),
        action="Scheduling",
    )
    labels: dict[str, str] = {}
    if controller is not None:
        labels["logging.gke.io/top_level_controller_type"] = controller[0]
        labels["logging.gke.io/top_level_controller_name"] = controller[1]
    labels.update(extra_labels or {})
    return kube_event_entry(cluster, event, labels=labels)


def jobset_event_entry(
    cluster: ClusterId,
    namespace: str,
    name: str,
    uid: str,
    reason: str = "AllJobsCompleted",
    shape: Literal["core", "events.k8s.io"] = "core",
    when: datetime | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """A JobSet Event LogEntry. ``shape="core"`` is what older JobSet releases record (core/v1
    recorder, ``source.component: jobset``); ``"events.k8s.io"`` what newer ones record."""
    type_, default = _JOBSET_REASONS.get(reason, ("Normal", reason))
    regarding = {"kind": "JobSet", "namespace": namespace, "name": name, "apiVersion": JOBSET_API_VERSION}
    if uid:
        regarding["uid"] = uid
    regarding["resourceVersion"] = str(secrets.randbelow(10**8))
    event = _event_object(
        namespace=namespace,
        regarding=regarding,
        reason=reason,
        message=message if message is not None else default,
        type_=type_,
        component="jobset",
        new_api=shape == "events.k8s.io",
        when=when or _now(),
        action="Reconciling",
    )
    return kube_event_entry(cluster, event)


def workload_event_entry(
    cluster: ClusterId,
    namespace: str,
    name: str,
    uid: str,
    reason: str = "QuotaReserved",
    when: datetime | None = None,
    message: str = "Quota reserved in ClusterQueue cluster-queue, wait time since queued was 0s",
) -> dict[str, Any]:
    """A Kueue Workload Event LogEntry, as Kueue v0.19.2's scheduler records it (events.k8s.io
    recorder of component ``kueue-admission``)."""
    regarding = {
        "kind": "Workload",
        "namespace": namespace,
        "name": name,
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "uid": uid,
        "resourceVersion": str(secrets.randbelow(10**8)),
    }
    event = _event_object(
        namespace=namespace,
        regarding=regarding,
        reason=reason,
        message=message,
        type_="Normal",
        component="kueue-admission",
        new_api=True,
        when=when or _now(),
        action=reason,
    )
    return kube_event_entry(cluster, event)


def jobset_delete_audit_entry(
    cluster: ClusterId,
    namespace: str,
    name: str,
    principal: str = "user@example.com",
    method: Literal["delete", "deletecollection"] = "delete",
    status_code: int = 0,
    when: datetime | None = None,
) -> dict[str, Any]:
    """The Admin Activity audit entry GKE writes for a JobSet delete (``name`` "" for deletecollection)."""
    group, version = JOBSET_API_VERSION.split("/")
    reversed_group = ".".join(reversed(group.split(".")))
    method_name = f"{reversed_group}.{version}.jobsets.{method}"
    resource_name = f"{JOBSET_API_VERSION}/namespaces/{namespace}/jobsets"
    if method == "delete":
        resource_name += f"/{name}"
    when = when or _now()
    denied = status_code == 7
    proto: dict[str, Any] = {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "authenticationInfo": {"principalEmail": principal},
        "authorizationInfo": [{"granted": not denied, "permission": method_name, "resource": resource_name}],
        "methodName": method_name,
        "requestMetadata": {
            "callerIp": "10.128.0.17",
            "callerSuppliedUserAgent": "kubectl/v1.30.5 (linux/amd64) kubernetes/74e84a9",
        },
        "resourceName": resource_name,
        "serviceName": "k8s.io",
    }
    if status_code:
        proto["status"] = {"code": status_code, "message": _GRPC_CODE_NAMES.get(status_code, "UNKNOWN")}
    return {
        "insertId": _uid(),
        "labels": {
            "authorization.k8s.io/decision": "forbid" if denied else "allow",
            "authorization.k8s.io/reason": "" if denied else "RBAC: allowed by ClusterRoleBinding",
        },
        "logName": f"projects/{cluster.project}/logs/{ACTIVITY_LOG_ID}",
        "operation": {"id": _uid(), "producer": "k8s.io", "first": True, "last": True},
        "protoPayload": proto,
        "receiveTimestamp": format_timestamp(when + _RECEIVE_DELAY),
        "resource": _resource(cluster, "k8s_cluster"),
        "severity": "ERROR" if status_code else "NOTICE",
        "timestamp": format_timestamp(when),
    }


def cluster_operation_entry(
    cluster: ClusterId,
    method: str = "google.container.v1.ClusterManager.CreateCluster",
    last: bool = True,
    status_code: int = 0,
    when: datetime | None = None,
) -> dict[str, Any]:
    """The Admin Activity entry GKE writes for a cluster operation (``CreateCluster`` by default):
    its first entry as the operation starts (``last`` False) or its last as it ends, which the
    setup sink routes (``sinks/cluster-created.filter``)."""
    resource_name = f"projects/{cluster.project}/zones/{cluster.location}/clusters/{cluster.name}"
    return _gke_operation_entry(
        cluster,
        method,
        resource_name,
        _resource(cluster, "gke_cluster"),
        "admin@example.com",
        "",
        last,
        status_code,
        when,
    )


def nodepool_operation_entry(
    cluster: ClusterId,
    pool: str,
    method: str = "CreateNodePool",
    operation: str = "",
    last: bool = True,
    status_code: int = 0,
    principal: str = "tpu-provisioner@example.iam.gserviceaccount.com",
    when: datetime | None = None,
) -> dict[str, Any]:
    """GKE's Admin Activity audit entry for a node-pool operation: its start, or with ``last`` its end."""
    resource_name = (
        f"projects/{cluster.project}/locations/{cluster.location}/clusters/{cluster.name}/nodePools/{pool}"
    )
    return _gke_operation_entry(
        cluster,
        f"google.container.v1.ClusterManager.{method}",
        resource_name,
        _resource(cluster, "gke_nodepool", nodepool_name=pool),
        principal,
        operation,
        last,
        status_code,
        when,
    )


def _gke_operation_entry(
    cluster: ClusterId,
    method_name: str,
    resource_name: str,
    resource: dict[str, Any],
    principal: str,
    operation: str,
    last: bool,
    status_code: int,
    when: datetime | None,
) -> dict[str, Any]:
    """An Admin Activity entry of one GKE long-running operation (its first or its last entry)."""
    when = when or _now()
    proto: dict[str, Any] = {
        "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
        "authenticationInfo": {"principalEmail": principal},
        "methodName": method_name,
        "resourceName": resource_name,
        "serviceName": "container.googleapis.com",
    }
    if status_code:
        proto["status"] = {"code": status_code, "message": _GRPC_CODE_NAMES.get(status_code, "UNKNOWN")}
    return {
        "insertId": _uid(),
        "logName": f"projects/{cluster.project}/logs/{ACTIVITY_LOG_ID}",
        "operation": {
            "id": operation or f"operation-{_uid()}",
            "producer": "container.googleapis.com",
            **({"last": True} if last else {"first": True}),
        },
        "protoPayload": proto,
        "receiveTimestamp": format_timestamp(when + _RECEIVE_DELAY),
        "resource": resource,
        "severity": "ERROR" if status_code else "NOTICE",
        "timestamp": format_timestamp(when),
    }


def text_marker_entry(cluster: ClusterId, text: str, when: datetime | None = None) -> dict[str, Any]:
    """A plain-text entry in the events log, like the exporter's "started watching" marker."""
    when = when or _now()
    return {
        "insertId": _insert_id(),
        "logName": f"projects/{cluster.project}/logs/{EVENTS_LOG_ID}",
        "receiveTimestamp": format_timestamp(when + _RECEIVE_DELAY),
        "resource": _resource(cluster, "k8s_cluster"),
        "severity": "WARNING",
        "textPayload": text,
        "timestamp": format_timestamp(when),
    }


def pubsub_message(
    entry: Mapping[str, Any],
    message_id: str | None = None,
    attributes: Mapping[str, str] | None = None,
    publish_time: datetime | None = None,
) -> dict[str, Any]:
    """The Pub/Sub message a log sink publishes for ``entry`` (REST/JSON form, camelCase)."""
    data = json.dumps(entry, separators=(",", ":")).encode()
    if attributes is None:
        attributes = {"logging.googleapis.com/timestamp": str(entry.get("timestamp", ""))}
    return {
        "data": base64.b64encode(data).decode("ascii"),
        "attributes": dict(attributes),
        "messageId": message_id or str(10**15 + secrets.randbelow(9 * 10**15)),
        "publishTime": format_timestamp(publish_time or _now()),
    }


def eventarc_body(message: Mapping[str, Any], subscription: str) -> dict[str, Any]:
    """The JSON body Eventarc (and a Pub/Sub push subscription) sends for ``message``."""
    inner = dict(message)
    inner["message_id"] = inner.get("messageId", "")
    inner["publish_time"] = inner.get("publishTime", "")
    return {"message": inner, "subscription": subscription}


def binary_cloudevent_headers(message: Mapping[str, Any], topic_path: str) -> dict[str, str]:
    """The ``ce-*`` HTTP headers Eventarc sets in binary mode (the body is :func:`eventarc_body`)."""
    return {
        "ce-id": str(message.get("messageId", "")),
        "ce-source": f"//pubsub.googleapis.com/{topic_path}",
        "ce-specversion": "1.0",
        "ce-time": str(message.get("publishTime", "")),
        "ce-type": PUBSUB_EVENT_TYPE,
        "content-type": "application/json",
    }


def structured_cloudevent(message: Mapping[str, Any], topic_path: str, subscription: str) -> dict[str, Any]:
    """The same event in structured mode: one JSON document (``application/cloudevents+json``)."""
    return {
        "specversion": "1.0",
        "id": str(message.get("messageId", "")),
        "source": f"//pubsub.googleapis.com/{topic_path}",
        "type": PUBSUB_EVENT_TYPE,
        "time": str(message.get("publishTime", "")),
        "datacontenttype": "application/json",
        "data": eventarc_body(message, subscription),
    }
