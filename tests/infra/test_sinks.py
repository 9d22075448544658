"""The sink filters in sinks/ against LogEntries as GKE writes them (shared.events.entries).

Each filter must export what its function acts on and nothing it would only throw away, and the
files must render the same through the sandbox's template code and Terraform's ``templatefile``.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sandbox.emulators.logging.filter import LogFilter, load_filter, render_template
from shared.app.deployment import sink_clusters
from shared.events import entries as logentries
from shared.events.envelope import (
    ClusterId,
    JobSetDeleted,
    JobSetFinished,
    NodePoolOperationDone,
    PodUnschedulable,
    WorkloadQuotaReserved,
    decode_log_entry,
)
from tests.infra.hcl import terraform_json
from tests.paths import REPO

ROOT = REPO
SINKS = ROOT / "sinks"
CLUSTER = ClusterId("sink-proj", "us-central2-b", "tpu-cluster")
OTHER_CLUSTER = ClusterId("sink-proj", "us-central2-b", "other-cluster")
OTHER_PROJECT = ClusterId("elsewhere", "us-central2-b", "tpu-cluster")
SUBS = {"project_id": CLUSTER.project, "clusters": sink_clusters([CLUSTER.path])}
UID = "6f1c3c52-8b4e-4a57-9d1a-0c8f3b1e2d44"
FILTER_NAMES = (
    "pending-tpu-pods",
    "nodepool-operations",
    "jobset-lifecycle",
    "cluster-created",
    "workload-quota-reserved",
)


def sink(name: str) -> LogFilter:
    return load_filter(SINKS / f"{name}.filter", SUBS)


def create_cluster_entry(
    cluster: ClusterId = CLUSTER,
    method: str = "google.container.v1.ClusterManager.CreateCluster",
    last: bool = True,
    status_code: int = 0,
) -> dict[str, Any]:
    """The GKE Admin Activity entry of a CreateCluster operation of ``cluster`` (first or last entry)."""
    when = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    return logentries.cluster_operation_entry(cluster, method, last, status_code, when)


PENDING = [
    (
        lambda: logentries.pod_event_entry(CLUSTER, "team-a", "train-0", UID, controller=("JobSet", "train")),
        True,
        "jobset-pod-selector-mismatch",
    ),
    (
        lambda: logentries.pod_event_entry(
            CLUSTER,
            "team-a",
            "train-0",
            UID,
            message=logentries.INSUFFICIENT_TPU_MESSAGE,
            controller=("JobSet", "t"),
        ),
        True,
        "jobset-pod-insufficient-tpu",
    ),
    (
        lambda: logentries.pod_event_entry(CLUSTER, "team-a", "train-0", UID, controller=None),
        True,
        "no-controller-label-kept",
    ),
    (
        lambda: logentries.pod_event_entry(
            CLUSTER, "team-a", "t-0", UID, reason="NotTriggerScaleUp", controller=("JobSet", "t")
        ),
        True,
        "not-trigger-scale-up",
    ),
    (
        lambda: logentries.pod_event_entry(CLUSTER, "team-a", "web-1", UID, controller=("Deployment", "web")),
        False,
        "deployment-pod-dropped",
    ),
    (
        lambda: logentries.pod_event_entry(CLUSTER, "team-a", "db-0", UID, controller=("StatefulSet", "db")),
        False,
        "statefulset-pod-dropped",
    ),
    (
        lambda: logentries.pod_event_entry(
            CLUSTER, "team-a", "t-0", UID, reason="Scheduled", controller=("JobSet", "t")
        ),
        False,
        "scheduled-dropped",
    ),
    (
        lambda: logentries.pod_event_entry(
            CLUSTER, "team-a", "t-0", UID, reason="Pulled", controller=("JobSet", "t")
        ),
        False,
        "pulled-dropped",
    ),
    (
        lambda: logentries.pod_event_entry(OTHER_CLUSTER, "team-a", "t-0", UID, controller=("JobSet", "t")),
        False,
        "other-cluster",
    ),
    (
        lambda: logentries.pod_event_entry(OTHER_PROJECT, "team-a", "t-0", UID, controller=("JobSet", "t")),
        False,
        "other-project",
    ),
    (
        lambda: logentries.jobset_event_entry(CLUSTER, "team-a", "train", UID),
        False,
        "jobset-event-is-not-a-pod-event",
    ),
    (lambda: logentries.text_marker_entry(CLUSTER, "Started watching events"), False, "exporter-marker"),
]


@pytest.mark.parametrize(("build", "expected"), [p[:2] for p in PENDING], ids=[p[2] for p in PENDING])
def test_pending_tpu_pods(build: Any, expected: bool) -> None:
    assert sink("pending-tpu-pods").matches(build()) is expected


LIFECYCLE = [
    (lambda: logentries.jobset_event_entry(CLUSTER, "team-a", "train", UID), True, "completed-core-shape"),
    (
        lambda: logentries.jobset_event_entry(CLUSTER, "team-a", "train", UID, shape="events.k8s.io"),
        True,
        "completed-events-v1",
    ),
    (
        lambda: logentries.jobset_event_entry(CLUSTER, "team-a", "train", UID, reason="FailedJobs"),
        True,
        "failed-jobs",
    ),
    (
        lambda: logentries.jobset_event_entry(CLUSTER, "team-a", "train", UID, reason="ReachedMaxRestarts"),
        True,
        "max-restarts",
    ),
    (
        lambda: logentries.jobset_event_entry(
            CLUSTER, "team-a", "train", UID, reason="FailJobSetFailurePolicyAction", shape="events.k8s.io"
        ),
        True,
        "failure-policy-events-v1",
    ),
    (
        lambda: logentries.jobset_event_entry(CLUSTER, "team-a", "train", UID, reason="SuspendedJobs"),
        False,
        "suspended-not-terminal",
    ),
    (
        lambda: logentries.jobset_event_entry(CLUSTER, "team-a", "train", UID, reason="Restarting"),
        False,
        "restarting-not-terminal",
    ),
    (
        lambda: logentries.jobset_event_entry(OTHER_CLUSTER, "team-a", "train", UID),
        False,
        "other-cluster-event",
    ),
    (lambda: logentries.jobset_delete_audit_entry(CLUSTER, "team-a", "train"), True, "deleted-by-user"),
    (
        lambda: logentries.jobset_delete_audit_entry(
            CLUSTER, "team-a", "train", principal=logentries.TTL_CONTROLLER_PRINCIPAL
        ),
        True,
        "deleted-by-ttl-controller",
    ),
    (
        lambda: logentries.jobset_delete_audit_entry(CLUSTER, "team-a", "", method="deletecollection"),
        True,
        "deletecollection",
    ),
    (
        lambda: logentries.jobset_delete_audit_entry(CLUSTER, "team-a", "train", status_code=7),
        False,
        "denied-delete",
    ),
    (
        lambda: logentries.jobset_delete_audit_entry(OTHER_CLUSTER, "team-a", "train"),
        False,
        "other-cluster-delete",
    ),
    (lambda: _pod_delete_audit(), False, "pod-delete-audit"),
    (
        lambda: logentries.pod_event_entry(CLUSTER, "team-a", "t-0", UID, controller=("JobSet", "t")),
        False,
        "pod-event",
    ),
]


def _pod_delete_audit() -> dict[str, Any]:
    entry = logentries.jobset_delete_audit_entry(CLUSTER, "team-a", "train")
    proto = entry["protoPayload"]
    proto["methodName"] = "io.k8s.core.v1.pods.delete"
    proto["resourceName"] = "core/v1/namespaces/team-a/pods/train-0"
    return entry


@pytest.mark.parametrize(("build", "expected"), [c[:2] for c in LIFECYCLE], ids=[c[2] for c in LIFECYCLE])
def test_jobset_lifecycle(build: Any, expected: bool) -> None:
    assert sink("jobset-lifecycle").matches(build()) is expected


CREATED = [
    (lambda: create_cluster_entry(), True, "v1-last"),
    (
        lambda: create_cluster_entry(method="google.container.v1beta1.ClusterManager.CreateCluster"),
        True,
        "v1beta1-last",
    ),
    (lambda: create_cluster_entry(cluster=OTHER_CLUSTER), True, "any-cluster-of-the-project"),
    (lambda: create_cluster_entry(last=False), False, "operation-started"),
    (lambda: create_cluster_entry(status_code=13), False, "creation-failed"),
    (
        lambda: create_cluster_entry(method="google.container.v1.ClusterManager.DeleteCluster"),
        False,
        "delete-cluster",
    ),
    (lambda: create_cluster_entry(cluster=OTHER_PROJECT), False, "other-project"),
    (lambda: logentries.jobset_delete_audit_entry(CLUSTER, "team-a", "train"), False, "k8s-audit"),
]


@pytest.mark.parametrize(("build", "expected"), [c[:2] for c in CREATED], ids=[c[2] for c in CREATED])
def test_cluster_created(build: Any, expected: bool) -> None:
    assert sink("cluster-created").matches(build()) is expected


NODEPOOL_OPS = [
    (lambda: logentries.nodepool_operation_entry(CLUSTER, "tpu-a"), True, "create-finished"),
    (
        lambda: logentries.nodepool_operation_entry(CLUSTER, "tpu-a", "DeleteNodePool"),
        True,
        "delete-finished",
    ),
    (lambda: logentries.nodepool_operation_entry(CLUSTER, "tpu-a", status_code=8), True, "create-failed"),
    (lambda: logentries.nodepool_operation_entry(CLUSTER, "tpu-a", last=False), False, "create-started"),
    (lambda: logentries.nodepool_operation_entry(CLUSTER, "tpu-a", "GetNodePool"), False, "read"),
    (lambda: logentries.nodepool_operation_entry(OTHER_CLUSTER, "tpu-a"), False, "other-cluster"),
    (lambda: logentries.jobset_delete_audit_entry(CLUSTER, "team-a", "train"), False, "k8s-audit"),
]


@pytest.mark.parametrize(
    ("build", "expected"), [c[:2] for c in NODEPOOL_OPS], ids=[c[2] for c in NODEPOOL_OPS]
)
def test_nodepool_operations(build: Any, expected: bool) -> None:
    assert sink("nodepool-operations").matches(build()) is expected


def test_every_exported_event_entry_decodes_to_the_functions_kind() -> None:
    """Sink and decoder agree: what the sinks export is what the functions act on."""
    kinds: dict[str, tuple[type, ...]] = {
        "pending-tpu-pods": (PodUnschedulable,),
        "nodepool-operations": (NodePoolOperationDone,),
        "jobset-lifecycle": (JobSetFinished, JobSetDeleted),
    }
    cases = {"pending-tpu-pods": PENDING, "nodepool-operations": NODEPOOL_OPS, "jobset-lifecycle": LIFECYCLE}
    for name, table in cases.items():
        for build, expected, case_id in table:
            entry = build()
            if expected:
                decoded = decode_log_entry(entry)
                assert isinstance(decoded, kinds[name]), (name, case_id, decoded)


def test_old_events_still_match() -> None:
    """The filters carry no time condition: age is the function's decision (MAX_EVENT_AGE_SECONDS)."""
    when = datetime(2020, 1, 1, tzinfo=UTC)
    entry = logentries.pod_event_entry(CLUSTER, "team-a", "t-0", UID, when=when, controller=("JobSet", "t"))
    assert sink("pending-tpu-pods").matches(entry)


