"""The GKE emulator, driven by the real ``ClusterManagerClient`` (and raw HTTP for the wire shape)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.api_core import exceptions as core
from google.cloud import container_v1 as gke

from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.kube.nodes import node_manifests, pool_from_gke
from sandbox.polling import eventually
from sandbox.testing.clock import FakeClock
from sandbox.testing.gke import make_pool, raw, rest_client
from tests.paths import REPO

ZONE = "us-central2-b"
# The cluster the gke_emulator fixture is seeded with.
GKE_TEST_CLUSTER = f"projects/test-proj/locations/{ZONE}/clusters/test-cluster"
FAILED_OP = "Cluster is running incompatible operation operation-123."
OTHER_CLUSTER = "projects/test-proj/locations/us-central2-b/clusters/nope"


@pytest.fixture
def client(gke_emulator: GkeEmulator) -> gke.ClusterManagerClient:
    """A client for the ``gke_emulator`` fixture."""
    return rest_client(gke_emulator.url)


def create(client: gke.ClusterManagerClient, pool: gke.NodePool, cluster: str = GKE_TEST_CLUSTER) -> Any:
    """Create without the library's retries, so each call is exactly one request."""
    return client.create_node_pool(parent=cluster, node_pool=pool, retry=None, timeout=5)


REJECTED = [
    ("Upper-Case", {"name": "Pool-A"}, "invalid"),
    ("starts-with-digit", {"name": "1pool"}, "start with a letter"),
    ("ends-with-hyphen", {"name": "pool-"}, "end with a letter or digit"),
    ("underscore", {"name": "my_pool"}, "lowercase letters"),
    ("41-chars", {"name": "a" * 41}, "limit is 40"),
    ("empty-name", {"name": ""}, "must be specified"),
    ("unknown-tpu-type", {"machine_type": "ct9z-hightpu-4t"}, "not a supported TPU machine type"),
    ("unknown-type", {"machine_type": "bogus-type", "topology": "", "nodes": 1}, "Invalid machine type"),
    ("count-mismatch", {"machine_type": "ct5p-hightpu-4t", "nodes": 3, "topology": "2x2x2"}, "has 8 chips"),
    ("2d-topology-v5p", {"machine_type": "ct5p-hightpu-4t", "nodes": 2, "topology": "2x4"}, "3D topology"),
    ("3d-topology-v5e", {"nodes": 2, "topology": "2x2x2"}, "2D topology"),
    ("2d-topology-tpu7x", {"machine_type": "tpu7x-standard-4t", "topology": "4x4"}, "3D topology"),
    ("malformed-topology", {"topology": "4by4"}, "malformed"),
    ("topology-single-host", {"nodes": 1, "topology": "2x2"}, "single-host"),
    (
        "topology-single-host-8t",
        {"machine_type": "ct6e-standard-8t", "nodes": 1, "topology": "2x4"},
        "single",
    ),
    ("multi-host-8t", {"machine_type": "ct5lp-hightpu-8t", "nodes": 2, "topology": "4x4"}, "multi-host"),
    ("multi-host-no-topology", {"topology": ""}, "needs a placement policy"),
    ("multi-host-autoscaling", {"autoscaling": True}, "Autoscaling"),
    ("zero-tpu-nodes", {"nodes": 0, "topology": ""}, "positive initial_node_count"),
    ("zone-other-region", {"locations": ("europe-west4-a",)}, "not a zone of the cluster's region"),
    ("multi-host-two-zones", {"locations": (ZONE, "us-central2-c")}, "exactly one zone"),
    ("topology-on-cpu-pool", {"machine_type": "e2-standard-4", "nodes": 2, "topology": "2x2"}, "only for"),
    ("bad-reservation-key", {"nodes": 1, "topology": "", "reservation_key": "res"}, "reservation-name"),
    (
        "reservation-value-not-a-reservation",
        {"reservation_key": "compute.googleapis.com/reservation-name", "reservation": "res/blocks/b1"},
        "is not a reservation",
    ),
    # The rules of issue 12, each with GKE's (or Compute's) own wording where it could be found.
    (
        "auto-upgrade-off-on-release-channel",
        {"auto_upgrade": False},
        "Auto_upgrade cannot be false when release_channel REGULAR is set.",
    ),
    (
        "flex-start-with-spot",
        {"flex_start": True, "spot": True},
        "Flex-start cannot be used together with Spot",
    ),
    (
        "pd-balanced-boot-disk-on-v6e",
        {"machine_type": "ct6e-standard-4t", "disk_type": "pd-balanced"},
        "[pd-balanced, ct6e-standard-4t] features are not compatible for creating instance.",
    ),
    (
        "pd-balanced-boot-disk-on-tpu7x",
        {"machine_type": "tpu7x-standard-4t", "topology": "2x2x4", "disk_type": "pd-balanced"},
        "[pd-balanced, tpu7x-standard-4t] features are not compatible",
    ),
    (
        "hyperdisk-boot-disk-on-v5e",
        {"disk_type": "hyperdisk-balanced"},
        "[hyperdisk-balanced, ct5lp-hightpu-4t] features are not compatible",
    ),
    (
        "spot-consuming-a-reservation",
        {"spot": True, "reservation_key": "compute.googleapis.com/reservation-name"},
        "Spot VMs cannot consume reservations",
    ),
    (
        "topology-on-single-host-pool-gke-text",
        {"machine_type": "ct6e-standard-4t", "nodes": 1, "topology": "2x2"},
        "TPU topology can't be specified with single-host TPU slice pool",
    ),
]


