"""Structured logs: each decision is one JSON line Cloud Logging can parse, with event, trace and JobSet.

Cloud Run forwards a container's stdout to Cloud Logging, which reads ``severity`` and ``message``
from each JSON line and links it to the request trace through ``logging.googleapis.com/trace``.
Deliveries here carry a W3C ``traceparent`` extension, as Eventarc's do, and every line the
delivery produced is checked; then each decision is looked up by its stable ``event`` name.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.core import labels, logs
from shared.events import entries as logentries
from tests.conftest import CLUSTER_ID, PROJECT

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
SEVERITIES = {"DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"}
JOBSET_API = f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"


class Stdout:
    """The product's log stream, captured the way Cloud Run would read it: line by line."""

    def __init__(self) -> None:
        self.buffer = io.StringIO()

    def attach(self) -> None:
        logs.configure(PROJECT, stream=self.buffer)

    def take(self) -> list[dict[str, Any]]:
        """Every line since the last call, each parsed as one JSON object."""
        text = self.buffer.getvalue()
        self.buffer.seek(0)
        self.buffer.truncate()
        lines = []
        for raw in text.splitlines():
            doc = json.loads(raw)  # one line, one JSON object: nothing else on stdout
            assert isinstance(doc, dict)
            lines.append(doc)
        return lines


@pytest.fixture
def stdout(world) -> Iterator[Stdout]:
    out = Stdout()
    out.attach()
    try:
        yield out
    finally:
        logs.configure(PROJECT)


def reconfigure(world, stdout: Stdout, **overrides: Any) -> None:
    world.configure(**overrides)  # a redeploy re-creates the runtime, which re-routes the logger
    stdout.attach()


def deliver(function: str, entry: dict[str, Any], mode: str = "binary") -> None:
    """Post ``entry`` as Eventarc would, with a traceparent extension; expect an ack."""
    fn = FunctionClient(function)
    message = logentries.pubsub_message(entry)
    if mode == "binary":
        headers = {**logentries.binary_cloudevent_headers(message, fn.topic), "ce-traceparent": TRACEPARENT}
        body = json.dumps(logentries.eventarc_body(message, fn.subscription))
        response = fn.post_raw(headers, body)
    else:
        doc = logentries.structured_cloudevent(message, fn.topic, fn.subscription)
        doc["traceparent"] = TRACEPARENT
        response = fn.post_raw({"content-type": "application/cloudevents+json"}, json.dumps(doc))
    assert response.status_code == 200, response.data


