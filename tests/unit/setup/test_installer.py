"""The JobSet + Kueue installer on the sandbox API with the real release manifests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.emulators.kube.api import KubeApiServer
from sandbox.testing.fixtures import kube as fixtures_kube
from shared.cloud.objects import ApiClientObjects, Bounds, WebhookNotReadyError
from shared.core.errors import AlreadyExistsError, NotFoundError, RejectedError, TransientError
from shared.core.settings import Settings
from shared.setup import manifests
from shared.setup.installer import Installer, InstallReport

MANIFESTS = fixtures_kube.MANIFESTS_DIR
JOBSET_VERSION, KUEUE_VERSION = "v0.10.1", "v0.19.2"
KUEUE_DEPLOYMENT = ("apps/v1", "deployments", "kueue-system", "kueue-controller-manager")
JOBSET_DEPLOYMENT = ("apps/v1", "deployments", "jobset-system", "jobset-controller-manager")
FAST = Bounds(total=20.0, webhook_retry=5.0, poll=0.01)
WEBHOOK_DOWN = (
    'Internal error occurred: failed calling webhook "mdeployment.kb.io": failed to call webhook: '
    'Post "https://kueue-webhook-service.kueue-system.svc:443/mutate-apps-v1-deployment": '
    "dial tcp 10.0.0.7:443: connect: connection refused"
)


@pytest.fixture
def release_manifests() -> Path:
    """The release manifests beside the repository; the test fails when they are missing."""
    fixtures_kube.require_manifest(fixtures_kube.JOBSET_MANIFEST)
    fixtures_kube.require_manifest(fixtures_kube.KUEUE_MANIFEST)
    return MANIFESTS


needs_manifests = pytest.mark.usefixtures("release_manifests")


# ----------------------------------------------------------------------------- on the sandbox API


@pytest.fixture
def sandbox() -> Iterator[KubeApiServer]:
    """A Kubernetes API whose CRDs establish and Deployments become Available after a short delay."""
    server = KubeApiServer(crd_establish_delay=0.05, deployment_ready_delay=0.05).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def objects(sandbox: KubeApiServer) -> Iterator[ApiClientObjects]:
    """The production adapter over an official-client ApiClient pointed at the sandbox."""
    client = sandbox.api_client()
    try:
        yield ApiClientObjects(client)
    finally:
        client.close()


def _installer(objects: ApiClientObjects, bounds: Bounds = FAST, directory: Path = MANIFESTS) -> Installer:
    return Installer(objects, Settings(manifests_dir=str(directory)), bounds)


def _image(server: KubeApiServer, deployment: tuple[str, str, str, str]) -> str:
    obj = server.get(*deployment)
    assert obj is not None
    return str(obj["spec"]["template"]["spec"]["containers"][0]["image"])


def _preinstall(server: KubeApiServer, namespace: str, name: str, image: str) -> None:
    server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    server.put(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "manager", "image": image}]},
                },
            },
        }
    )


def _is_foundation(path: str) -> bool:
    bare = path.split("?")[0]
    is_namespace = bare.startswith("/api/v1/namespaces/") and bare.count("/") == 4
    return is_namespace or "/customresourcedefinitions/" in bare


@needs_manifests
@pytest.mark.integration
def test_fresh_install_applies_in_dependency_order(sandbox: KubeApiServer, objects: ApiClientObjects) -> None:
    timeline: list[tuple[str, str, str, bool]] = []

    def record(event: str, obj: dict[str, Any]) -> None:
        conditions = (obj.get("status") or {}).get("conditions") or []
        established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
        timeline.append((event, obj["kind"], obj["metadata"]["name"], established))

    sandbox.on_change(record)
    report = _installer(objects).install("projects/p/locations/l/clusters/c")
    sandbox.wait_for_callbacks()

    assert [(r.component, r.action, r.found, len(r.created), r.available) for r in report.components] == [
        ("jobset", "installed", "", 18, True),
        ("kueue", "installed", "", 79, True),
    ]
    patches = [path for method, path in sandbox.requests if method == "PATCH"]
    assert len(patches) == 97
    assert all("fieldManager=tpu-provisioner" in p and "force=true" in p for p in patches)
    # 2 Namespaces + 12 CRDs go first...
    assert [i for i, p in enumerate(patches) if _is_foundation(p)] == list(range(14))
    # ...and nothing else is created before every CRD reported Established.
    first_other = next(
        i
        for i, (event, kind, _, _) in enumerate(timeline)
        if event == "ADDED" and kind not in ("Namespace", "CustomResourceDefinition")
    )
    established = {
        name for _, kind, name, ok in timeline[:first_other] if kind == "CustomResourceDefinition" and ok
    }
    assert len(established) == 12
    # Webhook configurations are the last objects written.
    added = [kind for event, kind, _, _ in timeline if event == "ADDED"]
    assert added[-2:] == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    assert _image(sandbox, KUEUE_DEPLOYMENT) == "registry.k8s.io/kueue/kueue:v0.19.2"
    stamped = sandbox.get(*JOBSET_DEPLOYMENT)
    assert stamped is not None
    assert stamped["metadata"]["annotations"][manifests.VERSION_ANNOTATION] == "v0.10.1"


@needs_manifests
@pytest.mark.integration
def test_second_run_changes_nothing(sandbox: KubeApiServer, objects: ApiClientObjects) -> None:
    installer = _installer(objects)
    assert installer.install().changed
    version_after_install = sandbox.resource_version
    report = installer.install()
    assert not report.changed
    assert [(r.component, r.action, r.found, r.unchanged) for r in report.components] == [
        ("jobset", "unchanged", "v0.10.1", 18),
        ("kueue", "unchanged", "v0.19.2", 79),
    ]
    assert sandbox.resource_version == version_after_install
    assert report.summary().startswith("jobset v0.10.1: unchanged (0 created, 0 configured, 18 unchanged)")


@needs_manifests
@pytest.mark.integration
def test_drift_on_the_same_version_is_put_back(sandbox: KubeApiServer, objects: ApiClientObjects) -> None:
    installer = _installer(objects)
    installer.install()
    sandbox.delete("v1", "services", "kueue-system", "kueue-webhook-service")
    report = installer.install()
    assert report.result("kueue").action == "reconciled"
    assert report.result("kueue").created == ["Service kueue-system/kueue-webhook-service"]
    assert report.result("jobset").action == "unchanged"


@needs_manifests
@pytest.mark.integration
def test_waits_for_both_controllers_to_become_available() -> None:
    with KubeApiServer(deployment_ready_delay=0.4) as server:
        client = server.api_client()
        try:
            started = time.monotonic()
            report = _installer(ApiClientObjects(client)).install()
            assert time.monotonic() - started >= 0.4
            assert all(r.available for r in report.components)
            for deployment in (JOBSET_DEPLOYMENT, KUEUE_DEPLOYMENT):
                obj = server.get(*deployment)
                assert obj is not None
                conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
                assert conditions["Available"] == "True"
        finally:
            client.close()


@needs_manifests
@pytest.mark.integration
def test_a_controller_that_never_becomes_available_asks_for_redelivery() -> None:
    with KubeApiServer(deployment_ready_delay=60.0) as server:
        client = server.api_client()
        try:
            installer = _installer(ApiClientObjects(client), Bounds(total=0.5, webhook_retry=0.5, poll=0.02))
            with pytest.raises(
                TransientError, match=r"waiting for Deployment jobset-system/jobset-controller-manager"
            ):
                installer.install()
        finally:
            client.close()


@needs_manifests
@pytest.mark.integration
def test_webhook_errors_are_retried_with_backoff(sandbox: KubeApiServer, objects: ApiClientObjects) -> None:
    sandbox.fail_next(
        3, 500, match=lambda method, path: method == "PATCH" and "/deployments/" in path, message=WEBHOOK_DOWN
    )
    report = _installer(objects).install()
    assert all(r.available for r in report.components)
    # jobset's Deployment failed three times, then both went through.
    assert sandbox.count("PATCH", "/deployments/") == 5
    assert _image(sandbox, JOBSET_DEPLOYMENT) == "registry.k8s.io/jobset/jobset:v0.10.1"


@needs_manifests
@pytest.mark.integration
@pytest.mark.parametrize(
    "message",
    [
        WEBHOOK_DOWN,
        'Internal error occurred: failed calling webhook "vjobset.kb.io": '
        'no endpoints available for service "jobset-webhook-service"',
        "conversion webhook for kueue.x-k8s.io/v1beta1, Kind=ClusterQueue failed: connection refused",
    ],
    ids=["connection-refused", "no-endpoints", "conversion-webhook"],
)
def test_persistent_webhook_errors_end_in_a_transient_error(
    sandbox: KubeApiServer, objects: ApiClientObjects, message: str
) -> None:
    sandbox.fail_next(
        10_000, 500, match=lambda method, path: method == "PATCH" and "/services/" in path, message=message
    )
    installer = _installer(objects, Bounds(total=5.0, webhook_retry=0.1, poll=0.01))
    with pytest.raises(TransientError, match="gave up after") as caught:
        installer.install()
    assert message[:40] in caught.value.why
    assert sandbox.count("PATCH", "/services/") >= 3


@needs_manifests
@pytest.mark.integration
def test_a_newer_installed_version_is_left_alone(sandbox: KubeApiServer, objects: ApiClientObjects) -> None:
    _preinstall(sandbox, "kueue-system", "kueue-controller-manager", "registry.k8s.io/kueue/kueue:v0.20.0")
    report = _installer(objects).install()
    kueue = report.result("kueue")
    assert (kueue.action, kueue.found, kueue.created, kueue.available) == (
        "skipped-newer",
        "v0.20.0",
        [],
        True,
    )
    assert report.result("jobset").action == "installed"
    assert sandbox.count("PATCH", "kueue") == 0
    assert _image(sandbox, KUEUE_DEPLOYMENT) == "registry.k8s.io/kueue/kueue:v0.20.0"


@needs_manifests
@pytest.mark.integration
def test_an_older_installed_version_is_upgraded(sandbox: KubeApiServer, objects: ApiClientObjects) -> None:
    _preinstall(sandbox, "kueue-system", "kueue-controller-manager", "registry.k8s.io/kueue/kueue:v0.18.1")
    report = _installer(objects).install()
    kueue = report.result("kueue")
    assert (kueue.action, kueue.found) == ("upgraded", "v0.18.1")
    assert "Deployment kueue-system/kueue-controller-manager" in kueue.configured
    assert _image(sandbox, KUEUE_DEPLOYMENT) == "registry.k8s.io/kueue/kueue:v0.19.2"
    assert "upgraded from v0.18.1" in report.summary()


@needs_manifests
@pytest.mark.integration
def test_an_unrecognisable_version_is_left_alone(sandbox: KubeApiServer, objects: ApiClientObjects) -> None:
    _preinstall(sandbox, "jobset-system", "jobset-controller-manager", "example.com/jobset:main")
    report = _installer(objects).install()
    assert (report.result("jobset").action, report.result("jobset").found) == ("skipped-unknown", "main")
    assert _image(sandbox, JOBSET_DEPLOYMENT) == "example.com/jobset:main"


def test_report_summary_names_every_component() -> None:
    from shared.setup.installer import ComponentResult

    report = InstallReport(
        "c",
        [
            ComponentResult("jobset", "v0.10.1", "", "installed", created=["a", "b"]),
            ComponentResult("kueue", "v0.19.2", "v0.20.0", "skipped-newer"),
        ],
    )
    assert report.summary() == (
        "jobset v0.10.1: installed (2 created, 0 configured, 0 unchanged); "
        "kueue v0.20.0: left alone (skipped-newer, pinned v0.19.2)"
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (500, WEBHOOK_DOWN, WebhookNotReadyError),
        (500, "etcdserver: request timed out", TransientError),
        (429, "too many requests", TransientError),
        (403, 'namespaces is forbidden: User "fn" cannot patch resource', TransientError),
        (404, "not found", NotFoundError),
        (409, "conflict", AlreadyExistsError),
        (422, 'Namespace "x" is invalid', RejectedError),
    ],
    ids=["webhook", "server-error", "throttled", "rbac", "not-found", "conflict", "invalid"],
)
def test_adapter_translates_api_errors(
    sandbox: KubeApiServer, objects: ApiClientObjects, status: int, message: str, expected: type[Exception]
) -> None:
    sandbox.fail_next(1, status, message=message)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
    with pytest.raises(expected) as caught:
        objects.apply(namespace)
    assert type(caught.value) is expected
    assert message in str(caught.value)
    assert objects.apply(namespace)["metadata"]["name"] == "x"  # the next call goes through
