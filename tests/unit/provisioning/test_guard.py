"""How the occupancy check reads a pool's pods: node by node for small pools, one list for large ones."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.testing.fakes import FakeKube
from shared.core import labels
from shared.provisioning.release.guard import PER_NODE_READS, PoolGuard
from shared.tpu.nodes import Node


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {labels.NODEPOOL: "p"}}, "spec": {}}


def _pod(name: str, node: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


@pytest.mark.parametrize(
    ("hosts", "reads"), [(1, 1), (PER_NODE_READS, PER_NODE_READS), (64, 1)], ids=["one", "small", "large"]
)
def test_pods_on_finds_exactly_the_live_pods_of_the_pools_nodes(hosts: int, reads: int) -> None:
    kube = FakeKube()
    nodes = [Node.parse(_node(f"n{i}")) for i in range(hosts)]
    kube.add_pod(_pod("mine", f"n{hosts - 1}"))
    kube.add_pod(_pod("done", "n0", phase="Succeeded"))
    kube.add_pod(_pod("elsewhere", "other-node"))
    kube.add_pod(
        {"metadata": {"name": "pending", "namespace": "ns"}, "spec": {}, "status": {"phase": "Pending"}}
    )
    before = kube.reads
    pods = PoolGuard(kube, 0, lambda s: None).pods_on(nodes)
    assert [p.name for p in pods] == ["mine"]
    assert kube.reads - before == reads
