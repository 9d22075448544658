"""The per-test reset of the session's real API server (``sandbox.kube.snapshot``): whatever a test
wrote is gone through the API, and what it changed of the set-up (RBAC, namespaces) is back."""

from __future__ import annotations

import pytest

from sandbox.kube import rbac
from sandbox.kube.cluster import RealCluster
from sandbox.kube.snapshot import Snapshot
from sandbox.testing.fixtures.kube import KubeHandle, wait_empty

pytestmark = pytest.mark.integration

ROLE = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{rbac.role_name('release')}"


def test_a_reset_removes_what_a_test_wrote_and_restores_what_it_changed(
    kube_cluster: tuple[RealCluster, Snapshot], kube_server: KubeHandle
) -> None:
    cluster, snapshot = kube_cluster
    role = kube_server.admin.get(ROLE)
    assert role is not None
    kube_server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}})
    kube_server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-0"}, "spec": {}})
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "finalizers": ["example.com/hold"]},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    kube_server.put(pod)
    kube_server.delete("v1", "pods", "team-a", "p")  # held by its finalizer: only marked
    kube_server.admin.patch(ROLE, {"rules": []})
    kube_server.put(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"x": "y"}}}
    )

    assert snapshot.restore() > 0
    wait_empty(kube_server)

    assert kube_server.get("v1", "namespaces", None, "scratch") is None
    assert kube_server.list("v1", "nodes") == [] and kube_server.list("v1", "pods") == []
    team_a = kube_server.get("v1", "namespaces", None, "team-a")
    assert team_a is not None and "x" not in (team_a["metadata"].get("labels") or {})
    restored = kube_server.admin.get(ROLE)
    assert restored is not None and restored["rules"] == role["rules"]
    assert snapshot.restore() == 0  # nothing left to do: an untouched store is not rewritten
    assert cluster.procs["kube-apiserver"].alive()
