"""Decoding edge cases (shared.events.envelope): hand-edited entries, garbage envelopes, hostile names."""

from __future__ import annotations

import copy
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.events import entries as le
from shared.events.envelope import (
    ClusterId,
    Event,
    Ignored,
    JobSetFinished,
    NodePoolOperationDone,
    PodUnschedulable,
    WorkloadQuotaReserved,
    decode_any,
    decode_cloud_event,
    decode_log_entry,
    parse_timestamp,
    to_dict,
)

CLUSTER = ClusterId("acme-ml-prod", "us-east5", "tpu-v5p-prod")
NS, POD, JOBSET = "ml-team", "llama-pretrain-slice-0-0-x7k2p", "llama-pretrain"
POD_UID = "c3a9e6d2-1f7b-4e58-9b0a-7d64f2e1c835"
JS_UID = "6f1d2c8e-9a41-4f0b-8d3e-52c7a1e0b9f4"
WHEN = datetime(2025, 6, 12, 14, 3, 21, tzinfo=UTC)
DELETE = object()  # sentinel: remove the key


def edit(entry: dict[str, Any], *changes: tuple[str, Any]) -> dict[str, Any]:
    """A deep copy of ``entry`` with dotted paths set (or removed with DELETE)."""
    out = copy.deepcopy(entry)
    for path, value in changes:
        *parents, last = path.split(".")
        node = out
        for key in parents:
            node = node[key]
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return out


def pod_entry(**kwargs: Any) -> dict[str, Any]:
    return le.pod_event_entry(CLUSTER, NS, POD, POD_UID, when=WHEN, **kwargs)


def jobset_entry(**kwargs: Any) -> dict[str, Any]:
    return le.jobset_event_entry(CLUSTER, NS, JOBSET, JS_UID, when=WHEN, **kwargs)


def audit_entry(**kwargs: Any) -> dict[str, Any]:
    return le.jobset_delete_audit_entry(CLUSTER, NS, JOBSET, when=WHEN, **kwargs)


POD_EVENT = PodUnschedulable(CLUSTER, NS, POD, POD_UID, "FailedScheduling", "m", WHEN, "", "")
FINISHED = JobSetFinished(CLUSTER, NS, JOBSET, JS_UID, "Completed", "AllJobsCompleted", WHEN)
RESOURCE_NAME = "protoPayload.resourceName"
OBJ_NS, EVENT_NS = "jsonPayload.involvedObject.namespace", "jsonPayload.metadata.namespace"

