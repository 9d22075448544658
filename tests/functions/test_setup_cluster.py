"""``setup_cluster`` function: trigger payloads, then binary-mode CloudEvents through functions-framework."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest

from sandbox import polling
from sandbox.testing.fixtures import kube as fixtures_kube
from sandbox.testing.fixtures.kube import KubeHandle
from sandbox.testing.fixtures.releases import SETUP, ReleaseCluster, release_cluster
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


# ----------------------------------------------------------------------------- which clusters
# Through the function as Cloud Run serves it; the installer is replaced by a recorder, so a test
# sees exactly which clusters would have been set up (and that no API is reached otherwise).


class _Recorded:
    changed = False

    def summary(self) -> str:
        return "recorded"


@pytest.fixture
def installs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The clusters setup_cluster went on to install on (nothing else reaches an API)."""
    from shared.app import setup_handlers

    seen: list[str] = []

    def no_objects(runtime: object, cluster_path: str) -> object:
        return cluster_path

    class RecordingInstaller:
        def __init__(self, objects: str, settings: Settings) -> None:
            self.objects = objects

        def install(self, cluster: str = "") -> _Recorded:
            seen.append(cluster)
            return _Recorded()

    monkeypatch.setattr(setup_handlers, "objects_for", no_objects)
    monkeypatch.setattr(setup_handlers, "Installer", RecordingInstaller)
    return seen


def _served(setup_clusters: tuple[str, ...] = ()) -> AbstractContextManager[LoggedFunction]:
    settings = Settings(
        unlimited_spending=True,
        project_id="test-proj",
        location="us-central2-b",
        cluster_name="test-cluster",
        # Nothing here may be reached: a call to either would fail the delivery.
        gke_api_endpoint="http://127.0.0.1:9",
        kube_api_endpoint="http://127.0.0.1:9",
        setup_clusters=setup_clusters,
    )
    return served_function("setup_cluster", settings, "tpuprov-setup")


OTHER_PROJECT_CLUSTER = "projects/someone-else/locations/us-central2-b/clusters/test-cluster"


@pytest.mark.parametrize(
    "payload",
    [
        {"cluster": NEW_CLUSTER},
        {"cluster": OTHER_PROJECT_CLUSTER},
        {"project": "test-proj", "location": "us-central2-b", "cluster": "another"},
        _audit_entry(),
    ],
    ids=["other-project", "same-name-other-project", "same-project-other-cluster", "audit-entry"],
)
def test_a_cluster_the_deployment_does_not_manage_is_acknowledged_and_left_alone(
    installs: list[str], payload: dict[str, Any]
) -> None:
    with _served() as function:
        response = function.post(json.dumps(payload).encode())
    assert response.status_code == 200
    assert installs == []
    [ignored] = function.events("setup.ignored")
    assert ignored["severity"] == "WARNING"
    assert "is not a cluster this deployment sets up" in ignored["message"]
    assert MANAGED in ignored["message"] and "SETUP_CLUSTERS" in ignored["message"]
    assert function.events("setup.done") == []


def test_the_managed_cluster_and_the_listed_ones_are_set_up(installs: list[str]) -> None:
    with _served() as function:
        assert function.post(json.dumps({"cluster": MANAGED}).encode()).status_code == 200
    with _served(setup_clusters=(NEW_CLUSTER,)) as function:
        assert function.post(json.dumps(_audit_entry()).encode()).status_code == 200
        assert function.post(json.dumps({"cluster": OTHER_PROJECT_CLUSTER}).encode()).status_code == 200
        [ignored] = function.events("setup.ignored")
        assert OTHER_PROJECT_CLUSTER in ignored["message"]
    assert installs == [MANAGED, NEW_CLUSTER]


# ----------------------------------------------------------------------------- over the wire
# On a real control plane (see sandbox.testing.fixtures.releases); the function authenticates with
# its own kubeconfig. The tests that need the releases' webhooks served come last.

JOBSET_DEPLOYMENT = ("apps/v1", "deployments", "jobset-system", "jobset-controller-manager")
FunctionFactory = Callable[..., AbstractContextManager[LoggedFunction]]


@pytest.fixture(scope="module")
def rig() -> Iterator[ReleaseCluster]:
    with release_cluster() as running:
        yield running


@pytest.fixture
def fresh(rig: ReleaseCluster) -> KubeHandle:
    """The module's cluster with no JobSet and no Kueue."""
    return rig.fresh()


@pytest.fixture
def serve(rig: ReleaseCluster) -> FunctionFactory:
    """The function app as Cloud Run serves it, configured for the cluster with small bounds."""

    def start(
        timeout: int = 60, webhook_retry: int = 20, setup_clusters: tuple[str, ...] = ()
    ) -> AbstractContextManager[LoggedFunction]:
        settings = Settings(
            unlimited_spending=True,
            project_id="test-proj",
            location="us-central2-b",
            cluster_name="test-cluster",
            kubeconfig=str(rig.cluster.kubeconfig_for(SETUP)),
            manifests_dir=str(fixtures_kube.MANIFESTS_DIR),
            setup_timeout_seconds=timeout,
            setup_webhook_retry_seconds=webhook_retry,
            setup_poll_interval_ms=50,
            setup_clusters=setup_clusters,
        )
        return served_function("setup_cluster", settings, "tpuprov-setup")

    return start


