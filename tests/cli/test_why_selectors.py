"""``tpuprov why`` names each selector's fate and a pool of the slice's name that no longer fits."""

from __future__ import annotations

import json

from sandbox.jobsets import tpu_jobset
from shared.core import labels
from shared.core.settings import Settings
from shared.tpu.jobsets import JobSet, expand_pods
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.pods import Pod
from shared.tpu.slices import build_node_pool, slice_request
from tpuprov.why import explain

SETTINGS = Settings(
    unlimited_spending=True,
    project_id="p",
    location="us-east5-b",
    cluster_name="c",
    node_label_keys=("team",),
)
UID = "0b9a1c3e-1111-4222-8333-444455556666"


def _case(selectors: dict[str, str]) -> tuple[dict, dict]:
    jobset = tpu_jobset("train", "team-a", uid=UID, replicas=1, topology="2x4", selectors=selectors)
    return expand_pods(jobset)[0], jobset


def _explain(pod: dict, jobset: dict, pools: list[NodePoolInfo] | None = None) -> str:
    """``explain`` on the pod and JobSet as the CLI's ClusterView reads them (parsed views)."""
    return explain(Pod.parse(pod), JobSet.parse(jobset), [], pools or [], [], SETTINGS)


def test_why_says_who_sets_each_selector() -> None:
    pod, jobset = _case({labels.SPOT: "true", "team": "ml"})
    text = _explain(pod, jobset)
    assert (
        "Of its node selectors, GKE sets cloud.google.com/gke-spot=true (config.spot), "
        "cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice (config.machineType), "
        "cloud.google.com/gke-tpu-topology=2x4 (placementPolicy.tpuTopology) from the pool's configuration; "
        "the product sets team=ml as node labels."
    ) in text


def test_why_names_a_pool_that_no_longer_fits() -> None:
    pod, jobset = _case({labels.SPOT: "true"})
    spec, _ = build_node_pool(SETTINGS, slice_request(pod))
    pool = NodePoolInfo(
        name=spec.name,
        status="RUNNING",
        machine_type=spec.machine_type,
        node_count=spec.node_count,
        labels=dict(spec.labels),
        node_locations=spec.node_locations,
        tpu_topology="2x4",
        spot=False,  # built when the pods selected on-demand capacity
    )
    text = _explain(pod, jobset, [pool])
    assert (
        f"Its pool {spec.name} exists but no longer fits the pod: the pod selects "
        "cloud.google.com/gke-spot=true but the pool's nodes carry no cloud.google.com/gke-spot label "
        "(GKE sets it from config.spot). "
        "Provision deletes it and builds it again once no JobSet pod runs on it"
    ) in text


def test_why_names_the_capacity_provision_asks_for_now() -> None:
    # The JobSet's policy starts at Spot; its slice's Spot attempt stocked out, and the record says
    # the next attempt is on-demand: why says what provision will ask for, not the first option.
    pod, jobset = _case({})
    jobset["metadata"]["annotations"] = {labels.CAPACITY_POLICY: "spot, on-demand"}
    assert "on spot@us-east5-b." in _explain(pod, jobset)
    name = slice_request(pod).pool_name
    record = {
        name: {"attempts": 1, "failedAt": 1, "option": "spot@us-east5-b", "next": "on-demand@us-east5-b"}
    }
    jobset["metadata"]["annotations"][labels.SLICE_FAILURES] = json.dumps(record)
    assert "on on-demand@us-east5-b." in _explain(pod, jobset)