def test_every_filter_file_is_documented_and_loads() -> None:
    files = sorted(p.stem for p in SINKS.glob("*.filter"))
    assert files == sorted(FILTER_NAMES)
    readme = (SINKS / "README.md").read_text()
    for name in files:
        assert f"`{name}.filter`" in readme
        assert f"## {name}" in readme
        sink(name)  # parses within the supported subset


def test_a_fleet_sink_exports_the_events_of_each_fleet_cluster_and_of_no_other() -> None:
    fleet = {**SUBS, "clusters": sink_clusters([CLUSTER.path, OTHER_CLUSTER.path])}
    pending = load_filter(SINKS / "pending-tpu-pods.filter", fleet)
    finished = load_filter(SINKS / "jobset-lifecycle.filter", fleet)
    third = ClusterId(CLUSTER.project, "us-east5-b", CLUSTER.name)  # same name, another location
    for cluster, exported in ((CLUSTER, True), (OTHER_CLUSTER, True), (third, False), (OTHER_PROJECT, False)):
        pod = logentries.pod_event_entry(cluster, "team-a", "t-0", UID, controller=("JobSet", "t"))
        assert pending.matches(pod) is exported, cluster
        assert finished.matches(logentries.jobset_event_entry(cluster, "team-a", "t", UID)) is exported, (
            cluster
        )


