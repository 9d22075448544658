"""What ``tpuprov why`` adds when a function's role lacks a permission (``tpuprov.denials``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from tpuprov.denials import DecisionDenials, Denial, LogFileDenials, denial_from, logging_filter, sentence


@pytest.mark.parametrize(
    ("line", "want"),
    [
        (
            {"event": "permission.denied", "permission": "container.nodes.update", "role": "release", "x": 1},
            Denial("release", "container.nodes.update"),
        ),
        ({"event": "delivery.retry", "permission": "container.nodes.update", "role": "release"}, None),
        ({"event": "permission.denied", "role": "release"}, None),
        ({}, None),
    ],
    ids=["denial", "other-event", "no-permission", "empty"],
)
def test_denial_from_a_decision_line(line: dict[str, Any], want: Denial | None) -> None:
    assert denial_from(line) == want


@pytest.mark.parametrize(
    ("denials", "want"),
    [
        ([], ""),
        ([Denial("apply_kueue", "container.priorityClasses.create")], ""),
        (
            [Denial("release", "container.nodes.update")] * 3,
            "Deployment error: The release function's role lacks container.nodes.update: add it to "
            "infra/roles.json and apply infra/. Until then its deliveries are refused and redelivered "
            "(nothing is lost once the role holds it).",
        ),
        (
            [Denial("release", "container.nodes.update"), Denial("provision", "container.pods.get")],
            "Deployment error: The provision function's role lacks container.pods.get: add it to "
            "infra/roles.json; the release function's role lacks container.nodes.update: add it to "
            "infra/roles.json and apply infra/. Until then their deliveries are refused and redelivered "
            "(nothing is lost once the role holds it).",
        ),
    ],
    ids=["none", "not-about-jobsets", "repeated-once", "two-roles"],
)
def test_sentence(denials: list[Denial], want: str) -> None:
    assert sentence(denials) == want


def test_decision_lines_source() -> None:
    lines = [
        {"event": "permission.denied", "permission": "container.nodes.update", "role": "release"},
        {"event": "release.deleted", "pool": "p"},
    ]
    assert DecisionDenials(lines).denials() == [Denial("release", "container.nodes.update")]


def test_cloud_logging_filter() -> None:
    since = datetime.datetime(2026, 1, 5, 10, 0, tzinfo=datetime.UTC)
    assert logging_filter("tpuprov", since) == (
        'resource.type="cloud_run_revision" '
        'resource.labels.service_name=("tpuprov-provision" OR "tpuprov-release" OR "tpuprov-reconcile") '
        'jsonPayload.event="permission.denied" timestamp>="2026-01-05T10:00:00Z"'
    )


def test_log_files_source(tmp_path: Any) -> None:
    (tmp_path / "release.log").write_text(
        "Serving on http://127.0.0.1:8080\n"
        '{"event": "permission.denied", "permission": "container.nodes.update", "role": "release"}\n'
        '{"event": "release.deleted", "pool": "p"}\n'
        "permission.denied but not JSON\n"
    )
    (tmp_path / "provision.log").write_text("")
    assert LogFileDenials(str(tmp_path)).denials() == [Denial("release", "container.nodes.update")]
