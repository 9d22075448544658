"""Fuzzing the function boundary: bad input of every shape is acknowledged with a reason and costs nothing.

Hypothesis builds deliveries from valid ones by breaking one thing at a time (the HTTP body, the
CloudEvent, the Pub/Sub envelope, the LogEntry, its names, labels and types) and posts each through
functions-framework's app to ``provision`` or ``release``. For every one: 2xx or a clean 4xx, a
logged reason, no call to the GKE emulator or the real API server, and no traceback anywhere.
The hand-picked corpus in ``tests/data/bad_inputs/`` runs too, one case per file.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sandbox.kube.cluster import RealCluster
from sandbox.kube.snapshot import Snapshot
from sandbox.testing import boundary as bench_boundary
from sandbox.testing.boundary import (
    CLUSTER_ID,
    SUBSCRIPTION,
    Answer,
    Boundary,
    deliver,
    encode,
    load_case,
    message_for,
    wrap,
    wrap_body,
)
from sandbox.testing.fixtures.kube import KubeHandle
from shared.events import entries as logentries
from shared.events.envelope import MAX_LOG_ENTRY_BYTES, PUBSUB_EVENT_TYPE
from shared.events.fields import (
    CONTROLLER_NAME_LABEL,
    JOBSET_TERMINAL_REASONS,
    SCHEDULING_FAILURE_REASONS,
)
from tests.paths import TEST_DATA

pytestmark = pytest.mark.integration

CORPUS = TEST_DATA / "bad_inputs"
UID = "0b7c1b1e-2f33-4c55-9a6e-1d2c3b4a5f60"
# Events that say "acknowledged without effect, and here is why".
REASON_EVENTS = {"provision.ignored", "release.ignored", "delivery.acked"}


@pytest.fixture(scope="module")
def boundary(kube_cluster: tuple[RealCluster, Snapshot]) -> Iterator[Boundary]:
    """The GKE emulator and the session's API server shared by every example (calls are checked as
    deltas; bad input writes nothing), functions wired to them."""
    with bench_boundary.started(KubeHandle(kube_cluster[0])) as started:
        yield started


def assert_clean_refusal(answer: Answer) -> None:
    """2xx with a logged reason, or a clean 4xx; never an API call, never a traceback."""
    assert answer.calls == (0, 0), f"bad input reached an API: {answer.calls}"
    logged = json.dumps(answer.lines)
    for text in (logged, answer.other_log, answer.stderr, answer.body):
        assert "Traceback" not in text and "stack_trace" not in text, text[-2000:]
    if 200 <= answer.status < 300:
        reasons = [line for line in answer.lines if line.get("event") in REASON_EVENTS]
        assert reasons, f"acknowledged without a logged reason: {answer.lines}"
        assert all(line["message"].strip() for line in reasons)
    else:
        assert 400 <= answer.status < 500, (answer.status, answer.body[:500])
        assert answer.body.strip(), "a 4xx must say why"


# --- valid entries to break ------------------------------------------------------------------------

POD_ENTRY = logentries.pod_event_entry(
    CLUSTER_ID, "team-a", "train-slice-0-0-abcde", UID, controller=("JobSet", "train")
)
JOBSET_ENTRY = logentries.jobset_event_entry(CLUSTER_ID, "team-a", "train", UID)
AUDIT_ENTRY = logentries.jobset_delete_audit_entry(CLUSTER_ID, "team-a", "train")
BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "pod": ("provision", POD_ENTRY),
    "jobset": ("release", JOBSET_ENTRY),
    "audit": ("release", AUDIT_ENTRY),
}


def set_path(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set ``doc[p0][p1]...`` (the parents exist in the base entries)."""
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


# Characters that no Kubernetes name, GCP name or label value may contain.
FORBIDDEN = [",", "=", "\n", "/", " ", "A", "_", "..", "\x00", "é", "{", '"', "%2F", "*", "\t", ":", "\u202e"]
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False), st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
not_a_string = json_values.filter(lambda v: not isinstance(v, str))
not_an_object = json_values.filter(lambda v: not isinstance(v, dict))


@st.composite
def hostile_text(draw: st.DrawFn) -> str:
    """Text with at least one character no API name or label accepts, or far too long."""
    if draw(st.integers(0, 9)) == 0:
        return "a" * draw(st.integers(254, 600))
    alphabet = st.characters(codec="utf-8", exclude_characters="\ud800")
    return (
        draw(st.text(alphabet, max_size=30)) + draw(st.sampled_from(FORBIDDEN)) + draw(st.text(max_size=30))
    )


