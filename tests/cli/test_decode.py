"""``tpuprov decode`` (tpuprov.commands.decode) on the shipped examples and on bad input."""

from __future__ import annotations

import argparse
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shared.events import entries as le
from shared.events.envelope import ClusterId
from tests.paths import EXAMPLES
from tpuprov.commands import decode as cli_decode

CLUSTER = ClusterId("acme-ml-prod", "us-east5", "tpu-v5p-prod")
WHEN = datetime(2025, 6, 12, 14, 3, 21, tzinfo=UTC)


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tpuprov")
    cli_decode.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


EXAMPLE_FILES = sorted(EXAMPLES.glob("*.json"))
KINDS = ("pod-unschedulable", "jobset-finished", "jobset-deleted", "ignored")


def expected_kind(path: Path) -> str:
    return next(kind for kind in KINDS if kind in path.stem)


def test_examples_cover_every_form_and_kind() -> None:
    stems = {p.stem for p in EXAMPLE_FILES}
    for form in ("logentry", "pubsub-message", "push-body", "cloudevent"):
        for kind in KINDS:
            assert f"{form}-{kind}" in stems


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.stem for p in EXAMPLE_FILES])
def test_cli_classifies_every_example(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["decode", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["kind"] == expected_kind(path)
    assert summary["reason"]
    if summary["kind"] != "ignored":
        assert summary["cluster"] == "projects/acme-ml-prod/locations/us-east5/clusters/tpu-v5p-prod"
        assert summary["namespace"] == "ml-team"


def test_cli_text_output_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((EXAMPLES / "push-body-jobset-finished.json").read_text()))
    assert run_cli(["decode", "-", "-o", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "kind: jobset-finished" in lines
    assert "outcome: Completed" in lines
    assert "delivery.subscription: projects/acme-ml-prod/subscriptions/tpuprov-push" in lines


def test_cli_decodes_a_gcloud_logging_read_array(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "read.json"
    path.write_text(
        json.dumps(
            [
                le.pod_event_entry(CLUSTER, "ml-team", "p", "", when=WHEN),
                le.jobset_delete_audit_entry(CLUSTER, "ml-team", "j", status_code=7),
            ]
        )
    )
    assert run_cli(["decode", str(path)]) == 0
    assert [s["kind"] for s in json.loads(capsys.readouterr().out)] == ["pod-unschedulable", "ignored"]


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), ("{not json", "is not valid JSON"), (b"\xff\xfe", "cannot read")],
    ids=["missing-file", "invalid-json", "not-utf8"],
)
def test_cli_fails_on_unreadable_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes | None, message: str
) -> None:
    path = tmp_path / "input.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    assert run_cli(["decode", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err and str(path) in captured.err
