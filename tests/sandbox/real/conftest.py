"""One real control plane per test module (starting one takes seconds, not milliseconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.kube.cluster import RealCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK on loopback."""
    with RealCluster() as running:
        yield running
