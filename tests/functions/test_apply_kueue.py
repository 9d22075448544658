"""``apply_kueue`` function: binary-mode CloudEvents through functions-framework onto the sandbox API."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
import yaml

from sandbox.emulators.kube.api import KubeApiServer
from sandbox.testing.fixtures import kube as fixtures_kube
from sandbox.testing.fnclient import LoggedFunction, served_function
from shared.core.settings import Settings
from shared.kueue.config import DEFAULT_CONFIG
from tests.paths import REPO

KUEUE = "kueue.x-k8s.io/v1beta2"
MANAGED = "tpuprov.dev/managed-by=tpu-provisioner"
WEBHOOK_DOWN = (
    'Internal error occurred: failed calling webhook "vclusterqueue.kb.io": failed to call webhook: '
    'Post "https://kueue-webhook-service.kueue-system.svc:443/validate-kueue-x-k8s-io-v1beta2-clusterqueue": '
    'no endpoints available for service "kueue-webhook-service"'
)
SEED = DEFAULT_CONFIG.read_bytes()
MULTI = (REPO / "examples" / "kueue" / "multi-flavor.yaml").read_bytes()


@contextlib.contextmanager
def _function(server: KubeApiServer) -> Iterator[LoggedFunction]:
    settings = Settings(
        project_id="test-proj",
        location="us-central2-b",
        cluster_name="test-cluster",
        kube_api_endpoint=server.url,
        setup_timeout_seconds=5,
        setup_webhook_retry_seconds=1,
        setup_poll_interval_ms=10,
    )
    with served_function("apply_kueue", settings, "tpuprov-kueue") as served:
        yield served


@pytest.fixture
def cluster() -> Iterator[KubeApiServer]:
    """A cluster API serving Kueue's CRDs, with the namespaces the examples use."""
    server = KubeApiServer(crd_files=[fixtures_kube.require_manifest(fixtures_kube.KUEUE_MANIFEST)]).start()
    try:
        for namespace in ("research", "prod"):
            server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        yield server
    finally:
        server.stop()


@pytest.fixture
def function(cluster: KubeApiServer) -> Iterator[LoggedFunction]:
    """The function app as Cloud Run serves it, configured for ``cluster`` with tiny bounds."""
    with _function(cluster) as fn:
        yield fn


def _managed(cluster: KubeApiServer) -> list[str]:
    names = []
    for api_version, plural in (
        ("scheduling.k8s.io/v1", "priorityclasses"),
        (KUEUE, "workloadpriorityclasses"),
        (KUEUE, "resourceflavors"),
        (KUEUE, "clusterqueues"),
        (KUEUE, "localqueues"),
    ):
        for obj in cluster.list(api_version, plural, label_selector=MANAGED):
            meta = obj["metadata"]
            where = f"{meta['namespace']}/" if meta.get("namespace") else ""
            names.append(f"{obj['kind']} {where}{meta['name']}")
    return sorted(names)


SEED_NAMES = [
    "ClusterQueue cluster-queue",
    "LocalQueue default/multislice-queue",
    "PriorityClass low-priority",
    "ResourceFlavor vlp-24",
]


@pytest.mark.integration
def test_an_empty_message_applies_the_packaged_default(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    response = function.post(None)
    assert response.status_code == 200
    assert _managed(cluster) == SEED_NAMES
    queue = cluster.get(KUEUE, "clusterqueues", None, "cluster-queue")
    assert queue is not None
    assert queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"] == [
        {"name": "google.com/tpu", "nominalQuota": 24}
    ]
    assert queue["spec"]["preemption"] == {
        "reclaimWithinCohort": "Any",
        "withinClusterQueue": "LowerPriority",
    }
    [applied] = function.events("kueue.applied")
    assert sorted(applied["created"]) == SEED_NAMES


