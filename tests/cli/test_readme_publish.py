"""docs/deploy.md's raw ``gcloud pubsub topics publish`` messages are the ones the CLI form beside each sends.

The README links docs/deploy.md for checking a deployment by hand; its "Check a deployment" section holds the
commands.

Each raw message is decoded the way its function decodes it, and compared with what ``tpuprov publish``
builds from the CLI line just above it (run against a recording publisher), so neither can drift.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from typing import Any

import pytest

from shared.events.envelope import decode_pubsub_message
from shared.events.trigger import parse_setup_payload
from shared.kueue.config import parse_config
from tests.cli.publishing import RecordingPublisher, parse
from tests.paths import REPO
from tpuprov.commands import publish as cli_publish

DEPLOYMENT = ["--project", "my-project", "--location", "us-central2-b", "--cluster", "tpu-cluster"]
# Fields of each decoded event that must agree (times and generated ids differ by design).
COMPARED = ("kind", "cluster", "namespace", "pod", "name", "reason", "outcome", "controller_name")


def _commands() -> list[list[str]]:
    text = (REPO / "docs" / "deploy.md").read_text()
    start = text.index("Check a deployment by publishing")
    block = text[text.index("```sh\n", start) + len("```sh\n") :]
    block = block[: block.index("```")]
    commands = []
    for line in shlex.split(block.replace("\\\n", " "), comments=True):
        if line in ("tpuprov", "gcloud"):
            commands.append([line])
        else:
            commands[-1].append(line)
    return commands


def _cat(value: str) -> str:
    # The Kueue form reads its file with $(cat PATH), which a shell would expand.
    match = re.fullmatch(r"\$\(cat (\S+)\)", value)
    return (REPO / match.group(1)).read_text() if match else value


def _gcloud(words: list[str]) -> tuple[str, str]:
    assert words[:4] == ["gcloud", "pubsub", "topics", "publish"]
    flags = dict(word.split("=", 1) if "=" in word else (word, "") for word in words[5:])
    project = words[words.index("--project") + 1]
    return f"projects/{project}/topics/{words[4]}", _cat(flags["--message"])


def _summary(topic: str, data: bytes) -> Any:
    if topic.endswith("-setup"):
        return parse_setup_payload(data)
    if topic.endswith("-kueue"):
        return parse_config(data.decode())
    event = decode_pubsub_message({"data": base64.b64encode(data).decode(), "attributes": {}}).event
    return {k: getattr(event, k, None) for k in COMPARED} | {"type": type(event).__name__}


def _pairs() -> list[Any]:
    commands = _commands()
    pairs = []
    for index, words in enumerate(commands):
        if words[:2] == ["tpuprov", "publish"]:
            raw = commands[index + 1]
            pairs.append(pytest.param(words[2:], raw, id=words[2]))
    return pairs


def test_the_deploy_page_shows_a_raw_message_for_every_topic() -> None:
    topics = {_gcloud(w)[0].rsplit("/", 1)[1] for w in _commands() if w[0] == "gcloud"}
    suffixes = set(cli_publish.publish.TOPIC_SUFFIXES.values()) | {"reconcile"}
    assert topics == {f"tpuprov-{suffix}" for suffix in suffixes}
    assert [p.id for p in _pairs()] == ["pending-pod", "jobset-finished", "jobset-deleted", "setup", "kueue"]


@pytest.mark.parametrize(("cli", "raw"), _pairs())
def test_each_raw_message_is_what_the_cli_form_beside_it_sends(cli: list[str], raw: list[str]) -> None:
    publisher = RecordingPublisher()
    # --wait follows the outcome on a cluster; the message is the same without it.
    if "--wait" in cli:
        cli = cli[: cli.index("--wait")] + cli[cli.index("--wait") + 2 :]
    assert cli_publish.run(parse([*cli, *DEPLOYMENT]), publisher=publisher) == 0
    sent_topic, sent = publisher.only_message()
    raw_topic, raw_message = _gcloud(raw)
    assert raw_topic == sent_topic
    expected = _summary(sent_topic, base64.b64decode(sent["data"]))
    assert _summary(raw_topic, raw_message.encode()) == expected
    if isinstance(expected, dict):
        assert expected["type"] != "Ignored", expected


def test_the_reconcile_message_is_what_cloud_scheduler_sends() -> None:
    [words] = [w for w in _commands() if w[0] == "gcloud" and w[4] == "tpuprov-reconcile"]
    tf = (REPO / "infra" / "main.tf").read_text()
    scheduled = re.search(r"jsonencode\(\{ source = \"([^\"]+)\", action = \"([^\"]+)\" \}\)", tf)
    assert scheduled is not None
    assert json.loads(_gcloud(words)[1])["action"] == scheduled.group(2)