@pytest.mark.parametrize(("overrides", "needle"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED])
def test_create_rejects_invalid_pools_with_400(
    client: gke.ClusterManagerClient, gke_emulator: GkeEmulator, overrides: dict[str, Any], needle: str
) -> None:
    with pytest.raises(core.BadRequest) as caught:
        create(client, make_pool(**overrides))
    assert needle in caught.value.message
    assert gke_emulator.pools(GKE_TEST_CLUSTER) == []


ACCEPTED = [
    ("v5e-4x4", {"machine_type": "ct5lp-hightpu-4t", "nodes": 4, "topology": "4x4"}),
    ("v5e-single-host-8t", {"machine_type": "ct5lp-hightpu-8t", "nodes": 1, "topology": ""}),
    ("v6e-8x8", {"machine_type": "ct6e-standard-4t", "nodes": 16, "topology": "8x8"}),
    ("v4-2x2x4", {"machine_type": "ct4p-hightpu-4t", "nodes": 4, "topology": "2x2x4"}),
    ("v5p-2x2x2", {"machine_type": "ct5p-hightpu-4t", "nodes": 2, "topology": "2x2x2"}),
    ("tpu7x-2x2x4", {"machine_type": "tpu7x-standard-4t", "nodes": 4, "topology": "2x2x4"}),
    ("tpu7x-workload-policy", {"machine_type": "tpu7x-standard-4t", "topology": "", "policy_name": "wp"}),
    ("cpu-pool", {"machine_type": "e2-standard-4", "nodes": 3, "topology": ""}),
    ("name-40-chars", {"name": "p" + "-0" * 19 + "z"}),
    ("good-reservation", {"reservation_key": "compute.googleapis.com/reservation-name"}),
    (
        "reservation-sub-block",
        {
            "reservation_key": "compute.googleapis.com/reservation-name",
            "reservation": "projects/owner-proj/reservations/res/reservationBlocks/b1"
            "/reservationSubBlocks/s1",
        },
    ),
    (
        "v6e-hyperdisk",
        {"machine_type": "ct6e-standard-4t", "topology": "4x4", "disk_type": "hyperdisk-balanced"},
    ),
    (
        "v5p-pd-balanced",
        {"machine_type": "ct5p-hightpu-4t", "nodes": 2, "topology": "2x2x2", "disk_type": "pd-balanced"},
    ),
    ("tpu7x-1t-single-host", {"machine_type": "tpu7x-standard-1t", "nodes": 1, "topology": ""}),
    ("spot-without-reservation", {"spot": True}),
    # GKE's release-channel rule covers auto-upgrade only; flex-start pools turn auto-repair off.
    ("auto-repair-off-on-release-channel", {"auto_repair": False}),
    ("flex-start-multi-host", {"flex_start": True}),
    (
        "flex-start-single-host",
        {"flex_start": True, "machine_type": "ct6e-standard-4t", "nodes": 1, "topology": ""},
    ),
]