@pytest.mark.integration
def test_a_yaml_message_replaces_the_configuration_and_prunes(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    assert function.post(MULTI).status_code == 200
    assert "ClusterQueue research" in _managed(cluster)
    hand_made = {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "hand-made"}, "spec": {}}
    cluster.put(hand_made)

    assert function.post(SEED).status_code == 200
    assert _managed(cluster) == SEED_NAMES
    assert cluster.get(KUEUE, "resourceflavors", None, "hand-made") is not None  # not ours: untouched
    pruned = function.events("kueue.applied")[-1]["pruned"]
    assert len(pruned) == 8 and "LocalQueue research/research-queue" in pruned


@pytest.mark.integration
def test_a_json_message_is_applied_and_a_repeat_changes_nothing(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    payload = json.dumps(yaml.safe_load(SEED)).encode()
    assert function.post(payload).status_code == 200
    version = cluster.resource_version
    assert function.post(payload).status_code == 200
    assert cluster.resource_version == version
    repeat = function.events("kueue.applied")[-1]
    assert repeat["created"] == [] and repeat["configured"] == [] and repeat["pruned"] == []


@pytest.mark.integration
def test_an_invalid_configuration_is_acknowledged_and_nothing_is_applied(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    assert function.post(SEED).status_code == 200
    cluster.clear_requests()
    bad = SEED.replace(b"topology: 2x4", b"topology: 3x3").replace(b"vlp-24: 24", b"vlp-24: -24")
    response = function.post(bad)
    assert response.status_code == 200
    assert cluster.count("PATCH") == 0 and cluster.count("DELETE") == 0
    assert _managed(cluster) == SEED_NAMES
    [acked] = function.events("delivery.acked")
    assert "2 problems" in acked["message"]
    assert "3x3" in acked["message"] and "must not be negative (-24)" in acked["message"]


@pytest.mark.integration
def test_a_missing_namespace_is_acknowledged_with_the_reason(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    payload = SEED.replace(b"namespace: default", b"namespace: team-z")
    assert function.post(payload).status_code == 200
    assert cluster.count("PATCH") == 0
    [acked] = function.events("delivery.acked")
    assert "team-z (for multislice-queue)" in acked["message"]


@pytest.mark.integration
def test_kueue_webhook_errors_are_retried_then_handed_back(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    def cluster_queue_patch(method: str, path: str) -> bool:
        return method == "PATCH" and "/clusterqueues/" in path

    cluster.fail_next(2, 500, match=cluster_queue_patch, message=WEBHOOK_DOWN)
    assert function.post(SEED).status_code == 200
    assert cluster.count("PATCH", "/clusterqueues/") == 3

    cluster.fail_next(10_000, 500, match=cluster_queue_patch, message=WEBHOOK_DOWN)
    response = function.post(SEED.replace(b"vlp-24: 24", b"vlp-24: 16"))
    assert response.status_code == 503
    [retry] = function.events("delivery.retry")
    assert "no endpoints available" in retry["message"]


@pytest.mark.integration
def test_a_cluster_without_kueue_asks_for_redelivery() -> None:
    with KubeApiServer() as bare, _function(bare) as fn:
        response = fn.post(None)
        assert response.status_code == 503
        [retry] = fn.events("delivery.retry")
        assert "is Kueue installed" in retry["message"]


@pytest.mark.integration
def test_a_queue_with_the_tpu_slices_check_gets_the_active_admission_check(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    checked = (REPO / "examples" / "kueue" / "tpu-slices-check.yaml").read_bytes()
    assert function.post(checked).status_code == 200
    check = cluster.get(KUEUE, "admissionchecks", None, "tpu-slices")
    assert check is not None and check["spec"] == {"controllerName": "tpuprov.dev/tpu-slices"}
    # Marked Active at once: Kueue holds a ClusterQueue whose check is not Active inactive.
    assert [(c["type"], c["status"]) for c in check["status"]["conditions"]] == [("Active", "True")]
    queue = cluster.get(KUEUE, "clusterqueues", None, "cluster-queue")
    assert queue is not None
    assert queue["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": "tpu-slices", "onFlavors": ["vlp-24"]}]
    }