def test_filters_only_reference_known_placeholders() -> None:
    for name in FILTER_NAMES:
        text = (SINKS / f"{name}.filter").read_text()
        with pytest.raises(ValueError, match="no value was given"):
            render_template(text, {k: v for k, v in SUBS.items() if k != "project_id"})


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
def test_terraform_templatefile_renders_the_same_text(tmp_path: Path) -> None:
    """Terraform's own templatefile() (via `terraform console`, which needs no providers) agrees."""
    vars_hcl = ", ".join(f"{k} = {json.dumps(v)}" for k, v in SUBS.items())  # JSON strings are HCL ones
    expr = (
        "{"
        + ", ".join(
            f'"{n}" = templatefile("{SINKS / (n + ".filter")}", {{{vars_hcl}}})' for n in FILTER_NAMES
        )
        + "}"
    )
    rendered = terraform_json(expr, tmp_path)
    for name in FILTER_NAMES:
        assert rendered[name] == sink(name).text, name


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: logentries.workload_event_entry(CLUSTER, "team-a", "jobset-t-1", UID), True),
        (lambda: logentries.workload_event_entry(OTHER_CLUSTER, "team-a", "jobset-t-1", UID), False),
        (lambda: logentries.workload_event_entry(OTHER_PROJECT, "team-a", "jobset-t-1", UID), False),
        (lambda: logentries.workload_event_entry(CLUSTER, "team-a", "w", UID, reason="Admitted"), False),
        (lambda: logentries.jobset_event_entry(CLUSTER, "team-a", "t", UID, reason="QuotaReserved"), False),
    ],
    ids=["quota-reserved", "other-cluster", "other-project", "admitted", "a-jobset-event"],
)
def test_workload_quota_reserved(build: Any, expected: bool) -> None:
    entry = build()
    assert sink("workload-quota-reserved").matches(entry) is expected
    if expected:
        assert isinstance(decode_log_entry(entry), WorkloadQuotaReserved)
    # The pending-pods sink never exports a Workload's Event (nor the other way round).
    assert not sink("pending-tpu-pods").matches(entry)
