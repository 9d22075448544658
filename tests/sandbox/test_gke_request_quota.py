"""The GKE emulator's per-project API request quota, through the real client and the product's adapter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from google.api_core import exceptions as core

from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.emulators.gke.quota import DEFAULT_PER_MINUTE, project_number
from sandbox.testing.clock import FakeClock
from sandbox.testing.gke import rest_client
from shared.cloud.gke import GkeNodePoolAPI
from shared.core.errors import OperationLimitError, TransientError

ZONE = "us-central2-b"
CLUSTER = f"projects/quota-proj/locations/{ZONE}/clusters/c"


@pytest.fixture
def emulator() -> Iterator[tuple[GkeEmulator, FakeClock]]:
    clock = FakeClock(1000.0)
    with GkeEmulator([ClusterSeed("quota-proj", ZONE, "c")], op_delay=0, clock=clock) as gke:
        yield gke, clock


def test_the_default_quota_is_gkes_3000_requests_a_minute(emulator: tuple[GkeEmulator, FakeClock]) -> None:
    gke, _ = emulator
    assert DEFAULT_PER_MINUTE == 3000
    assert gke.quota.per_minute == 3000


def test_a_request_beyond_the_minutes_quota_gets_googles_429_until_the_window_moves(
    emulator: tuple[GkeEmulator, FakeClock],
) -> None:
    gke, clock = emulator
    gke.set_request_quota(3)
    client = rest_client(gke.url)
    for _ in range(3):
        client.list_node_pools(parent=CLUSTER, retry=None, timeout=5)
    with pytest.raises(core.TooManyRequests) as refused:
        client.get_cluster(name=CLUSTER, retry=None, timeout=5)  # every method counts
    # The REST client prefixes the method and URL; the rest is the body's message.
    assert refused.value.message.endswith(
        "Quota exceeded for quota metric 'Requests' and limit 'Requests per minute' of service "
        f"'container.googleapis.com' for consumer 'project_number:{project_number('quota-proj')}'."
    )
    assert gke.answered("get_cluster", 429) == 1
    assert gke.quota.refused() == 1
    clock.now += 59.0
    with pytest.raises(core.TooManyRequests):
        client.list_node_pools(parent=CLUSTER, retry=None, timeout=5)
    clock.now += 1.0  # the first three are a minute old: their room is free again
    client.list_node_pools(parent=CLUSTER, retry=None, timeout=5)
    assert gke.quota.busiest_minute("quota-proj") == 3


def test_the_adapter_reports_a_spent_quota_as_transient_not_as_the_operation_limit(
    emulator: tuple[GkeEmulator, FakeClock],
) -> None:
    gke, _ = emulator
    gke.set_request_quota(1)
    adapter = GkeNodePoolAPI(endpoint=gke.url)
    adapter.list_node_pools(CLUSTER)
    with pytest.raises(TransientError, match="Quota exceeded for quota metric") as refused:
        adapter.list_node_pools(CLUSTER)
    assert not isinstance(refused.value, OperationLimitError)
