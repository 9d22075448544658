"""Pytest fixtures for the sandbox Kubernetes API server (registered with ``pytest_plugins``).

``kube_server`` is a fresh server per test with the JobSet CRD (v0.10.1) preloaded from the
shared release manifest beside the repository; ``kube_client`` is an official-client ApiClient
pointed at it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from sandbox.kube_api import KubeApiServer

# The release manifests live in ../shared beside the repository and are never copied into it.
MANIFESTS_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "manifests"
JOBSET_MANIFEST = MANIFESTS_DIR / "jobset-v0.10.1.yaml"
KUEUE_MANIFEST = MANIFESTS_DIR / "kueue-v0.19.2.yaml"


def require_manifest(path: Path) -> Path:
    """Return the manifest path, failing the test with a clear message when it is missing."""
    if not path.is_file():
        pytest.fail(f"release manifest {path} is missing; see {MANIFESTS_DIR / 'README.md'}", pytrace=False)
    return path


@pytest.fixture
def kube_server() -> Iterator[KubeApiServer]:
    """A running sandbox Kubernetes API server with the JobSet CRD served; stopped afterwards."""
    server = KubeApiServer(crd_files=[require_manifest(JOBSET_MANIFEST)]).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_client(kube_server: KubeApiServer) -> Iterator[kubernetes.client.ApiClient]:
    """An official ``kubernetes`` ApiClient for ``kube_server`` (no auth); closed afterwards."""
    client = kube_server.api_client()
    try:
        yield client
    finally:
        client.close()