@pytest.mark.parametrize("overrides", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_create_accepts_valid_pools(
    client: gke.ClusterManagerClient, gke_emulator: GkeEmulator, overrides: dict[str, Any]
) -> None:
    pool = make_pool(**overrides)
    operation = create(client, pool)
    assert operation.operation_type == gke.Operation.Type.CREATE_NODE_POOL
    assert operation.target_link.endswith(f"{GKE_TEST_CLUSTER}/nodePools/{pool.name}")
    assert [p["name"] for p in gke_emulator.pools(GKE_TEST_CLUSTER)] == [pool.name]


def _flex(change: Callable[[gke.NodePool], None]) -> gke.NodePool:
    pool = make_pool(flex_start=True)
    change(pool)
    return pool


def _specific_reservation(pool: gke.NodePool) -> None:
    pool.config.reservation_affinity = gke.ReservationAffinity(
        consume_reservation_type=gke.ReservationAffinity.Type.SPECIFIC_RESERVATION,
        key="compute.googleapis.com/reservation-name",
        values=["res-1"],
    )


FLEX_REJECTED: list[tuple[str, Callable[[gke.NodePool], None], str]] = [
    ("specific-reservation", _specific_reservation, "cannot consume a reservation"),
    ("autoscaling-off", lambda p: setattr(p.autoscaling, "enabled", False), "need autoscaling enabled"),
    ("preemptible", lambda p: setattr(p.config, "preemptible", True), "Spot or preemptible"),
    (
        "total-and-per-zone-max",
        lambda p: setattr(p.autoscaling, "max_node_count", 4),
        "node_pool_autoscaling.max_node_count and node_pool_autoscaling.total_max_node_count cannot be both "
        "greater than zero.",
    ),
    (
        "total-and-per-zone-min",
        lambda p: (
            setattr(p.autoscaling, "min_node_count", 1),
            setattr(p.autoscaling, "total_min_node_count", 1),
        ),
        "min_node_count and node_pool_autoscaling.total_min_node_count cannot be both greater than zero",
    ),
    (
        "no-maximum",
        lambda p: setattr(p.autoscaling, "total_max_node_count", 0),
        "max_node_count and node_pool_autoscaling.total_max_node_count cannot be both set to zero.",
    ),
]


@pytest.mark.parametrize(
    ("change", "needle"), [c[1:] for c in FLEX_REJECTED], ids=[c[0] for c in FLEX_REJECTED]
)
def test_create_rejects_invalid_flex_start_pools_with_400(
    client: gke.ClusterManagerClient,
    gke_emulator: GkeEmulator,
    change: Callable[[gke.NodePool], None],
    needle: str,
) -> None:
    with pytest.raises(core.BadRequest) as caught:
        create(client, _flex(change))
    assert needle in caught.value.message
    assert gke_emulator.pools(GKE_TEST_CLUSTER) == []


# Node labels: GKE's and Kubernetes' domains are refused with GKE's text (but for the two TPU keys
# GKE takes from a pool); any other key is the pool's to set.
NODE_LABELS = [
    ("gke-reserved", {"cloud.google.com/compute-class": "x"}, "cloud.google.com/compute-class"),
    ("gke-nodepool", {"cloud.google.com/gke-nodepool": "x"}, "cloud.google.com/gke-nodepool"),
    ("kubernetes", {"kubernetes.io/arch": "amd64"}, "kubernetes.io/arch"),
    ("kubernetes-subdomain", {"node-role.kubernetes.io/tpu": ""}, "node-role.kubernetes.io/tpu"),
    ("k8s", {"k8s.io/x": "y"}, "k8s.io/x"),
    ("ici-resiliency", {"cloud.google.com/gke-tpu-ici-resiliency": "false"}, ""),
    ("location-hint", {"cloud.google.com/gke-location-hint": "cell-a"}, ""),
    ("google-com", {"google.com/team": "x"}, ""),
    ("user-key", {"team": "ml", "example.com/kubernetes.io": "x"}, ""),
]


@pytest.mark.parametrize(
    ("node_labels", "key"), [c[1:] for c in NODE_LABELS], ids=[c[0] for c in NODE_LABELS]
)
def test_node_labels_in_gke_or_kubernetes_domains_are_refused(
    client: gke.ClusterManagerClient, gke_emulator: GkeEmulator, node_labels: dict[str, str], key: str
) -> None:
    pool = make_pool()
    pool.config.labels.update(node_labels)
    if not key:
        create(client, pool)
        assert [p["name"] for p in gke_emulator.pools(GKE_TEST_CLUSTER)] == [pool.name]
        return
    with pytest.raises(core.BadRequest) as caught:
        create(client, pool)
    assert caught.value.message.endswith(
        f'Node labels with key "{key}" are managed by GKE or Kubernetes and must not be manually specified.'
    )
    assert gke_emulator.pools(GKE_TEST_CLUSTER) == []


@pytest.mark.parametrize(
    ("key", "accepted"),
    [
        ("projects/p/locations/us-central2/keyRings/r/cryptoKeys/k", True),
        ("projects/p/keyRings/r/cryptoKeys/k", False),
        ("k", False),
    ],
)
def test_boot_disk_kms_key_must_be_a_crypto_key_name(
    client: gke.ClusterManagerClient, gke_emulator: GkeEmulator, key: str, accepted: bool
) -> None:
    pool = make_pool()
    pool.config.boot_disk_kms_key = key
    if accepted:
        create(client, pool)
        [stored] = gke_emulator.pools(GKE_TEST_CLUSTER)
        assert stored["config"]["bootDiskKmsKey"] == key
        return
    with pytest.raises(core.BadRequest, match="boot_disk_kms_key"):
        create(client, pool)


def _secondary_disk(image: str) -> Callable[[gke.NodePool], None]:
    def change(pool: gke.NodePool) -> None:
        mode = gke.SecondaryBootDisk.Mode.CONTAINER_IMAGE_CACHE
        pool.config.secondary_boot_disks.append(gke.SecondaryBootDisk(disk_image=image, mode=mode))

    return change


def _extra_network(network: str, subnetwork: str) -> Callable[[gke.NodePool], None]:
    def change(pool: gke.NodePool) -> None:
        extra = gke.AdditionalNodeNetworkConfig(network=network, subnetwork=subnetwork)
        pool.network_config.additional_node_network_configs.append(extra)

    return change


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (_secondary_disk("projects/p/global/images/jax-cache"), ""),
        (_secondary_disk("jax-cache"), "secondary_boot_disks.disk_image"),
        (_extra_network("dcn-1", "dcn-1-sub"), ""),
        (_extra_network("dcn-1", ""), "needs both a network and a subnetwork"),
    ],
    ids=["disk-image", "bare-image-name", "extra-network", "network-without-subnetwork"],
)
def test_secondary_boot_disks_and_additional_networks(
    client: gke.ClusterManagerClient,
    gke_emulator: GkeEmulator,
    change: Callable[[gke.NodePool], None],
    needle: str,
) -> None:
    pool = make_pool()
    change(pool)
    if not needle:
        create(client, pool)
        assert [p["name"] for p in gke_emulator.pools(GKE_TEST_CLUSTER)] == [pool.name]
        return
    with pytest.raises(core.BadRequest, match=needle):
        create(client, pool)


