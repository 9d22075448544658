"""Pods land, or are refused: every selector a TPU pod makes is matched by the pool built for it.

GKE's emulator refuses node labels in GKE's and Kubernetes' domains (with GKE's text) and the
simulated nodes carry the labels GKE derives from the pool's configuration, so a selector the
product dropped or mis-built would leave the pod pending on a billed pool; these scenarios show
it running, or refused with an Event and no pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandbox.cluster.common import RUN_SECONDS_ANNOTATION
from sandbox.stack.core import Stack
from sandbox.testing.stack import (
    FAST,
    assert_clean_run,
    create_requests,
    events_about,
    exclusive_tpu_jobset,
    owned_pools,
    submit,
    successful_creates,
    wait_finished,
    wait_released,
)
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("timeline_on_failure")]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """The stand-in sandbox (FAST), until these scenarios run on the real stack."""
    with Stack(FAST) as running:
        yield running


def _pods(stack: Stack, name: str) -> list[dict[str, Any]]:
    return stack.kube.list("v1", "pods", "default", label_selector=f"{labels.JOBSET_NAME}={name}")


@pytest.mark.parametrize(
    ("name", "selector"),
    [
        ("ici-off", {labels.ICI_RESILIENCY: "false"}),
        ("hinted", {labels.LOCATION_HINT: "cell-a"}),
        ("counted", {labels.ACCELERATOR_COUNT: "4", "topology.kubernetes.io/region": "us-east5"}),
    ],
)
def test_pod_selecting_a_label_gke_takes_or_sets_runs(
    stack: Stack, name: str, selector: dict[str, str]
) -> None:
    assert stack.config.location == "us-east5-b"  # the region selected above
    submit(stack, exclusive_tpu_jobset(name, replicas=1, topology="2x4", selectors=selector))

    def pool_labels() -> dict[str, str]:
        pools = owned_pools(stack, name)
        return dict((pools[0].get("config") or {}).get("labels") or {}) if pools else {}

    seen = stack.wait_for(pool_labels, 20, f"the pool of {name}")
    assert wait_finished(stack, name) == "Completed"
    pods = _pods(stack, name)
    assert pods and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    # What GKE takes as a node label is in the pool's node labels; what it derives itself is not.
    taken = {k: v for k, v in selector.items() if k in (labels.ICI_RESILIENCY, labels.LOCATION_HINT)}
    assert {k: seen[k] for k in selector if k in seen} == taken
    wait_released(stack, name)
    assert_clean_run(stack, name, slices=1)


@pytest.mark.parametrize(
    ("name", "selector", "needle"),
    [
        (
            "classy",
            {"cloud.google.com/compute-class": "tpu"},
            'Node labels with key "cloud.google.com/compute-class" are managed by GKE or Kubernetes',
        ),
        ("armed", {"kubernetes.io/arch": "amd64"}, "pod selects kubernetes.io/arch=amd64"),
        ("notspot", {labels.SPOT: "false"}, "the pool's nodes carry no cloud.google.com/gke-spot label"),
    ],
)
def test_pod_selecting_a_label_no_pool_can_carry_is_refused_without_a_pool(
    stack: Stack, name: str, selector: dict[str, str], needle: str
) -> None:
    creates = stack.gke.count("create")
    submit(stack, exclusive_tpu_jobset(name, replicas=1, topology="2x4", selectors=selector))

    def refused() -> list[str]:
        return [
            str(e.get("message", ""))
            for e in events_about(stack, labels.REASON_REFUSED, name)
            if (e.get("involvedObject") or {}).get("kind") == "Pod"
        ]

    messages = stack.wait_for(refused, 20, "a TPUSliceRefused Event on the pod")
    assert any(needle in m and next(iter(selector)) in m for m in messages), messages
    assert {p["status"].get("phase") for p in _pods(stack, name)} == {"Pending"}
    stack.delete_jobset("default", name)
    assert stack.gke.count("create") == creates and create_requests(stack, name) == {}
    assert owned_pools(stack, name) == []


def test_readmission_under_spot_replaces_the_idle_on_demand_pool(stack: Stack) -> None:
    # What Kueue does to a JobSet it evicts and admits again under another flavor, done by hand:
    # suspend it (its pods go, its pool stays through SUSPEND_GRACE_SECONDS), write the new
    # flavor's node labels into the pod template, unsuspend it.
    name = "flavored"
    submit(stack, exclusive_tpu_jobset(name, replicas=1, topology="2x4", run_seconds=60))

    def running() -> bool:
        pods = _pods(stack, name)
        return bool(pods) and {p["status"].get("phase") for p in pods} == {"Running"}

    stack.wait_for(running, 30, f"the pods of {name} running")
    (before,) = owned_pools(stack, name)
    assert not (before.get("config") or {}).get("spot")

    jobset = stack.jobset("default", name)
    assert jobset is not None
    jobset["spec"]["suspend"] = True
    stack.kube.put(jobset)
    stack.wait_for(lambda: not _pods(stack, name), 20, f"the pods of suspended {name} deleted")

    jobset = stack.jobset("default", name)
    assert jobset is not None
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["spec"]["nodeSelector"][labels.SPOT] = "true"
    template["metadata"]["annotations"][RUN_SECONDS_ANNOTATION] = "1"
    jobset["spec"]["suspend"] = False
    stack.kube.put(jobset)

    assert wait_finished(stack, name, timeout=60) == "Completed"
    replaced = [d for d in stack.decisions("provision.replaced") if d.get("pool") == before["name"]]
    assert replaced and "cloud.google.com/gke-spot=true" in str(replaced[0].get("message", "")), replaced
    # The pods select gke-spot=true: they could only have run on the rebuilt pool's Spot nodes.
    pods = _pods(stack, name)
    assert pods and {p["status"]["phase"] for p in pods} == {"Succeeded"}
    wait_released(stack, name)
    # The same pool name, created twice: on-demand first, then as the re-admitted pods asked.
    assert successful_creates(stack, name) == {before["name"]: 2}
    assert stack.jobsets.errors == [] and stack.scheduler.errors == []
    rebuilt = [
        e["message"]
        for e in events_about(stack, labels.REASON_RELEASED, name)
        if "to build it again" in e["message"]
    ]
    assert rebuilt, "no Event tells why the pool was deleted"
