"""The sandbox Kubernetes API: discovery, CRDs, Deployment readiness, kubectl and the CLI process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client
from kubernetes.client import ApiClient, ApiException

from sandbox.emulators.kube.api import KubeApiServer
from sandbox.testing.fixtures.kube import JOBSET_MANIFEST
from tests.paths import REPO
from tests.sandbox import standin_kube


# The stand-in's own tests: the suite-wide kube_server is the real API server.
@pytest.fixture
def kube_server() -> Iterator[KubeApiServer]:
    yield from standin_kube.server()


@pytest.fixture
def kube_client(kube_server: KubeApiServer) -> Iterator[ApiClient]:
    yield from standin_kube.api_client(kube_server)


DISCOVERY_CASES = [
    # (API class, resource, kind, namespaced, a short name or "", a verb that must be listed)
    ("CoreV1Api", "namespaces", "Namespace", False, "ns", "watch"),
    ("CoreV1Api", "pods", "Pod", True, "po", "deletecollection"),
    ("CoreV1Api", "pods/status", "Pod", True, "", "patch"),
    ("CoreV1Api", "nodes", "Node", False, "no", "list"),
    ("CoreV1Api", "events", "Event", True, "ev", "create"),
    ("CoreV1Api", "services", "Service", True, "svc", "get"),
    ("CoreV1Api", "serviceaccounts", "ServiceAccount", True, "sa", "create"),
    ("CoreV1Api", "configmaps", "ConfigMap", True, "cm", "update"),
    ("CoreV1Api", "secrets", "Secret", True, "", "delete"),
    ("AppsV1Api", "deployments", "Deployment", True, "deploy", "patch"),
    ("AppsV1Api", "deployments/status", "Deployment", True, "", "update"),
    ("BatchV1Api", "jobs", "Job", True, "", "watch"),
    ("EventsV1Api", "events", "Event", True, "ev", "list"),
    ("RbacAuthorizationV1Api", "roles", "Role", True, "", "create"),
    ("RbacAuthorizationV1Api", "clusterroles", "ClusterRole", False, "", "create"),
    ("RbacAuthorizationV1Api", "rolebindings", "RoleBinding", True, "", "create"),
    ("RbacAuthorizationV1Api", "clusterrolebindings", "ClusterRoleBinding", False, "", "create"),
    ("ApiextensionsV1Api", "customresourcedefinitions", "CustomResourceDefinition", False, "crd", "watch"),
    (
        "ApiextensionsV1Api",
        "customresourcedefinitions/status",
        "CustomResourceDefinition",
        False,
        "",
        "patch",
    ),
    (
        "AdmissionregistrationV1Api",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        "",
        "get",
    ),
    (
        "AdmissionregistrationV1Api",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        "",
        "get",
    ),
    ("ApiregistrationV1Api", "apiservices", "APIService", False, "", "create"),
    ("SchedulingV1Api", "priorityclasses", "PriorityClass", False, "pc", "create"),
    ("CoordinationV1Api", "leases", "Lease", True, "", "update"),
    ("PolicyV1Api", "poddisruptionbudgets", "PodDisruptionBudget", True, "pdb", "create"),
]


@pytest.mark.parametrize(
    ("api", "name", "kind", "namespaced", "short", "verb"),
    DISCOVERY_CASES,
    ids=[f"{case[0]}:{case[1]}" for case in DISCOVERY_CASES],
)
def test_builtin_discovery(
    kube_client: client.ApiClient, api: str, name: str, kind: str, namespaced: bool, short: str, verb: str
) -> None:
    api_obj: Any = getattr(client, api)(kube_client)
    resources = {r.name: r for r in api_obj.get_api_resources().resources}

    entry = resources[name]
    assert (entry.kind, entry.namespaced) == (kind, namespaced)
    assert verb in entry.verbs
    if short:
        assert short in entry.short_names


def test_group_discovery_and_version(kube_client: client.ApiClient) -> None:
    apis: Any = client.ApisApi(kube_client)
    core: Any = client.CoreApi(kube_client)
    groups = {group.name: group for group in apis.get_api_versions().groups}

    assert core.get_api_versions().versions == ["v1"]
    assert groups["autoscaling"].preferred_version.version == "v2"
    assert groups["jobset.x-k8s.io"].preferred_version.group_version == "jobset.x-k8s.io/v1alpha2"
    assert {"apps", "batch", "apiextensions.k8s.io", "rbac.authorization.k8s.io"} <= set(groups)


def test_version_is_configurable() -> None:
    with KubeApiServer(kube_version="v1.31.2") as server:
        api = server.api_client()
        try:
            info: Any = client.VersionApi(api).get_code()
        finally:
            api.close()

    assert (info.git_version, info.major, info.minor) == ("v1.31.2", "1", "31")


def _widget_crd(scope: str = "Cluster") -> dict[str, Any]:
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": schema,
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def _conditions(crd: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}


def test_crd_is_served_discoverable_and_established_at_once(kube_server: KubeApiServer) -> None:
    api = kube_server.api_client()
    try:
        extensions: Any = client.ApiextensionsV1Api(api)
        custom: Any = client.CustomObjectsApi(api)
        extensions.create_custom_resource_definition(_widget_crd())
        crd = api.sanitize_for_serialization(
            extensions.read_custom_resource_definition("widgets.example.com")
        )
        widget = {
            "apiVersion": "example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"size": 3},
        }
        created = custom.create_cluster_custom_object("example.com", "v1", "widgets", widget)
        discovered = requests.get(f"{kube_server.url}/apis/example.com/v1", timeout=5).json()

        extensions.delete_custom_resource_definition("widgets.example.com")
        with pytest.raises(ApiException) as gone:
            custom.get_cluster_custom_object("example.com", "v1", "widgets", "w1")
        undiscovered = requests.get(f"{kube_server.url}/apis/example.com/v1", timeout=5)
    finally:
        api.close()

    assert _conditions(crd) == {"NamesAccepted": "True", "Established": "True"}
    assert crd["status"]["acceptedNames"]["kind"] == "Widget"
    assert created["metadata"]["uid"] and "namespace" not in created["metadata"]
    entries = {r["name"]: r for r in discovered["resources"]}
    assert entries["widgets"]["namespaced"] is False
    assert entries["widgets"]["shortNames"] == ["wd"]
    assert entries["widgets/status"]["kind"] == "Widget"
    assert gone.value.status == 404
    assert undiscovered.status_code == 404


def _wait_until(check: Callable[[], bool], since: float, timeout: float = 5.0) -> float:
    """Seconds from ``since`` (taken before the write that starts the delay) until ``check`` holds."""
    while not check():
        assert time.monotonic() - since < timeout, "condition not reached in time"
        time.sleep(0.02)
    return time.monotonic() - since


def test_crd_establishment_can_be_delayed() -> None:
    with KubeApiServer(crd_establish_delay=0.4) as server:
        since = time.monotonic()
        server.put(_widget_crd(scope="Namespaced"))
        crd_now = server.get(
            "apiextensions.k8s.io/v1", "customresourcedefinitions", None, "widgets.example.com"
        )
        served_now = server.put(
            {
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": "w", "namespace": "default"},
            }
        )

        def established() -> bool:
            crd = server.get(
                "apiextensions.k8s.io/v1", "CustomResourceDefinition", None, "widgets.example.com"
            )
            return crd is not None and _conditions(crd).get("Established") == "True"

        waited = _wait_until(established, since)

    assert crd_now is not None and _conditions(crd_now) == {}
    assert served_now["metadata"]["namespace"] == "default"
    assert waited >= 0.39  # the 0.4 s delay, measured from before the write


def test_preloaded_jobset_crd(kube_server: KubeApiServer) -> None:
    crd = kube_server.get(
        "apiextensions.k8s.io/v1", "customresourcedefinitions", None, "jobsets.jobset.x-k8s.io"
    )
    discovered = requests.get(f"{kube_server.url}/apis/jobset.x-k8s.io/v1alpha2", timeout=5).json()

    assert crd is not None and _conditions(crd)["Established"] == "True"
    assert {(r["name"], r["namespaced"]) for r in discovered["resources"]} == {
        ("jobsets", True),
        ("jobsets/status", True),
    }


def _deployment(replicas: int) -> dict[str, Any]:
    labels = {"app": "web"}
    return {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }


def test_deployments_report_availability(kube_client: client.ApiClient) -> None:
    apps: Any = client.AppsV1Api(kube_client)
    apps.create_namespaced_deployment("default", _deployment(3))
    first = apps.read_namespaced_deployment_status("web", "default")
    apps.patch_namespaced_deployment("web", "default", {"spec": {"replicas": 5}})
    scaled = apps.read_namespaced_deployment("web", "default")

    assert (first.status.available_replicas, first.status.ready_replicas) == (3, 3)
    assert first.status.observed_generation == first.metadata.generation == 1
    assert {(c.type, c.status) for c in first.status.conditions} >= {("Available", "True")}
    assert scaled.status.available_replicas == 5
    assert scaled.status.observed_generation == scaled.metadata.generation == 2


def test_deployment_readiness_can_be_delayed() -> None:
    with KubeApiServer(deployment_ready_delay=0.4) as server:
        body = {"apiVersion": "apps/v1", "kind": "Deployment", **_deployment(2)}
        since = time.monotonic()
        created = server.put(body)

        def available() -> bool:
            got = server.get("apps/v1", "deployments", "default", "web") or {}
            return (got.get("status") or {}).get("availableReplicas") == 2

        waited = _wait_until(available, since)

    assert "availableReplicas" not in (created.get("status") or {})
    assert waited >= 0.39  # the 0.4 s delay, measured from before the write


def _kubectl(kubeconfig: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = ["kubectl", "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.integration
def test_kubectl_server_side_apply_of_the_jobset_release(kube_server: KubeApiServer, tmp_path: Path) -> None:
    kubeconfig = kube_server.write_kubeconfig(tmp_path / "kubeconfig")
    manifest = str(JOBSET_MANIFEST)
    docs = [doc for doc in yaml.safe_load_all(JOBSET_MANIFEST.read_text()) if doc]

    def versions() -> list[str]:
        found = []
        for doc in docs:
            meta = doc["metadata"]
            obj = kube_server.get(doc["apiVersion"], doc["kind"], meta.get("namespace"), meta["name"])
            assert obj is not None, f"{doc['kind']} {meta['name']} was not applied"
            found.append(obj["metadata"]["resourceVersion"])
        return found

    first = _kubectl(
        kubeconfig, tmp_path / "cache", "apply", "--server-side", "--force-conflicts", "-f", manifest
    )
    after_first = versions()
    second = _kubectl(
        kubeconfig, tmp_path / "cache", "apply", "--server-side", "--force-conflicts", "-f", manifest
    )
    after_second = versions()
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "train"}}
    kube_server.put({**jobset, "metadata": {"name": "train", "namespace": "jobset-system"}, "spec": {}})
    listed = _kubectl(kubeconfig, tmp_path / "cache", "get", "jobsets", "-A")

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    lines = second.stdout.strip().splitlines()
    assert len(lines) == len(docs) and all(line.endswith(" serverside-applied") for line in lines)
    assert after_second == after_first
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split()[:3] == ["NAMESPACE", "NAME", "AGE"]
    assert listed.stdout.split()[3:5] == ["jobset-system", "train"]


@pytest.mark.integration
def test_runs_as_a_process_until_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    command = [
        sys.executable,
        "-m",
        "sandbox.emulators.kube.api",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
    ]
    command += ["--crd-file", str(JOBSET_MANIFEST)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        version = requests.get(f"{url}/version", timeout=5).json()
        jobsets = requests.get(f"{url}/apis/jobset.x-k8s.io/v1alpha2/jobsets", timeout=5).json()
        server_in_config = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)

    assert url.startswith("http://127.0.0.1:")
    assert version["gitVersion"].startswith("v1.")
    assert jobsets["kind"] == "JobSetList"
    assert server_in_config == url
    assert code == 0
