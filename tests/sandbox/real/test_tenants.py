"""A shared cluster's tenants, attacked as a tenant would: with only pods and JobSets of its own.

On the real components (``RealStack``: the real API server, scheduler, controller manager, the real
JobSet and Kueue controllers, KWOK; the functions with their deployed roles). The deployment states
who may spend what (``TENANTS``): team-a 64 chips and reservation ``res-a``, team-b 8 chips and no
reservation, team-c nothing. Each test reproduces one attack of the issue "Tenants get exactly what
they declared" and asserts what a user sees: no pool of team-a's adopted, kept, deleted or outspent
by team-b, and a ``TPUSliceRefused`` Event saying why. Every wait is for the condition asserted, through
the API, with a bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.realstack.core import RealStack
from sandbox.realstack.demo import ACCELERATOR
from sandbox.realstack.kubestate import collection
from sandbox.testing.stack import kube, owned_pools, real_config, submit, wait_finished, wait_released
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("timeline_on_failure")]

TENANTS = {
    "team-a": {"chips": 64, "reservations": ["res-a"]},
    "team-b": {"chips": 8},
}
WAIT = 120.0  # generous: two cores shared by several stacks
TOPOLOGY = "2x4"  # v5e: 2 VMs of 4 chips, 8 chips


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    config = real_config(TENANTS=json.dumps(TENANTS), UNLIMITED_SPENDING="false")
    with RealStack(config) as running:
        client = running.kube_cluster.client()
        for namespace in ("team-a", "team-b", "team-c"):
            client.create(
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            )
        running.setup()
        yield running


def _jobset(name: str, namespace: str, run_seconds: float = 0.0, **options: Any) -> dict[str, Any]:
    return tpu_jobset(
        name,
        namespace,
        replicas=options.pop("replicas", 1),
        accelerator=ACCELERATOR,
        topology=options.pop("topology", TOPOLOGY),
        chips_per_vm=4,
        run_seconds=run_seconds,
        **options,
    )


def _refusals(stack: RealStack, namespace: str, target: str) -> list[str]:
    """Messages of the TPUSliceRefused Events about ``target`` (an object's name or its prefix)."""
    return [
        str(e.get("message", ""))
        for e in stack.events(labels.REASON_REFUSED, namespace)
        if str((e.get("involvedObject") or {}).get("name", "")).startswith(target)
    ]


def _wait_refused(stack: RealStack, namespace: str, target: str, why: str) -> list[str]:
    return stack.wait_for(
        lambda: [m for m in _refusals(stack, namespace, target) if why in m],
        WAIT,
        f"a TPUSliceRefused Event about {namespace}/{target} saying {why!r}",
    )


def _running_pool(stack: RealStack, name: str, namespace: str) -> dict[str, Any]:
    def up() -> dict[str, Any] | None:
        pools = [p for p in owned_pools(stack, name, namespace) if p.get("status") == "RUNNING"]
        pods = kube(stack).list("v1", "pods", namespace, f"{labels.JOBSET_NAME}={name}")
        running = pods and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
        return pools[0] if pools and running else None

    return stack.wait_for(up, WAIT, f"{namespace}/{name} running on its pool")


def _bare_pod(
    name: str, namespace: str, jobset_labels: dict[str, str], spec: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": jobset_labels},
        "spec": {"restartPolicy": "Never", **spec},
    }


def _tpu_spec(topology: str, chips: int = 4) -> dict[str, Any]:
    return {
        "nodeSelector": {labels.TPU_ACCELERATOR: ACCELERATOR, labels.TPU_TOPOLOGY: topology},
        "containers": [
            {
                "name": "c",
                "image": "python:3.11",
                "resources": {
                    "requests": {labels.TPU_RESOURCE: str(chips)},
                    "limits": {labels.TPU_RESOURCE: str(chips)},
                },
            }
        ],
    }


def test_a_bare_pod_of_a_suspended_jobset_never_takes_another_teams_pool(stack: RealStack) -> None:
    # team-a's JobSet runs on its pool. team-b suspends a JobSet "hold" of its own and pins a bare
    # pod without TPUs, labelled as hold's, to team-a's node. When team-a's JobSet ends its pool must
    # go: the bare pod is not hold's (no Job made it), a suspended JobSet holds nothing, and team-b
    # may not own a pool anyway (its budget is too small).
    owner = submit(stack, _jobset("owner", "team-a", run_seconds=25))
    pool = _running_pool(stack, "owner", "team-a")
    hold = _jobset("hold", "team-b")
    hold["spec"]["suspend"] = True
    hold = submit(stack, hold)
    client = stack.kube_cluster.client()
    squat = _bare_pod(
        "squat",
        "team-b",
        {
            labels.JOBSET_NAME: "hold",
            labels.JOBSET_UID: hold["metadata"]["uid"],
            labels.REPLICATED_JOB_NAME: "slice",
            labels.JOB_INDEX: "0",
        },
        {
            "nodeSelector": {labels.NODEPOOL: pool["name"]},
            "containers": [{"name": "c", "image": "python:3.11"}],
        },
    )
    client.create(collection("v1", "pods", "team-b"), squat)
    stack.wait_for(
        lambda: (
            (kube(stack).get("v1", "pods", "team-b", "squat") or {}).get("status", {}).get("phase")
            == "Running"
        ),
        WAIT,
        "the squatting pod running on team-a's node",
    )
    assert wait_finished(stack, "owner", timeout=WAIT, namespace="team-a") == "Completed"
    wait_released(stack, "owner", timeout=WAIT, namespace="team-a")
    # Never team-b's: no adoption, no pool labelled for it, no handover Event in team-b.
    assert owned_pools(stack, "hold", "team-b") == []
    assert [e for e in stack.events(labels.REASON_ADOPTED, "team-b")] == []
    assert not [d for d in stack.decisions("release.adopted") if "team-b" in str(d.get("message", ""))]
    # kubectl describe on team-a's JobSet says the pool went and which pod it did not count.
    said = f"not counted as occupants of {pool['name']}: pod(s) team-b/squat"
    [event, *_] = stack.wait_for(
        lambda: [e for e in stack.events(labels.REASON_RELEASED, "team-a") if said in str(e.get("message"))],
        WAIT,
        "team-a's Released Event naming the squatting pod",
    )
    assert event["involvedObject"]["uid"] == owner["metadata"]["uid"]


def test_pods_claiming_more_than_the_jobset_declares_buy_nothing(stack: RealStack) -> None:
    # team-a's JobSet "small" declares one 8-chip slice. Bare pods claiming it (by its name and uid,
    # as its labels would) ask for index 7 and 12345, a uid-less index 0 and a 16x16 slice: none is a
    # pod of small's Jobs, so none buys anything; small gets exactly its one pool.
    small = submit(stack, _jobset("small", "team-a", run_seconds=60))
    _running_pool(stack, "small", "team-a")
    client = stack.kube_cluster.client()
    claims = {
        "claim-7": ("7", small["metadata"]["uid"], TOPOLOGY),
        "claim-12345": ("12345", small["metadata"]["uid"], TOPOLOGY),
        "claim-no-uid": ("0", "", TOPOLOGY),
        "claim-16x16": ("0", small["metadata"]["uid"], "16x16"),
    }
    for pod_name, (index, uid, topology) in claims.items():
        pod_labels = {
            labels.JOBSET_NAME: "small",
            labels.REPLICATED_JOB_NAME: "slice",
            labels.JOB_INDEX: index,
        }
        if uid:
            pod_labels[labels.JOBSET_UID] = uid
        client.create(
            collection("v1", "pods", "team-a"), _bare_pod(pod_name, "team-a", pod_labels, _tpu_spec(topology))
        )
    for pod_name in claims:
        _wait_refused(stack, "team-a", pod_name, "not controlled by a Job")
    assert len(owned_pools(stack, "small", "team-a")) == 1
    created = [d for d in stack.decisions("provision.created") if "/small " in str(d.get("slice", ""))]
    assert len(created) == 1, created
    for pod_name in claims:
        client.delete(f"{collection('v1', 'pods', 'team-a')}/{pod_name}", grace_seconds=0)
    stack.kube_cluster.client().delete(f"{collection('jobset.x-k8s.io/v1alpha2', 'jobsets', 'team-a')}/small")
    wait_released(stack, "small", timeout=WAIT, namespace="team-a")


def test_a_jobset_declaring_fewer_pods_than_its_slice_has_vms_is_refused(stack: RealStack) -> None:
    # One pod per Job of a v5e 4x4 slice (4 VMs): 4 chips declared (and charged by Kueue), 16 bought.
    wide = _jobset("wide", "team-a", topology="4x4", vms=1)
    submit(stack, wide)
    _wait_refused(stack, "team-a", "wide", "runs 1 pod(s) per Job")
    assert owned_pools(stack, "wide", "team-a") == []
    stack.delete_jobset("team-a", "wide")


def test_spending_follows_what_each_team_was_given(stack: RealStack) -> None:
    # team-b: 8 chips and no reservation. Its 2-slice JobSet gets one pool and is refused the other;
    # a JobSet selecting team-a's reservation gets nothing; team-c has no entry at all.
    two = _jobset("two", "team-b", replicas=2)
    submit(stack, two)
    _wait_refused(stack, "team-b", "two", 'TENANTS["team-b"] chip budget exceeded')
    stack.wait_for(
        lambda: len(owned_pools(stack, "two", "team-b")) == 1, WAIT, "team-b's one affordable pool"
    )
    theirs = _jobset("theirs", "team-b", selectors={labels.RESERVATION_NAME: "res-a"})
    submit(stack, theirs)
    _wait_refused(stack, "team-b", "theirs", 'TENANTS["team-b"] does not list reservation res-a')
    # Another shape than team-b's pool: the real scheduler would bind same-shape pods to that pool's
    # free nodes (nothing in a pod's selectors names a team), and a bound pod is never refused.
    nobody = _jobset("nobody", "team-c", topology="2x2")
    submit(stack, nobody)
    _wait_refused(stack, "team-c", "nobody", "has no entry in TENANTS, so it may spend nothing")
    assert owned_pools(stack, "theirs", "team-b") == [] and owned_pools(stack, "nobody", "team-c") == []
    for namespace, name in (("team-b", "two"), ("team-b", "theirs"), ("team-c", "nobody")):
        stack.delete_jobset(namespace, name)
    wait_released(stack, "two", timeout=WAIT, namespace="team-b")


def test_selectors_never_put_gke_or_unlisted_labels_on_a_pool(stack: RealStack) -> None:
    for name, selector in (
        ("gvisor", {"sandbox.gke.io/runtime": "gvisor"}),
        ("costly", {"cost-center": "x"}),
    ):
        submit(stack, _jobset(name, "team-a", selectors=selector))
    _wait_refused(stack, "team-a", "gvisor", "belong to GKE's node features")
    _wait_refused(stack, "team-a", "costly", "NODE_LABEL_KEYS does not allow that key")
    assert owned_pools(stack, "gvisor", "team-a") == [] and owned_pools(stack, "costly", "team-a") == []
    for name in ("gvisor", "costly"):
        stack.delete_jobset("team-a", name)


def test_a_record_written_on_a_suspended_jobset_keeps_nothing(stack: RealStack) -> None:
    # The JobSet's owner suspends it and writes the record earlier versions read as "the admission
    # check is provisioning": its pools must still go once the suspend grace (1 s here) is over.
    paused = submit(stack, _jobset("paused", "team-a", run_seconds=600))
    _running_pool(stack, "paused", "team-a")
    path = f"{collection('jobset.x-k8s.io/v1alpha2', 'jobsets', 'team-a')}/paused"
    stack.kube_cluster.client().patch(
        path,
        {
            "metadata": {"annotations": {"tpuprov.dev/admission-check": "Pending@9999999999"}},
            "spec": {"suspend": True},
        },
    )
    stack.wait_for(lambda: stack.jobset_state("team-a", "paused") == "Suspended", WAIT, "paused suspended")

    def released() -> bool:
        if owned_pools(stack, "paused", "team-a"):
            stack.trigger_reconcile()
            return False
        return True

    stack.wait_for(released, WAIT, "the suspended JobSet's pools to be released", interval=5.0)
    # kubectl describe says why: the suspension outlasted its grace; the record kept nothing.
    stack.wait_for(
        lambda: [
            e
            for e in stack.events(labels.REASON_RELEASED, "team-a")
            if (e.get("involvedObject") or {}).get("uid") == paused["metadata"]["uid"]
            and "team-a/paused suspended for" in str(e.get("message"))
        ],
        WAIT,
        "a Released Event on paused naming its suspension",
    )
    stack.delete_jobset("team-a", "paused")
