"""Fixtures of the provisioning service tests: the stateful fakes of the two clouds."""

from __future__ import annotations

import pytest

from sandbox.testing.fakes import FakeGke, FakeKube


@pytest.fixture
def gke() -> FakeGke:
    """A GKE with no pools, on a release channel (as new clusters are)."""
    return FakeGke()


@pytest.fixture
def kube() -> FakeKube:
    """An empty Kubernetes API."""
    return FakeKube()
