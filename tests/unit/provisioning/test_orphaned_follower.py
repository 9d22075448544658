"""A follower pod JobSet's exclusive placement left with an empty node-pool selector
(kubernetes-sigs/jobset issue 1088): refused with what to do, on the pod and its JobSet, and no
pool is created for it."""

from __future__ import annotations

import datetime

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.outcomes import REFUSED
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.pods import Pod

SETTINGS = Settings(unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c")


def pods_of(kube: FakeKube, exclusive: bool = True) -> list[dict]:
    annotations = {labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL} if exclusive else None
    jobset = tpu_jobset("train", "team-a", replicas=1, annotations=annotations)  # v6e 4x4: 4 VMs
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        if exclusive:  # JobSet's webhooks annotate every pod of an exclusive JobSet
            pod["metadata"].setdefault("annotations", {})[labels.EXCLUSIVE_TOPOLOGY] = labels.NODEPOOL
    return pods


def deliver(kube: FakeKube, gke: FakeGke, pod: dict) -> tuple[str, str]:
    kube.add_pod(pod)
    now = datetime.datetime.now(tz=datetime.UTC)
    outcome = Provisioner(Services(SETTINGS, gke, kube)).handle_pending_pod(
        pod["metadata"]["namespace"], pod["metadata"]["name"], now
    )
    return outcome.result, outcome.why


def test_a_follower_with_an_empty_node_pool_selector_is_refused_with_the_fix() -> None:
    kube, gke = FakeKube(), FakeGke()
    follower = pods_of(kube)[1]
    follower["spec"].setdefault("nodeSelector", {})[labels.NODEPOOL] = ""
    result, why = deliver(kube, gke, follower)
    assert result == REFUSED
    assert (
        "jobset issue 1088" in why and f"kubectl delete pod -n team-a {follower['metadata']['name']}" in why
    )
    assert gke.count("create") == 0
    # Told on the pod and, the pod proven one of its pods, on the JobSet.
    kinds = {
        e["kind"] for e in kube.events if e["reason"] == labels.REASON_REFUSED and "1088" in e["message"]
    }
    assert kinds == {"Pod", "JobSet"}


def test_the_signature_needs_a_follower_of_an_exclusive_jobset_and_an_empty_value() -> None:
    kube = FakeKube()
    leader, follower = pods_of(kube)[:2]
    follower["spec"].setdefault("nodeSelector", {})[labels.NODEPOOL] = ""
    assert Pod.parse(follower).orphaned_follower == labels.NODEPOOL
    # A leader is never given the selector; a real pool name is the webhook's normal work.
    leader["spec"].setdefault("nodeSelector", {})[labels.NODEPOOL] = ""
    assert Pod.parse(leader).orphaned_follower == ""
    follower["spec"]["nodeSelector"][labels.NODEPOOL] = "tpu-train-slice-0-abc"
    assert Pod.parse(follower).orphaned_follower == ""
    plain = pods_of(FakeKube(), exclusive=False)[1]
    plain["spec"].setdefault("nodeSelector", {})[labels.NODEPOOL] = ""
    assert Pod.parse(plain).orphaned_follower == ""