@pytest.mark.parametrize(
    ("disk_type", "key", "accepted"),
    [
        ("hyperdisk-balanced", "projects/p/locations/us-central2/keyRings/r/cryptoKeys/k", True),
        ("hyperdisk-balanced", "", False),
        ("pd-balanced", "projects/p/locations/us-central2/keyRings/r/cryptoKeys/k", False),
    ],
    ids=["hyperdisk-with-key", "no-key", "persistent-disk"],
)
def test_confidential_storage_needs_hyperdisk_and_a_kms_key(
    client: gke.ClusterManagerClient, gke_emulator: GkeEmulator, disk_type: str, key: str, accepted: bool
) -> None:
    pool = make_pool(machine_type="ct6e-standard-4t", topology="4x4", disk_type=disk_type)
    pool.config.boot_disk_kms_key = key
    pool.config.enable_confidential_storage = True
    if accepted:
        create(client, pool)
        assert [p["name"] for p in gke_emulator.pools(GKE_TEST_CLUSTER)] == [pool.name]
        return
    with pytest.raises(core.BadRequest, match="Confidential storage needs a hyperdisk-balanced boot disk"):
        create(client, pool)


def test_duplicate_pool_is_409(client: gke.ClusterManagerClient) -> None:
    create(client, make_pool())
    with pytest.raises(core.Conflict, match="Already exists"):
        create(client, make_pool())


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.get_cluster(name=OTHER_CLUSTER, retry=None),
        lambda c: c.list_node_pools(parent=OTHER_CLUSTER, retry=None),
        lambda c: c.get_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/missing", retry=None),
        lambda c: c.delete_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/missing", retry=None),
        lambda c: c.get_operation(name="projects/test-proj/locations/us-central2-b/operations/operation-9"),
        lambda c: create(c, make_pool(), cluster=OTHER_CLUSTER),
    ],
    ids=["cluster", "list-unknown-cluster", "pool", "delete-pool", "operation", "create-unknown-cluster"],
)
def test_unknown_objects_are_404(client: gke.ClusterManagerClient, call: Callable[[Any], Any]) -> None:
    with pytest.raises(core.NotFound):
        call(client)


def test_get_cluster_reports_seeded_cluster_and_its_pools(client: gke.ClusterManagerClient) -> None:
    create(client, make_pool(name="cpu", machine_type="e2-standard-4", nodes=1, topology=""))
    cluster = client.get_cluster(name=GKE_TEST_CLUSTER, retry=None)
    assert (cluster.name, cluster.location, list(cluster.locations)) == ("test-cluster", ZONE, [ZONE])
    assert cluster.master_auth.cluster_ca_certificate
    assert [p.name for p in cluster.node_pools] == ["cpu"]


@pytest.fixture
def clocked() -> Iterator[tuple[GkeEmulator, FakeClock, gke.ClusterManagerClient]]:
    """An emulator whose operations take 10 fake seconds."""
    clock = FakeClock()
    emulator = GkeEmulator([ClusterSeed.from_path(GKE_TEST_CLUSTER)], op_delay=10, clock=clock)
    emulator.start()
    try:
        yield emulator, clock, rest_client(emulator.url)
    finally:
        emulator.stop()


