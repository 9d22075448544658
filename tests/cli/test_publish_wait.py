"""``tpuprov publish kueue --wait``: follow the apply on the cluster until it is exactly the configuration.

The cluster is the real API server with the JobSet and Kueue CRDs (no Kueue controller runs); the apply
itself is the product's ``KueueService`` (what ``apply_kueue`` runs on the message), started a moment after
publishing.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sandbox.testing.fixtures.kube import KubeHandle
from shared.cloud.objects import ApiClientObjects, Bounds
from shared.kueue.apply import KueueService
from shared.kueue.config import parse_config
from tests.cli.publishing import RecordingPublisher, parse
from tpuprov.commands import publish as cli_publish

pytestmark = pytest.mark.integration

CLUSTER = ["--cluster", "projects/p/locations/us-central2-b/clusters/c"]
CONFIG = """
flavors:
  - {name: v5e-2x4, accelerator: tpu-v5-lite-podslice, topology: 2x4}
clusterQueues:
  - {name: team-a, quota: {v5e-2x4: 16}}
localQueues:
  - {name: a, namespace: default, clusterQueue: team-a}
"""
# What was applied before: one more LocalQueue, which the new configuration prunes.
BEFORE = CONFIG + "  - {name: old, namespace: default, clusterQueue: team-a}\n"


@pytest.fixture
def kube(kube_server: KubeHandle, monkeypatch: pytest.MonkeyPatch) -> KubeHandle:
    monkeypatch.setenv("KUBECONFIG", str(kube_server.kubeconfig))
    for name in ("PROJECT_ID", "LOCATION", "CLUSTER_NAME", "ALLOWED_ACCELERATORS", "TOPIC_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    apply(kube_server, BEFORE)
    return kube_server


def apply(server: KubeHandle, text: str) -> None:
    """What apply_kueue does with the message, as apply_kueue's own identity."""
    client = server.api_client("apply_kueue")
    try:
        KueueService(ApiClientObjects(client), Bounds(total=10, webhook_retry=5, poll=0.1)).apply(
            parse_config(text)
        )
    finally:
        client.close()


def _publish(tmp_path: Any, argv: list[str], publisher: RecordingPublisher) -> int:
    path = tmp_path / "queues.yaml"
    path.write_text(CONFIG)
    return cli_publish.run(parse(["kueue", "-f", str(path), *argv]), publisher=publisher)


def test_kueue_wait_follows_the_apply_until_the_cluster_matches(
    kube: KubeHandle, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    publisher = RecordingPublisher()
    # apply_kueue receives the message a moment after it is published.
    timer = threading.Timer(0.5, apply, (kube, CONFIG))
    timer.start()
    try:
        assert _publish(tmp_path, ["--project", "p", *CLUSTER, "--wait", "30"], publisher) == 0
    finally:
        timer.cancel()
        timer.join()
    out, err = capsys.readouterr()
    assert out == "published kueue to projects/p/topics/tpuprov-kueue: message id 1000\n"
    assert err.splitlines() == [
        "Waiting for the Kueue configuration (3 objects)...",
        "Waiting for the Kueue configuration (3 objects)...done.",
    ]


def test_kueue_wait_that_never_sees_the_apply_fails_and_says_how_far_it_got(
    kube: KubeHandle, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _publish(tmp_path, ["--project", "p", *CLUSTER, "--wait", "1"], RecordingPublisher()) == 1
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (
        "Waiting for the Kueue configuration (3 objects)...failed: gave up after 1s "
        "(3/3 objects applied; to prune: LocalQueue default/old)"
    )


def test_kueue_wait_without_the_cluster_names_the_flags_and_publishes_nothing(
    kube: KubeHandle, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    publisher = RecordingPublisher()
    assert _publish(tmp_path, ["--project", "p", "--wait", "10"], publisher) == 2
    assert publisher.topics == {}
    assert capsys.readouterr().err == (
        "tpuprov publish: which cluster? give --location (or $LOCATION), --cluster (or $CLUSTER_NAME)\n"
    )
