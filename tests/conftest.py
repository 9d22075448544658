"""Suite-wide fixtures: the emulators (via plugins) and a "world" wiring the real functions to them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from shared.app import entry
from shared.core.settings import Settings
from shared.events.envelope import ClusterId

pytest_plugins = [
    "sandbox.testing.compute",
    "sandbox.testing.fixtures.gke",
    "sandbox.testing.fixtures.kube",
    "sandbox.testing.fixtures.pubsub",
]

PROJECT, LOCATION, CLUSTER = "test-proj", "us-central2-b", "test-cluster"
CLUSTER_ID = ClusterId(PROJECT, LOCATION, CLUSTER)


@dataclass
class World:
    """The GKE emulator, the Kubernetes API and the settings the functions run with."""

    gke: Any
    kube: Any
    settings: Settings

    @property
    def cluster_path(self) -> str:
        return self.settings.cluster_path

    def configure(self, **overrides: Any) -> Settings:
        """Re-install the functions' runtime with changed settings (what a redeploy would do)."""
        self.settings = self.settings.with_overrides(**overrides)
        entry.reset_runtime(self.settings)
        return self.settings

    def pools(self) -> list[dict[str, Any]]:
        return list(self.gke.pools(self.cluster_path))

    def pool_names(self) -> list[str]:
        return sorted(p["name"] for p in self.pools())


@pytest.fixture
def world(gke_emulator: Any, kube_server: Any) -> Iterator[World]:
    """Functions configured against both emulators; runtime reset afterwards."""
    settings = Settings(
        project_id=PROJECT,
        location=LOCATION,
        cluster_name=CLUSTER,
        gke_api_endpoint=gke_emulator.url,
        kube_api_endpoint=kube_server.url,
    )
    for ns in ("team-a", "team-b"):
        kube_server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    entry.reset_runtime(settings)
    try:
        yield World(gke_emulator, kube_server, settings)
    finally:
        entry.reset_runtime(None)