def test_operation_lifecycle_follows_the_clock(
    clocked: tuple[GkeEmulator, FakeClock, gke.ClusterManagerClient],
) -> None:
    emulator, clock, client = clocked
    ready: list[tuple[str, dict[str, Any]]] = []
    deleted: list[tuple[str, str]] = []
    emulator.on_pool_ready(lambda cluster, pool: ready.append((cluster, pool)))
    emulator.on_pool_deleted(lambda cluster, name: deleted.append((cluster, name)))
    op = create(client, make_pool())
    op_name = f"projects/test-proj/locations/{ZONE}/operations/{op.name}"
    status = lambda: client.get_operation(name=op_name).status  # noqa: E731
    pool_status = lambda: client.get_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/pool-a").status  # noqa: E731

    assert (op.status, status(), pool_status()) == (
        gke.Operation.Status.PENDING,
        gke.Operation.Status.PENDING,
        gke.NodePool.Status.PROVISIONING,
    )
    clock.now += 5
    assert (status(), pool_status()) == (gke.Operation.Status.RUNNING, gke.NodePool.Status.PROVISIONING)
    assert ready == []
    clock.now += 5
    assert (status(), pool_status()) == (gke.Operation.Status.DONE, gke.NodePool.Status.RUNNING)
    assert [(c, p["name"], p["status"]) for c, p in ready] == [(GKE_TEST_CLUSTER, "pool-a", "RUNNING")]

    delete_op = client.delete_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/pool-a", retry=None)
    assert delete_op.operation_type == gke.Operation.Type.DELETE_NODE_POOL
    assert pool_status() == gke.NodePool.Status.STOPPING
    clock.now += 10
    emulator.state.advance()
    assert deleted == [(GKE_TEST_CLUSTER, "pool-a")]
    with pytest.raises(core.NotFound):
        pool_status()


def test_operations_finish_in_real_time_without_polling(gke_emulator: GkeEmulator) -> None:
    gke_emulator.set_op_delay(0.2)
    ready = threading.Event()
    gke_emulator.on_pool_ready(lambda cluster, pool: ready.set())
    op = create(rest_client(gke_emulator.url), make_pool())
    assert op.status != gke.Operation.Status.DONE
    assert ready.wait(3), "the ticker should finish the operation and fire the hook"
    assert gke_emulator.pools(GKE_TEST_CLUSTER)[0]["status"] == "RUNNING"


def test_mutating_a_pool_with_a_running_operation_is_incompatible(
    clocked: tuple[GkeEmulator, FakeClock, gke.ClusterManagerClient],
) -> None:
    _, _, client = clocked
    op = create(client, make_pool())
    with pytest.raises(core.BadRequest, match=f"incompatible operation {op.name}"):
        client.delete_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/pool-a", retry=None)


def test_other_pools_proceed_concurrently_unless_strict(
    clocked: tuple[GkeEmulator, FakeClock, gke.ClusterManagerClient],
) -> None:
    emulator, clock, client = clocked
    create(client, make_pool(name="a"))
    create(client, make_pool(name="b"))
    emulator.set_strict_cluster_ops(True)
    with pytest.raises(core.BadRequest, match="Cluster is running incompatible operation"):
        create(client, make_pool(name="c"))
    clock.now += 10
    create(client, make_pool(name="c"))
    assert sorted(p["name"] for p in emulator.pools(GKE_TEST_CLUSTER)) == ["a", "b", "c"]


def test_stockout_ends_the_operation_in_error_and_leaves_an_error_pool(
    client: gke.ClusterManagerClient, gke_emulator: GkeEmulator
) -> None:
    ready: list[str] = []
    gke_emulator.on_pool_ready(lambda cluster, pool: ready.append(pool["name"]))
    gke_emulator.stockout("ct5lp-hightpu-4t")
    create(client, make_pool(name="cpu", machine_type="e2-standard-4", nodes=1, topology=""))
    op = create(client, make_pool(name="tpu"))
    done = client.get_operation(name=f"projects/test-proj/locations/{ZONE}/operations/{op.name}")
    assert done.status == gke.Operation.Status.DONE
    assert "does not have enough resources available" in done.error.message
    pool = client.get_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/tpu")
    assert pool.status == gke.NodePool.Status.ERROR
    assert "does not have enough resources available" in pool.status_message
    assert ready == ["cpu"]
    assert gke_emulator.faults_fired("stockout") == 1
    create(client, make_pool(name="tpu-2"))  # the stockout was armed once
    assert gke_emulator.pools(GKE_TEST_CLUSTER)[-1]["status"] == "RUNNING"