ENTRY_CASES: list[tuple[str, dict[str, Any], Event]] = [
    # Events recorded through events.k8s.io, exported with the native field names.
    (
        "native-events-k8s-io-names",
        edit(
            jobset_entry(shape="events.k8s.io"),
            ("jsonPayload.regarding", jobset_entry()["jsonPayload"]["involvedObject"]),
            ("jsonPayload.involvedObject", DELETE),
            ("timestamp", DELETE),
            ("jsonPayload.eventTime", "2025-06-12T14:03:21.000000Z"),
        ),
        FINISHED,
    ),
    ("pod-message-from-note", edit(pod_entry(message=""), ("jsonPayload.note", "m")), POD_EVENT),
    (
        "pod-without-uid",
        edit(pod_entry(message="m"), ("jsonPayload.involvedObject.uid", DELETE)),
        PodUnschedulable(CLUSTER, NS, POD, "", "FailedScheduling", "m", WHEN, "", ""),
    ),
    (
        "timestamp-from-payload-when-entry-has-zero-time",
        edit(
            jobset_entry(),
            ("timestamp", "0001-01-01T00:00:00Z"),
            ("jsonPayload.lastTimestamp", "2025-06-12T14:03:21Z"),
        ),
        FINISHED,
    ),
    (
        "no-timestamp-anywhere",
        edit(jobset_entry(), ("timestamp", DELETE), ("receiveTimestamp", DELETE)),
        Ignored("log entry has no usable timestamp", CLUSTER),
    ),
    (
        "namespace-mismatch",
        edit(jobset_entry(), ("jsonPayload.metadata.namespace", "other")),
        Ignored("Event in namespace 'other' is about an object in 'ml-team'", CLUSTER),
    ),
    (
        "pod-resource-labels-disagree",
        edit(pod_entry(), ("resource.labels.pod_name", "someone-else")),
        Ignored("k8s_pod resource labels disagree with the Event's involved object", CLUSTER),
    ),
    (
        "event-about-a-node",
        edit(pod_entry(), ("jsonPayload.involvedObject.kind", "Node")),
        Ignored("Event about a 'Node' ('FailedScheduling'), not a Pod, JobSet or Workload", CLUSTER),
    ),
    (
        "jobset-of-another-api-group",
        edit(jobset_entry(), ("jsonPayload.involvedObject.apiVersion", "example.com/v1")),
        Ignored("JobSet event for apiVersion 'example.com/v1', not jobset.x-k8s.io", CLUSTER),
    ),
    (
        "not-the-events-log",
        edit(pod_entry(), ("logName", "projects/acme-ml-prod/logs/stdout")),
        Ignored("log 'projects/acme-ml-prod/logs/stdout' is not the Kubernetes events log", CLUSTER),
    ),
    (
        "audit-pod-delete",
        edit(
            audit_entry(),
            (RESOURCE_NAME, "core/v1/namespaces/ml-team/pods/p"),
            ("protoPayload.methodName", "io.k8s.core.v1.pods.delete"),
        ),
        Ignored("audit entry for 'core/v1/namespaces/ml-team/pods/p', not a JobSet", CLUSTER),
    ),
    (
        "audit-jobset-create",
        edit(audit_entry(), ("protoPayload.methodName", "io.x-k8s.jobset.v1alpha2.jobsets.create")),
        Ignored("JobSet audit method 'io.x-k8s.jobset.v1alpha2.jobsets.create' is not a delete", CLUSTER),
    ),
    (
        "audit-status-subresource",
        edit(audit_entry(), (RESOURCE_NAME, "jobset.x-k8s.io/v1alpha2/namespaces/ml-team/jobsets/j/status")),
        Ignored(
            "audit entry for 'jobset.x-k8s.io/v1alpha2/namespaces/ml-team/jobsets/j/status', not a JobSet",
            CLUSTER,
        ),
    ),
    (
        "audit-delete-trailing-slash",
        edit(audit_entry(), (RESOURCE_NAME, "jobset.x-k8s.io/v1alpha2/namespaces/ml-team/jobsets/")),
        Ignored("JobSet delete without a JobSet name", CLUSTER),
    ),
    (
        "audit-explicit-ok-status",
        edit(audit_entry(), ("protoPayload.status", {"code": 0})),
        decode_log_entry(audit_entry()),
    ),
    (
        "audit-other-service",
        edit(audit_entry(), ("protoPayload.serviceName", "compute.googleapis.com")),
        Ignored("audit entry from service 'compute.googleapis.com', not k8s.io", CLUSTER),
    ),
    (
        "gke-audit-on-the-cluster-resource",
        edit(audit_entry(), ("protoPayload.serviceName", "container.googleapis.com")),
        Ignored("GKE audit entry logged against resource type 'k8s_cluster'", CLUSTER),
    ),
    (
        "nodepool-create-finished",
        le.nodepool_operation_entry(CLUSTER, "tpu-a", operation="operation-17", when=WHEN),
        NodePoolOperationDone(CLUSTER, "tpu-a", "CreateNodePool", False, WHEN, "operation-17"),
    ),
    (
        "nodepool-delete-failed",
        le.nodepool_operation_entry(
            CLUSTER, "tpu-a", "DeleteNodePool", operation="operation-18", status_code=9, when=WHEN
        ),
        NodePoolOperationDone(CLUSTER, "tpu-a", "DeleteNodePool", True, WHEN, "operation-18"),
    ),
    (
        "nodepool-create-started",
        le.nodepool_operation_entry(CLUSTER, "tpu-a", last=False, when=WHEN),
        Ignored("CreateNodePool has not finished yet (not the operation's last audit entry)", CLUSTER),
    ),
    (
        "nodepool-read-is-no-operation",
        le.nodepool_operation_entry(CLUSTER, "tpu-a", "GetNodePool", when=WHEN),
        Ignored(
            "GKE audit method 'google.container.v1.ClusterManager.GetNodePool' is not a node-pool operation",
            CLUSTER,
        ),
    ),
    (
        "nodepool-hostile-pool-name",
        le.nodepool_operation_entry(CLUSTER, "../../x", when=WHEN),
        Ignored("node pool name '../../x' is not a valid Kubernetes name (DNS-1123 subdomain)", CLUSTER),
    ),
    (
        "audit-data-access-log",
        edit(
            audit_entry(), ("logName", "projects/acme-ml-prod/logs/cloudaudit.googleapis.com%2Fdata_access")
        ),
        Ignored(
            "log 'projects/acme-ml-prod/logs/cloudaudit.googleapis.com%2Fdata_access' is not the Admin"
            " Activity audit log",
            CLUSTER,
        ),
    ),
    (
        "missing-resource",
        edit(pod_entry(), ("resource", DELETE)),
        Ignored("log entry has no resource labels"),
    ),
    (
        "wrong-type-payload",
        edit(pod_entry(), ("jsonPayload", ["not", "an", "object"])),
        Ignored("jsonPayload is not an object", CLUSTER),
    ),
    (
        "no-payload",
        edit(pod_entry(), ("jsonPayload", DELETE)),
        Ignored("log entry has neither jsonPayload nor protoPayload", CLUSTER),
    ),
    ("not-an-object", [1, 2], Ignored("log entry is not a JSON object but list")),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("entry", "expected"), [c[1:] for c in ENTRY_CASES], ids=[c[0] for c in ENTRY_CASES])