def submit(world, jobset: dict[str, Any], mutate=None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return world.kube.submit_jobset(jobset, mutate)


def pending(pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    controller = ("JobSet", meta["labels"].get(labels.JOBSET_NAME, ""))
    return logentries.pod_event_entry(
        CLUSTER_ID, meta["namespace"], meta["name"], meta.get("uid", ""), controller=controller
    )


def assert_cloud_logging_shape(lines: list[dict[str, Any]]) -> None:
    """Fields Cloud Logging parses: severity, message, the trace path; plus our stable event name."""
    assert lines, "the delivery logged nothing"
    for line in lines:
        assert line["severity"] in SEVERITIES
        assert isinstance(line["message"], str) and line["message"]
        assert isinstance(line["event"], str) and line["event"].count(".") >= 1
        assert line["logging.googleapis.com/trace"] == f"projects/{PROJECT}/traces/{TRACE}"
        assert "trace" not in line  # only the key Cloud Logging understands
        assert "stack_trace" not in line


def only(lines: list[dict[str, Any]], event: str) -> dict[str, Any]:
    """The single line with this event (a decision is logged exactly once)."""
    matching = [line for line in lines if line["event"] == event]
    assert len(matching) == 1, (event, [line["event"] for line in lines])
    return matching[0]


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_created_then_exists_each_one_line_with_trace_and_jobset(world, stdout, mode):
    _, pods = submit(world, tpu_jobset("train", "team-a", replicas=1, topology="2x4"))
    deliver("provision", pending(pods[0]), mode)
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    created = only(lines, "provision.created")
    assert created["severity"] == "INFO"
    assert created["jobset"] == "team-a/train"
    assert created["pool"] == world.pool_names()[0]
    assert created["slice"] == "team-a/train slice[0]"
    assert created["function"] == "provision" and created["message_id"]
    assert "ct6e-standard-4t" in created["message"]

    deliver("provision", pending(pods[1]), mode)
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    exists = only(lines, "provision.exists")
    assert exists["jobset"] == "team-a/train" and exists["pool"] == created["pool"]
    assert not [line for line in lines if line["event"] == "provision.created"]


def _pinned(pod: dict[str, Any]) -> None:
    pod["spec"]["nodeSelector"][labels.NODEPOOL] = "leaders-pool"


def test_skipped_says_why_and_names_the_jobset(world, stdout):
    _, pods = submit(world, tpu_jobset("follow", "team-a", replicas=1, topology="2x2"), _pinned)
    deliver("provision", pending(pods[0]))
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    skipped = only(lines, "provision.skipped")
    assert skipped["jobset"] == "team-a/follow"
    assert "pinned to node pool 'leaders-pool'" in skipped["message"]


def test_skipped_for_a_vanished_pod_still_names_the_jobset(world, stdout):
    _, pods = submit(world, tpu_jobset("gone", "team-a", replicas=1, topology="2x2"))
    world.kube.delete("v1", "pods", "team-a", pods[0]["metadata"]["name"])
    deliver("provision", pending(pods[0]))
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    skipped = only(lines, "provision.skipped")
    assert skipped["jobset"] == "team-a/gone"
    assert "no longer exists" in skipped["message"]


@pytest.mark.parametrize(
    ("overrides", "mutate", "why"),
    [
        ({"namespace_allowlist": ("ml",)}, None, "NAMESPACE_ALLOWLIST"),
        ({"drain": True}, None, "drain mode"),
        # (A selector value the API server's validation refuses cannot reach the product on a pod.)
        ({}, lambda pod: pod["spec"]["nodeSelector"].update({"tpuprov.dev/team": "a"}), "reserved"),
        ({}, lambda pod: pod["spec"]["nodeSelector"].pop(labels.TPU_TOPOLOGY), labels.TPU_TOPOLOGY),
    ],
    ids=["allowlist", "drain", "hostile-selector", "no-topology"],
)
def test_refused_says_why_at_warning_and_names_the_jobset(world, stdout, overrides, mutate, why):
    if overrides:
        reconfigure(world, stdout, **overrides)
    _, pods = submit(world, tpu_jobset("nope", "team-a", replicas=1, topology="2x2"), mutate)
    deliver("provision", pending(pods[0]))
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    refused = only(lines, "provision.refused")
    assert refused["severity"] == "WARNING"
    assert refused["jobset"] == "team-a/nope"
    assert why in refused["message"]
    assert world.gke.count("create") == 0


def test_ignored_input_is_one_line_with_the_reason(world, stdout):
    deliver("provision", logentries.text_marker_entry(CLUSTER_ID, "started watching"))
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    ignored = only(lines, "provision.ignored")
    assert "textPayload" in ignored["message"]


def _with_pools(world, name: str, replicas: int) -> tuple[dict[str, Any], list[str]]:
    jobset, pods = submit(world, tpu_jobset(name, "team-a", replicas=replicas, topology="2x4"))
    for pod in pods:
        deliver("provision", pending(pod))
    world.gke.finish_operations()
    return jobset, world.pool_names()


def _complete(world, jobset: dict[str, Any]) -> None:
    meta = jobset["metadata"]
    condition = {
        "type": "Completed",
        "status": "True",
        "reason": "AllJobsCompleted",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    world.kube.patch_status(
        JOBSET_API, "jobsets", meta["namespace"], meta["name"], {"conditions": [condition]}
    )


def test_released_and_kept_are_one_line_per_pool_with_the_jobset(world, stdout):
    jobset, names = _with_pools(world, "done", replicas=2)
    meta = jobset["metadata"]
    finished = logentries.jobset_event_entry(CLUSTER_ID, "team-a", "done", meta["uid"])
    stdout.take()

    deliver("release", finished)  # still running in the API: the event nominates, the API decides
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    kept = [line for line in lines if line["event"] == "release.kept"]
    assert sorted(line["pool"] for line in kept) == names
    assert all(line["jobset"] == "team-a/done" and "still running" in line["message"] for line in kept)

    _complete(world, jobset)
    deliver("release", finished)
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    deleted = [line for line in lines if line["event"] == "release.deleted"]
    assert sorted(line["pool"] for line in deleted) == names
    assert all(line["jobset"] == "team-a/done" and "completed" in line["message"] for line in deleted)

    world.gke.finish_operations()
    deliver("release", finished)
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    assert only(lines, "release.nothing")["jobset"] == "team-a/done"


def test_audited_deletion_release_names_the_jobset(world, stdout):
    _, names = _with_pools(world, "deleted", replicas=1)
    world.kube.delete(JOBSET_API, "jobsets", "team-a", "deleted")
    stdout.take()
    deliver("release", logentries.jobset_delete_audit_entry(CLUSTER_ID, "team-a", "deleted"))
    lines = stdout.take()
    assert_cloud_logging_shape(lines)
    deleted = only(lines, "release.deleted")
    assert deleted["pool"] == names[0] and deleted["jobset"] == "team-a/deleted"
    assert "no longer exists" in deleted["message"]


def test_without_traceparent_lines_carry_no_trace_field(world, stdout):
    fn = FunctionClient("provision")
    assert fn.post_entry(logentries.text_marker_entry(CLUSTER_ID, "x")).status_code == 200
    [line] = stdout.take()
    assert line["event"] == "provision.ignored"
    assert "logging.googleapis.com/trace" not in line
