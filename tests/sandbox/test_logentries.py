"""Round trips: LogEntry builders (shared.events.entries) -> envelopes -> decoders."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.events import entries as le
from shared.events.envelope import (
    ClusterId,
    Decoded,
    Delivery,
    Event,
    Ignored,
    JobSetDeleted,
    JobSetFinished,
    PodUnschedulable,
    decode_any,
    decode_cloud_event,
    decode_log_entry,
    decode_pubsub_message,
)

CLUSTER = ClusterId("acme-ml-prod", "us-east5", "tpu-v5p-prod")
TOPIC = "projects/acme-ml-prod/topics/tpuprov-events"
SUB = "projects/acme-ml-prod/subscriptions/eventarc-us-east5-provision-sub-071"
NS = "ml-team"
POD = "llama-pretrain-slice-0-0-x7k2p"
POD_UID = "c3a9e6d2-1f7b-4e58-9b0a-7d64f2e1c835"
JS_UID = "6f1d2c8e-9a41-4f0b-8d3e-52c7a1e0b9f4"
# core/v1 Event times have whole-second precision; events.k8s.io eventTime has microseconds.
WHEN = datetime(2025, 6, 12, 14, 3, 21, tzinfo=UTC)
WHEN_US = datetime(2025, 6, 12, 14, 3, 21, 482913, tzinfo=UTC)
TTL = le.TTL_CONTROLLER_PRINCIPAL


def pod_expected(reason: str, message: str, when: datetime, controller: tuple[str, str] = ("", "")) -> Event:
    return PodUnschedulable(CLUSTER, NS, POD, POD_UID, reason, message, when, *controller)


def finished(outcome: str, reason: str, when: datetime) -> Event:
    return JobSetFinished(CLUSTER, NS, "llama-pretrain", JS_UID, outcome, reason, when)


# (id, entry builder, expected event)
CASES: list[tuple[str, Callable[[], dict[str, Any]], Event]] = [
    (
        "pod-failed-scheduling-selector",
        lambda: le.pod_event_entry(CLUSTER, NS, POD, POD_UID, when=WHEN_US, controller=("JobSet", "llama")),
        pod_expected("FailedScheduling", le.DEFAULT_FAILED_SCHEDULING_MESSAGE, WHEN_US, ("JobSet", "llama")),
    ),
    (
        "pod-failed-scheduling-insufficient-tpu",
        lambda: le.pod_event_entry(
            CLUSTER, NS, POD, POD_UID, message=le.INSUFFICIENT_TPU_MESSAGE, when=WHEN_US
        ),
        pod_expected("FailedScheduling", le.INSUFFICIENT_TPU_MESSAGE, WHEN_US),
    ),
    (
        "pod-not-trigger-scale-up",
        lambda: le.pod_event_entry(
            CLUSTER, NS, POD, POD_UID, reason="NotTriggerScaleUp", message="m", when=WHEN
        ),
        pod_expected("NotTriggerScaleUp", "m", WHEN),
    ),
    (
        "pod-scheduled-ignored",
        lambda: le.pod_event_entry(CLUSTER, NS, POD, POD_UID, reason="Scheduled", when=WHEN_US),
        Ignored("Pod event reason 'Scheduled' is not a scheduling failure", CLUSTER),
    ),
    (
        "pod-pulled-ignored",
        lambda: le.pod_event_entry(CLUSTER, NS, POD, POD_UID, reason="Pulled", when=WHEN),
        Ignored("Pod event reason 'Pulled' is not a scheduling failure", CLUSTER),
    ),
    *[
        (
            f"jobset-{reason}-{shape}",
            (
                lambda reason=reason, shape=shape: le.jobset_event_entry(
                    CLUSTER, NS, "llama-pretrain", JS_UID, reason=reason, shape=shape, when=WHEN_US
                )
            ),
            finished(outcome, reason, WHEN_US if shape == "events.k8s.io" else WHEN),
        )
        for reason, outcome in [
            ("AllJobsCompleted", "Completed"),
            ("FailedJobs", "Failed"),
            ("ReachedMaxRestarts", "Failed"),
            ("FailJobSetFailurePolicyAction", "Failed"),
            ("DeadlineExceeded", "Failed"),
        ]
        for shape in ("core", "events.k8s.io")
    ],
    *[
        (
            f"jobset-{reason}-ignored",
            lambda reason=reason: le.jobset_event_entry(CLUSTER, NS, "llama-pretrain", JS_UID, reason=reason),
            Ignored(f"JobSet event reason {reason!r} is not terminal", CLUSTER),
        )
        for reason in ("SuspendedJobs", "ResumeJobs", "Restarting", "JobCreationFailed")
    ],
    (
        "audit-delete-by-user",
        lambda: le.jobset_delete_audit_entry(
            CLUSTER, NS, "llama-pretrain", "alice@acme.example", when=WHEN_US
        ),
        JobSetDeleted(CLUSTER, NS, "llama-pretrain", "alice@acme.example", WHEN_US),
    ),
    (
        "audit-delete-by-ttl-controller",
        lambda: le.jobset_delete_audit_entry(CLUSTER, NS, "llama-pretrain", TTL, when=WHEN_US),
        JobSetDeleted(CLUSTER, NS, "llama-pretrain", TTL, WHEN_US),
    ),
    (
        "audit-deletecollection",
        lambda: le.jobset_delete_audit_entry(
            CLUSTER, NS, "", "bob@acme.example", "deletecollection", when=WHEN
        ),
        JobSetDeleted(CLUSTER, NS, "", "bob@acme.example", WHEN),
    ),
    (
        "audit-delete-denied",
        lambda: le.jobset_delete_audit_entry(CLUSTER, NS, "llama-pretrain", status_code=7),
        Ignored("the JobSet delete failed (status code 7: 'PERMISSION_DENIED')", CLUSTER),
    ),
    (
        "audit-delete-not-found",
        lambda: le.jobset_delete_audit_entry(CLUSTER, NS, "llama-pretrain", status_code=5),
        Ignored("the JobSet delete failed (status code 5: 'NOT_FOUND')", CLUSTER),
    ),
    (
        "text-marker",
        lambda: le.text_marker_entry(CLUSTER, "event exporter started watching"),
        Ignored("plain-text entry (textPayload), not a Kubernetes Event or audit record", CLUSTER),
    ),
]
IDS = [case[0] for case in CASES]


@pytest.mark.parametrize(("build", "expected"), [case[1:] for case in CASES], ids=IDS)
def test_bare_log_entry_round_trips(build: Callable[[], dict[str, Any]], expected: Event) -> None:
    # Through JSON text, as the entry travels in production.
    entry = json.loads(json.dumps(build()))
    assert decode_log_entry(entry) == expected
    assert decode_any(entry) == Decoded(expected, None)


def _delivery(message: dict[str, Any], subscription: str) -> Delivery:
    return Delivery(message["messageId"], message["publishTime"], subscription, message["attributes"])


@pytest.mark.parametrize(("build", "expected"), [case[1:] for case in CASES], ids=IDS)
def test_every_envelope_round_trips(build: Callable[[], dict[str, Any]], expected: Event) -> None:
    entry = build()
    message = le.pubsub_message(entry)
    assert message["attributes"] == {"logging.googleapis.com/timestamp": entry["timestamp"]}
    push = le.eventarc_body(message, SUB)
    structured = le.structured_cloudevent(message, TOPIC, SUB)
    with_sub, without_sub = _delivery(message, SUB), _delivery(message, "")
    assert decode_pubsub_message(message) == Decoded(expected, without_sub)
    assert decode_any(message) == Decoded(expected, without_sub)
    assert decode_any(push) == Decoded(expected, with_sub)
    assert decode_any(structured) == Decoded(expected, with_sub)
    assert decode_cloud_event(structured) == Decoded(expected, with_sub)


# ------------------------------------------------------------------ via functions-framework


@pytest.fixture(scope="module")
def ff_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[Any]]]:
    """A functions-framework app (in-process, no server) whose function records each CloudEvent."""
    functions_framework = pytest.importorskip("functions_framework")
    src_dir = tmp_path_factory.mktemp("ff")
    source = src_dir / "h4_capture_main.py"
    source.write_text("CAPTURED = []\n\n\ndef handle(cloud_event):\n    CAPTURED.append(cloud_event)\n")
    saved_path = list(sys.path)
    try:
        app = functions_framework.create_app("handle", str(source), "cloudevent")
        yield app.test_client(), sys.modules["h4_capture_main"].CAPTURED
    finally:
        sys.path[:] = saved_path
        sys.modules.pop("h4_capture_main", None)


def _post(client: Any, mode: str, message: dict[str, Any]) -> None:
    if mode == "binary":
        headers = le.binary_cloudevent_headers(message, TOPIC)
        response = client.post("/", headers=headers, data=json.dumps(le.eventarc_body(message, SUB)))
    elif mode == "structured":
        body = json.dumps(le.structured_cloudevent(message, TOPIC, SUB))
        response = client.post("/", headers={"content-type": "application/cloudevents+json"}, data=body)
    else:  # a Pub/Sub push subscription pointed straight at the function
        response = client.post(f"/{TOPIC}", json=le.eventarc_body(message, SUB))
    assert response.status_code == 200, response.get_data(as_text=True)


@pytest.mark.parametrize(
    ("mode", "subscription"),
    [("binary", SUB), ("structured", SUB), ("raw-push", "")],
    ids=["eventarc-binary", "eventarc-structured", "raw-push-converted"],
)
def test_functions_framework_cloud_events_decode(
    ff_client: tuple[Any, list[Any]], mode: str, subscription: str
) -> None:
    client, captured = ff_client
    captured.clear()
    entry = le.pod_event_entry(CLUSTER, NS, POD, POD_UID, when=WHEN_US, controller=("JobSet", "llama"))
    message = le.pubsub_message(entry, message_id="4815162342")
    _post(client, mode, message)
    [cloud_event] = captured
    expected = pod_expected(
        "FailedScheduling", le.DEFAULT_FAILED_SCHEDULING_MESSAGE, WHEN_US, ("JobSet", "llama")
    )
    assert decode_cloud_event(cloud_event) == Decoded(expected, _delivery(message, subscription))


def test_raw_push_cloud_event_carries_the_pubsub_message_type(ff_client: tuple[Any, list[Any]]) -> None:
    client, captured = ff_client
    captured.clear()
    _post(client, "raw-push", le.pubsub_message(le.text_marker_entry(CLUSTER, "x")))
    [cloud_event] = captured
    assert cloud_event["type"] == "google.cloud.pubsub.topic.v1.messagePublished"
    assert cloud_event.data["message"]["@type"] == "type.googleapis.com/google.pubsub.v1.PubsubMessage"
    assert "subscription" not in cloud_event.data


# ------------------------------------------------------------------ entry shapes


def test_pod_entry_has_the_exporter_shape() -> None:
    entry = le.pod_event_entry(CLUSTER, NS, POD, POD_UID, when=WHEN_US, controller=("JobSet", "llama"))
    assert entry["logName"] == "projects/acme-ml-prod/logs/events"
    assert entry["resource"] == {
        "type": "k8s_pod",
        "labels": {
            "project_id": "acme-ml-prod",
            "location": "us-east5",
            "cluster_name": "tpu-v5p-prod",
            "namespace_name": NS,
            "pod_name": POD,
        },
    }
    assert entry["severity"] == "WARNING"
    assert entry["timestamp"] == "2025-06-12T14:03:21.482913Z"
    assert entry["labels"] == {
        "logging.gke.io/top_level_controller_type": "JobSet",
        "logging.gke.io/top_level_controller_name": "llama",
    }
    payload = entry["jsonPayload"]
    # The scheduler records through events.k8s.io; the exporter reads it back as core/v1.
    assert (payload["apiVersion"], payload["kind"], payload["reportingComponent"]) == (
        "v1",
        "Event",
        "default-scheduler",
    )
    assert payload["involvedObject"]["uid"] == POD_UID
    assert not {"count", "firstTimestamp", "lastTimestamp", "regarding", "note"} & payload.keys()


def _event(kind: str, name: str, event_ns: str, object_ns: str = "") -> dict[str, Any]:
    obj = {"kind": kind, "name": name} | ({"namespace": object_ns} if object_ns else {})
    return {
        "metadata": {"name": f"{name}.1", "namespace": event_ns},
        "involvedObject": obj,
        "reason": "R",
        "message": "m",
        "type": "Normal",
        "count": 3,
        "firstTimestamp": "2025-06-12T13:00:00Z",
        "lastTimestamp": "2025-06-12T14:03:21Z",
    }


@pytest.mark.parametrize(
    ("event", "resource_type", "extra_labels"),
    [
        (_event("Pod", "p", "ns1", "ns1"), "k8s_pod", {"namespace_name": "ns1", "pod_name": "p"}),
        (_event("Pod", "p", "ns1", "ns2"), "k8s_cluster", {}),
        (_event("Node", "gke-n-1", "default"), "k8s_node", {"node_name": "gke-n-1"}),
        (_event("Node", "gke-n-1", "team-x"), "k8s_cluster", {}),
        (_event("Job", "j", "ns1", "ns1"), "k8s_cluster", {}),
    ],
    ids=["pod", "pod-namespace-mismatch", "node", "node-untrusted-namespace", "job"],
)
def test_kube_event_entry_picks_the_monitored_resource(
    event: dict[str, Any], resource_type: str, extra_labels: dict[str, str]
) -> None:
    entry = le.kube_event_entry(CLUSTER, event)
    base = {"project_id": "acme-ml-prod", "location": "us-east5", "cluster_name": "tpu-v5p-prod"}
    assert entry["resource"] == {"type": resource_type, "labels": base | extra_labels}
    assert entry["timestamp"] == "2025-06-12T14:03:21Z"
    assert entry["severity"] == "INFO"
    assert not {"count", "firstTimestamp", "lastTimestamp"} & entry["jsonPayload"].keys()
    assert event["count"] == 3, "the caller's dict must not be modified"


def test_kube_event_entry_presents_events_k8s_io_objects_in_the_core_view() -> None:
    native = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "js.1", "namespace": NS},
        "regarding": {"kind": "JobSet", "namespace": NS, "name": "js", "apiVersion": le.JOBSET_API_VERSION},
        "note": "jobset completed successfully",
        "reason": "AllJobsCompleted",
        "reportingController": "jobset",
        "reportingInstance": "jobset-abc",
        "action": "Reconciling",
        "type": "Normal",
        "series": {"count": 2, "lastObservedTime": "2025-06-12T14:03:21.482913Z"},
    }
    entry = le.kube_event_entry(CLUSTER, native)
    payload = entry["jsonPayload"]
    assert payload["apiVersion"] == "v1"
    assert payload["involvedObject"] == native["regarding"]
    assert (payload["message"], payload["reportingComponent"], payload["source"]) == (
        native["note"],
        "jobset",
        {},
    )
    assert entry["timestamp"] == "2025-06-12T14:03:21.482913Z"
    assert decode_log_entry(entry) == JobSetFinished(
        CLUSTER, NS, "js", "", "Completed", "AllJobsCompleted", WHEN_US
    )


def test_audit_entry_names_the_jobset_the_way_gke_does() -> None:
    entry = le.jobset_delete_audit_entry(CLUSTER, NS, "llama", method="delete")
    proto = entry["protoPayload"]
    assert entry["logName"] == "projects/acme-ml-prod/logs/cloudaudit.googleapis.com%2Factivity"
    assert proto["methodName"] == "io.x-k8s.jobset.v1alpha2.jobsets.delete"
    assert proto["resourceName"] == "jobset.x-k8s.io/v1alpha2/namespaces/ml-team/jobsets/llama"
    collection = le.jobset_delete_audit_entry(CLUSTER, NS, "", method="deletecollection")["protoPayload"]
    assert collection["resourceName"] == "jobset.x-k8s.io/v1alpha2/namespaces/ml-team/jobsets"


def test_cloud_event_headers_and_structured_form_agree() -> None:
    message = le.pubsub_message(le.text_marker_entry(CLUSTER, "x"), message_id="77")
    headers = le.binary_cloudevent_headers(message, TOPIC)
    structured = le.structured_cloudevent(message, TOPIC, SUB)
    assert headers["ce-id"] == structured["id"] == "77"
    assert headers["ce-source"] == structured["source"] == f"//pubsub.googleapis.com/{TOPIC}"
    assert headers["ce-type"] == structured["type"] == "google.cloud.pubsub.topic.v1.messagePublished"
    assert structured["data"]["message"]["message_id"] == "77"
