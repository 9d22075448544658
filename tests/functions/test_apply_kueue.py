"""``apply_kueue`` function: binary-mode CloudEvents through functions-framework onto the real API server
(Kueue's CRDs installed, no Kueue controller), as the function's own identity."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sandbox.kube.snapshot import delete_keys
from sandbox.kube.webhooks import FailingWebhook
from sandbox.testing.fixtures.kube import KUEUE_MANIFEST, KubeHandle, crds
from sandbox.testing.fnclient import LoggedFunction, served_function
from shared.core.settings import Settings
from shared.kueue.config import DEFAULT_CONFIG
from tests.paths import REPO

KUEUE = "kueue.x-k8s.io/v1beta2"
MANAGED = "tpuprov.dev/managed-by=tpu-provisioner"
SEED = DEFAULT_CONFIG.read_bytes()
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_KEYS = "/registry/apiextensions.k8s.io/customresourcedefinitions"  # in etcd
MANAGED_KINDS = (
    ("scheduling.k8s.io/v1", "priorityclasses"),
    (KUEUE, "workloadpriorityclasses"),
    (KUEUE, "resourceflavors"),
    (KUEUE, "clusterqueues"),
    (KUEUE, "localqueues"),
)
MULTI = (REPO / "examples" / "kueue" / "multi-flavor.yaml").read_bytes()


@contextlib.contextmanager
def _function(kubeconfig: Path) -> Iterator[LoggedFunction]:
    settings = Settings(
        unlimited_spending=True,
        project_id="test-proj",
        location="us-central2-b",
        cluster_name="test-cluster",
        kubeconfig=str(kubeconfig),
        setup_timeout_seconds=5,
        setup_webhook_retry_seconds=1,
        setup_poll_interval_ms=10,
    )
    with served_function("apply_kueue", settings, "tpuprov-kueue") as served:
        yield served


@pytest.fixture
def cluster(kube_server: KubeHandle) -> KubeHandle:
    """The API server serving Kueue's CRDs, with the namespaces the examples use."""
    for namespace in ("research", "prod"):
        kube_server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    return kube_server


@pytest.fixture
def function(cluster: KubeHandle) -> Iterator[LoggedFunction]:
    """The function app as Cloud Run serves it, configured for ``cluster`` with tiny bounds."""
    with _function(cluster.kubeconfig_for("apply_kueue")) as fn:
        yield fn


def _versions(cluster: KubeHandle) -> dict[str, str]:
    """resourceVersion of every object the product manages (a write of any changes its own)."""
    found = {}
    for api_version, plural in MANAGED_KINDS:
        for obj in cluster.list(api_version, plural, label_selector=MANAGED):
            meta = obj["metadata"]
            found[f"{obj['kind']} {meta.get('namespace', '')}/{meta['name']}"] = meta["resourceVersion"]
    return found


def _managed(cluster: KubeHandle) -> list[str]:
    names = []
    for api_version, plural in MANAGED_KINDS:
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
def test_an_empty_message_applies_the_packaged_default(function: LoggedFunction, cluster: KubeHandle) -> None:
    response = function.post(None)
    assert response.status_code == 200
    assert _managed(cluster) == SEED_NAMES
    queue = cluster.get(KUEUE, "clusterqueues", None, "cluster-queue")
    assert queue is not None
    assert queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"] == [
        {"name": "google.com/tpu", "nominalQuota": 24}
    ]
    assert queue["spec"]["preemption"] == {
        "borrowWithinCohort": {"policy": "Never"},  # the CRD's default, filled in by the API server
        "reclaimWithinCohort": "Any",
        "withinClusterQueue": "LowerPriority",
    }
    [applied] = function.events("kueue.applied")
    assert sorted(applied["created"]) == SEED_NAMES


@pytest.mark.integration
def test_a_yaml_message_replaces_the_configuration_and_prunes(
    function: LoggedFunction, cluster: KubeHandle
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
    function: LoggedFunction, cluster: KubeHandle
) -> None:
    payload = json.dumps(yaml.safe_load(SEED)).encode()
    assert function.post(payload).status_code == 200
    versions = _versions(cluster)
    assert function.post(payload).status_code == 200
    assert _versions(cluster) == versions
    repeat = function.events("kueue.applied")[-1]
    assert repeat["created"] == [] and repeat["configured"] == [] and repeat["pruned"] == []


@pytest.mark.integration
def test_an_invalid_configuration_is_acknowledged_and_nothing_is_applied(
    function: LoggedFunction, cluster: KubeHandle
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
    function: LoggedFunction, cluster: KubeHandle
) -> None:
    payload = SEED.replace(b"namespace: default", b"namespace: team-z")
    assert function.post(payload).status_code == 200
    assert cluster.count("PATCH") == 0
    [acked] = function.events("delivery.acked")
    assert "team-z (for multislice-queue)" in acked["message"]


@pytest.mark.integration
def test_kueue_webhook_errors_are_retried_then_handed_back(
    function: LoggedFunction, cluster: KubeHandle
) -> None:
    # Kueue's validating webhook for ClusterQueues answers errors, twice, then recovers.
    webhook = FailingWebhook(
        cluster.cluster, "vclusterqueue.kb.io", "kueue.x-k8s.io", "v1beta2", "clusterqueues", "ClusterQueue"
    ).start()
    try:
        webhook.failures = 2
        cluster.clear_requests()
        assert function.post(SEED).status_code == 200
        assert cluster.count("PATCH", "/clusterqueues/") == 3

        webhook.failures = 10_000
        response = function.post(SEED.replace(b"vlp-24: 24", b"vlp-24: 16"))
        assert response.status_code == 503
    finally:
        webhook.stop()
    [retry] = function.events("delivery.retry")
    assert 'failed calling webhook "vclusterqueue.kb.io"' in retry["message"]


@pytest.mark.integration
def test_a_cluster_without_kueue_asks_for_redelivery(kube_server: KubeHandle) -> None:
    # Kueue not installed: its CRDs go from the store at once (the next test's reset puts them back).
    names = [str(crd["metadata"]["name"]) for crd in crds(KUEUE_MANIFEST)]
    delete_keys(kube_server.cluster.etcd_url, [f"{CRD_KEYS}/{name}" for name in names])
    while any(kube_server.admin.get(f"{CRDS}/{name}") for name in names):
        time.sleep(0.05)
    with _function(kube_server.kubeconfig_for("apply_kueue")) as fn:
        response = fn.post(None)
        assert response.status_code == 503
        [retry] = fn.events("delivery.retry")
        assert "is Kueue installed" in retry["message"]


@pytest.mark.integration
def test_a_queue_with_the_tpu_slices_check_gets_the_active_admission_check(
    function: LoggedFunction, cluster: KubeHandle
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
