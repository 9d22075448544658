"""``setup_cluster`` function: trigger payloads, then binary-mode CloudEvents through functions-framework."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.emulators.kube.api import KubeApiServer
from sandbox.testing.fixtures import kube as fixtures_kube
from sandbox.testing.fnclient import LoggedFunction, served_function
from shared.core.errors import InvalidInputError
from shared.core.settings import Settings
from shared.events.trigger import parse_setup_payload

MANAGED = "projects/test-proj/locations/us-central2-b/clusters/test-cluster"
NEW_CLUSTER = "projects/other-proj/locations/europe-west4/clusters/fresh-one"
WEBHOOK_DOWN = (
    'Internal error occurred: failed calling webhook "mdeployment.kb.io": connect: connection refused'
)


def _audit_entry(last: bool = True, method: str = "CreateCluster", code: int = 0) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "logName": "projects/other-proj/logs/cloudaudit.googleapis.com%2Factivity",
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "serviceName": "container.googleapis.com",
            "methodName": f"google.container.v1.ClusterManager.{method}",
            "resourceName": "projects/other-proj/zones/europe-west4/clusters/fresh-one",
        },
        "resource": {
            "type": "gke_cluster",
            "labels": {"project_id": "other-proj", "location": "europe-west4", "cluster_name": "fresh-one"},
        },
        "operation": {
            "id": "operation-1",
            "producer": "container.googleapis.com",
            "last" if last else "first": True,
        },
        "severity": "NOTICE",
    }
    if code:
        entry["protoPayload"]["status"] = {"code": code, "message": "quota exceeded"}
    return entry


# ----------------------------------------------------------------------------- payloads


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"cluster": NEW_CLUSTER}, NEW_CLUSTER),
        ({"project": "other-proj", "location": "europe-west4", "cluster": "fresh-one"}, NEW_CLUSTER),
        (_audit_entry(), NEW_CLUSTER),
        (
            {**_audit_entry(), "resource": {"type": "gke_cluster", "labels": {}}},
            "projects/other-proj/locations/europe-west4/clusters/fresh-one",
        ),
    ],
    ids=["cluster-path", "project-location-cluster", "audit-last-entry", "audit-zonal-resource-name"],
)
def test_payloads_that_name_a_cluster(payload: dict[str, Any], expected: str) -> None:
    cluster, ignored = parse_setup_payload(json.dumps(payload).encode())
    assert cluster is not None and cluster.path == expected
    assert ignored == ""


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (_audit_entry(last=False), "still running"),
        (_audit_entry(code=8), "creation failed (status code 8)"),
        (_audit_entry(method="DeleteCluster"), "not a cluster creation"),
    ],
    ids=["operation-first-entry", "creation-failed", "other-method"],
)
def test_audit_entries_that_are_not_a_finished_creation_are_ignored(
    payload: dict[str, Any], reason: str
) -> None:
    cluster, ignored = parse_setup_payload(json.dumps(payload).encode())
    assert cluster is None
    assert reason in ignored


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", "not JSON"),
        (b'["projects/p/locations/l/clusters/c"]', "not an object"),
        (b"{}", 'must name "cluster"'),
        (b'{"cluster": "projects/p/clusters/c"}', "is not projects/P/locations/L/clusters/C"),
        (b'{"cluster": "c"}', "project is missing"),
        (b'{"project": "Bad Project", "location": "l", "cluster": "c"}', "not a valid GCP name"),
        (b'{"cluster": "projects/p/locations/l/clusters/c", "project": "p"}', "not both"),
    ],
    ids=[
        "not-json",
        "array",
        "no-cluster",
        "short-path",
        "name-without-project",
        "bad-project",
        "path-and-parts",
    ],
)
def test_bad_payloads_are_invalid_input(payload: bytes, reason: str) -> None:
    with pytest.raises(InvalidInputError, match=reason):
        parse_setup_payload(payload)


# ----------------------------------------------------------------------------- over the wire


@pytest.fixture
def cluster() -> Iterator[KubeApiServer]:
    """An empty cluster API (no JobSet, no Kueue)."""
    fixtures_kube.require_manifest(fixtures_kube.JOBSET_MANIFEST)
    fixtures_kube.require_manifest(fixtures_kube.KUEUE_MANIFEST)
    server = KubeApiServer(crd_establish_delay=0.02, deployment_ready_delay=0.02).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def function(cluster: KubeApiServer) -> Iterator[LoggedFunction]:
    """The function app as Cloud Run serves it, configured for ``cluster`` with tiny bounds."""
    settings = Settings(
        project_id="test-proj",
        location="us-central2-b",
        cluster_name="test-cluster",
        kube_api_endpoint=cluster.url,
        manifests_dir=str(fixtures_kube.MANIFESTS_DIR),
        setup_timeout_seconds=10,
        setup_webhook_retry_seconds=1,
        setup_poll_interval_ms=10,
    )
    with served_function("setup_cluster", settings, "tpuprov-setup") as served:
        yield served


def _deployment_version(cluster: KubeApiServer, namespace: str, name: str) -> str:
    obj = cluster.get("apps/v1", "deployments", namespace, name)
    assert obj is not None
    return str(obj["metadata"]["annotations"]["tpuprov.dev/installed-version"])


def _down(times: int) -> tuple[int, int, Any, str]:
    def match(method: str, path: str) -> bool:
        return method == "PATCH" and "/deployments/" in path

    return times, 500, match, WEBHOOK_DOWN


@pytest.mark.integration
def test_manual_message_installs_then_a_rerun_changes_nothing(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    response = function.post(json.dumps({"cluster": MANAGED}).encode())
    assert response.status_code == 200
    assert _deployment_version(cluster, "jobset-system", "jobset-controller-manager") == "v0.10.1"
    assert _deployment_version(cluster, "kueue-system", "kueue-controller-manager") == "v0.19.2"
    assert cluster.get(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", None, "clusterqueues.kueue.x-k8s.io"
    )
    [done] = function.events("setup.done")
    assert done["changed"] is True and done["cluster"] == MANAGED

    version = cluster.resource_version
    response = function.post(json.dumps({"cluster": MANAGED}).encode(), message_id="1002")
    assert response.status_code == 200
    assert cluster.resource_version == version
    rerun = function.events("setup.done")[-1]
    assert rerun["changed"] is False
    assert "jobset v0.10.1: unchanged" in rerun["message"] and "kueue v0.19.2: unchanged" in rerun["message"]


@pytest.mark.integration
def test_cluster_creation_audit_entry_bootstraps_another_cluster(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    response = function.post(json.dumps(_audit_entry()).encode())
    assert response.status_code == 200
    assert _deployment_version(cluster, "kueue-system", "kueue-controller-manager") == "v0.19.2"
    [done] = function.events("setup.done")
    assert done["cluster"] == NEW_CLUSTER


@pytest.mark.integration
@pytest.mark.parametrize(
    ("payload", "logged"),
    [
        (b"definitely not json", "setup message is not JSON"),
        (json.dumps({"cluster": "projects/p"}).encode(), "is not projects/P/locations/L/clusters/C"),
        (None, "Pub/Sub message has no data"),
    ],
    ids=["not-json", "bad-cluster-path", "empty-message"],
)
def test_bad_payload_is_logged_and_acknowledged(
    function: LoggedFunction, cluster: KubeApiServer, payload: bytes | None, logged: str
) -> None:
    response = function.post(payload)
    assert response.status_code == 200
    assert cluster.count("PATCH") == 0
    [acked] = function.events("delivery.acked")
    assert logged in acked["message"]


@pytest.mark.integration
def test_first_entry_of_the_creation_is_acknowledged_without_setup(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    response = function.post(json.dumps(_audit_entry(last=False)).encode())
    assert response.status_code == 200
    assert cluster.count() == 0
    [ignored] = function.events("setup.ignored")
    assert "still running" in ignored["message"]


@pytest.mark.integration
def test_webhook_that_stays_down_answers_503_for_redelivery(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    cluster.fail_next(*_down(10_000))
    response = function.post(json.dumps({"cluster": MANAGED}).encode())
    assert response.status_code == 503
    # The retries happened inside the delivery before it was handed back to Pub/Sub.
    assert cluster.count("PATCH", "/deployments/jobset-controller-manager") >= 3
    [retry] = function.events("delivery.retry")
    assert "failed calling webhook" in retry["message"]


@pytest.mark.integration
def test_webhook_that_recovers_is_retried_within_the_delivery(
    function: LoggedFunction, cluster: KubeApiServer
) -> None:
    cluster.fail_next(*_down(2))
    response = function.post(json.dumps({"cluster": MANAGED}).encode())
    assert response.status_code == 200
    assert cluster.count("PATCH", "/deployments/") == 4
    assert _deployment_version(cluster, "jobset-system", "jobset-controller-manager") == "v0.10.1"
