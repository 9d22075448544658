"""A slice's pool that its pods no longer fit: replaced when idle, refused when a workload runs there."""

import copy
import dataclasses
import datetime

from sandbox.jobsets import tpu_jobset
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.outcomes import CREATED, EXISTS, REFUSED, REPLACED, WAITING
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_RUNNING

SETTINGS = Settings(
    unlimited_spending=True,
    project_id="p",
    location="us-east5-b",
    cluster_name="c",
    cordon_settle_seconds=0,
    node_label_keys=("team",),
)
CLUSTER = SETTINGS.cluster_path
UID = "0b9a1c3e-1111-4222-8333-444455556666"


def provision(gke, kube, pod):
    service = Provisioner(Services(SETTINGS, gke, kube))
    meta = pod["metadata"]
    return service.handle_pending_pod(meta["namespace"], meta["name"], datetime.datetime.now(tz=datetime.UTC))


def admit(kube, selectors):
    """The JobSet as Kueue admits it under a flavor: its pods select the flavor's node labels."""
    jobset = tpu_jobset("train", "team-a", uid=UID, replicas=1, topology="2x2", selectors=selectors)
    kube.add_jobset(jobset)
    kube.pods.clear()  # suspending deleted the previous admission's pods
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    return pods


def running_pool(gke, kube):
    (name,) = gke.managed_names(CLUSTER)
    gke.mark(CLUSTER, name, STATUS_RUNNING)
    pool = gke.pools[CLUSTER][name]
    return pool, kube.add_pool_nodes(pool)


def test_kueue_readmission_under_spot_replaces_the_idle_on_demand_pool(gke, kube):
    # Admitted under an on-demand flavor: one on-demand pool.
    pod = admit(kube, {})[0]
    assert provision(gke, kube, pod).result == CREATED
    pool, nodes = running_pool(gke, kube)
    assert not pool.spot
    # Suspended and re-admitted within SUSPEND_GRACE_SECONDS under a Spot flavor (same uid): the
    # pool of the slice's name still exists, but a pod selecting Spot can never land on it.
    pod = admit(kube, {labels.SPOT: "true"})[0]
    outcome = provision(gke, kube, pod)
    assert outcome.result == REPLACED
    assert outcome.why == (
        f"deleted node pool {pool.name} to build it again: the pod selects cloud.google.com/gke-spot=true "
        "but the pool's nodes carry no cloud.google.com/gke-spot label (GKE sets it from config.spot)"
    )
    assert gke.count("delete") == 1 and gke.managed_names(CLUSTER) == []
    assert all(kube.nodes[n]["spec"].get("unschedulable") for n in nodes)  # cordoned before the delete
    released = [(e["kind"], e["reason"]) for e in kube.events if e["reason"] == labels.REASON_RELEASED]
    assert released == [("JobSet", labels.REASON_RELEASED), ("Pod", labels.REASON_RELEASED)]
    # The pod is still pending: its next event builds the pool as it now asks.
    assert provision(gke, kube, pod).result == CREATED
    assert gke.specs[pool.name].spot and gke.pools[CLUSTER][pool.name].spot


def test_a_pool_a_jobset_pod_runs_on_is_never_replaced(gke, kube):
    pod = admit(kube, {})[0]
    provision(gke, kube, pod)
    _, nodes = running_pool(gke, kube)
    other = copy.deepcopy(pod)  # a pod of the JobSet still runs there (its own, or a sibling's)
    other["metadata"]["name"] = "still-running"
    pod = admit(kube, {labels.SPOT: "true"})[0]
    kube.add_pod(other)
    kube.bind("team-a", "still-running", nodes[0])
    outcome = provision(gke, kube, pod)
    assert outcome.result == REFUSED
    assert outcome.why.endswith(
        "is not replaced: 1 JobSet pod(s) run on it, and a pool is never replaced under a workload"
    )
    assert gke.count("delete") == 0
    assert not any(kube.nodes[n]["spec"].get("unschedulable") for n in nodes)
    refused = [e for e in kube.events if e["reason"] == labels.REASON_REFUSED]
    assert {e["kind"] for e in refused} == {"Pod", "JobSet"}
    assert all("cloud.google.com/gke-spot=true" in e["message"] for e in refused)


def test_a_pool_still_being_created_is_replaced_later(gke, kube):
    provision(gke, kube, admit(kube, {})[0])  # PROVISIONING
    outcome = provision(gke, kube, admit(kube, {labels.ZONE: "us-east5-b", "team": "b"})[0])
    assert outcome.result == WAITING and "replaced once it is RUNNING" in outcome.why
    assert gke.count("delete") == 0


def test_a_pool_handed_to_another_jobset_is_not_replaced(gke, kube):
    provision(gke, kube, admit(kube, {})[0])
    (name,) = gke.managed_names(CLUSTER)
    pool = gke.pools[CLUSTER][name]
    gke.pools[CLUSTER][name] = dataclasses.replace(
        pool, status=STATUS_RUNNING, labels={**pool.labels, labels.OWNER_UID: "another-uid"}
    )
    outcome = provision(gke, kube, admit(kube, {labels.SPOT: "true"})[0])
    assert outcome.result == REFUSED and outcome.why.endswith("it is not this JobSet's own pool")
    assert gke.count("delete") == 0


def test_a_pool_that_still_fits_is_kept(gke, kube):
    provision(gke, kube, admit(kube, {labels.SPOT: "true", "team": "a"})[0])
    running_pool(gke, kube)
    outcome = provision(gke, kube, admit(kube, {labels.SPOT: "true", "team": "a"})[0])
    assert outcome.result == EXISTS
    assert gke.count("delete") == 0


def test_a_pool_labelled_for_another_slice_is_never_replaced_even_under_the_slices_name(gke, kube):
    # The pool of this slice's name carries another slice's identity (a name collision, or labels
    # moved by a handover): only a pool carrying this very slice (namespace, JobSet, uid, replicated
    # job, index) is ever deleted for it.
    provision(gke, kube, admit(kube, {})[0])
    (name,) = gke.managed_names(CLUSTER)
    pool = gke.pools[CLUSTER][name]
    for key, value in ((labels.OWNER_NAMESPACE, "team-b"), (labels.OWNER_JOB_INDEX, "3")):
        gke.pools[CLUSTER][name] = dataclasses.replace(
            pool, status=STATUS_RUNNING, labels={**pool.labels, key: value}
        )
        outcome = provision(gke, kube, admit(kube, {labels.SPOT: "true"})[0])
        assert outcome.result == REFUSED and outcome.why.endswith("it is not this JobSet's own pool")
    assert gke.count("delete") == 0