def _required_path_types() -> list[tuple[str, tuple[str, ...], str]]:
    # Paths whose wrong type must make the entry unusable: (base, path, "object" | "string").
    pod = [
        (("jsonPayload",), "object"),
        (("jsonPayload", "involvedObject"), "object"),
        (("jsonPayload", "involvedObject", "name"), "string"),
        (("jsonPayload", "involvedObject", "namespace"), "string"),
        (("jsonPayload", "involvedObject", "kind"), "string"),
        (("jsonPayload", "reason"), "string"),
        (("resource",), "object"),
        (("resource", "labels"), "object"),
        (("resource", "labels", "cluster_name"), "string"),
        (("logName",), "string"),
    ]
    jobset = [
        (("jsonPayload", "involvedObject", "name"), "string"),
        (("jsonPayload", "involvedObject", "namespace"), "string"),
        (("jsonPayload", "reason"), "string"),
        (("resource", "labels", "project_id"), "string"),
    ]
    audit = [
        (("protoPayload",), "object"),
        (("protoPayload", "resourceName"), "string"),
        (("protoPayload", "methodName"), "string"),
        (("protoPayload", "serviceName"), "string"),
        (("resource", "labels", "location"), "string"),
    ]
    return (
        [("pod", p, t) for p, t in pod]
        + [("jobset", p, t) for p, t in jobset]
        + [("audit", p, t) for p, t in audit]
    )


REQUIRED = _required_path_types()


@st.composite
def broken_entries(draw: st.DrawFn) -> tuple[str, str, Any]:
    """(function, what was broken, the LogEntry) with exactly one thing broken past the point of use."""
    kind = draw(
        st.sampled_from(
            [
                "wrong-type",
                "invalid-name",
                "invalid-namespace",
                "unknown-reason",
                "hostile-resource-label",
                "hostile-controller-label",
                "foreign-cluster",
                "not-our-log",
                "hostile-jobset-path",
            ]
        )
    )
    if kind == "wrong-type":
        base, path, expected = draw(st.sampled_from(REQUIRED))
        function, doc = BASES[base][0], copy.deepcopy(BASES[base][1])
        set_path(doc, path, draw(not_an_object if expected == "object" else not_a_string))
        return function, f"{kind}:{'.'.join(path)}", doc
    if kind in ("invalid-name", "invalid-namespace"):
        base = draw(st.sampled_from(["pod", "jobset"]))
        function, doc = BASES[base][0], copy.deepcopy(BASES[base][1])
        bad = draw(hostile_text())
        field = "name" if kind == "invalid-name" else "namespace"
        doc["jsonPayload"]["involvedObject"][field] = bad
        if field == "namespace":
            doc["jsonPayload"]["metadata"]["namespace"] = bad
            doc["resource"]["labels"].pop("namespace_name", None)
        if base == "pod":  # keep the k8s_pod labels in agreement so only the name itself is wrong
            doc["resource"]["labels"]["namespace_name" if field == "namespace" else "pod_name"] = bad
        return function, f"{kind}:{base}", doc
    if kind == "unknown-reason":
        base = draw(st.sampled_from(["pod", "jobset"]))
        function, doc = BASES[base][0], copy.deepcopy(BASES[base][1])
        known = SCHEDULING_FAILURE_REASONS | set(JOBSET_TERMINAL_REASONS)
        doc["jsonPayload"]["reason"] = draw(st.text(max_size=40).filter(lambda r: r not in known))
        return function, f"{kind}:{base}", doc
    if kind == "hostile-resource-label":
        base = draw(st.sampled_from(sorted(BASES)))
        function, doc = BASES[base][0], copy.deepcopy(BASES[base][1])
        key = draw(st.sampled_from(["project_id", "location", "cluster_name"]))
        doc["resource"]["labels"][key] = draw(hostile_text())
        return function, f"{kind}:{key}", doc
    if kind == "hostile-controller-label":
        doc = copy.deepcopy(POD_ENTRY)
        doc["labels"][CONTROLLER_NAME_LABEL] = draw(hostile_text())
        return "provision", kind, doc
    if kind == "foreign-cluster":
        base = draw(st.sampled_from(sorted(BASES)))
        function, doc = BASES[base][0], copy.deepcopy(BASES[base][1])
        other = draw(st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True))
        doc["resource"]["labels"]["cluster_name"] = other if other != CLUSTER_ID.name else other + "x"
        return function, kind, doc
    if kind == "not-our-log":
        base = draw(st.sampled_from(sorted(BASES)))
        function, doc = BASES[base][0], copy.deepcopy(BASES[base][1])
        doc["logName"] = draw(
            st.text(max_size=60).filter(lambda n: not n.lower().endswith(("/events", "activity")))
        )
        return function, kind, doc
    doc = copy.deepcopy(AUDIT_ENTRY)
    tail = draw(st.sampled_from(["../../../secrets/x", "a/b", "", "train/status", "%2e%2e", "UPPER"]))
    doc["protoPayload"]["resourceName"] = (
        draw(
            st.sampled_from(
                ["jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets/", "core/v1/namespaces/team-a/pods/"]
            )
        )
        + tail
    )
    return "release", kind, doc


