"""Public TPU manifests, unmodified but for the sandbox's run time, on the real components (#30).

Each manifest of ``tests/data/public_manifests`` named below is submitted as its source publishes
it; the only change is KWOK's ``run-seconds`` annotation on its pod templates, without which a
sandbox pod runs until deleted (no container runs here). What a user would see is asserted: the
real JobSet controller creates its Jobs and pods (privileged containers and host networking
included, as GKE Standard allows them), the real scheduler binds every TPU pod to a Node of a pool
the product built for that JobSet, the JobSet completes, and each pool is deleted after, none
leaked and no pod killed. One stack for the module, with JobSet and Kueue installed and the
queues the manifests name applied through the product's ``apply_kueue`` (``QUEUES``). What the
product cannot build for (GKE's dynamic slicing, one-pod Jobs on a multi-host slice) is refused on
the JobSet with the reason, and nothing is created.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.jobsets import RUN_SECONDS
from sandbox.realstack.core import RealStack
from sandbox.testing.stack import (
    REAL_FAST,
    PoolWatch,
    events_about,
    kube,
    owned_pools,
    pods_killed,
    submit,
    wait_finished,
    wait_released,
)
from shared.core import labels
from tests.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CORPUS = REPO / "tests" / "data" / "public_manifests"
RUN_SECONDS_EACH = 4
FINISH_TIMEOUT = 300.0
RELEASE_TIMEOUT = 180.0

# file -> (slices the product builds for it, TPU pods it runs): #30's representative set.
RUNS: dict[str, tuple[int, int]] = {
    "spot-custom-label.yaml": (1, 1),  # single host, Spot, the custom label abc
    "ai-on-gke-tpu-provisioner.yaml": (1, 2),  # v5p multi-host on Spot, the custom label abc
    "gke-tutorial-multislice.yaml": (2, 4),  # multislice under Kueue, the admission check on
    "jobset-repo-tpu.yaml": (2, 8),  # v6e multislice under Kueue, the admission check on
    "xpk-workload.yaml": (2, 8),  # xpk's JobSet: priority class, podFailurePolicy, null fields
    "flex-start-v6e.yaml": (1, 4),
    "tpu7x.yaml": (1, 1),  # under Kueue without the check: the pending-pod path
}
# file -> what the refusal on its pods and JobSet says; nothing is created for them.
REFUSALS = {
    "tpu7x-dynamic-slicing.yaml": "which only GKE's slice controller sets",
    "tf-workers-one-pod-per-job.yaml": "declare replicas: 1 with parallelism and completions 8",
}
# The queues the manifests name, as their sources' own setups make them: GKE's tutorial (and the
# JobSet repo's and xpk's JobSets) use multislice-queue, here with the product's check and a v6e
# flavor beside the tutorial's v5e one; Cluster Toolkit's tpu7x sample uses user-queue; xpk's
# cluster setup creates the PriorityClass "medium" (value 500, xpk src/xpk/core/kueue.py) its
# JobSets name, without which the API server refuses their pods.
QUEUES = """
flavors:
  - {name: vlp-24, accelerator: tpu-v5-lite-podslice, topology: 2x4}
  - {name: v6e-4x4, accelerator: tpu-v6e-slice, topology: 4x4}
  - {name: tpu7x-2x2x1, accelerator: tpu7x, topology: 2x2x1}
clusterQueues:
  - name: cluster-queue
    quota: {vlp-24: 24, v6e-4x4: 32}
    tpuSlicesCheck: true
  - name: tpu7x-queue
    quota: {tpu7x-2x2x1: 4}
localQueues:
  - {name: multislice-queue, namespace: default, clusterQueue: cluster-queue}
  - {name: user-queue, namespace: default, clusterQueue: tpu7x-queue}
priorityClasses:
  - {name: medium, kind: PriorityClass, value: 500}
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    config = dataclasses.replace(
        REAL_FAST,
        # The ai-on-gke examples' own label: a key the operator lets pools carry (docs/trust.md).
        function_env={**REAL_FAST.function_env, "NODE_LABEL_KEYS": "abc"},
    )
    with RealStack(config) as running:
        running.setup(timeout=300)
        running.apply_kueue(QUEUES)
        # The TensorFlow sample runs as the ServiceAccount its source's setup creates; without it
        # the API server refuses the JobSet's pods (the ServiceAccount admission plugin).
        account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tpu-training-sa"}}
        running.kube_cluster.client().create("/api/v1/namespaces/default/serviceaccounts", account)
        yield running


