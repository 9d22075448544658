"""The JobSet + Kueue installer on a real control plane with the real release manifests.

A full ``RealCluster`` (controller manager, scheduler, KWOK playing the controller pods on the
default pool's CPU Nodes) per module, reset to "nothing installed" before each test that needs
it (``sandbox.testing.fixtures.releases``). The installer runs as ``setup_cluster``'s identity, so
the API server's audit log shows the order of its requests. The tests that re-run it on an
installed cluster come last: they serve the releases' webhooks from local controllers.
"""

from __future__ import annotations

import concurrent.futures
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import polling
from sandbox.kube import addons
from sandbox.testing.fixtures import kube as fixtures_kube
from sandbox.testing.fixtures.kube import KubeHandle
from sandbox.testing.fixtures.releases import SETUP, ReleaseCluster, release_cluster, release_documents
from shared.cloud.kube import translate_status
from shared.cloud.objects import ApiClientObjects, Bounds, WebhookNotReadyError, describe, webhook_not_ready
from shared.core.errors import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    RejectedError,
    TransientError,
)
from shared.core.settings import Settings
from shared.setup import manifests
from shared.setup.installer import ComponentResult, Installer, InstallReport
from tests.unit.setup import test_manifests

pytestmark = pytest.mark.integration

MANIFESTS = fixtures_kube.MANIFESTS_DIR
KUEUE_DEPLOYMENT = ("apps/v1", "deployments", "kueue-system", "kueue-controller-manager")
JOBSET_DEPLOYMENT = ("apps/v1", "deployments", "jobset-system", "jobset-controller-manager")
FAST = Bounds(total=120.0, webhook_retry=30.0, poll=0.05)
WEBHOOK_DOWN = (
    'Internal error occurred: failed calling webhook "mdeployment.kb.io": failed to call webhook: '
    'Post "https://kueue-webhook-service.kueue-system.svc:443/mutate-apps-v1-deployment": '
    "dial tcp 10.0.0.7:443: connect: connection refused"
)


@pytest.fixture(scope="module")
def rig() -> Iterator[ReleaseCluster]:
    with release_cluster() as running:
        yield running


@pytest.fixture
def fresh(rig: ReleaseCluster) -> KubeHandle:
    """The module's cluster with nothing installed."""
    return rig.fresh()


@pytest.fixture
def objects(rig: ReleaseCluster) -> Iterator[ApiClientObjects]:
    """The production adapter over an official-client ApiClient with ``setup_cluster``'s token."""
    client = rig.handle.api_client(SETUP)
    try:
        yield ApiClientObjects(client)
    finally:
        client.close()


def _installer(objects: ApiClientObjects, bounds: Bounds = FAST, directory: Path = MANIFESTS) -> Installer:
    return Installer(objects, Settings(manifests_dir=str(directory)), bounds)


def _image(handle: KubeHandle, deployment: tuple[str, str, str, str]) -> str:
    obj = handle.get(*deployment)
    assert obj is not None
    return str(obj["spec"]["template"]["spec"]["containers"][0]["image"])


def _available(handle: KubeHandle, deployment: tuple[str, str, str, str]) -> bool:
    obj = handle.get(*deployment) or {}
    conditions = {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or []}
    return conditions.get("Available") == "True"


def _preinstall(handle: KubeHandle, manifest: Path, image: str) -> None:
    """What an earlier install of another version leaves: the release's namespace, its controller's
    ServiceAccount and its Deployment running ``image``."""
    docs = release_documents(manifest)
    [deployment] = [copy.deepcopy(d) for d in docs if d["kind"] == "Deployment"]
    account = deployment["spec"]["template"]["spec"].get("serviceAccountName", "default")
    namespace = deployment["metadata"]["namespace"]
    handle.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for doc in docs:
        if doc["kind"] == "ServiceAccount" and doc["metadata"]["name"] == account:
            handle.put(doc)
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = image
    handle.put(deployment)


def _is_foundation(path: str) -> bool:
    bare = path.split("?")[0]
    is_namespace = bare.startswith("/api/v1/namespaces/") and bare.count("/") == 4
    return is_namespace or "/customresourcedefinitions/" in bare


# ----------------------------------------------------------------------------- a fresh cluster


