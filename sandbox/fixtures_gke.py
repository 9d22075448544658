"""Pytest fixtures for the GKE emulator and the real adapter pointed at it.

Registered for the whole suite through ``pytest_plugins`` in ``tests/conftest.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.gke_emulator import ClusterSeed, GkeEmulator
from shared.gke import GkeNodePoolAPI

GKE_TEST_PROJECT = "test-proj"
GKE_TEST_LOCATION = "us-central2-b"
GKE_TEST_CLUSTER = f"projects/{GKE_TEST_PROJECT}/locations/{GKE_TEST_LOCATION}/clusters/test-cluster"
GKE_TEST_CA_B64 = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="  # base64 of a PEM header line; never parsed


@pytest.fixture
def gke_emulator() -> Iterator[GkeEmulator]:
    """A started emulator with one zonal cluster (``GKE_TEST_CLUSTER``); operations finish at once."""
    seed = ClusterSeed(
        GKE_TEST_PROJECT,
        GKE_TEST_LOCATION,
        "test-cluster",
        endpoint="127.0.0.1",
        ca_certificate_b64=GKE_TEST_CA_B64,
        locations=(GKE_TEST_LOCATION,),
    )
    emulator = GkeEmulator([seed], op_delay=0)
    emulator.start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def gke_cluster() -> str:
    """The resource path of the cluster ``gke_emulator`` is seeded with."""
    return GKE_TEST_CLUSTER


@pytest.fixture
def gke_api(gke_emulator: GkeEmulator) -> GkeNodePoolAPI:
    """The production adapter talking REST to ``gke_emulator``."""
    return GkeNodePoolAPI(endpoint=gke_emulator.url, timeout=5.0)
