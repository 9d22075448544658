"""``tpuprov publish``: validation, the messages it builds, and real publishes to the Pub/Sub emulator."""

from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from shared.core.errors import PermanentError, TransientError
from shared.events.envelope import (
    ClusterId,
    JobSetDeleted,
    JobSetFinished,
    PodUnschedulable,
    decode_pubsub_message,
)
from shared.events.trigger import parse_setup_payload
from shared.kueue.config import DEFAULT_CONFIG, parse_config
from tests.cli.publishing import RecordingPublisher, parse
from tests.paths import REPO
from tpuprov import main as cli
from tpuprov.commands import publish as cli_publish

if TYPE_CHECKING:
    from sandbox.testing.fixtures.pubsub import PubsubAdmin

# The emulator fixtures (a no-op once tests/conftest.py registers the module for the whole suite).

ROOT = REPO
PROJECT, LOCATION, CLUSTER = "pub-proj", "us-central2-b", "tpu-cluster"
CLUSTER_ID = ClusterId(PROJECT, LOCATION, CLUSTER)
UID = "0b9d6c1e-2f3a-4b5c-8d7e-9f0a1b2c3d4e"
KUEUE_FILE = DEFAULT_CONFIG
DEPLOYMENT = ["--project", PROJECT, "--location", LOCATION, "--cluster", CLUSTER]
ENV_NAMES = (
    "PROJECT_ID",
    "GOOGLE_CLOUD_PROJECT",
    "LOCATION",
    "CLUSTER_NAME",
    "TOPIC_PREFIX",
    "ALLOWED_ACCELERATORS",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults come from the environment; start every test from none."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def run(argv: list[str], publisher: RecordingPublisher) -> int:
    return cli_publish.run(parse(argv), publisher=publisher)


CASES = [
    (
        ["pending-pod", "--namespace", "team-a", "--pod", "train-0", "--uid", UID, "--jobset", "train"],
        "tpuprov-pending-pods",
        PodUnschedulable,
        {
            "namespace": "team-a",
            "pod": "train-0",
            "pod_uid": UID,
            "reason": "FailedScheduling",
            "controller_name": "train",
        },
    ),
    (
        ["pending-pod", "--namespace", "team-a", "--pod", "train-0", "--reason", "NotTriggerScaleUp"],
        "tpuprov-pending-pods",
        PodUnschedulable,
        {"pod_uid": "", "reason": "NotTriggerScaleUp", "controller_type": ""},
    ),
    (
        ["jobset-finished", "--namespace", "team-a", "--name", "train", "--uid", UID],
        "tpuprov-jobset-lifecycle",
        JobSetFinished,
        {"name": "train", "uid": UID, "outcome": "Completed", "reason": "AllJobsCompleted"},
    ),
    (
        ["jobset-finished", "--namespace", "team-a", "--name", "train", "--failed"],
        "tpuprov-jobset-lifecycle",
        JobSetFinished,
        {"uid": "", "outcome": "Failed", "reason": "FailedJobs"},
    ),
    (
        ["jobset-deleted", "--namespace", "team-a", "--name", "train", "--principal", "alice@example.com"],
        "tpuprov-jobset-lifecycle",
        JobSetDeleted,
        {"namespace": "team-a", "name": "train", "principal": "alice@example.com"},
    ),
]


@pytest.mark.parametrize(
    ("argv", "topic", "kind", "fields"), CASES, ids=["pod", "pod-scale-up", "finished", "failed", "deleted"]
)
def test_log_messages_decode_as_the_sink_would_deliver_them(
    argv: list[str], topic: str, kind: type, fields: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    publisher = RecordingPublisher()
    assert run([*argv, *DEPLOYMENT], publisher) == 0
    topic_path, message = publisher.only_message()
    assert topic_path == f"projects/{PROJECT}/topics/{topic}"
    event = decode_pubsub_message(message).event
    assert isinstance(event, kind)
    assert event.cluster == CLUSTER_ID
    assert {k: getattr(event, k) for k in fields} == fields
    assert message["attributes"]["logging.googleapis.com/timestamp"]
    assert capsys.readouterr().out.strip() == f"published {argv[0]} to {topic_path}: message id 1000"


def test_setup_message_names_the_cluster_path() -> None:
    publisher = RecordingPublisher()
    other = "projects/new-proj/locations/europe-west4/clusters/fresh"
    assert run(["setup", "--cluster", other], publisher) == 0
    topic_path, message = publisher.only_message()
    # With a full path and no --project, the topic lives in the cluster's project.
    assert topic_path == "projects/new-proj/topics/tpuprov-setup"
    cluster, ignored = parse_setup_payload(base64.b64decode(message["data"]))
    assert (cluster, ignored) == (ClusterId("new-proj", "europe-west4", "fresh"), "")


def test_kueue_message_is_the_validated_file() -> None:
    publisher = RecordingPublisher()
    assert (
        run(["kueue", "-f", str(KUEUE_FILE), "--project", PROJECT, "--topic-prefix", "tp2"], publisher) == 0
    )
    topic_path, message = publisher.only_message()
    assert topic_path == f"projects/{PROJECT}/topics/tp2-kueue"
    data = base64.b64decode(message["data"])
    assert data.decode() == KUEUE_FILE.read_text()
    assert parse_config(data) == parse_config(KUEUE_FILE.read_text())


def test_a_kueue_message_for_a_fleet_cluster_names_it_in_its_cluster_attribute() -> None:
    publisher = RecordingPublisher()
    other = ClusterId(PROJECT, "europe-west4", "eu-tpus")
    assert (
        run(["kueue", "-f", str(KUEUE_FILE), "--project", PROJECT, "--cluster", other.path], publisher) == 0
    )
    _, message = publisher.only_message()
    assert message["attributes"]["cluster"] == other.path  # what apply_kueue applies it to
    # Without a cluster it stays the deployment's own: no attribute.
    publisher = RecordingPublisher()
    assert run(["kueue", "-f", str(KUEUE_FILE), "--project", PROJECT], publisher) == 0
    assert "cluster" not in publisher.only_message()[1]["attributes"]


def test_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROJECT_ID", PROJECT)
    monkeypatch.setenv("LOCATION", LOCATION)
    monkeypatch.setenv("CLUSTER_NAME", CLUSTER)
    monkeypatch.setenv("TOPIC_PREFIX", "staging")
    publisher = RecordingPublisher()
    assert run(["jobset-deleted", "--namespace", "ns", "--name", "js"], publisher) == 0
    topic_path, message = publisher.only_message()
    assert topic_path == f"projects/{PROJECT}/topics/staging-jobset-lifecycle"
    assert decode_pubsub_message(message).event.cluster == CLUSTER_ID


INVALID = [
    (
        ["pending-pod", "--namespace", "Team_A", "--pod", "p", *DEPLOYMENT],
        "namespace 'Team_A'",
        "namespace-case",
    ),
    (
        ["pending-pod", "--namespace", "a" * 64, "--pod", "p", *DEPLOYMENT],
        "not a valid Kubernetes namespace",
        "namespace-long",
    ),
    (
        ["pending-pod", "--namespace", "ns", "--pod", "../etc", *DEPLOYMENT],
        "pod name '../etc'",
        "pod-traversal",
    ),
    (["pending-pod", "--namespace", "ns", "--pod", "p", "--uid", "xyz", *DEPLOYMENT], "uid 'xyz'", "bad-uid"),
    (
        ["pending-pod", "--namespace", "ns", "--pod", "p", "--jobset", "Bad", *DEPLOYMENT],
        "JobSet name 'Bad'",
        "bad-jobset",
    ),
    (
        ["jobset-finished", "--namespace", "ns", "--name", "x" * 300, *DEPLOYMENT],
        "JobSet name",
        "name-too-long",
    ),
    (
        ["jobset-deleted", "--namespace", "ns", "--name", "UPPER", *DEPLOYMENT],
        "JobSet name 'UPPER'",
        "name-case",
    ),
    (
        ["jobset-deleted", "--namespace", "ns", "--name", "js"],
        "which cluster? give --project (or $PROJECT_ID), --location (or $LOCATION), "
        "--cluster (or $CLUSTER_NAME)",
        "no-cluster",
    ),
    (["setup", "--cluster", "projects/p/clusters/c"], "is not projects/P/locations/L/clusters/C", "bad-path"),
    (
        ["setup", "--cluster", "c", "--project", "Bad_Project", "--location", "l"],
        "cluster: --project='Bad_Project' is not a valid GCP name",
        "bad-project",
    ),
    (["kueue", "-f", "/does/not/exist.yaml", *DEPLOYMENT], "cannot read", "missing-file"),
    (["kueue", "-f", str(KUEUE_FILE)], "give --project", "kueue-without-project"),
    (["setup", *DEPLOYMENT, "--topic-prefix", "Bad Prefix"], "topic prefix", "bad-prefix"),
]


@pytest.mark.parametrize(("argv", "message"), [c[:2] for c in INVALID], ids=[c[2] for c in INVALID])
def test_invalid_input_exits_2_and_publishes_nothing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    publisher = RecordingPublisher()
    assert run(argv, publisher) == 2
    assert publisher.topics == {}
    err = capsys.readouterr().err
    assert err.startswith("tpuprov publish: ")
    assert message in err


def test_invalid_kueue_configuration_lists_the_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "queues.yaml"
    config.write_text("flavors:\n  - name: f1\n    accelerator: tpu-v9-imaginary\n    topology: 2x4\n")
    publisher = RecordingPublisher()
    assert run(["kueue", "-f", str(config), *DEPLOYMENT], publisher) == 2
    assert publisher.topics == {}
    assert "tpu-v9-imaginary" in capsys.readouterr().err


def test_dry_run_prints_the_message_and_publishes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    publisher = RecordingPublisher()
    argv = ["jobset-finished", "--namespace", "ns", "--name", "js", "--dry-run", "-o", "json", *DEPLOYMENT]
    assert run(argv, publisher) == 0
    assert publisher.topics == {}
    shown = json.loads(capsys.readouterr().out)
    assert shown["topic"] == f"projects/{PROJECT}/topics/tpuprov-jobset-lifecycle"
    assert shown["data"]["jsonPayload"]["reason"] == "AllJobsCompleted"
    assert shown["data"]["resource"]["labels"]["cluster_name"] == CLUSTER


@pytest.mark.parametrize(
    "error",
    [PermanentError("topic projects/p/topics/t does not exist"), TransientError("deadline exceeded")],
    ids=["permanent", "transient"],
)
def test_publish_failure_exits_1_with_the_reason(
    error: Exception, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["setup", *DEPLOYMENT]
    assert run(argv, RecordingPublisher(fail_with=error)) == 1
    assert capsys.readouterr().err.strip() == f"tpuprov publish: {error}"


def test_the_tpuprov_command_has_publish(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["publish", "setup", "--dry-run", "-o", "yaml", *DEPLOYMENT]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["data"] == {"cluster": CLUSTER_ID.path}


@pytest.mark.parametrize(("argv", "topic", "kind", "fields"), CASES[:1] + CASES[-1:], ids=["pod", "deleted"])
def test_dry_run_table_is_the_gcloud_command_of_the_same_message(
    argv: list[str], topic: str, kind: type, fields: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    publisher = RecordingPublisher()
    assert run([*argv, *DEPLOYMENT], publisher) == 0
    _, sent = publisher.only_message()
    capsys.readouterr()
    assert run([*argv, "--dry-run", *DEPLOYMENT], publisher) == 0
    words = shlex.split(capsys.readouterr().out)
    assert words[:5] == ["gcloud", "pubsub", "topics", "publish", f"projects/{PROJECT}/topics/{topic}"]
    flags = dict(word.split("=", 1) for word in words[5:])
    attributes = dict(pair.split("=", 1) for pair in flags["--attribute"].split(","))
    message = {"data": base64.b64encode(flags["--message"].encode()).decode(), "attributes": attributes}
    decoded = decode_pubsub_message(message)
    assert isinstance(decoded.event, kind)
    assert {k: getattr(decoded.event, k) for k in fields} == fields
    assert set(attributes) == set(sent["attributes"])


# --- against the real Pub/Sub emulator ---------------------------------------------------------

LIVE = [
    (["pending-pod", "--namespace", "team-a", "--pod", "train-0", "--jobset", "train"], "pending-pods"),
    (
        ["jobset-finished", "--namespace", "team-a", "--name", "train", "--uid", UID, "--failed"],
        "jobset-lifecycle",
    ),
    (["jobset-deleted", "--namespace", "team-a", "--name", "train"], "jobset-lifecycle"),
    (["setup"], "setup"),
    (["kueue", "-f", str(KUEUE_FILE)], "kueue"),
]


def _message_dict(message: Any) -> dict[str, Any]:
    return {
        "data": base64.b64encode(message.data).decode(),
        "attributes": dict(message.attributes),
        "messageId": message.message_id,
        "publishTime": message.publish_time.isoformat(),
    }


@pytest.mark.integration
@pytest.mark.parametrize(("argv", "suffix"), LIVE, ids=["pod", "finished", "deleted", "setup", "kueue"])
def test_publish_to_the_emulator(
    argv: list[str], suffix: str, pubsub: PubsubAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = pubsub.unique("live")
    topic = pubsub.create_topic(f"{prefix}-{suffix}")
    subscription = pubsub.create_subscription(topic, pubsub.unique("sub"))
    args = [*argv, "--project", pubsub.project, "--location", LOCATION, "--cluster", CLUSTER]
    assert cli.main(["publish", *args, "--topic-prefix", prefix]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith(f"published {argv[0]} to {topic}: message id ")

    [message] = pubsub.pull(subscription)
    assert printed.endswith(f"message id {message.message_id}")
    assert message.attributes["tpuprov.dev/source"] == "tpuprov-publish"
    cluster = ClusterId(pubsub.project, LOCATION, CLUSTER)
    if suffix == "setup":
        assert parse_setup_payload(message.data) == (cluster, "")
        return
    if suffix == "kueue":
        assert message.data.decode() == KUEUE_FILE.read_text()
        return
    event = decode_pubsub_message(_message_dict(message)).event
    assert event.cluster == cluster
    if argv[0] == "pending-pod":
        assert isinstance(event, PodUnschedulable)
        assert (event.namespace, event.pod, event.controller_type, event.controller_name) == (
            "team-a",
            "train-0",
            "JobSet",
            "train",
        )
    elif argv[0] == "jobset-finished":
        assert isinstance(event, JobSetFinished)
        assert (event.name, event.uid, event.outcome) == ("train", UID, "Failed")
    else:
        assert isinstance(event, JobSetDeleted)
        assert (event.namespace, event.name) == ("team-a", "train")


@pytest.mark.integration
def test_publish_to_a_missing_topic_fails_clearly(
    pubsub: PubsubAdmin, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["publish", "setup", "--project", pubsub.project, "--location", LOCATION, "--cluster", CLUSTER]
    assert cli.main([*argv, "--topic-prefix", pubsub.unique("nothing")]) == 1
    err = capsys.readouterr().err
    assert "does not exist" in err
    assert "-setup" in err