def test_fresh_install_applies_in_dependency_order(fresh: KubeHandle, objects: ApiClientObjects) -> None:
    report = _installer(objects).install("projects/p/locations/l/clusters/c")

    assert [(r.component, r.action, r.found, len(r.created), r.available) for r in report.components] == [
        ("jobset", "installed", "", 18, True),
        ("kueue", "installed", "", 79, True),
    ]
    requests = fresh.requests  # setup_cluster's, in the order the API server answered them
    patches = [path for method, path in requests if method == "PATCH"]
    assert len(patches) == 97
    assert all("fieldManager=tpu-provisioner" in p and "force=true" in p for p in patches)
    # 2 Namespaces + 12 CRDs go first...
    assert [i for i, p in enumerate(patches) if _is_foundation(p)] == list(range(14))
    # ...and nothing else is written before the installer has read back every CRD it applied
    # (it polls each until the API server reports it Established).
    first_other = next(i for i, (m, p) in enumerate(requests) if m == "PATCH" and not _is_foundation(p))
    crd_paths = {p.split("?")[0] for p in patches[:14] if "/customresourcedefinitions/" in p}
    assert len(crd_paths) == 12
    read_back = {p.split("?")[0] for m, p in requests[:first_other] if m == "GET"}
    assert crd_paths <= read_back
    names = {p.rsplit("/", 1)[1] for p in crd_paths}
    for crd in fresh.list("apiextensions.k8s.io/v1", "customresourcedefinitions"):
        if crd["metadata"]["name"] in names:
            conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
            assert conditions["Established"] == "True"
    # Webhook configurations are the last objects written.
    assert [p.split("?")[0].split("/")[-2] for p in patches[-2:]] == [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ]
    assert _image(fresh, KUEUE_DEPLOYMENT) == "registry.k8s.io/kueue/kueue:v0.19.2"
    stamped = fresh.get(*JOBSET_DEPLOYMENT)
    assert stamped is not None
    assert stamped["metadata"]["annotations"][manifests.VERSION_ANNOTATION] == "v0.10.1"


def test_waits_for_both_controllers_to_become_available(fresh: KubeHandle, objects: ApiClientObjects) -> None:
    report = _installer(objects).install()
    assert all(r.available for r in report.components)
    for deployment in (JOBSET_DEPLOYMENT, KUEUE_DEPLOYMENT):
        assert _available(fresh, deployment)
        # It read the Deployment again until the controller manager reported it Available.
        path = fresh.path(*deployment)
        assert sum(1 for m, p in fresh.requests if m == "GET" and p.split("?")[0] == path) >= 2
    # The controller pods run on the default pool's Nodes (played by KWOK), as on GKE.
    for namespace in ("jobset-system", "kueue-system"):
        pods = fresh.list("v1", "pods", namespace)
        assert pods and all(p["status"]["phase"] == "Running" and p["spec"]["nodeName"] for p in pods)


def test_a_controller_that_never_becomes_available_asks_for_redelivery(
    rig: ReleaseCluster, fresh: KubeHandle, objects: ApiClientObjects
) -> None:
    rig.set_schedulable(False)  # every Node cordoned: the controller pods stay Pending
    try:
        # The budget must outlast applying the release on a starved machine (the run under test has
        # to reach the wait); it is all spent waiting, so it is not larger than that needs.
        installer = _installer(objects, Bounds(total=25.0, webhook_retry=5.0, poll=0.1))
        with pytest.raises(
            TransientError, match=r"waiting for Deployment jobset-system/jobset-controller-manager"
        ):
            installer.install()
        # Read before the Nodes are uncordoned: the pods bind and the Deployment turns Available then.
        assert not _available(fresh, JOBSET_DEPLOYMENT)
    finally:
        rig.set_schedulable(True)


def test_a_newer_installed_version_is_left_alone(fresh: KubeHandle, objects: ApiClientObjects) -> None:
    _preinstall(fresh, fixtures_kube.KUEUE_MANIFEST, "registry.k8s.io/kueue/kueue:v0.20.0")
    fresh.clear_requests()
    report = _installer(objects).install()
    kueue = report.result("kueue")
    assert (kueue.action, kueue.found, kueue.created, kueue.available) == (
        "skipped-newer",
        "v0.20.0",
        [],
        True,
    )
    assert report.result("jobset").action == "installed"
    assert fresh.count("PATCH", "kueue") == 0
    assert _image(fresh, KUEUE_DEPLOYMENT) == "registry.k8s.io/kueue/kueue:v0.20.0"


