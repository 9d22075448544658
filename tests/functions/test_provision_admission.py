"""Wire level: Kueue's QuotaReserved LogEntry into the provision function, real clients against the
GKE emulator and the real API server serving the JobSet and Kueue CRDs."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.core import labels
from shared.events import entries as logentries
from tests.conftest import CLUSTER_ID, World
from tests.functions.deliveries import submit

pytestmark = pytest.mark.integration

KUEUE = "kueue.x-k8s.io/v1beta2"


@pytest.fixture
def kueue_world(world: World) -> World:
    """``world``: its API server serves Kueue's CRDs (v0.19.2) beside JobSet's."""
    return world


def workload_of(jobset: dict[str, Any], flavor: str) -> dict[str, Any]:
    meta = jobset["metadata"]
    rjob = jobset["spec"]["replicatedJobs"][0]
    return {
        "apiVersion": KUEUE,
        "kind": "Workload",
        "metadata": {
            "name": f"jobset-{meta['name']}-1a2b3",
            "namespace": meta["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {"queueName": "lq", "podSets": [{"name": rjob["name"], "count": 8, "template": {}}]},
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "message": "Quota reserved in ClusterQueue checked",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "admission": {
                "clusterQueue": "checked",
                "podSetAssignments": [
                    {"name": rjob["name"], "flavors": {labels.TPU_RESOURCE: flavor}, "count": 8}
                ],
            },
            "admissionChecks": [
                {
                    "name": "tpu-slices",
                    "state": "Pending",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    }


def test_quota_reserved_provisions_every_slice_and_sets_the_check_pending(kueue_world: World) -> None:
    world = kueue_world
    shape = {labels.TPU_ACCELERATOR: "tpu-v6e-slice", labels.TPU_TOPOLOGY: "4x4"}
    world.kube.put(
        {
            "apiVersion": KUEUE,
            "kind": "ResourceFlavor",
            "metadata": {"name": "v6e"},
            "spec": {"nodeLabels": shape},
        }
    )
    jobset = tpu_jobset("train", "team-a", replicas=2, topology="4x4", chips_per_vm=4)
    jobset["spec"]["suspend"] = True
    stored, _ = submit(world, jobset)
    workload = world.kube.put(workload_of(stored, "v6e"))

    entry_ = logentries.workload_event_entry(
        CLUSTER_ID, "team-a", workload["metadata"]["name"], workload["metadata"].get("uid", "")
    )
    response = FunctionClient("provision").post_entry(entry_)
    assert response.status_code == 200, response.data
    assert world.gke.count("create") == 2
    after = world.kube.get(KUEUE, "workloads", "team-a", workload["metadata"]["name"])
    assert after is not None
    [check] = after["status"]["admissionChecks"]
    assert (check["name"], check["state"], check["message"]) == ("tpu-slices", "Pending", "pools ready 0/2")
    events = [e for e in world.kube.list("v1", "events", "team-a") if e.get("reason") == "TPUSlicesPending"]
    assert sorted(e["involvedObject"]["kind"] for e in events) == ["JobSet", "Workload"]
    # Nothing is recorded on the JobSet (its owner could rewrite it): release reads the Workload.
    stored = world.kube.get("jobset.x-k8s.io/v1alpha2", "jobsets", "team-a", "train")
    assert stored is not None
    assert not any(k.startswith("tpuprov.dev/") for k in stored["metadata"].get("annotations") or {})

    # A repeat delivery (Pub/Sub is at-least-once) creates nothing more and writes nothing new.
    assert FunctionClient("provision").post_entry(entry_).status_code == 200
    assert world.gke.count("create") == 2
