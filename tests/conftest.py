"""Suite-wide fixtures: the emulators (via plugins) and a "world" wiring the real functions to them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sandbox.kube import netns, rbac
from sandbox.testing import fnclient
from shared.app import entry
from shared.core import logs
from shared.core.settings import Settings
from shared.events.envelope import ClusterId

pytest_plugins = [
    "sandbox.testing.compute",
    "sandbox.testing.fixtures.gke",
    "sandbox.testing.fixtures.kube",
    "sandbox.testing.fixtures.pubsub",
]

PROJECT, LOCATION, CLUSTER = "test-proj", "us-central2-b", "test-cluster"
# The identity the world's runtime starts as; a delivery to another function switches to that one's.
DEFAULT_FUNCTION = "provision"


def pytest_configure(config: pytest.Config) -> None:
    """Before any test starts a thread or a server: the whole session into a network namespace with
    only lo (``sandbox.kube.netns``), where the real API server runs; every emulator listens there."""
    netns.isolate()


CLUSTER_ID = ClusterId(PROJECT, LOCATION, CLUSTER)


@dataclass
class World:
    """The GKE emulator, the Kubernetes API and the settings the functions run with."""

    gke: Any
    kube: Any
    settings: Settings

    function: str = DEFAULT_FUNCTION

    @property
    def cluster_path(self) -> str:
        return self.settings.cluster_path

    def configure(self, **overrides: Any) -> Settings:
        """Re-install the functions' runtime with changed settings (what a redeploy would do)."""
        self.settings = self.settings.with_overrides(**overrides)
        entry.reset_runtime(self.settings)
        return self.settings

    def act_as(self, function: str) -> None:
        """Run the runtime as ``function``'s identity (its kubeconfig), as that function's own
        deployment would; called before each delivery to it."""
        if function != self.function and function in rbac.FUNCTIONS:
            self.function = function
            # A new runtime routes the product's log lines to stdout again: keep the stream the
            # test captures them from.
            handlers = logging.getLogger(logs.LOGGER_NAME).handlers
            stream = next((h.stream for h in handlers if isinstance(h, logging.StreamHandler)), None)
            self.configure(kubeconfig=str(self.kube.kubeconfig_for(function)))
            if stream is not None:
                logs.configure(self.settings.project_id, stream=stream)

    def pools(self) -> list[dict[str, Any]]:
        return list(self.gke.pools(self.cluster_path))

    def pool_names(self) -> list[str]:
        return sorted(p["name"] for p in self.pools())


@pytest.fixture
def world(gke_emulator: Any, kube_server: Any) -> Iterator[World]:
    """Functions configured against the GKE emulator and the real API server (each delivery as
    its function's identity); runtime reset afterwards."""
    settings = Settings(
        unlimited_spending=True,
        project_id=PROJECT,
        location=LOCATION,
        cluster_name=CLUSTER,
        gke_api_endpoint=gke_emulator.url,
        kubeconfig=str(kube_server.kubeconfig_for(DEFAULT_FUNCTION)),
        # The function tests redeliver one object on purpose to see each decision; coalescing has its
        # own tests (tests/functions/test_trust_boundary.py).
        event_coalesce_seconds=0,
    )
    entry.reset_runtime(settings)
    world = World(gke_emulator, kube_server, settings)
    fnclient.set_delivery_hook(world.act_as)
    try:
        yield world
    finally:
        fnclient.set_delivery_hook(None)
        entry.reset_runtime(None)