@pytest.fixture
def function(serve: FunctionFactory) -> Iterator[LoggedFunction]:
    with serve() as served:
        yield served


@pytest.fixture
def unserved(rig: ReleaseCluster, serve: FunctionFactory) -> KubeHandle:
    """Both releases installed by the function (unless a test before left them so), webhooks not
    served."""

    def install() -> None:
        with serve() as function:
            assert function.post(json.dumps({"cluster": MANAGED}).encode()).status_code == 200

    return rig.installed_unserved(install)


def _deployment_version(handle: KubeHandle, namespace: str, name: str) -> str:
    obj = handle.get("apps/v1", "deployments", namespace, name)
    assert obj is not None
    return str(obj["metadata"]["annotations"]["tpuprov.dev/installed-version"])


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
    fresh: KubeHandle, function: LoggedFunction, payload: bytes | None, logged: str
) -> None:
    response = function.post(payload)
    assert response.status_code == 200
    assert fresh.count("PATCH") == 0
    [acked] = function.events("delivery.acked")
    assert logged in acked["message"]


@pytest.mark.integration
def test_first_entry_of_the_creation_is_acknowledged_without_setup(
    fresh: KubeHandle, function: LoggedFunction
) -> None:
    response = function.post(json.dumps(_audit_entry(last=False)).encode())
    assert response.status_code == 200
    assert fresh.count() == 0
    [ignored] = function.events("setup.ignored")
    assert "still running" in ignored["message"]


@pytest.mark.integration
def test_manual_message_installs_and_both_controllers_become_available(
    fresh: KubeHandle, function: LoggedFunction
) -> None:
    response = function.post(json.dumps({"cluster": MANAGED}).encode())
    assert response.status_code == 200
    assert _deployment_version(fresh, "jobset-system", "jobset-controller-manager") == "v0.10.1"
    assert _deployment_version(fresh, "kueue-system", "kueue-controller-manager") == "v0.19.2"
    assert fresh.get(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", None, "clusterqueues.kueue.x-k8s.io"
    )
    for namespace in ("jobset-system", "kueue-system"):
        pods = fresh.list("v1", "pods", namespace)
        assert pods and all(p["status"]["phase"] == "Running" for p in pods)
    [done] = function.events("setup.done")
    assert done["changed"] is True and done["cluster"] == MANAGED


@pytest.mark.integration
def test_cluster_creation_audit_entry_bootstraps_a_listed_cluster(
    fresh: KubeHandle, serve: FunctionFactory
) -> None:
    # Only because SETUP_CLUSTERS names it (the test's control plane stands in for that cluster).
    with serve(setup_clusters=(NEW_CLUSTER,)) as function:
        response = function.post(json.dumps(_audit_entry()).encode())
    assert response.status_code == 200
    assert _deployment_version(fresh, "kueue-system", "kueue-controller-manager") == "v0.19.2"
    [done] = function.events("setup.done")
    assert done["cluster"] == NEW_CLUSTER


@pytest.mark.integration
def test_webhook_that_stays_down_answers_503_for_redelivery(
    unserved: KubeHandle, serve: FunctionFactory
) -> None:
    # Kueue's release is installed but nothing serves its webhooks: the next write of the JobSet
    # Deployment fails at Kueue's Deployment webhook, as on a cluster whose Kueue is down.
    fresh = unserved
    with serve(timeout=10, webhook_retry=2) as function:
        response = function.post(json.dumps({"cluster": MANAGED}).encode(), message_id="1002")
        assert response.status_code == 503
        # The retries happened inside the delivery before it was handed back to Pub/Sub.
        assert fresh.count("PATCH", "/deployments/jobset-controller-manager") >= 3
        [retry] = function.events("delivery.retry")
        assert "failed calling webhook" in retry["message"]


@pytest.mark.integration
def test_webhook_that_recovers_is_retried_within_the_delivery(
    rig: ReleaseCluster, unserved: KubeHandle, serve: FunctionFactory
) -> None:
    fresh = unserved
    with serve(timeout=170, webhook_retry=160) as function, concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(function.post, json.dumps({"cluster": MANAGED}).encode(), message_id="1002")
        # The first write of the JobSet Deployment was refused; then Kueue's controller comes up.
        polling.eventually(
            lambda: fresh.count("PATCH", "/deployments/jobset-controller-manager"), 60, "a first attempt"
        )
        rig.serve_webhooks()
        response = running.result(timeout=180)
    assert response.status_code == 200
    assert fresh.count("PATCH", "/deployments/jobset-controller-manager") >= 2
    assert _deployment_version(fresh, "jobset-system", "jobset-controller-manager") == "v0.10.1"


@pytest.mark.integration
def test_a_rerun_on_an_installed_cluster_leaves_the_controllers_as_they_were(
    rig: ReleaseCluster, function: LoggedFunction
) -> None:
    # After the test above: installed, webhooks served.
    rig.wait_served()
    handle = rig.handle
    before = handle.get(*JOBSET_DEPLOYMENT)
    assert before is not None
    response = function.post(json.dumps({"cluster": MANAGED}).encode(), message_id="1003")
    assert response.status_code == 200
    rerun = function.events("setup.done")[-1]
    assert "jobset v0.10.1:" in rerun["message"] and "kueue v0.19.2:" in rerun["message"]
    after = handle.get(*JOBSET_DEPLOYMENT)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
