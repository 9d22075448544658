"""The real JobSet and Kueue releases on the real control plane, their webhooks served from loopback.

The release manifests are applied server-side as an operator would; the controllers run as local
processes under the manifests' own ServiceAccounts (``sandbox.kube.addons``). What the product lives
with is asserted as the upstream code does it: Kueue's webhook creates a queued JobSet suspended,
Kueue admits it within the queue's quota, JobSet's pod webhook injects exclusive placement, the
real scheduler binds the pods to the pool's KWOK nodes and the JobSet completes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from sandbox import polling
from sandbox.kube import addons
from sandbox.kube.cluster import RealCluster
from sandbox.kube.kwok import RUN_SECONDS
from sandbox.kube.nodes import PoolNodes, ready, register_pool_nodes
from shared.core import labels
from shared.kueue.config import load_config
from shared.kueue.render import render, to_yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T = TypeVar("T")
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
QUEUE_NAME = "kueue.x-k8s.io/queue-name"


@pytest.fixture(scope="module")
def cluster() -> Iterator[RealCluster]:
    """A cluster of its own: once the releases' webhooks are configured every pod goes through them."""
    with RealCluster() as running:
        installed = [addons.apply_release(running, addon) for addon in (addons.JOBSET, addons.KUEUE)]
        for release in installed:
            addons.run_controller(running, release)
        yield running


def eventually(probe: Callable[[], T | None], timeout: float, what: str, cluster: RealCluster) -> T:
    """``sandbox.polling.eventually`` that shows the add-on controllers' and the scheduler's logs."""

    def logs() -> str:
        return "\n".join(f"--- {c}\n{cluster.logs(c, 20)}" for c in ("jobset", "kueue", "kube-scheduler"))

    return polling.eventually(probe, timeout, what, 0.3, explain=logs)  # type: ignore[return-value]


def multislice_jobset(name: str) -> dict[str, Any]:
    # One v5e 2x4 slice (two 4-chip VMs), queued on the default LocalQueue, as the GKE tutorial's.
    pod_spec = {
        "restartPolicy": "Never",
        "nodeSelector": {labels.TPU_ACCELERATOR: "tpu-v5-lite-podslice", labels.TPU_TOPOLOGY: "2x4"},
        "containers": [
            {
                "name": "jax",
                "image": "python:3.12",
                "resources": {"limits": {labels.TPU_RESOURCE: "4"}, "requests": {labels.TPU_RESOURCE: "4"}},
            }
        ],
    }
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "labels": {QUEUE_NAME: "multislice-queue"},
            "annotations": {labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL},
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "backoffLimit": 0,
                            "template": {"metadata": {"annotations": {RUN_SECONDS: "2"}}, "spec": pod_spec},
                        }
                    },
                }
            ]
        },
    }


def test_the_release_crds_are_served(cluster: RealCluster) -> None:
    crds = cluster.kubectl("get", "crd", "-o", "name").stdout.split()
    assert "customresourcedefinition.apiextensions.k8s.io/jobsets.jobset.x-k8s.io" in crds
    assert "customresourcedefinition.apiextensions.k8s.io/clusterqueues.kueue.x-k8s.io" in crds
    resources = cluster.kubectl("api-resources", "--api-group=kueue.x-k8s.io", "-o", "name").stdout
    assert "workloads.kueue.x-k8s.io" in resources


def test_a_queued_jobset_is_suspended_admitted_placed_exclusively_and_completes(cluster: RealCluster) -> None:
    # Applied with apply_kueue's own token: its role in infra/ must be enough for the queues.
    queues = to_yaml(render(load_config()))
    applied = cluster.kubectl(
        "apply", "--server-side", "-f", "-", input=queues, identity="apply_kueue"
    ).stdout
    assert "clusterqueue.kueue.x-k8s.io/cluster-queue serverside-applied" in applied
    api = cluster.client()
    register_pool_nodes(
        api,
        "sandbox",
        PoolNodes(
            pool="np-slice",
            machine_type="ct5lp-hightpu-4t",
            zones={"us-west4-a": 2},
            accelerator="tpu-v5-lite-podslice",
            topology="2x4",
            chips_per_node=4,
        ),
    )
    eventually(
        lambda: (
            [n for n in api.list("/api/v1/nodes", label_selector=f"{labels.NODEPOOL}=np-slice") if ready(n)]
            if len(api.list("/api/v1/nodes", label_selector=f"{labels.NODEPOOL}=np-slice")) == 2
            else None
        ),
        60,
        "slice nodes Ready",
        cluster,
    )

    created = api.create(JOBSETS, multislice_jobset("train"))
    assert created["spec"]["suspend"] is True  # Kueue's webhook: queued JobSets start suspended

    def admitted() -> dict[str, Any] | None:
        jobset = api.get(f"{JOBSETS}/train")
        return jobset if jobset and jobset["spec"].get("suspend") is False else None

    eventually(admitted, 90, "Kueue admitting the JobSet", cluster)
    workloads = api.list("/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads")
    assert [w["status"]["admission"]["clusterQueue"] for w in workloads] == ["cluster-queue"]

    def pods() -> list[dict[str, Any]] | None:
        found = api.list("/api/v1/namespaces/default/pods", label_selector=f"{labels.JOBSET_NAME}=train")
        return found if len(found) == 2 and all(p["spec"].get("nodeName") for p in found) else None

    # JobSet's pod webhook: the leader (completion index 0) gets affinity to its own job and
    # anti-affinity to other jobs per node pool; a follower is pinned to the leader's pool.
    by_index = {
        p["metadata"]["annotations"][labels.JOB_COMPLETION_INDEX]: p
        for p in eventually(pods, 90, "two pods bound", cluster)
    }
    leader, follower = by_index["0"], by_index["1"]
    affinity = leader["spec"]["affinity"]
    for kind in ("podAffinity", "podAntiAffinity"):
        terms = affinity[kind]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert [term["topologyKey"] for term in terms] == [labels.NODEPOOL]
    assert follower["spec"]["nodeSelector"][labels.NODEPOOL] == "np-slice"
    assert {p["spec"]["nodeName"] for p in by_index.values()} == {
        "gke-sandbox-np-slice-0",
        "gke-sandbox-np-slice-1",
    }

    def completed() -> dict[str, Any] | None:
        jobset = api.get(f"{JOBSETS}/train") or {}
        conditions = (jobset.get("status") or {}).get("conditions") or []
        done = any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)
        return jobset if done else None

    eventually(completed, 90, "JobSet Completed", cluster)


def test_a_jobset_deletion_is_in_the_audit_log(cluster: RealCluster) -> None:
    api = cluster.client()
    jobset = multislice_jobset("audited")
    del jobset["metadata"]["labels"]  # not queued: nothing else to wait for
    api.create(JOBSETS, jobset)
    assert api.delete(f"{JOBSETS}/audited")

    def deletion() -> dict[str, Any] | None:
        entries = [json.loads(line) for line in cluster.audit_log.read_text().splitlines() if line]
        found = [
            e
            for e in entries
            if e["verb"] == "delete"
            and e["objectRef"]["resource"] == "jobsets"
            and e["objectRef"]["name"] == "audited"
        ]
        return found[-1] if found else None

    entry = eventually(deletion, 30, "audit entry of the deletion", cluster)
    assert entry["level"] == "Metadata"
    assert entry["stage"] == "ResponseComplete"
    assert entry["objectRef"]["apiGroup"] == "jobset.x-k8s.io"
    assert entry["objectRef"]["namespace"] == "default"
    assert entry["user"]["username"] == "sandbox-admin"
    assert entry["responseStatus"]["code"] == 200