def test_an_older_installed_version_is_upgraded(fresh: KubeHandle, objects: ApiClientObjects) -> None:
    _preinstall(fresh, fixtures_kube.KUEUE_MANIFEST, "registry.k8s.io/kueue/kueue:v0.18.1")
    report = _installer(objects).install()
    kueue = report.result("kueue")
    assert (kueue.action, kueue.found, kueue.available) == ("upgraded", "v0.18.1", True)
    assert "Deployment kueue-system/kueue-controller-manager" in kueue.configured
    assert _image(fresh, KUEUE_DEPLOYMENT) == "registry.k8s.io/kueue/kueue:v0.19.2"
    assert "upgraded from v0.18.1" in report.summary()
    # Available again only once the controller manager rolled out the new template.
    deployment = fresh.get(*KUEUE_DEPLOYMENT)
    assert deployment is not None
    assert deployment["status"]["observedGeneration"] >= deployment["metadata"]["generation"]


def test_an_unrecognisable_version_is_left_alone(fresh: KubeHandle, objects: ApiClientObjects) -> None:
    _preinstall(fresh, fixtures_kube.JOBSET_MANIFEST, "example.com/jobset:main")
    report = _installer(objects).install()
    assert (report.result("jobset").action, report.result("jobset").found) == ("skipped-unknown", "main")
    assert _image(fresh, JOBSET_DEPLOYMENT) == "example.com/jobset:main"


def test_a_newer_supported_release_is_kept_by_default(fresh: KubeHandle, objects: ApiClientObjects) -> None:
    # xpk's JobSet v0.11.1, newer than the pinned v0.10.1 and in the supported range.
    _preinstall(fresh, fixtures_kube.JOBSET_MANIFEST, "registry.k8s.io/jobset/jobset:v0.11.1")
    fresh.clear_requests()
    report = _installer(objects).install()
    jobset = report.result("jobset")
    assert (jobset.action, jobset.found, jobset.created) == ("skipped-newer", "v0.11.1", [])
    assert "supported: tested" in report.summary()
    # Nothing of JobSet's release written (Kueue's release names jobset in some of its objects).
    assert fresh.count("PATCH", "jobset-system") == fresh.count("PATCH", "jobsets.jobset.x-k8s.io") == 0
    assert _image(fresh, JOBSET_DEPLOYMENT) == "registry.k8s.io/jobset/jobset:v0.11.1"


def test_addon_upgrade_pinned_replaces_a_newer_release(fresh: KubeHandle, objects: ApiClientObjects) -> None:
    _preinstall(fresh, fixtures_kube.JOBSET_MANIFEST, "registry.k8s.io/jobset/jobset:v0.11.1")
    settings = Settings(manifests_dir=str(MANIFESTS), addon_upgrade="pinned")
    report = Installer(objects, settings, FAST).install()
    jobset = report.result("jobset")
    assert (jobset.action, jobset.found, jobset.available) == ("downgraded", "v0.11.1", True)
    assert "downgraded from v0.11.1" in report.summary()
    assert _image(fresh, JOBSET_DEPLOYMENT) == "registry.k8s.io/jobset/jobset:v0.10.1"


@pytest.fixture
def unserved(rig: ReleaseCluster, objects: ApiClientObjects) -> KubeHandle:
    """Both releases applied, their webhooks not served."""
    return rig.installed_unserved(_installer(objects).install)


def test_a_webhook_nobody_serves_ends_in_a_transient_error_after_retries(
    unserved: KubeHandle, objects: ApiClientObjects
) -> None:
    # Kueue's release is applied but its controller is not serving (here: no network to reach it),
    # so the next write of the JobSet Deployment fails at Kueue's Deployment webhook.
    fresh = unserved
    installer = _installer(objects, Bounds(total=10.0, webhook_retry=1.5, poll=0.05))
    with pytest.raises(TransientError, match="gave up after") as caught:
        installer.install()
    assert "failed calling webhook" in caught.value.why and "mdeployment.kb.io" in caught.value.why
    assert fresh.count("PATCH", "/deployments/jobset-controller-manager") >= 3


def test_adapter_translates_the_real_api_servers_errors(fresh: KubeHandle, objects: ApiClientObjects) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
    with pytest.raises(NotFoundError, match="HTTP 404"):
        objects.get("v1", "Namespace", "x")
    with pytest.raises(RejectedError, match="HTTP 422"):
        objects.apply({**namespace, "metadata": {"name": "Not_A_Name"}})
    objects.apply({**namespace, "metadata": {"name": "x", "labels": {"team": "a"}}})
    other = ApiClientObjects(objects.api_client, field_manager="someone-else")
    with pytest.raises(AlreadyExistsError, match="HTTP 409"):  # a field another manager owns
        other.apply({**namespace, "metadata": {"name": "x", "labels": {"team": "b"}}}, force=False)
    client = fresh.api_client("provision")  # a role with no write access to namespaces
    try:
        # GKE's authorizer (played by the sandbox's IAM-reason webhook) names the permission wanted.
        with pytest.raises(PermissionDeniedError, match="HTTP 403") as denied:
            ApiClientObjects(client).apply(namespace)
        assert denied.value.permission.startswith("container.namespaces.")
    finally:
        client.close()
    assert objects.get("v1", "Namespace", "x")["metadata"]["labels"] == {
        "team": "a",
        "kubernetes.io/metadata.name": "x",
    }


