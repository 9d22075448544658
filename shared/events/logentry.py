"""Classify one Cloud Logging LogEntry into a typed event (the LogEntry half of ``shared.events.envelope``).

Import the names from ``shared.events.envelope``; this module exists to keep each file short.
Kubernetes Events arrive as GKE's event exporter writes them: the core/v1 Event in
``jsonPayload`` (with ``count``/``firstTimestamp``/``lastTimestamp`` usually stripped and the
entry ``timestamp`` set to the last occurrence). Events recorded through the events.k8s.io/v1
API show up in the same core/v1 view (``reportingComponent``, ``action``, ``eventTime``); the
native events.k8s.io names (``regarding``, ``note``) are accepted as well. JobSet deletions come
from GKE's Admin Activity audit log (``protoPayload`` is a ``google.cloud.audit.AuditLog``), and so
do finished node-pool operations: GKE writes a long-running operation's audit entry twice, with
``operation.first`` when it starts and ``operation.last`` when it ends; only the last one means a
slot of the cluster's operation budget is free again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

from shared.core.errors import Skip
from shared.core.meta import Meta
from shared.events.fields import (
    ACTIVITY_LOG_SUFFIXES,
    AUDIT_LOG_TYPE,
    CONTROLLER_NAME_LABEL,
    CONTROLLER_TYPE_LABEL,
    EVENTS_LOG_SUFFIX,
    JOBSET_RESOURCE_NAME,
    JOBSET_TERMINAL_REASONS,
    SCHEDULING_FAILURE_REASONS,
    ClusterId,
    clip,
    cluster_from_labels,
    first_dict,
    first_str,
    log_name_matches,
    parse_timestamp,
    validate_name,
    validate_namespace,
    validate_uid,
)


@dataclasses.dataclass(frozen=True)
class PodUnschedulable:
    """The scheduler (or autoscaler) could not place a Pod. The entry carries no pod spec."""

    kind: ClassVar[str] = "pod-unschedulable"
    cluster: ClusterId
    namespace: str
    pod: str
    pod_uid: str  # "" when the Event did not name it
    reason: str  # FailedScheduling | NotTriggerScaleUp
    message: str
    timestamp: datetime
    controller_type: str  # GKE's top-level controller label, e.g. "JobSet"; "" if absent
    controller_name: str


@dataclasses.dataclass(frozen=True)
class JobSetFinished:
    """A JobSet reached a terminal state (``outcome`` is "Completed" or "Failed")."""

    kind: ClassVar[str] = "jobset-finished"
    cluster: ClusterId
    namespace: str
    name: str
    uid: str  # "" if unknown
    outcome: str
    reason: str
    timestamp: datetime


@dataclasses.dataclass(frozen=True)
class WorkloadQuotaReserved:
    """Kueue reserved quota for a Workload (its scheduler's ``QuotaReserved`` Event, component
    ``kueue-admission``): the moment an admission check starts working on it."""

    kind: ClassVar[str] = "workload-quota-reserved"
    cluster: ClusterId
    namespace: str
    name: str
    uid: str
    message: str
    timestamp: datetime


@dataclasses.dataclass(frozen=True)
class JobSetDeleted:
    """A JobSet delete succeeded. ``name == ""`` means deletecollection: every JobSet in the namespace."""

    kind: ClassVar[str] = "jobset-deleted"
    cluster: ClusterId
    namespace: str
    name: str
    principal: str
    timestamp: datetime


@dataclasses.dataclass(frozen=True)
class NodePoolOperationDone:
    """A node-pool operation of the cluster ended (``failed`` when its status carries an error)."""

    kind: ClassVar[str] = "nodepool-operation-done"
    cluster: ClusterId
    pool: str
    method: str  # e.g. "CreateNodePool"
    failed: bool
    timestamp: datetime
    # The LogEntry's ``operation.id`` (GKE's operation name; its first and last audit entries share
    # it): two operations of one pool, say two relabels seconds apart, are two events, not one.
    operation: str = ""


# Node-pool operations that hold one of the cluster's operation slots while they run.
NODEPOOL_METHODS = frozenset(
    {"CreateNodePool", "DeleteNodePool", "UpdateNodePool", "SetNodePoolSize", "SetNodePoolAutoscaling"}
)
NODEPOOL_RESOURCE_NAME = "/nodePools/"


@dataclasses.dataclass(frozen=True)
class Ignored:
    """Input the product does not act on, and why; ``cluster`` is set when it could be read."""

    kind: ClassVar[str] = "ignored"
    reason: str
    cluster: ClusterId | None = None


Event = (
    PodUnschedulable
    | JobSetFinished
    | JobSetDeleted
    | NodePoolOperationDone
    | WorkloadQuotaReserved
    | Ignored
)


def decode_log_entry(entry: Any) -> Event:
    """Classify one parsed Cloud Logging LogEntry (a dict in the LogEntry JSON form)."""
    if not isinstance(entry, Mapping):
        return Ignored(f"log entry is not a JSON object but {type(entry).__name__}")
    resource = entry.get("resource")
    resource_type = resource.get("type") if isinstance(resource, Mapping) else None
    labels = resource.get("labels") if isinstance(resource, Mapping) else None
    cluster: ClusterId | None = None
    try:
        if not isinstance(labels, Mapping):
            raise Skip("log entry has no resource labels")
        cluster = cluster_from_labels(labels)
        if "textPayload" in entry:
            raise Skip("plain-text entry (textPayload), not a Kubernetes Event or audit record")
        if "protoPayload" in entry:
            return _audit_event(entry, cluster, resource_type)
        if "jsonPayload" in entry:
            return _kube_event(entry, cluster, resource_type, labels)
        raise Skip("log entry has neither jsonPayload nor protoPayload")
    except Skip as skip:
        return Ignored(skip.reason, cluster)


def _entry_time(entry: Mapping[str, Any], payload: Mapping[str, Any]) -> datetime:
    # The exporter stamps the entry with the Event's last occurrence; fall back to the
    # Event's own clocks (both API shapes) and finally to when Logging received it.
    series = payload.get("series")
    candidates = (
        entry.get("timestamp"),
        payload.get("lastTimestamp"),
        series.get("lastObservedTime") if isinstance(series, Mapping) else None,
        payload.get("eventTime"),
        payload.get("deprecatedLastTimestamp"),
        payload.get("firstTimestamp"),
        entry.get("receiveTimestamp"),
    )
    for candidate in candidates:
        when = parse_timestamp(candidate)
        if when is not None:
            return when
    raise Skip("log entry has no usable timestamp")


def _kube_event(
    entry: Mapping[str, Any], cluster: ClusterId, resource_type: Any, labels: Mapping[str, Any]
) -> Event:
    if not log_name_matches(entry.get("logName"), (EVENTS_LOG_SUFFIX,)):
        raise Skip(f"log {clip(entry.get('logName'))} is not the Kubernetes events log")
    payload = entry["jsonPayload"]
    if not isinstance(payload, Mapping):
        raise Skip("jsonPayload is not an object")
    if payload.get("kind", "Event") != "Event":
        raise Skip(f"jsonPayload is a {clip(payload.get('kind'))}, not a Kubernetes Event")
    # core/v1 names first; events.k8s.io/v1 names (regarding, note, ...) when exported natively.
    obj = first_dict(payload, "involvedObject", "regarding")
    if obj is None:
        raise Skip("Kubernetes Event names no involved object")
    reason = first_str(payload, "reason")
    object_kind = obj.get("kind")
    if object_kind not in ("Pod", "JobSet", "Workload"):
        raise Skip(f"Event about a {clip(object_kind)} ({clip(reason)}), not a Pod, JobSet or Workload")
    event_ns = Meta.of(payload, default_namespace="").namespace
    object_ns = obj.get("namespace")
    # Mirror the exporter's RBAC check: an Event may only speak about objects in its own namespace.
    if event_ns and event_ns != object_ns:
        raise Skip(f"Event in namespace {clip(event_ns)} is about an object in {clip(object_ns)}")
    if object_kind == "Pod":
        return _pod_event(entry, payload, obj, reason, cluster, resource_type, labels)
    if object_kind == "Workload":
        return _workload_event(entry, payload, obj, reason, cluster, resource_type)
    return _jobset_event(entry, payload, obj, reason, cluster, resource_type)


def _workload_event(
    entry: Mapping[str, Any],
    payload: Mapping[str, Any],
    obj: Mapping[str, Any],
    reason: str,
    cluster: ClusterId,
    resource_type: Any,
) -> WorkloadQuotaReserved:
    # Kueue's scheduler: Eventf(wl, Normal, "QuotaReserved", "Quota reserved in ClusterQueue ...").
    if reason != "QuotaReserved":
        raise Skip(f"Workload event reason {clip(reason)} is not QuotaReserved")
    namespace, name, uid = _custom_resource_identity("Workload", "kueue.x-k8s.io", obj, resource_type)
    return WorkloadQuotaReserved(
        cluster=cluster,
        namespace=namespace,
        name=name,
        uid=uid,
        message=first_str(payload, "message", "note"),
        timestamp=_entry_time(entry, payload),
    )


def _custom_resource_identity(
    kind: str, group: str, obj: Mapping[str, Any], resource_type: Any
) -> tuple[str, str, str]:
    """(namespace, name, uid) of the custom resource an Event is about; Skip when the Event names
    another API group or was logged against something other than the cluster."""
    api_version = obj.get("apiVersion", "")
    if api_version and (not isinstance(api_version, str) or not api_version.startswith(f"{group}/")):
        raise Skip(f"{kind} event for apiVersion {clip(api_version)}, not {group}")
    if resource_type != "k8s_cluster":
        raise Skip(f"{kind} event logged against resource type {clip(resource_type)}")
    return (
        validate_namespace(obj.get("namespace")),
        validate_name(obj.get("name"), f"{kind} name"),
        validate_uid(obj.get("uid")),
    )


def _pod_event(
    entry: Mapping[str, Any],
    payload: Mapping[str, Any],
    obj: Mapping[str, Any],
    reason: str,
    cluster: ClusterId,
    resource_type: Any,
    labels: Mapping[str, Any],
) -> PodUnschedulable:
    if reason not in SCHEDULING_FAILURE_REASONS:
        raise Skip(f"Pod event reason {clip(reason)} is not a scheduling failure")
    if resource_type not in ("k8s_pod", "k8s_cluster"):
        raise Skip(f"Pod event logged against resource type {clip(resource_type)}")
    namespace = validate_namespace(obj.get("namespace"))
    pod = validate_name(obj.get("name"), "pod name")
    if resource_type == "k8s_pod" and (
        labels.get("namespace_name") != namespace or labels.get("pod_name") != pod
    ):
        raise Skip("k8s_pod resource labels disagree with the Event's involved object")
    entry_labels = entry.get("labels")
    entry_labels = entry_labels if isinstance(entry_labels, Mapping) else {}
    controller_type = entry_labels.get(CONTROLLER_TYPE_LABEL, "")
    controller_name = entry_labels.get(CONTROLLER_NAME_LABEL, "")
    if not isinstance(controller_type, str) or len(controller_type) > 63:
        raise Skip(f"invalid controller type label {clip(controller_type)}")
    if controller_name != "":
        controller_name = validate_name(controller_name, "controller name")
    return PodUnschedulable(
        cluster=cluster,
        namespace=namespace,
        pod=pod,
        pod_uid=validate_uid(obj.get("uid")),
        reason=reason,
        message=first_str(payload, "message", "note"),
        timestamp=_entry_time(entry, payload),
        controller_type=controller_type,
        controller_name=controller_name,
    )


def _jobset_event(
    entry: Mapping[str, Any],
    payload: Mapping[str, Any],
    obj: Mapping[str, Any],
    reason: str,
    cluster: ClusterId,
    resource_type: Any,
) -> JobSetFinished:
    outcome = JOBSET_TERMINAL_REASONS.get(reason)
    if outcome is None:
        raise Skip(f"JobSet event reason {clip(reason)} is not terminal")
    namespace, name, uid = _custom_resource_identity("JobSet", "jobset.x-k8s.io", obj, resource_type)
    return JobSetFinished(
        cluster=cluster,
        namespace=namespace,
        name=name,
        uid=uid,
        outcome=outcome,
        reason=reason,
        timestamp=_entry_time(entry, payload),
    )


def _nodepool_operation(
    entry: Mapping[str, Any], proto: Mapping[str, Any], cluster: ClusterId, resource_type: Any
) -> NodePoolOperationDone:
    if resource_type != "gke_nodepool":
        raise Skip(f"GKE audit entry logged against resource type {clip(resource_type)}")
    method = proto.get("methodName")
    verb = method.rsplit(".", 1)[-1] if isinstance(method, str) else ""
    if verb not in NODEPOOL_METHODS:
        raise Skip(f"GKE audit method {clip(method)} is not a node-pool operation")
    operation = entry.get("operation")
    if not isinstance(operation, Mapping) or operation.get("last") is not True:
        raise Skip(f"{verb} has not finished yet (not the operation's last audit entry)")
    resource_name = proto.get("resourceName")
    pool = ""
    if isinstance(resource_name, str) and NODEPOOL_RESOURCE_NAME in resource_name:
        pool = resource_name.rsplit(NODEPOOL_RESOURCE_NAME, 1)[1]
    status = proto.get("status")
    code = status.get("code", 0) if isinstance(status, Mapping) else 0
    return NodePoolOperationDone(
        cluster=cluster,
        pool=validate_name(pool, "node pool name") if pool else "",
        method=verb,
        failed=isinstance(code, int) and code != 0,
        timestamp=_entry_time(entry, {}),
        operation=_operation_id(operation),
    )


def _operation_id(operation: Mapping[str, Any]) -> str:
    """``operation.id`` of the entry (LogEntryOperation, Cloud Logging's LogEntry reference), or
    "" when it is missing or not a plausible id: it only tells operations apart, never names one."""
    value = operation.get("id")
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        return ""
    return value


def _audit_event(
    entry: Mapping[str, Any], cluster: ClusterId, resource_type: Any
) -> JobSetDeleted | NodePoolOperationDone:
    proto = entry["protoPayload"]
    if not isinstance(proto, Mapping) or proto.get("@type") != AUDIT_LOG_TYPE:
        raise Skip("protoPayload is not an AuditLog")
    if proto.get("serviceName") == "container.googleapis.com" and log_name_matches(
        entry.get("logName"), ACTIVITY_LOG_SUFFIXES
    ):
        return _nodepool_operation(entry, proto, cluster, resource_type)
    if proto.get("serviceName") != "k8s.io":
        raise Skip(f"audit entry from service {clip(proto.get('serviceName'))}, not k8s.io")
    if not log_name_matches(entry.get("logName"), ACTIVITY_LOG_SUFFIXES):
        raise Skip(f"log {clip(entry.get('logName'))} is not the Admin Activity audit log")
    if resource_type != "k8s_cluster":
        raise Skip(f"audit entry logged against resource type {clip(resource_type)}")
    resource_name = proto.get("resourceName")
    match = JOBSET_RESOURCE_NAME.match(resource_name) if isinstance(resource_name, str) else None
    if match is None:
        raise Skip(f"audit entry for {clip(resource_name)}, not a JobSet")
    method = proto.get("methodName")
    verb = method.rsplit(".", 1)[-1] if isinstance(method, str) else ""
    name = match.group("name") or ""
    # A bare "jobsets/" must not read as "every JobSet": only deletecollection means that.
    if verb == "delete" and not name:
        raise Skip("JobSet delete without a JobSet name")
    if verb == "deletecollection" and match.group("name") is not None:
        raise Skip("JobSet deletecollection addressed to a single JobSet")
    if verb not in ("delete", "deletecollection"):
        raise Skip(f"JobSet audit method {clip(method)} is not a delete")
    status = proto.get("status")
    if status is not None:
        code = status.get("code", 0) if isinstance(status, Mapping) else None
        if not isinstance(code, int) or isinstance(code, bool):
            raise Skip("audit entry has a malformed status")
        if code != 0:
            message = status.get("message") if isinstance(status, Mapping) else ""
            detail = f": {clip(message)}" if isinstance(message, str) and message else ""
            raise Skip(f"the JobSet delete failed (status code {code}{detail})")
    auth = proto.get("authenticationInfo")
    principal = auth.get("principalEmail") if isinstance(auth, Mapping) else None
    return JobSetDeleted(
        cluster=cluster,
        namespace=validate_namespace(match.group("namespace")),
        name=validate_name(name, "JobSet name") if name else "",
        principal=principal[:320] if isinstance(principal, str) else "",
        timestamp=_entry_time(entry, {}),
    )