FAULTS = [
    ("create-429", "create", 429, "too many operations", core.TooManyRequests),
    (
        "create-incompatible",
        "create",
        400,
        "Cluster is running incompatible operation op-1.",
        core.BadRequest,
    ),
    ("list-503", "list", 503, "backend unavailable", core.ServiceUnavailable),
    ("get-cluster-403", "get_cluster", 403, "permission denied", core.Forbidden),
]


@pytest.mark.parametrize(
    ("kind", "code", "message", "error"), [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS]
)
def test_injected_faults_fire_once_then_clear(
    client: gke.ClusterManagerClient,
    gke_emulator: GkeEmulator,
    kind: str,
    code: int,
    message: str,
    error: type[Exception],
) -> None:
    calls: dict[str, Callable[[], Any]] = {
        "create": lambda: create(client, make_pool()),
        "list": lambda: client.list_node_pools(parent=GKE_TEST_CLUSTER, retry=None),
        "get_cluster": lambda: client.get_cluster(name=GKE_TEST_CLUSTER, retry=None),
    }
    gke_emulator.fail_next(kind, code, message)
    with pytest.raises(error, match=message):
        calls[kind]()
    calls[kind]()
    assert gke_emulator.faults_fired(f"error:{kind}") == 1
    assert gke_emulator.count(kind) == 2


def test_hang_is_cut_short_by_stop() -> None:
    emulator = GkeEmulator([ClusterSeed.from_path(GKE_TEST_CLUSTER)], op_delay=0).start()
    emulator.hang_next("get_cluster", 30)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            urllib.request.urlopen(f"{emulator.url}/v1/{GKE_TEST_CLUSTER}", timeout=10).read()
        except Exception as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    eventually(lambda: emulator.faults_fired("hang:get_cluster") == 1)
    started = time.monotonic()
    emulator.stop()
    worker.join(10)
    assert not worker.is_alive()
    assert time.monotonic() - started < 5
    assert outcome, "the hung request must not be answered normally"


