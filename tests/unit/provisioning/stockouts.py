"""What the stockout tests share (tests/unit/provisioning/test_backoff.py, test_fallback.py): a
cluster, GKE's stockout text, a start time, and the moves of a pod that GKE cannot place."""

from __future__ import annotations

import json
from typing import Any

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.provisioner import Provisioner
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_ERROR, STATUS_PROVISIONING

SETTINGS = Settings(
    unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c", cordon_settle_seconds=0
)
CLUSTER = SETTINGS.cluster_path
STOCKOUT = "GCE_STOCKOUT: ZONE_RESOURCE_POOL_EXHAUSTED: the zone does not have enough resources available"
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
OPTION = "on-demand@us-east5-b"  # no capacity policy: every attempt is the pod's own choice, on-demand


def submit(kube: FakeKube, name: str = "a", replicas: int = 1) -> list[dict[str, Any]]:
    jobset = tpu_jobset(name, "team-a", replicas=replicas)
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    return pods


def pending(service: Provisioner, pod: dict[str, Any]) -> str:
    """One FailedScheduling event of ``pod`` handled by provision; returns the outcome."""
    return service.handle_pending_pod("team-a", pod["metadata"]["name"], None).result


def record(kube: FakeKube, name: str = "a") -> dict[str, Any]:
    raw = kube.jobsets[("team-a", name)]["metadata"].get("annotations", {}).get(labels.SLICE_FAILURES)
    return json.loads(raw) if raw else {}


def failed_events(kube: FakeKube) -> list[dict[str, Any]]:
    return [e for e in kube.events if e["reason"] == labels.REASON_FAILED]


def stock_out(gke: FakeGke) -> None:
    """What GKE does to every create while the zone has no capacity: the pool ends in ERROR."""
    for name, pool in list(gke.pools.get(CLUSTER, {}).items()):
        if pool.status == STATUS_PROVISIONING:
            gke.mark(CLUSTER, name, STATUS_ERROR, STOCKOUT)