def test_log_entry_variants(entry: Any, expected: Event) -> None:
    assert decode_log_entry(entry) == expected


HOSTILE_CASES: list[tuple[str, dict[str, Any], str]] = [
    (
        "pod-uppercase",
        edit(pod_entry(), ("jsonPayload.involvedObject.name", "Train-Pod")),
        "pod name 'Train-Pod'",
    ),
    (
        "pod-dot-dot-slash",
        edit(pod_entry(), ("jsonPayload.involvedObject.name", "../../etc")),
        "pod name '../../etc'",
    ),
    ("pod-300-chars", edit(pod_entry(), ("jsonPayload.involvedObject.name", "a" * 300)), "pod name 'aaaaa"),
    (
        "pod-name-not-a-string",
        edit(pod_entry(), ("jsonPayload.involvedObject.name", 7)),
        "pod name is missing",
    ),
    (
        "namespace-slash",
        edit(jobset_entry(), (OBJ_NS, "../kube-system"), (EVENT_NS, "../kube-system")),
        "namespace '../",
    ),
    (
        "namespace-64-chars",
        edit(jobset_entry(), (OBJ_NS, "n" * 64), (EVENT_NS, "n" * 64)),
        "namespace 'nnn",
    ),
    (
        "jobset-uppercase",
        edit(jobset_entry(), ("jsonPayload.involvedObject.name", "Llama")),
        "JobSet name 'Llama'",
    ),
    (
        "uid-not-uuid",
        edit(jobset_entry(), ("jsonPayload.involvedObject.uid", "x/../y")),
        "uid 'x/../y' is not a UUID",
    ),
    (
        "audit-dot-dot",
        edit(audit_entry(), (RESOURCE_NAME, f"{le.JOBSET_API_VERSION}/namespaces/ml/jobsets/..")),
        "'..'",
    ),
    (
        "audit-namespace-case",
        edit(audit_entry(), (RESOURCE_NAME, f"{le.JOBSET_API_VERSION}/namespaces/ML/jobsets/j")),
        "'ML'",
    ),
    (
        "controller-name",
        edit(
            pod_entry(),
            ("labels", {"logging.gke.io/top_level_controller_name": "x/y"}),
        ),
        "controller name 'x/y'",
    ),
]