def test_wire_format_enums_and_bad_requests(gke_emulator: GkeEmulator) -> None:
    body = json.dumps(
        {
            "nodePool": {
                "name": "raw",
                "initialNodeCount": 2,
                "config": {"machineType": "ct5p-hightpu-4t"},
                "placementPolicy": {"type": "COMPACT", "tpuTopology": "2x2x2"},
                "management": {"autoUpgrade": True, "autoRepair": True},
            }
        }
    ).encode()
    code, op = raw(gke_emulator, "POST", f"/v1/{GKE_TEST_CLUSTER}/nodePools", body)
    assert (code, op["operationType"], op["status"]) == (200, "CREATE_NODE_POOL", "DONE")
    _, numeric = raw(
        gke_emulator, "GET", f"/v1/{GKE_TEST_CLUSTER}/nodePools/raw?%24alt=json%3Benum-encoding%3Dint"
    )
    assert numeric["status"] == int(gke.NodePool.Status.RUNNING)
    assert numeric["placementPolicy"] == {"type": 1, "tpuTopology": "2x2x2"}

    bad_field = json.dumps({"nodePool": {"name": "x", "nodeCount": 1}}).encode()
    code, err = raw(gke_emulator, "POST", f"/v1/{GKE_TEST_CLUSTER}/nodePools", bad_field)
    assert (code, err["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert "nodeCount" in err["error"]["message"]
    code, err = raw(gke_emulator, "POST", f"/v1/{GKE_TEST_CLUSTER}/nodePools", b"{not json")
    assert (code, err["error"]["status"]) == (400, "INVALID_ARGUMENT")
    code, err = raw(gke_emulator, "GET", "/v1/projects/test-proj/zones/us-central2-b/clusters/test-cluster")
    assert (code, err["error"]["status"]) == (404, "NOT_FOUND")
    # Injected errors use the same {"error": {"code", "message", "status"}} shape GKE sends.
    for code, message, status in [
        (429, "slow down", "RESOURCE_EXHAUSTED"),
        (400, FAILED_OP, "FAILED_PRECONDITION"),
    ]:
        gke_emulator.fail_next("get_cluster", code, message)
        expected = {"error": {"code": code, "message": message, "status": status}}
        assert raw(gke_emulator, "GET", f"/v1/{GKE_TEST_CLUSTER}") == (code, expected)


def test_calls_are_recorded_in_order(client: gke.ClusterManagerClient, gke_emulator: GkeEmulator) -> None:
    create(client, make_pool())
    client.list_node_pools(parent=GKE_TEST_CLUSTER, retry=None)
    client.delete_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/pool-a", retry=None)
    assert [c.method for c in gke_emulator.calls] == ["create", "list", "delete"]
    assert gke_emulator.calls[0].summary == "name=pool-a machineType=ct5lp-hightpu-4t nodes=4 topology=4x4"
    assert [gke_emulator.count(k) for k in ("create", "list", "delete", "get")] == [1, 1, 1, 0]
    with pytest.raises(ValueError, match="unknown request kind"):
        gke_emulator.count("patch")
    with pytest.raises(ValueError, match="unknown request kind"):
        gke_emulator.fail_next("patch", 500)


def test_cluster_seed_from_path() -> None:
    seed = ClusterSeed.from_path("projects/p/locations/us-east5/clusters/c", endpoint="10.0.0.2")
    assert (seed.project, seed.location, seed.name, seed.locations) == ("p", "us-east5", "c", ("us-east5-a",))
    assert seed.path == "projects/p/locations/us-east5/clusters/c"
    with pytest.raises(ValueError, match="not a cluster path"):
        ClusterSeed.from_path("projects/p/zones/z/clusters/c")


@pytest.mark.integration
def test_runs_as_a_process_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandbox.emulators.gke.emulator",
            "--port",
            "0",
            "--op-delay",
            "0",
            "--cluster",
            GKE_TEST_CLUSTER,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(f"{url}/v1/{GKE_TEST_CLUSTER}", timeout=5) as response:
            assert json.loads(response.read())["name"] == "test-cluster"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


NO_CHANNEL_CLUSTER = "projects/test-proj/locations/us-central2/clusters/no-channel"


@pytest.fixture
def no_channel_emulator() -> Iterator[GkeEmulator]:
    """A regional cluster outside release channels, in two zones."""
    seed = ClusterSeed.from_path(
        NO_CHANNEL_CLUSTER, locations=("us-central2-b", "us-central2-c"), release_channel=""
    )
    with GkeEmulator([seed], op_delay=0) as emulator:
        yield emulator


def test_get_cluster_reports_the_release_channel(
    client: gke.ClusterManagerClient, no_channel_emulator: GkeEmulator
) -> None:
    enrolled = client.get_cluster(name=GKE_TEST_CLUSTER, retry=None)
    assert enrolled.release_channel.channel == gke.ReleaseChannel.Channel.REGULAR
    other = rest_client(no_channel_emulator.url).get_cluster(name=NO_CHANNEL_CLUSTER, retry=None)
    assert other.release_channel.channel == gke.ReleaseChannel.Channel.UNSPECIFIED


def test_auto_upgrade_off_is_accepted_without_a_release_channel(no_channel_emulator: GkeEmulator) -> None:
    pool = make_pool(auto_upgrade=False, auto_repair=False)
    create(rest_client(no_channel_emulator.url), pool, cluster=NO_CHANNEL_CLUSTER)
    [stored] = no_channel_emulator.pools(NO_CHANNEL_CLUSTER)
    assert stored.get("management", {}).get("autoUpgrade", False) is False


def test_auto_upgrade_off_sent_raw_is_refused_with_gke_text(gke_emulator: GkeEmulator) -> None:
    body = json.dumps(
        {"nodePool": {"name": "raw", "initialNodeCount": 1, "config": {"machineType": "ct5lp-hightpu-4t"}}}
    ).encode()
    code, error = raw(gke_emulator, "POST", f"/v1/{GKE_TEST_CLUSTER}/nodePools", body)
    assert (code, error["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert error["error"]["message"] == "Auto_upgrade cannot be false when release_channel REGULAR is set."


def test_node_count_is_per_zone(no_channel_emulator: GkeEmulator) -> None:
    # A single-host pool in two zones is two slices: GKE creates initial_node_count nodes per zone.
    pool = make_pool(nodes=1, topology="2x2", locations=("us-central2-b", "us-central2-c"))
    pool.placement_policy = gke.NodePool.PlacementPolicy()
    create(rest_client(no_channel_emulator.url), pool, cluster=NO_CHANNEL_CLUSTER)
    [stored] = no_channel_emulator.pools(NO_CHANNEL_CLUSTER)
    nodes = node_manifests("no-channel", pool_from_gke(stored))
    zones = [n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes]
    assert zones == ["us-central2-b", "us-central2-c"]


# --- realism: latency, GKE's concurrent-operations quota, drawn operation durations ---------------


def test_latency_of_concurrent_calls_overlaps(gke_emulator: GkeEmulator, client: Any) -> None:
    gke_emulator.set_latency(0.3, ("list",))
    threads = [
        threading.Thread(target=client.list_node_pools, kwargs={"parent": GKE_TEST_CLUSTER, "retry": None})
        for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Every request was being served at once: each waited on its own thread, not in a queue.
    assert gke_emulator.max_in_flight("list") == 6
    assert gke_emulator.answered("list", 200) == 6


def test_operation_limit_answers_gke_429_until_an_operation_finishes(
    gke_emulator: GkeEmulator, client: Any
) -> None:
    gke_emulator.set_operation_limit(2)
    gke_emulator.set_op_durations(600)
    create(client, make_pool("a"))
    create(client, make_pool("b"))
    with pytest.raises(core.TooManyRequests) as caught:
        create(client, make_pool("c"))
    assert caught.value.code == 429
    assert 'Too many operations: cluster "test-cluster" hits the concurrent operations quota 2' in str(
        caught.value.message
    )
    assert gke_emulator.running_operations(GKE_TEST_CLUSTER) == 2
    assert [p["name"] for p in gke_emulator.pools(GKE_TEST_CLUSTER)] == ["a", "b"]
    gke_emulator.finish_operations()
    create(client, make_pool("c"))
    assert gke_emulator.answered("create", 429) == 1
    assert gke_emulator.answered("create", 200) == 3


def test_a_busy_pool_still_answers_incompatible_operation_before_the_quota(
    gke_emulator: GkeEmulator, client: Any
) -> None:
    gke_emulator.set_operation_limit(1)
    gke_emulator.set_op_durations(600)
    create(client, make_pool("a"))
    with pytest.raises(core.BadRequest, match="incompatible operation"):
        client.delete_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/a", retry=None)


def test_operation_durations_are_drawn_per_operation(gke_emulator: GkeEmulator, client: Any) -> None:
    durations = iter([0.0, 600.0])
    gke_emulator.set_op_durations(lambda: next(durations))
    create(client, make_pool("fast"))
    create(client, make_pool("slow"))
    status = {p["name"]: p["status"] for p in gke_emulator.pools(GKE_TEST_CLUSTER)}
    assert status == {"fast": "RUNNING", "slow": "PROVISIONING"}


def test_realism_is_off_by_default(gke_emulator: GkeEmulator, client: Any) -> None:
    for name in "abcdefgh":
        create(client, make_pool(name))
    assert gke_emulator.answered("create", 200) == 8
    assert gke_emulator.running_operations(GKE_TEST_CLUSTER) == 0


NO_WI_CLUSTER = "projects/test-proj/locations/us-central2-b/clusters/no-wi"


def test_gke_metadata_needs_workload_identity_on_the_cluster(client: gke.ClusterManagerClient) -> None:
    # container_v1 WorkloadMetadataConfig.Mode: GKE_METADATA only with Workload Identity enabled at
    # the cluster level. The default seed has it (workloadPool PROJECT.svc.id.goog), so it is accepted.
    assert client.get_cluster(name=GKE_TEST_CLUSTER, retry=None).workload_identity_config.workload_pool == (
        "test-proj.svc.id.goog"
    )
    pool = make_pool()
    pool.config.workload_metadata_config = gke.WorkloadMetadataConfig(
        mode=gke.WorkloadMetadataConfig.Mode.GKE_METADATA
    )
    create(client, pool)
    stored = client.get_node_pool(name=f"{GKE_TEST_CLUSTER}/nodePools/pool-a", retry=None)
    assert stored.config.workload_metadata_config.mode == gke.WorkloadMetadataConfig.Mode.GKE_METADATA

    seed = ClusterSeed.from_path(NO_WI_CLUSTER, workload_identity=False)
    with GkeEmulator([seed], op_delay=0) as emulator:
        other = rest_client(emulator.url)
        assert not other.get_cluster(name=NO_WI_CLUSTER, retry=None).workload_identity_config.workload_pool
        with pytest.raises(core.BadRequest) as refused:
            create(other, pool, cluster=NO_WI_CLUSTER)
        # The REST client prefixes GKE's message with the request line.
        assert refused.value.message.endswith(
            ": Workload metadata mode GKE_METADATA requires Workload Identity to be enabled on the "
            "cluster (workloadIdentityConfig.workloadPool is not set)."
        )
        assert emulator.pools(NO_WI_CLUSTER) == []
        # Without the mode (or with the Compute metadata server) the pool is GKE's ordinary business.
        pool.config.workload_metadata_config = gke.WorkloadMetadataConfig(
            mode=gke.WorkloadMetadataConfig.Mode.GCE_METADATA
        )
        create(other, pool, cluster=NO_WI_CLUSTER)
        assert [p["name"] for p in emulator.pools(NO_WI_CLUSTER)] == ["pool-a"]


def test_cluster_seeds_have_a_workload_pool_unless_seeded_without() -> None:
    seed = ClusterSeed.from_path(NO_WI_CLUSTER, workload_identity=False)
    assert (seed.workload_pool, ClusterSeed.from_path(NO_WI_CLUSTER).workload_pool) == (
        "",
        "test-proj.svc.id.goog",
    )
