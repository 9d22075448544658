"""``shared.cloud.gke.GkeNodePoolAPI``: the real client over HTTP against the GKE emulator."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.emulators.gke.emulator import GkeEmulator
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.gke_messages import spec_to_node_pool
from shared.core.errors import (
    AlreadyExistsError,
    InvalidInputError,
    NotFoundError,
    OperationLimitError,
    RejectedError,
    RequestQuotaError,
    TpuProvError,
    TransientError,
)
from shared.tpu.drift import drift
from shared.tpu.nodepools import NodeConfig, NodePoolInfo, NodePoolSpec, Placement, Reservation
from tests.paths import REPO

ZONE = "us-central2-b"
OPS = f"projects/test-proj/locations/{ZONE}/operations"


def slice_spec(name: str = "js-train-0", **changes: Any) -> NodePoolSpec:
    """A two-host v5p slice with everything the product sets (as on a release-channel cluster)."""
    fields: dict[str, Any] = {
        "name": name,
        "machine_type": "ct5p-hightpu-4t",
        "node_count": 2,
        "node_locations": (ZONE,),
        "labels": {"tpuprov/jobset": "train", "tpuprov/slice": "0"},
        "resource_labels": {"team": "ml"},
        "placement": Placement(tpu_topology="2x2x2"),
        "reservation": Reservation("tpu-res", project="shared-proj"),
        "service_account": "tpu@test-proj.iam.gserviceaccount.com",
        "oauth_scopes": ("https://www.googleapis.com/auth/cloud-platform",),
        "max_pods_per_node": 32,
        "disk_size_gb": 200,
        "disk_type": "pd-balanced",
        "tags": ("tpu",),
        "auto_upgrade": True,
    }
    fields.update(changes)
    return NodePoolSpec(**fields)


def test_create_then_get_round_trips_the_spec(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    spec = slice_spec()
    op = gke_api.create_node_pool(gke_cluster, spec, why="jobset train needs slice 0")
    assert op.startswith(f"{OPS}/operation-")

    assert gke_api.get_node_pool(gke_cluster, spec.name) == NodePoolInfo(
        name=spec.name,
        status="RUNNING",
        machine_type="ct5p-hightpu-4t",
        node_count=2,
        labels={"tpuprov/jobset": "train", "tpuprov/slice": "0"},
        node_locations=(ZONE,),
        tpu_topology="2x2x2",
        spot=False,  # Spot VMs cannot consume a reservation: the adapter sends the reservation only
        reservation="projects/shared-proj/reservations/tpu-res",
        # Read back for config drift: what it was built with, as GKE reports it.
        config=NodeConfig(
            service_account="tpu@test-proj.iam.gserviceaccount.com",
            oauth_scopes=("https://www.googleapis.com/auth/cloud-platform",),
            disk_size_gb=200,
            disk_type="pd-balanced",
            max_pods_per_node=32,
            max_surge=1,  # none sent: GKE reports its surge default
            max_unavailable=0,
            tags=("tpu",),
        ),
    )
    # A pool just built from the spec has drifted from nothing.
    assert drift(gke_api.get_node_pool(gke_cluster, spec.name), spec) == ()
    [sent] = gke_emulator.pools(gke_cluster)
    config = sent["config"]
    assert config.get("spot", False) is False
    assert config["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["projects/shared-proj/reservations/tpu-res"],
    }
    assert (config["resourceLabels"], config["serviceAccount"], config["oauthScopes"]) == (
        {"team": "ml"},
        "tpu@test-proj.iam.gserviceaccount.com",
        ["https://www.googleapis.com/auth/cloud-platform"],
    )
    assert (config["diskSizeGb"], config["diskType"], config["tags"]) == (200, "pd-balanced", ["tpu"])
    assert sent["management"] == {"autoUpgrade": True, "autoRepair": True}
    assert sent.get("autoscaling", {}).get("enabled", False) is False
    assert sent["maxPodsConstraint"] == {"maxPodsPerNode": "32"}
    assert sent["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "2x2x2"}


PLACEMENTS = [
    ("none", None, {}),
    (
        "topology",
        Placement(tpu_topology="4x4"),
        {"type_": "COMPACT", "tpu_topology": "4x4", "policy_name": ""},
    ),
    (
        "named-policy",
        Placement(policy_name="wp-1"),
        {"type_": "TYPE_UNSPECIFIED", "tpu_topology": "", "policy_name": "wp-1"},
    ),
]


@pytest.mark.parametrize(
    ("placement", "expected"), [p[1:] for p in PLACEMENTS], ids=[p[0] for p in PLACEMENTS]
)
def test_placement_policy_is_sent_only_when_set(
    placement: Placement | None, expected: dict[str, str]
) -> None:
    pool = spec_to_node_pool(slice_spec(placement=placement, max_pods_per_node=0, reservation=None))
    policy = pool.placement_policy
    got = {"type_": policy.type_.name, "tpu_topology": policy.tpu_topology, "policy_name": policy.policy_name}
    assert (got if "placement_policy" in pool else {}) == expected
    assert "max_pods_constraint" not in pool
    assert "reservation_affinity" not in pool.config


def test_a_pool_placed_in_a_sub_block_reads_back_as_its_reservation_and_place(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    placed = Reservation("tpu-res", project="shared-proj", block="b1", sub_block="s2")
    gke_api.create_node_pool(gke_cluster, slice_spec(reservation=placed), why="placed")
    [sent] = gke_emulator.pools(gke_cluster)
    assert sent["config"]["reservationAffinity"]["values"] == [
        "projects/shared-proj/reservations/tpu-res/reservationBlocks/b1/reservationSubBlocks/s2"
    ]
    [pool] = gke_api.list_node_pools(gke_cluster)
    # The reservation the pool consumes is the one its capacity option named; the place is apart.
    assert (pool.reservation, pool.reservation_place) == (
        "projects/shared-proj/reservations/tpu-res",
        "b1/s2",
    )


def test_unknown_placement_type_is_invalid_input() -> None:
    with pytest.raises(InvalidInputError, match="SPREAD"):
        spec_to_node_pool(slice_spec(placement=Placement(type="SPREAD", tpu_topology="2x2x2")))


def test_list_get_cluster_and_delete(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    assert gke_api.list_node_pools(gke_cluster) == []
    gke_api.create_node_pool(gke_cluster, slice_spec("a"), why="slice a")
    gke_api.create_node_pool(gke_cluster, slice_spec("b", spot=False, reservation=None), why="slice b")
    assert [(p.name, p.status) for p in gke_api.list_node_pools(gke_cluster)] == [
        ("a", "RUNNING"),
        ("b", "RUNNING"),
    ]

    cluster = gke_api.get_cluster(gke_cluster)
    assert (cluster.name, cluster.location, cluster.endpoint, cluster.locations, cluster.status) == (
        "test-cluster",
        ZONE,
        "127.0.0.1",
        (ZONE,),
        "RUNNING",
    )
    assert cluster.ca_certificate.startswith("LS0t")

    op = gke_api.delete_node_pool(gke_cluster, "a", why="jobset finished")
    info = gke_api.get_operation(op)
    assert (info.name, info.status, info.operation_type, info.target, info.error) == (
        op,
        "DONE",
        "DELETE_NODE_POOL",
        f"{gke_cluster}/nodePools/a",
        "",
    )
    assert [p.name for p in gke_api.list_node_pools(gke_cluster)] == ["b"]
    with pytest.raises(NotFoundError):
        gke_api.get_node_pool(gke_cluster, "a")
    # Only the locations-style resource paths are used, never the legacy project/zone ones.
    assert all(call.path.startswith("/v1/projects/test-proj/locations/") for call in gke_emulator.calls)


def test_slow_operation_and_stockout_are_visible(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    gke_emulator.set_op_delay(30)
    op = gke_api.create_node_pool(gke_cluster, slice_spec("slow"), why="slow")
    assert gke_api.get_operation(op).status in ("PENDING", "RUNNING")
    assert gke_api.get_node_pool(gke_cluster, "slow").status == "PROVISIONING"

    gke_emulator.set_op_delay(0)
    gke_emulator.stockout("ct5p-hightpu-4t")
    op = gke_api.create_node_pool(gke_cluster, slice_spec("dry"), why="stockout")
    info = gke_api.get_operation(op)
    assert info.status == "DONE"
    assert "does not have enough resources available" in info.error
    pool = gke_api.get_node_pool(gke_cluster, "dry")
    assert pool.status == "ERROR"
    assert "does not have enough resources available" in pool.status_message


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


ERRORS: list[tuple[str, Callable[[GkeEmulator], None], str, type[TpuProvError], int | None]] = [
    ("get-missing-404", lambda e: None, "get", NotFoundError, None),
    ("delete-missing-404", lambda e: None, "delete", NotFoundError, None),
    ("create-duplicate-409", lambda e: None, "create-twice", AlreadyExistsError, None),
    (
        "create-429-too-many-operations",
        lambda e: e.fail_next(
            "create",
            429,
            'Too many operations: cluster "c" hits the concurrent operations quota 5, '
            "please try again later.",
        ),
        "create",
        OperationLimitError,
        None,
    ),
    (
        "create-429-other",
        lambda e: e.fail_next("create", 429, "Quota exceeded for quota metric 'Write requests'."),
        "create",
        RequestQuotaError,  # a TransientError: the project's request quota, shared with other clients
        None,
    ),
    (
        "create-incompatible-op",
        lambda e: e.fail_next("create", 400, "Cluster is running incompatible operation operation-123."),
        "create",
        OperationLimitError,
        None,
    ),
    (
        "create-operation-is-currently-upgrading",
        lambda e: e.fail_next(
            "create",
            400,
            "Operation operation-1596 is currently upgrading cluster c. "
            "Please wait and try again once it is done.",
            status="FAILED_PRECONDITION",
        ),
        "create",
        OperationLimitError,
        None,
    ),
    ("create-bad-topology-400", lambda e: None, "create-bad", RejectedError, 400),
    (
        # A 403 that names no permission and no quota (credentials, an API not enabled): an operator
        # fixes it, so the delivery is kept for redelivery (shared.cloud.errors, the one mapping).
        "create-403",
        lambda e: e.fail_next("create", 403, "Required permission denied"),
        "create",
        TransientError,
        None,
    ),
    (
        "delete-503",
        lambda e: e.fail_next("delete", 503, "backend unavailable"),
        "delete",
        TransientError,
        None,
    ),
    ("list-500", lambda e: e.fail_next("list", 500, "internal error"), "list", TransientError, None),
    (
        "cluster-504",
        lambda e: e.fail_next("get_cluster", 504, "deadline"),
        "get_cluster",
        TransientError,
        None,
    ),
    ("operation-404", lambda e: None, "get_operation", NotFoundError, None),
]


@pytest.mark.parametrize(
    ("arrange", "action", "error", "code"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_library_errors_are_translated(
    gke_api: GkeNodePoolAPI,
    gke_emulator: GkeEmulator,
    gke_cluster: str,
    arrange: Callable[[GkeEmulator], None],
    action: str,
    error: type[TpuProvError],
    code: int | None,
) -> None:
    actions: dict[str, Callable[[], Any]] = {
        "get": lambda: gke_api.get_node_pool(gke_cluster, "missing"),
        "delete": lambda: gke_api.delete_node_pool(gke_cluster, "missing", why="t"),
        "create": lambda: gke_api.create_node_pool(gke_cluster, slice_spec(), why="t"),
        "create-twice": lambda: [
            gke_api.create_node_pool(gke_cluster, slice_spec(), why="t") for _ in range(2)
        ],
        "create-bad": lambda: gke_api.create_node_pool(gke_cluster, slice_spec(node_count=3), why="t"),
        "list": lambda: gke_api.list_node_pools(gke_cluster),
        "get_cluster": lambda: gke_api.get_cluster(gke_cluster),
        "get_operation": lambda: gke_api.get_operation(f"{OPS}/operation-404"),
    }
    arrange(gke_emulator)
    with pytest.raises(error) as caught:
        actions[action]()
    assert type(caught.value) is error
    assert caught.value.why.startswith("GKE ")
    if code is not None:
        assert isinstance(caught.value, RejectedError)
        assert caught.value.code == code


def test_each_call_is_one_request_without_library_retries(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    gke_emulator.fail_next("create", 503, "unavailable")
    gke_emulator.fail_next("list", 429, "slow down")
    with pytest.raises(TransientError):
        gke_api.create_node_pool(gke_cluster, slice_spec(), why="t")
    with pytest.raises(TransientError):
        gke_api.list_node_pools(gke_cluster)
    assert (gke_emulator.count("create"), gke_emulator.count("list")) == (1, 1)


def test_strict_cluster_incompatible_operation_is_an_operation_limit(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    gke_emulator.set_op_delay(30)
    gke_emulator.set_strict_cluster_ops(True)
    gke_api.create_node_pool(gke_cluster, slice_spec("a"), why="first")
    with pytest.raises(OperationLimitError, match="incompatible operation"):
        gke_api.create_node_pool(gke_cluster, slice_spec("b"), why="second")


def test_connection_refused_is_transient(gke_cluster: str) -> None:
    api = GkeNodePoolAPI(endpoint=f"http://127.0.0.1:{_closed_port()}", timeout=2)
    with pytest.raises(TransientError, match="ConnectionError"):
        api.list_node_pools(gke_cluster)


def test_missing_production_credentials_are_a_rejection(
    gke_cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A credentials file that does not exist fails fast, before any metadata-server lookup.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    with pytest.raises(RejectedError, match="no usable credentials") as caught:
        GkeNodePoolAPI().get_cluster(gke_cluster)
    assert caught.value.code == 401


@pytest.mark.parametrize("kind", ["create", "get"], ids=["mutating", "read"])
def test_a_hung_server_costs_at_most_the_timeout(
    gke_emulator: GkeEmulator, gke_cluster: str, kind: str
) -> None:
    api = GkeNodePoolAPI(endpoint=gke_emulator.url, timeout=0.5)
    gke_emulator.hang_next(kind, 10)
    started = time.monotonic()
    with pytest.raises(TransientError):
        if kind == "create":
            api.create_node_pool(gke_cluster, slice_spec(), why="t")
        else:
            api.get_node_pool(gke_cluster, "any")
    assert time.monotonic() - started < 1.5


def test_bad_cluster_path_is_rejected_before_any_request(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator
) -> None:
    with pytest.raises(RejectedError, match="not a cluster path"):
        gke_api.create_node_pool("projects/p/zones/z/clusters/c", slice_spec(), why="t")
    assert gke_emulator.calls == []


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def gke_log() -> Iterator[_Records]:
    """Records of the ``tpuprov.gke`` logger, whatever other tests did to propagation."""
    logger = logging.getLogger("tpuprov.gke")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_mutations_log_their_reason(gke_api: GkeNodePoolAPI, gke_cluster: str, gke_log: _Records) -> None:
    gke_api.create_node_pool(gke_cluster, slice_spec("a"), why="jobset train is pending")
    gke_api.delete_node_pool(gke_cluster, "a", why="jobset train finished")
    lines = [(r.getMessage(), getattr(r, "fields", {}).get("event")) for r in gke_log.records]
    assert lines == [
        (f"creating node pool a in {gke_cluster}: jobset train is pending", "gke.create_node_pool"),
        (f"deleting node pool a in {gke_cluster}: jobset train finished", "gke.delete_node_pool"),
    ]


def test_client_is_built_lazily_and_cached(gke_emulator: GkeEmulator, gke_cluster: str) -> None:
    code = (
        "import sys, shared.cloud.gke as g\n"
        "api = g.GkeNodePoolAPI()\n"
        "heavy = ('google.cloud.container', 'google.api_core', 'grpc')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "[]"
    api = GkeNodePoolAPI(endpoint=gke_emulator.url)
    api.list_node_pools(gke_cluster)
    assert api.client is api.client
    assert api.client.api_endpoint == gke_emulator.url


def test_set_node_pool_labels_replaces_labels_through_an_update_operation(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    gke_api.create_node_pool(gke_cluster, slice_spec("a"), why="slice a")
    hooked: list[dict[str, Any]] = []
    gke_emulator.on_pool_updated(lambda cluster, pool: hooked.append(pool))
    op = gke_api.set_node_pool_labels(gke_cluster, "a", {"owner": "b", "team": "x"}, why="adopted by b")
    info = gke_api.get_operation(op)
    assert (info.status, info.operation_type, info.target) == (
        "DONE",
        "UPGRADE_NODES",
        f"{gke_cluster}/nodePools/a",
    )
    pool = gke_api.get_node_pool(gke_cluster, "a")
    # NodeLabels replaces the whole set: the create-time labels are gone, nothing else changed.
    assert (pool.labels, pool.status, pool.machine_type, pool.node_count) == (
        {"owner": "b", "team": "x"},
        "RUNNING",
        "ct5p-hightpu-4t",
        2,
    )
    assert (pool.spot, pool.reservation) == (False, "projects/shared-proj/reservations/tpu-res")
    assert [p["config"]["labels"] for p in hooked] == [{"owner": "b", "team": "x"}]
    assert [c.method for c in gke_emulator.calls if c.method == "update"] == ["update"]


def test_second_operation_on_a_pool_being_updated_is_transient(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    gke_api.create_node_pool(gke_cluster, slice_spec("a"), why="slice a")
    gke_emulator.set_op_delay(30)
    gke_api.set_node_pool_labels(gke_cluster, "a", {"owner": "b"}, why="adopt")
    assert gke_api.get_node_pool(gke_cluster, "a").status == "RECONCILING"
    with pytest.raises(TransientError, match="incompatible operation"):
        gke_api.set_node_pool_labels(gke_cluster, "a", {"owner": "c"}, why="adopt again")
    with pytest.raises(TransientError, match="incompatible operation"):
        gke_api.delete_node_pool(gke_cluster, "a", why="release")
    with pytest.raises(NotFoundError):
        gke_api.set_node_pool_labels(gke_cluster, "missing", {}, why="adopt")


def test_relabel_moves_the_billing_labels_in_the_same_operation(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    # A handover relabels node and resource labels at once: GKE runs one operation per pool, so a
    # second update for the billing labels would be refused while the first runs.
    gke_api.create_node_pool(gke_cluster, slice_spec("a"), why="slice a")
    gke_emulator.set_op_delay(30)
    gke_api.set_node_pool_labels(
        gke_cluster, "a", {"owner": "b"}, why="adopted by b", resource_labels={"tpuprov-jobset": "b"}
    )
    stored = gke_emulator.state.get_pool(gke_cluster, "a")
    assert (dict(stored.config.labels), dict(stored.config.resource_labels)) == (
        {"owner": "b"},
        {"tpuprov-jobset": "b"},
    )
    assert [c.method for c in gke_emulator.calls if c.method == "update"] == ["update"]
    # Without resource labels the pool's billing labels stay as they are (an idle stamp, say).
    gke_emulator.state.finish_operations()
    gke_api.set_node_pool_labels(gke_cluster, "a", {"owner": "b", "idle": "1"}, why="idle")
    assert dict(gke_emulator.state.get_pool(gke_cluster, "a").config.resource_labels) == {
        "tpuprov-jobset": "b"
    }


def test_every_pool_asks_for_gkes_metadata_server_and_reads_it_back(
    gke_api: GkeNodePoolAPI, gke_emulator: GkeEmulator, gke_cluster: str
) -> None:
    spec = slice_spec("meta", workload_metadata="GKE_METADATA")
    gke_api.create_node_pool(gke_cluster, spec, why="slice with GKE's metadata server")
    [sent] = gke_emulator.pools(gke_cluster)
    assert sent["config"]["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    pool = gke_api.get_node_pool(gke_cluster, "meta")
    assert pool.config is not None and pool.config.workload_metadata == "GKE_METADATA"
    assert drift(pool, spec) == ()
    # The emulator's cluster has Workload Identity, as GKE_METADATA pools need.
    assert gke_api.get_cluster(gke_cluster).workload_pool == "test-proj.svc.id.goog"


def test_gke_metadata_on_a_cluster_without_workload_identity_is_refused_by_gke() -> None:
    from sandbox.emulators.gke.emulator import ClusterSeed

    cluster = f"projects/test-proj/locations/{ZONE}/clusters/no-wi"
    seed = ClusterSeed.from_path(cluster, workload_identity=False)
    with GkeEmulator([seed], op_delay=0) as emulator:
        api = GkeNodePoolAPI(endpoint=emulator.url, timeout=5.0)
        assert api.get_cluster(cluster).workload_pool == ""
        with pytest.raises(RejectedError, match="requires Workload Identity") as refused:
            api.create_node_pool(cluster, slice_spec(workload_metadata="GKE_METADATA"), why="slice")
        assert refused.value.code == 400
        assert emulator.pools(cluster) == []


def test_an_unknown_workload_metadata_mode_is_never_sent() -> None:
    with pytest.raises(InvalidInputError, match="SECURE"):
        spec_to_node_pool(slice_spec(workload_metadata="SECURE"))
