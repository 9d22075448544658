"""The Cloud Logging query subset (sandbox.emulators.logging.filter): semantics, bad syntax, templating."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.emulators.logging.filter import load_filter, parse_filter, render_template

ENTRY: dict[str, Any] = {
    "logName": "projects/p1/logs/cloudaudit.googleapis.com%2Factivity",
    "severity": "WARNING",
    "timestamp": "2026-05-01T12:00:00.5Z",
    "resource": {"type": "k8s_pod", "labels": {"cluster_name": "c1", "location": "us-central2-b"}},
    "labels": {"logging.gke.io/top_level_controller_type": "JobSet", "k8s-pod/app": "train"},
    "jsonPayload": {
        "reason": "FailedScheduling",
        "message": "0/3 nodes are available: 3 Insufficient google.com/tpu.",
        "count": 3,
        "involvedObject": {"kind": "Pod", "name": "train-0"},
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "Scheduled", "status": "True"}],
        "nullField": None,
    },
    "operation": {"last": True, "first": False},
    "protoPayload": {"status": {"code": 7}},
}

MATCHES = [
    ('resource.type="k8s_pod"', True, "equals"),
    ('resource.type="K8S_POD"', False, "equals-is-case-sensitive"),
    ("resource.type=k8s_pod", True, "bare-word-value"),
    ('resource.type!="k8s_pod"', False, "not-equals"),
    ('jsonPayload.absent!="x"', True, "not-equals-matches-missing-field"),
    ('jsonPayload.absent="x"', False, "missing-field-never-equal"),
    ('jsonPayload.message:"insufficient GOOGLE.com/tpu"', True, "has-is-case-insensitive-substring"),
    ('jsonPayload.message:"gpu"', False, "has-no-substring"),
    ('jsonPayload.involvedObject:"train-0"', True, "has-searches-nested-object"),
    ('jsonPayload.message=~"^0/[0-9]+ nodes"', True, "regex-search"),
    ('jsonPayload.message=~"^nodes"', False, "regex-anchored-miss"),
    ('jsonPayload.message!~"gpu"', True, "regex-negated"),
    ('jsonPayload.message=~"\\d+ Insufficient"', True, "regex-backslash-class-kept"),
    ('labels."logging.gke.io/top_level_controller_type"="JobSet"', True, "quoted-path-segment"),
    ('labels."k8s-pod/app"="train"', True, "quoted-segment-with-slash"),
    ('labels."logging.gke.io/top_level_controller_type":*', True, "presence"),
    ('labels."logging.gke.io/top_level_controller_name":*', False, "presence-missing"),
    ("jsonPayload.nullField:*", False, "null-is-absent"),
    ("NOT labels.nothing:*", True, "not-presence"),
    ("-labels.nothing:*", True, "minus-negation"),
    ('jsonPayload.reason=("Scheduled" OR "FailedScheduling")', True, "value-or-list"),
    ('jsonPayload.reason=("Scheduled" OR "Pulled")', False, "value-or-list-miss"),
    ('jsonPayload.reason!=("Scheduled" OR "FailedScheduling")', False, "negated-value-list"),
    ("operation.last=true", True, "boolean-literal"),
    ("operation.last=TRUE", True, "boolean-literal-any-case"),
    ("operation.first=true", False, "boolean-false"),
    ("jsonPayload.count=3", True, "number-equals"),
    ("jsonPayload.count>2", True, "number-greater"),
    ("jsonPayload.count>=3.0", True, "number-greater-equal"),
    ("jsonPayload.count<3", False, "number-less"),
    ("protoPayload.status.code>0", True, "nested-number"),
    ("NOT protoPayload.status.code>0", False, "not-number"),
    ("NOT jsonPayload.status.code>0", True, "not-number-missing"),
    ("severity>=WARNING", True, "severity-order"),
    ("severity>ERROR", False, "severity-order-miss"),
    ("severity<=warning", True, "severity-order-any-case"),
    ('timestamp>="2026-05-01T11:59:59Z"', True, "timestamp-order"),
    ('timestamp<"2026-05-01T11:59:59Z"', False, "timestamp-order-miss"),
    ('jsonPayload.conditions.type="Scheduled"', True, "repeated-field-any-element"),
    ('jsonPayload.conditions.type="Initialized"', False, "repeated-field-no-element"),
    ('logName="projects/p1/logs/cloudaudit.googleapis.com%2Factivity"', True, "url-encoded-log-name"),
    ('resource.type="k8s_pod" resource.labels.cluster_name="c1"', True, "implicit-and"),
    ('resource.type="k8s_pod"\nresource.labels.cluster_name="c2"', False, "implicit-and-across-lines"),
    ('resource.type="k8s_pod" AND resource.labels.cluster_name="c2"', False, "explicit-and"),
    ('resource.type="gce" OR resource.labels.cluster_name="c1"', True, "or"),
    # Cloud Logging binds OR tighter than AND: this is (x OR y) AND z.
    (
        'resource.type="k8s_pod" OR severity=ERROR resource.labels.cluster_name="c2"',
        False,
        "or-binds-tighter",
    ),
    ('(resource.type="gce" AND severity=ERROR) OR operation.last=true', True, "parentheses"),
    ('NOT resource.type="gce" AND NOT severity=ERROR', True, "not-binds-tightest"),
    ('NOT (resource.type="k8s_pod" AND severity=WARNING)', False, "not-group"),
    (
        'resource.type="k8s_pod" -- trailing comment\n-- a whole comment line\nseverity=WARNING',
        True,
        "comments",
    ),
    (
        'jsonPayload.message="0/3 nodes are available: 3 Insufficient google.com/tpu."',
        True,
        "string-with-colon",
    ),
    ('jsonPayload.message="say \\"hi\\""', False, "escaped-quotes-parse"),
]


@pytest.mark.parametrize(("query", "expected", "_id"), MATCHES, ids=[m[2] for m in MATCHES])
def test_query_semantics(query: str, expected: bool, _id: str) -> None:
    assert parse_filter(query).matches(ENTRY) is expected


def test_escaped_quote_is_part_of_the_value() -> None:
    entry = {"jsonPayload": {"message": 'say "hi"'}}
    assert parse_filter('jsonPayload.message="say \\"hi\\""').matches(entry)


REJECTED = [
    ("", "empty filter", "empty"),
    ('"The cat in the hat"', "global restrictions", "global-text"),
    ("robot", "global restriction 'robot'", "bare-word"),
    ('resource.type="a" and severity=ERROR', "lower-case keyword", "lowercase-and"),
    ('SEARCH("foo")', "functions", "search-function"),
    ('log_id("events")', "functions", "log-id-function"),
    ('resource.type="a" AND', "found end of filter", "dangling-and"),
    ('resource.type="a" OR', "found end of filter", "dangling-or"),
    ('(resource.type="a"', "expected ')'", "unbalanced-open"),
    ('resource.type="a")', "unexpected ')'", "unbalanced-close"),
    ('resource.type="a', "unterminated string", "unterminated-string"),
    ('jsonPayload.message=~"(unclosed"', "invalid regular expression", "bad-regex"),
    ('resource.type=("a" AND "b")', "only OR is supported", "and-in-value-list"),
    ("resource.type=", "expected a value", "missing-value"),
    ("resource.type=a:b", "quote it", "unquoted-operator-char"),
    ('- resource.type="a"', "'-' must be followed directly", "detached-minus"),
]


@pytest.mark.parametrize(("query", "message", "_id"), REJECTED, ids=[r[2] for r in REJECTED])
def test_unsupported_syntax_is_rejected_at_load(query: str, message: str, _id: str) -> None:
    with pytest.raises(ValueError, match=r"line 1|empty") as err:
        parse_filter(query)
    assert message in str(err.value)


def test_error_reports_line_and_column() -> None:
    with pytest.raises(ValueError, match="line 3 column 1"):
        parse_filter('resource.type="a"\nseverity=ERROR\nrobot')


TEMPLATES = [
    ('a="${project_id}"', {"project_id": "p"}, 'a="p"', "substitutes"),
    ('a="${ project_id }"', {"project_id": "p"}, 'a="p"', "whitespace-inside-braces"),
    ('a="$${project_id}"', {}, 'a="${project_id}"', "dollar-escape"),
    ('a="%%{x}"', {}, 'a="%{x}"', "percent-escape"),
    ('a="%2F $ {x}"', {}, 'a="%2F $ {x}"', "lone-dollar-and-percent-untouched"),
    ('a="${x}${x}"', {"x": "1", "unused": "2"}, 'a="11"', "repeat-and-unused"),
]


@pytest.mark.parametrize(("text", "subs", "expected", "_id"), TEMPLATES, ids=[t[3] for t in TEMPLATES])
def test_render_template(text: str, subs: dict[str, str], expected: str, _id: str) -> None:
    assert render_template(text, subs) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('a="${missing}"', "no value was given for 'missing'"),
        ('a="${upper(x)}"', "only ${name} is allowed"),
        ('%{ if x }a="1"%{ endif }', "directives"),
    ],
    ids=["missing-variable", "expression", "directive"],
)
def test_render_template_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        render_template(text, {"x": "1"})
    assert message in str(err.value)


def test_load_filter_substitutes_and_keeps_text(tmp_path: Path) -> None:
    path = tmp_path / "demo.filter"
    path.write_text('resource.labels.cluster_name="${cluster_name}"\nseverity>=WARNING\n')
    loaded = load_filter(path, {"cluster_name": "c1"})
    assert loaded.text == 'resource.labels.cluster_name="c1"\nseverity>=WARNING\n'
    assert loaded.matches(ENTRY)
    assert not load_filter(path, {"cluster_name": "other"}).matches(ENTRY)


def test_load_filter_names_the_file_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "broken.filter"
    path.write_text("resource.type=(\n")
    with pytest.raises(ValueError, match=r"broken\.filter: line 2 column 1: expected a value"):
        load_filter(path, {})
