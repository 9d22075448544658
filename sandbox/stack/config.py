"""Configuration of a sandbox stack: names, delays and policies, with demo-friendly defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from shared.app.deployment import FUNCTIONS, INFRA_MAX_DELIVERY_ATTEMPTS, INFRA_RETRY_POLICY, RetryPolicy

REPO_ROOT = Path(__file__).resolve().parents[2]
# Release manifests live in the shared folder beside the repository, never inside it.
DEFAULT_MANIFESTS_DIR = REPO_ROOT.parent / "shared" / "manifests"
DEFAULT_SINKS_DIR = REPO_ROOT / "sinks"
EVENT_FUNCTIONS = ("provision", "release", "reconcile")  # what the JobSet loop needs
ALL_FUNCTIONS = tuple(f.function for f in FUNCTIONS)  # plus setup_cluster and apply_kueue


@dataclasses.dataclass(frozen=True)
class StackConfig:
    """Everything a ``RealStack`` can be tuned with (each function always holds exactly its role).

    ``retry`` and ``max_delivery_attempts`` default to what infra declares; tests that exercise
    redelivery pass a shorter backoff of the same shape so that a retry takes a second, not ten.
    """

    project: str = "tpuprov-sandbox"
    location: str = "us-east5-b"  # a zone with v6e; a zonal cluster's TPU pools go in its own zone
    cluster_name: str = "sandbox"
    # The cluster's node locations (a multi-zonal cluster lists more than one); () = just ``location``.
    cluster_zones: tuple[str, ...] = ()
    # Further clusters of the same project served by the same functions (FLEET_CLUSTERS), each a
    # (zone, name) with its own control plane, JobSet and Kueue (``sandbox.realstack.plane``).
    fleet: tuple[tuple[str, str], ...] = ()
    functions: tuple[str, ...] = EVENT_FUNCTIONS
    gke_op_delay: float = 2.0  # seconds a node-pool create/delete operation takes
    retry: RetryPolicy = INFRA_RETRY_POLICY
    max_delivery_attempts: int = INFRA_MAX_DELIVERY_ATTEMPTS
    cpu_nodes: int = 2  # the cluster's default (non-TPU) pool, where KWOK plays the controllers' pods
    max_event_age_seconds: int = 900
    function_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    manifests_dir: Path = DEFAULT_MANIFESTS_DIR
    sinks_dir: Path = DEFAULT_SINKS_DIR
    workdir: Path | None = None  # logs and kubeconfig; a fresh temporary directory when None
    startup_timeout: float = 90.0