@st.composite
def bad_deliveries(draw: st.DrawFn) -> tuple[str, str, dict[str, str], bytes]:
    """(function, label, headers, body) for one bad delivery of any layer."""
    mode = draw(st.sampled_from(["binary", "binary", "structured", "push"]))
    layer = draw(st.sampled_from(["entry", "entry", "entry", "payload", "message", "cloudevent"]))
    function = draw(st.sampled_from(["provision", "release"]))
    if layer == "entry":
        function, label, doc = draw(broken_entries())
        headers, body = wrap(message_for(encode(doc)), mode)
        return function, f"{mode}:{label}", headers, body
    if layer == "payload":
        valid = json.dumps(POD_ENTRY).encode()
        choice = draw(st.sampled_from(["truncated", "oversized", "not-base64", "random-bytes", "not-object"]))
        if choice == "truncated":
            data = base64.b64encode(valid[: draw(st.integers(0, len(valid) - 1))]).decode()
        elif choice == "oversized":
            padded = {**POD_ENTRY, "padding": "x" * (MAX_LOG_ENTRY_BYTES + draw(st.integers(0, 4096)))}
            data = encode(padded)
        elif choice == "not-base64":
            text = encode(POD_ENTRY)
            cut = draw(st.integers(0, len(text)))
            data = text[:cut] + draw(st.sampled_from(["!", "*", "~", "\u00e9", "=a", "$$"])) + text[cut:]
        elif choice == "random-bytes":
            data = base64.b64encode(draw(st.binary(max_size=300))).decode()
        else:
            data = encode(draw(not_an_object))
        headers, body = wrap(message_for(data), mode)
        return function, f"{mode}:payload:{choice}", headers, body
    if layer == "message":
        choice = draw(st.sampled_from(["data-type", "attributes", "message-type", "no-message"]))
        if choice == "data-type":
            message: Any = message_for(draw(not_a_string))
        elif choice == "attributes":
            attributes = draw(
                not_an_object.filter(lambda v: v is not None)
                | st.dictionaries(st.text(max_size=8), not_a_string, min_size=1, max_size=3)
            )
            message = message_for(encode(POD_ENTRY), attributes)
        elif choice == "message-type":
            message = draw(not_an_object)
        else:
            headers, body = wrap_body({"subscription": SUBSCRIPTION}, mode)
            return function, f"{mode}:no-message", headers, body
        headers, body = wrap(message, mode)
        return function, f"{mode}:message:{choice}", headers, body
    # CloudEvent layer (binary mode, what Eventarc sends): other event types, bodies that are not JSON.
    headers, body = wrap(message_for(encode(POD_ENTRY)), "binary")
    if draw(st.booleans()):
        headers["ce-type"] = draw(st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=60))
        if headers["ce-type"] == PUBSUB_EVENT_TYPE:
            headers["ce-type"] += ".other"
        return function, "cloudevent:type", headers, body
    return (
        function,
        "cloudevent:body",
        headers,
        draw(st.binary(max_size=400).filter(lambda b: not _is_json(b))),
    )


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=bad_deliveries())
def test_fuzzed_bad_input_is_refused_cleanly_without_any_api_call(boundary, case):
    function, label, headers, body = case
    event(":".join(label.split(":")[:2]))  # the layer and what was broken, for --hypothesis-show-statistics
    answer = deliver(boundary, function, headers, body)
    try:
        assert_clean_refusal(answer)
    except AssertionError as exc:
        raise AssertionError(f"{function} {label}: {exc}") from None


# --- the corpus, and proof that the harness can see a call -----------------------------------------


CORPUS_FILES = sorted(CORPUS.glob("*.json"))
# The gap-* cases are bodies functions-framework cannot parse itself; entry.guard_boundary answers 400.
CLEAN = CORPUS_FILES


@pytest.mark.parametrize("path", CLEAN, ids=[p.stem for p in CLEAN])
def test_corpus_case_is_refused_cleanly(boundary, path):
    case = load_case(path)
    assert_clean_refusal(deliver(boundary, case["function"], case["headers"], case["body"]))


@pytest.mark.parametrize(
    ("function", "doc", "calls"),
    [
        ("provision", POD_ENTRY, lambda gke, kube: kube == 1 and gke == 0),
        ("release", JOBSET_ENTRY, lambda gke, kube: gke == 1),
        ("release", AUDIT_ENTRY, lambda gke, kube: gke == 1),
    ],
    ids=["pod-event-reads-the-pod", "jobset-event-lists-pools", "audit-delete-lists-pools"],
)
def test_unbroken_entries_do_reach_the_apis(boundary, function, doc, calls: Callable[[int, int], bool]):
    # Without this, "zero calls" above could pass for a harness that never counts anything.
    answer = deliver(boundary, function, *wrap(message_for(encode(doc)), "binary"))
    assert 200 <= answer.status < 300
    assert calls(*answer.calls), answer.calls