def test_the_installed_kueue_config_enables_jobset(
    fresh: KubeHandle, objects: ApiClientObjects, tmp_path: Path
) -> None:
    directory = test_manifests._manifest_dir(tmp_path, test_manifests._without_jobset)
    # An edited release is applied only with its hash stated, as an operator would in KUEUE_SHA256.
    settings = Settings(manifests_dir=str(directory), kueue_sha256=test_manifests._kueue_sha256(directory))
    report = Installer(objects, settings, FAST).install()
    assert report.result("kueue").available
    config_map = fresh.get("v1", "configmaps", "kueue-system", "kueue-manager-config")
    assert config_map is not None
    frameworks = test_manifests._manager_config([config_map])["integrations"]["frameworks"]
    assert "jobset.x-k8s.io/jobset" in frameworks


# ----------------------------------------------------------------------------- decisions, no server


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
def test_api_statuses_map_onto_the_error_taxonomy(
    status: int, message: str, expected: type[Exception]
) -> None:
    error = translate_status(status, message, "apply Namespace x")
    if isinstance(error, TransientError) and webhook_not_ready(error.why):
        error = WebhookNotReadyError(error.why)
    assert type(error) is expected
    assert message in str(error)


@pytest.mark.parametrize(
    ("why", "expected"),
    [
        (f"apply Deployment a/b: HTTP 500 {WEBHOOK_DOWN}", True),
        (
            'apply Service a/b: HTTP 500 Internal error occurred: failed calling webhook "vjobset.kb.io": '
            'no endpoints available for service "jobset-webhook-service"',
            True,
        ),
        (
            "apply ClusterQueue q: HTTP 500 conversion webhook for kueue.x-k8s.io/v1beta1, "
            "Kind=ClusterQueue failed: connection refused",
            True,
        ),
        ("apply Deployment a/b: HTTP 500 etcdserver: request timed out", False),
        ("Kubernetes API unreachable for apply Deployment a/b: connection refused", False),
    ],
    ids=["connection-refused", "no-endpoints", "conversion-webhook", "server-error", "client-side"],
)
def test_which_errors_mean_a_webhook_is_not_serving_yet(why: str, expected: bool) -> None:
    assert webhook_not_ready(why) is expected


def test_report_summary_names_every_component() -> None:
    report = InstallReport(
        "c",
        [
            ComponentResult("jobset", "v0.10.1", "", "installed", created=["a", "b"]),
            ComponentResult("kueue", "v0.19.2", "v0.20.0", "skipped-newer"),
        ],
    )
    assert report.summary() == (
        "jobset v0.10.1: installed (2 created, 0 configured, 0 unchanged); "
        "kueue v0.20.0: left alone (skipped-newer, pinned v0.19.2; unsupported: newer than the range "
        "v0.17-v0.19)"
    )


# ----------------------------------------------------------------------------- an installed cluster
# Last in the module: from here on the releases' webhooks are served by local controllers.


@pytest.fixture
def installed(rig: ReleaseCluster, objects: ApiClientObjects) -> KubeHandle:
    """Both releases installed and their webhooks served (installed once per module)."""
    if rig.wiring is None:
        rig.fresh()
        rig.serve_webhooks()
        _installer(objects).install()
    rig.wait_served()
    polling.eventually(
        lambda: not _still_on_services(rig.handle) and not _api_services(rig.handle),
        60,
        "every release webhook repointed and the aggregated APIs dropped",
        0.1,
    )
    rig.handle.clear_requests()
    return rig.handle


