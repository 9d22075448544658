"""The kmock-based stand-in API server for the tests of the stand-in itself (tests/sandbox/test_kube_api*).

The suite's ``kube_server`` is the real kube-apiserver now (``sandbox.testing.fixtures.kube``); the
stand-in stays only while the simulated stack (``sandbox.stack``, ``sandbox.cluster``) and the bench
still run on it, and these tests go with it.
"""

from __future__ import annotations

from collections.abc import Iterator

import kubernetes.client

from sandbox.emulators.kube.api import KubeApiServer
from sandbox.testing.fixtures.kube import JOBSET_MANIFEST, require_manifest


def server() -> Iterator[KubeApiServer]:
    """A fresh stand-in server with the JobSet CRD served; stopped afterwards."""
    running = KubeApiServer(crd_files=[require_manifest(JOBSET_MANIFEST)]).start()
    try:
        yield running
    finally:
        running.stop()


def api_client(running: KubeApiServer) -> Iterator[kubernetes.client.ApiClient]:
    """An official ApiClient for the stand-in (no auth); closed afterwards."""
    client = running.api_client()
    try:
        yield client
    finally:
        client.close()