@pytest.mark.parametrize(
    ("entry", "fragment"), [c[1:] for c in HOSTILE_CASES], ids=[c[0] for c in HOSTILE_CASES]
)
def test_hostile_names_are_ignored_with_a_reason(entry: dict[str, Any], fragment: str) -> None:
    event = decode_log_entry(entry)
    assert isinstance(event, Ignored)
    assert fragment in event.reason
    assert len(event.reason) < 200, "reasons must not echo unbounded input"


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        ({"project_id": "acme", "location": "us-east5"}, "resource label cluster_name is missing"),
        (
            {"project_id": "../x", "location": "l", "cluster_name": "c"},
            "resource label project_id='../x' is not",
        ),
        ({"project_id": "p", "location": "US", "cluster_name": "c"}, "resource label location='US' is not"),
    ],
    ids=["missing-cluster", "project-traversal", "location-uppercase"],
)
def test_bad_cluster_labels_are_ignored_without_a_cluster(labels: dict[str, str], reason: str) -> None:
    event = decode_log_entry(edit(pod_entry(), ("resource.labels", labels)))
    assert isinstance(event, Ignored) and event.cluster is None
    assert event.reason.startswith(reason)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-06-12T14:03:21.123456789Z", datetime(2025, 6, 12, 14, 3, 21, 123456, tzinfo=UTC)),
        ("2025-06-12T16:03:21+02:00", datetime(2025, 6, 12, 14, 3, 21, tzinfo=UTC)),
        ("0001-01-01T00:00:00Z", None),
        ("2025-13-40T00:00:00Z", None),
        ("yesterday", None),
        (None, None),
    ],
    ids=["nanoseconds", "offset", "go-zero-time", "impossible-date", "garbage", "null"],
)
def test_parse_timestamp(text: Any, expected: datetime | None) -> None:
    assert parse_timestamp(text) == expected


def test_to_dict_is_json_safe_and_names_the_target() -> None:
    message = le.pubsub_message(audit_entry(), message_id="9")
    summary = to_dict(decode_any(le.eventarc_body(message, "projects/p/subscriptions/s")))
    assert json.loads(json.dumps(summary)) == {
        "kind": "jobset-deleted",
        "cluster": CLUSTER.path,
        "namespace": NS,
        "name": JOBSET,
        "principal": "user@example.com",
        "reason": "JobSet llama-pretrain deleted by user@example.com",
        "timestamp": "2025-06-12T14:03:21Z",
        "delivery": {
            "message_id": "9",
            "publish_time": message["publishTime"],
            "subscription": "projects/p/subscriptions/s",
            "attributes": {"logging.googleapis.com/timestamp": "2025-06-12T14:03:21Z"},
        },
    }


def test_decoding_costs_well_under_a_millisecond() -> None:
    event = le.structured_cloudevent(
        le.pubsub_message(pod_entry()), "projects/p/topics/t", "projects/p/subscriptions/s"
    )
    rounds = 2000
    start = time.perf_counter()
    for _ in range(rounds):
        decode_cloud_event(event)
    assert (time.perf_counter() - start) / rounds < 0.001


def test_kueue_quota_reserved_on_a_workload_decodes_to_the_check_trigger() -> None:
    entry = le.workload_event_entry(
        CLUSTER, "ml-team", "jobset-train-3f2a1", "0b6c1e9a-1111-4c3d-9e8f-aa00bb11cc22"
    )
    decoded = decode_log_entry(entry)
    assert isinstance(decoded, WorkloadQuotaReserved)
    assert (decoded.namespace, decoded.name, decoded.uid) == (
        "ml-team",
        "jobset-train-3f2a1",
        "0b6c1e9a-1111-4c3d-9e8f-aa00bb11cc22",
    )
    assert decoded.message.startswith("Quota reserved in ClusterQueue")
    admitted = le.workload_event_entry(CLUSTER, "ml-team", "w", "", reason="Admitted", message="Admitted by")
    assert decode_log_entry(admitted) == Ignored(
        "Workload event reason 'Admitted' is not QuotaReserved", CLUSTER
    )
