"""``shared.cloud.kube.KubeClient`` over HTTPS against the real kube-apiserver (``world``, as provision)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.app import entry
from shared.core import labels
from shared.core.errors import NotFoundError


def node(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {labels.NODEPOOL: pool, labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
        },
        "spec": {},
    }


def pod(name: str, node_name: str, phase: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "labels": {labels.JOBSET_NAME: "js"}},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": phase},
    }


def test_nodes_are_listed_by_pool_and_cordoned_with_the_reason(world: Any) -> None:
    for name, pool in (("n-a-0", "pool-a"), ("n-a-1", "pool-a"), ("n-b-0", "pool-b")):
        world.kube.put(node(name, pool))
    kube = entry.runtime().kube()
    found = kube.list_nodes(f"{labels.NODEPOOL}=pool-a")
    assert sorted(n.name for n in found) == ["n-a-0", "n-a-1"]
    assert {n.pool for n in found} == {"pool-a"}  # parsed at the adapter

    kube.set_unschedulable("n-a-0", True, "123 tpu-provisioner is about to delete node pool pool-a")
    stored = world.kube.get("v1", "nodes", None, "n-a-0")
    assert stored["spec"]["unschedulable"] is True
    assert stored["metadata"]["annotations"][labels.CORDONED].endswith("delete node pool pool-a")
    assert stored["metadata"]["labels"][labels.NODEPOOL] == "pool-a"  # a merge patch keeps the rest

    kube.set_unschedulable("n-a-0", False, "kept")
    stored = world.kube.get("v1", "nodes", None, "n-a-0")
    assert not stored["spec"].get("unschedulable")
    assert labels.CORDONED not in (stored["metadata"].get("annotations") or {})
    with pytest.raises(NotFoundError):
        kube.set_unschedulable("missing", True, "x")


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=n-1", ["done", "run"]),
        ("spec.nodeName=n-1,status.phase!=Succeeded,status.phase!=Failed", ["run"]),
        ("status.phase=Pending", ["wait"]),
        ("", ["done", "run", "wait"]),
    ],
    ids=["node", "node-non-terminal", "pending", "none"],
)
def test_pods_are_filtered_by_field_selectors_on_the_server(
    world: Any, selector: str, expected: list[str]
) -> None:
    world.kube.put(pod("run", "n-1", "Running"))
    world.kube.put(pod("done", "n-1", "Succeeded"))
    world.kube.put(pod("wait", "", "Pending"))
    found = entry.runtime().kube().list_pods(label_selector=labels.JOBSET_NAME, field_selector=selector)
    assert sorted(p.name for p in found) == expected


def test_repeated_events_are_aggregated_into_one_object(world: Any) -> None:
    kube = entry.runtime().kube()
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "namespace": "team-a", "uid": "u-1"},
    }
    for _ in range(3):
        kube.record_event(jobset, labels.REASON_REFUSED, "chip budget exceeded", warning=True)
    kube.record_event(jobset, labels.REASON_RELEASED, "released node pools p")
    events = world.kube.list("v1", "events", namespace="team-a")
    by_reason = {e["reason"]: e for e in events}
    assert len(events) == 2
    refused = by_reason[labels.REASON_REFUSED]
    assert (refused["count"], refused["type"], refused["involvedObject"]["uid"]) == (3, "Warning", "u-1")
    assert refused["lastTimestamp"] >= refused["firstTimestamp"]
    assert by_reason[labels.REASON_RELEASED]["count"] == 1
