"""One real control plane per test module (starting one takes seconds, not milliseconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.kube import netns
from sandbox.kube.cluster import RealCluster


def pytest_configure(config: pytest.Config) -> None:
    """Before any test starts a thread: the whole session into a network namespace with only lo,
    so nothing the real API server (or anything else) dials can leave this machine."""
    netns.isolate()


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK on loopback."""
    with RealCluster() as running:
        yield running
