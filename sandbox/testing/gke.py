"""Helpers for driving the GKE emulator in tests: a real REST client, NodePool builders, raw HTTP.

Kept out of the test files so any test (the emulator's own, sandbox end-to-end ones) can build
requests the same way. The Google client is imported here; only tests and the sandbox import this.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1 as gke

from sandbox.emulators.gke.emulator import GkeEmulator

DEFAULT_ZONE = "us-central2-b"


def rest_client(url: str) -> gke.ClusterManagerClient:
    """The real client on the REST transport, pointed at an emulator."""
    options = {"api_endpoint": url}
    return gke.ClusterManagerClient(
        transport="rest", client_options=options, credentials=AnonymousCredentials()
    )


def make_pool(
    name: str = "pool-a",
    machine_type: str = "ct5lp-hightpu-4t",
    nodes: int = 4,
    topology: str = "4x4",
    locations: tuple[str, ...] = (DEFAULT_ZONE,),
    policy_name: str = "",
    autoscaling: bool = False,
    reservation_key: str = "",
    reservation: str = "res-1",
    spot: bool = False,
    disk_type: str = "",
    auto_upgrade: bool = True,
    auto_repair: bool = True,
    flex_start: bool = False,
) -> gke.NodePool:
    """A NodePool message with just the fields the emulator's create rules look at.

    Auto-upgrade and auto-repair default to on, which every cluster accepts (the emulator's default
    cluster is enrolled in a release channel, like a new GKE cluster). ``flex_start`` builds the pool
    the way the product (``shared.cloud.gke_messages.spec_to_node_pool``) and GKE's examples do: no initial
    nodes, autoscaling 0..``nodes`` in total with location policy ANY, no reservation, no auto-repair.
    """
    pool = gke.NodePool(
        name=name,
        initial_node_count=nodes,
        locations=list(locations),
        config=gke.NodeConfig(machine_type=machine_type, spot=spot, disk_type=disk_type),
        autoscaling=gke.NodePoolAutoscaling(enabled=autoscaling, max_node_count=4 if autoscaling else 0),
        management=gke.NodeManagement(auto_upgrade=auto_upgrade, auto_repair=auto_repair),
    )
    if flex_start:
        pool.initial_node_count = 0
        pool.config.flex_start = True
        pool.autoscaling = gke.NodePoolAutoscaling(
            enabled=True,
            total_min_node_count=0,
            total_max_node_count=nodes,
            location_policy=gke.NodePoolAutoscaling.LocationPolicy.ANY,
        )
        pool.config.reservation_affinity = gke.ReservationAffinity(
            consume_reservation_type=gke.ReservationAffinity.Type.NO_RESERVATION
        )
        pool.management.auto_repair = False
    if topology or policy_name:
        pool.placement_policy = gke.NodePool.PlacementPolicy(
            type_=gke.NodePool.PlacementPolicy.Type.COMPACT if topology else 0,
            tpu_topology=topology,
            policy_name=policy_name,
        )
    if reservation_key:
        pool.config.reservation_affinity = gke.ReservationAffinity(
            consume_reservation_type=gke.ReservationAffinity.Type.SPECIFIC_RESERVATION,
            key=reservation_key,
            values=[reservation],
        )
    return pool


def raw(
    emulator: GkeEmulator, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    """One plain HTTP exchange, returning the status and the decoded JSON body."""
    request = urllib.request.Request(emulator.url + path, data=body, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