def _hooks(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "CustomResourceDefinition":
        webhook = ((obj["spec"].get("conversion") or {}).get("webhook")) or {}
        return [webhook] if webhook else []
    return list(obj.get("webhooks") or [])


def _webhook_objects(handle: KubeHandle) -> list[dict[str, Any]]:
    found = []
    for api_version, kind in (
        ("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations"),
        ("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations"),
        ("apiextensions.k8s.io/v1", "customresourcedefinitions"),
    ):
        found += [o for o in handle.list(api_version, kind) if _hooks(o)]
    return found


def _still_on_services(handle: KubeHandle) -> list[str]:
    return [
        describe(o)
        for o in _webhook_objects(handle)
        if any((h.get("clientConfig") or {}).get("service") for h in _hooks(o))
    ]


def _api_services(handle: KubeHandle) -> list[str]:
    """Kueue's aggregated visibility APIServices present (the sandbox deletes them: an aggregated API
    is reachable only through its Service)."""
    return [
        f"APIService {name}"
        for name in addons.KUEUE.api_services
        if handle.get("apiregistration.k8s.io/v1", "apiservices", None, name) is not None
    ]


def _repointed(handle: KubeHandle) -> set[str]:
    """The release objects the sandbox rewrote to reach the local controllers (a url on loopback)."""
    return {
        describe(o)
        for o in _webhook_objects(handle)
        if any((h.get("clientConfig") or {}).get("url") for h in _hooks(o))
    }


def test_a_webhook_that_comes_back_is_retried_within_the_run(
    rig: ReleaseCluster, unserved: KubeHandle, objects: ApiClientObjects
) -> None:
    # As above, Kueue's webhook is not serving when the re-run starts; then its controller comes
    # up and the wiring repoints the webhook at it: the run retries through and completes.
    fresh = unserved
    rerun = _installer(objects, Bounds(total=170.0, webhook_retry=160.0, poll=0.2))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(rerun.install)
        # Its first write of the JobSet Deployment was refused (nothing serves the webhook yet)...
        polling.eventually(
            lambda: fresh.count("PATCH", "/deployments/jobset-controller-manager"), 60, "a first attempt"
        )
        rig.serve_webhooks()  # ...then Kueue's controller comes up
        report = running.result(timeout=180)
    assert all(r.available for r in report.components)
    assert fresh.count("PATCH", "/deployments/jobset-controller-manager") >= 2
    assert _image(fresh, JOBSET_DEPLOYMENT) == "registry.k8s.io/jobset/jobset:v0.10.1"


def test_second_run_changes_nothing_but_the_sandboxs_repoints(
    installed: KubeHandle, objects: ApiClientObjects
) -> None:
    before = {kind: _versions(installed, kind) for kind in _WATCHED}
    repointed = _repointed(installed)
    assert len(repointed) >= 4  # both releases' webhook configurations at least
    report = _installer(objects).install()
    # The sandbox had rewritten the webhooks' Service to a loopback url (a real cluster reaches the
    # Service) and dropped Kueue's aggregated APIs; putting those back is all a re-run writes.
    # Everything else is left as it was.
    dropped = sorted(f"APIService {name}" for name in addons.KUEUE.api_services)
    assert [(r.component, r.found, r.created) for r in report.components] == [
        ("jobset", "v0.10.1", []),
        ("kueue", "v0.19.2", dropped),
    ]
    configured = {name for r in report.components for name in r.configured}
    assert configured == repointed
    assert [r.unchanged + len(r.configured) + len(r.created) for r in report.components] == [18, 79]
    assert {kind: _versions(installed, kind) for kind in _WATCHED} == before


def test_drift_on_the_same_version_is_put_back(installed: KubeHandle, objects: ApiClientObjects) -> None:
    repointed = _repointed(installed)
    assert installed.delete("v1", "services", "kueue-system", "kueue-webhook-service")
    report = _installer(objects).install()
    assert report.result("kueue").action == "reconciled"
    assert set(report.result("kueue").created) == {
        "Service kueue-system/kueue-webhook-service",
        *(f"APIService {name}" for name in addons.KUEUE.api_services),  # the sandbox drops them
    }
    assert report.result("jobset").created == []
    assert set(report.result("jobset").configured) <= repointed
    assert installed.get("v1", "services", "kueue-system", "kueue-webhook-service") is not None


# The release objects a re-run could rewrite (the controllers keep their own status and leases
# moving, so the whole store's resourceVersion is no measure here).
_WATCHED = (
    ("apps/v1", "deployments", "jobset-system"),
    ("apps/v1", "deployments", "kueue-system"),
    ("v1", "services", "kueue-system"),
    ("v1", "services", "jobset-system"),
    ("v1", "configmaps", "kueue-system"),
    ("rbac.authorization.k8s.io/v1", "clusterroles", None),
    ("rbac.authorization.k8s.io/v1", "clusterrolebindings", None),
)


def _versions(handle: KubeHandle, kind: tuple[str, str, str | None]) -> dict[str, Any]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in handle.list(*kind)}
