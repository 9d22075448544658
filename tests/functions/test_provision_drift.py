"""Wire level: a slice's pool built before the operator changed the node settings (config drift).

Real CloudEvents into the provision function, the real GKE client against the GKE emulator (which
reports the pool's node config as GKE does) and the Kubernetes API server; the settings change
between deliveries as a redeploy would change them.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.core import labels
from tests.functions.deliveries import pending_event, submit

pytestmark = pytest.mark.integration

NEW_SA = "tpu-nodes@test-proj.iam.gserviceaccount.com"
DRIFT = f"NODE_SERVICE_ACCOUNT: default -> {NEW_SA}; DISK_SIZE_GB: 100 -> 200"


@pytest.fixture
def fn(world: Any) -> FunctionClient:
    return FunctionClient("provision")


def built(world: Any, fn: FunctionClient) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A one-slice JobSet whose pool the function built under the first settings, RUNNING, one Node."""
    jobset, pods = submit(world, tpu_jobset("train", "team-a", replicas=1, topology="2x2"))
    assert fn.post_entry(pending_event(pods[0])).status_code == 200
    world.gke.finish_operations()
    [pool] = world.pools()
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"{pool['name']}-n0", "labels": {labels.NODEPOOL: pool["name"]}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    world.kube.put(node)
    return jobset, pods[0], pool["name"]


def released(world: Any) -> list[tuple[str, str]]:
    events = world.kube.list("v1", "events", "team-a")
    return [
        (e["involvedObject"]["kind"], e["message"]) for e in events if e["reason"] == labels.REASON_RELEASED
    ]


def test_an_idle_drifted_pool_is_rebuilt_under_the_current_settings(world: Any, fn: FunctionClient) -> None:
    _, pod, name = built(world, fn)
    world.configure(node_service_account=NEW_SA, disk_size_gb=200)
    # Report only (the default): the pool stays.
    assert fn.post_entry(pending_event(pod)).status_code == 200
    assert world.gke.count("delete") == 0 and released(world) == []

    world.configure(replace_drifted_pools=True)
    assert fn.post_entry(pending_event(pod)).status_code == 200
    message = f"deleted node pool {name} to build it under the current settings ({DRIFT})"
    assert world.gke.count("delete") == 1
    assert sorted(released(world)) == [("JobSet", message), ("Pod", message)]
    world.gke.finish_operations()
    assert world.pool_names() == []
    # The pod is still pending: its next event builds the pool as the settings now say.
    assert fn.post_entry(pending_event(pod)).status_code == 200
    [pool] = world.pools()
    assert (pool["name"], pool["config"]["serviceAccount"], pool["config"]["diskSizeGb"]) == (
        name,
        NEW_SA,
        200,
    )


def test_a_drifted_pool_a_workload_runs_on_is_kept(world: Any, fn: FunctionClient) -> None:
    jobset, pod, name = built(world, fn)
    # Another pod of the JobSet runs on the pool's node (the pending one is, say, a restarted sibling).
    running = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-worker-running",
            "namespace": "team-a",
            "labels": {labels.JOBSET_NAME: "train", labels.JOBSET_UID: jobset["metadata"]["uid"]},
        },
        "spec": {"nodeName": f"{name}-n0", "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running"},
    }
    world.kube.put(running)
    world.configure(node_service_account=NEW_SA, disk_size_gb=200, replace_drifted_pools=True)
    assert fn.post_entry(pending_event(pod)).status_code == 200
    assert world.gke.count("delete") == 0 and world.pool_names() == [name]
    assert released(world) == []
    node = world.kube.get("v1", "nodes", "", f"{name}-n0")
    assert not (node.get("spec") or {}).get("unschedulable")  # the guard lifted its own cordon