def as_published(path: Path) -> dict[str, Any]:
    """The manifest's one JobSet, with KWOK's run time on every pod template (the only edit)."""
    (jobset,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    body = copy.deepcopy(jobset)
    body["metadata"].pop("namespace", None)  # the module runs everything in "default"
    for rjob in body["spec"]["replicatedJobs"]:
        template = rjob["template"]["spec"]["template"]
        meta = template.setdefault("metadata", {})
        # xpk writes "annotations:" with nothing under it (null, which the API server drops).
        meta["annotations"] = {**(meta.get("annotations") or {}), RUN_SECONDS: str(RUN_SECONDS_EACH)}
    return dict(body)


def _pool_of_node(stack: RealStack, node: str) -> str:
    """The pool a sandbox Node belongs to: GKE names Nodes ``gke-<cluster>-<pool>-...``."""
    prefix = f"gke-{stack.config.cluster_name}-"
    return node.removeprefix(prefix).rsplit("-", 1)[0] if node.startswith(prefix) else ""


def _tpu_pods(stack: RealStack, name: str) -> list[dict[str, Any]]:
    pods = kube(stack).list("v1", "pods", "default", f"{labels.JOBSET_NAME}={name}")
    return [
        p
        for p in pods
        if any(
            "google.com/tpu" in (c.get("resources") or {}).get("limits", {}) for c in p["spec"]["containers"]
        )
    ]


@pytest.mark.parametrize("manifest", sorted(RUNS))
def test_a_public_manifest_runs_on_the_pools_the_product_builds(stack: RealStack, manifest: str) -> None:
    slices, tpu_pods = RUNS[manifest]
    jobset = as_published(CORPUS / manifest)
    name = str(jobset["metadata"]["name"])

    def all_bound() -> list[dict[str, Any]]:
        pods = _tpu_pods(stack, name)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        return bound if len(bound) >= tpu_pods else []

    with PoolWatch(stack) as watch:
        submit(stack, jobset)
        bound = stack.wait_for(all_bound, FINISH_TIMEOUT, f"the {tpu_pods} TPU pods of {name} to be bound")
        assert wait_finished(stack, name, timeout=FINISH_TIMEOUT) == "Completed"
        wait_released(stack, name, timeout=RELEASE_TIMEOUT)

    its_pools = {pool for pool in watch.owners if name in watch.carried_by(pool)}
    ran_on = {_pool_of_node(stack, str(p["spec"]["nodeName"])) for p in bound}
    assert len(its_pools) == slices, f"pools that carried {name}: {sorted(its_pools)}"
    assert ran_on == its_pools, f"{name}'s TPU pods ran on {sorted(ran_on)}, its pools {sorted(its_pools)}"
    assert watch.crowded == []  # no slice paid for twice
    assert owned_pools(stack, name) == []  # every pool deleted (or handed on), none leaked
    assert pods_killed(stack, name) == []
    assert {p["status"].get("phase") for p in _tpu_pods(stack, name)} == {"Succeeded"}
    stack.delete_jobset("default", name)


@pytest.mark.parametrize("manifest", sorted(REFUSALS))
def test_a_public_manifest_the_product_cannot_build_for_is_refused_on_its_jobset(
    stack: RealStack, manifest: str
) -> None:
    jobset = as_published(CORPUS / manifest)
    name = str(jobset["metadata"]["name"])
    creates = stack.gke.count("create")
    submit(stack, jobset)

    def refused_on_jobset() -> list[str]:
        return [
            str(e.get("message", ""))
            for e in events_about(stack, labels.REASON_REFUSED, name)
            if (e.get("involvedObject") or {}).get("kind") == "JobSet"
        ]

    messages = stack.wait_for(refused_on_jobset, 120, f"a {labels.REASON_REFUSED} Event on JobSet {name}")
    assert all(REFUSALS[manifest] in m for m in messages), messages
    stack.delete_jobset("default", name)
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Gone", 60, f"JobSet {name} to go")
    assert stack.gke.count("create") == creates  # nothing was bought for it
    assert owned_pools(stack, name) == []
