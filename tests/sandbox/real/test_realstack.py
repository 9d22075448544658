"""The product end to end on the real components (``RealStack``): one stack for the module.

GKE's "TPU Multislice with JobSet and Kueue" flow runs first: the product's ``setup_cluster``
installs the unmodified JobSet and Kueue releases, ``apply_kueue`` the default queues, and three
queued JobSets run on pools ``provision`` creates from the real scheduler's ``FailedScheduling``
Events, exported through the ``sinks/`` filters. Then scenarios ported from the stand-in stack.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.kube import nodes, rbac
from sandbox.kube.kwok import FAIL_UNTIL_ATTEMPT
from sandbox.realstack import demo
from sandbox.realstack.core import RealStack
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from sandbox.testing.stack import condition, events_about, restarts, workload
from shared.app.deployment import RetryPolicy
from shared.core import labels

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
# A preempted JobSet's pools are up for release a second after Kueue suspends it (infra: minutes).
SUSPEND_GRACE = 1
CONFIG = StackConfig(
    functions=ALL_FUNCTIONS,
    function_env={"SUSPEND_GRACE_SECONDS": str(SUSPEND_GRACE)},
    gke_op_delay=1.0,
    # Redelivery within seconds, as REAL_FAST gives the other scenario modules.
    retry=RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4),
)


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    with RealStack(CONFIG) as running:
        yield running


@pytest.fixture(scope="module")
def outcome(stack: RealStack) -> demo.Outcome:
    return demo.run(stack, run_seconds=5, timeout=420)


JOBSETS = f"/apis/{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}/namespaces/default/jobsets"


@pytest.fixture(autouse=True)
def contained(request: pytest.FixtureRequest, stack: RealStack) -> Iterator[None]:
    """A test that fails leaves its JobSets, their pods and pools on the module's one stack, where the
    next test of the same shape would land on them (an adoption where it asserts a create): its
    JobSets are deleted and their pools waited out, so one failure reads as one."""
    api = stack.kube_cluster.client()
    before = {str(j["metadata"]["name"]) for j in api.list(JOBSETS)}
    failed = request.session.testsfailed  # a failed call is counted before its fixtures tear down
    yield
    if request.session.testsfailed == failed:
        return
    left = sorted({str(j["metadata"]["name"]) for j in api.list(JOBSETS)} - before)
    for name in left:
        stack.delete_jobset("default", name)
    try:
        stack.wait_for(lambda: not any(_owned(stack, n) for n in left), 180, f"the pools of {left} to go")
    except TimeoutError as exc:
        print(f"after the failure, not cleared: {exc}")


def test_the_multislice_kueue_flow_runs_on_the_real_components(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    assert outcome.problems == []
    assert outcome.states == {name: "Completed" for name, _ in demo.JOBSETS}
    summary = outcome.summary
    # The 3-slice JobSet's three pools, handed over to the next two JobSets, then deleted. When the
    # next JobSets' pods pend before the first one's pools are free, provision may create more (as
    # the stand-in's flow allows too); every pool created is deleted.
    assert summary.pools_created >= 3
    assert summary.pools_deleted == summary.pools_created
    assert summary.pools_leaked == []
    assert summary.pools_adopted >= 1
    assert summary.pods_killed == 0


def test_the_queued_jobsets_ran_on_the_first_ones_pools_once_each(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """Ported from tests/sandbox/test_kueue_flow.py (the same three JobSets; there the simulated
    Kueue admitted them): the real Kueue admitted each once (its ``Started`` Event on the JobSet)
    and finished its Workload; the queued JobSets adopted the first one's pools, which it handed
    over, and none restarted."""
    names = [name for name, _ in demo.JOBSETS]
    assert {name: restarts(stack, name) for name in names} == dict.fromkeys(names, 0)
    adopters = {e["involvedObject"]["name"] for e in stack.events(labels.REASON_ADOPTED, "default")}
    assert adopters and adopters <= {"multislice-1", "multislice-2"}, adopters
    handed = [e["message"] for e in events_about(stack, labels.REASON_RELEASED, "multislice-3")]
    assert any("handed node pool" in m for m in handed), handed
    started = [
        e["involvedObject"]["name"]
        for e in stack.events("Started", "default")
        if e["involvedObject"].get("kind") == "JobSet" and e["involvedObject"]["name"] in names
    ]
    assert sorted(started) == sorted(names)  # each admitted exactly once
    for name in names:
        assert condition(workload(stack, name), "Finished"), name


def test_each_pool_is_released_by_the_jobset_that_ran_on_it_last(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """#30: the real scheduler often puts a queued JobSet's slice on a pool made or held for another
    of the same shape. Whatever the swaps, every pool a tutorial JobSet ran on is deleted by the
    release of the JobSet that ran there last, and that JobSet's ``TPUSliceReleased`` Event names it
    (the README's promise: ``kubectl describe jobset`` says where it ran)."""
    names = {name for name, _ in demo.JOBSETS}
    prefix = f"gke-{stack.config.cluster_name}-"
    last: dict[str, tuple[str, str]] = {}  # pool -> (the latest pod start there, its JobSet)
    for pod in stack.kube_cluster.client().list("/api/v1/namespaces/default/pods"):
        jobset = (pod["metadata"].get("labels") or {}).get(labels.JOBSET_NAME, "")
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if jobset not in names or not node.startswith(prefix):
            continue
        pool = node[len(prefix) :].rsplit("-", 1)[0]
        started = str((pod.get("status") or {}).get("startTime") or "")
        last[pool] = max(last.get(pool, ("", "")), (started, jobset))
    assert len(last) >= 3, last

    def unnamed() -> dict[str, str]:
        released: dict[str, set[str]] = {name: set() for name in names}
        for event in stack.events(labels.REASON_RELEASED, "default"):
            involved, message = event["involvedObject"], str(event["message"])
            elsewhere = involved.get("kind") != "JobSet" or involved["name"] not in names
            if not elsewhere and message.startswith("released node pools "):
                listed = message.removeprefix("released node pools ").split(":", 1)[0]
                released[involved["name"]].update(listed.split(", "))
        return {pool: jobset for pool, (_, jobset) in last.items() if pool not in released[jobset]}

    try:
        stack.wait_for(lambda: not unnamed(), 60, "each pool named by the JobSet that ran there last")
    except TimeoutError as exc:
        raise AssertionError(f"not named in its last user's release: {unnamed()}") from exc


def test_setup_cluster_installed_both_releases_unmodified(stack: RealStack, outcome: demo.Outcome) -> None:
    components = {d.get("component"): d for d in stack.decisions("setup.component", function="setup_cluster")}
    assert set(components) >= {"jobset", "kueue"}
    api = stack.kube_cluster.client()
    for ns, name in (
        ("jobset-system", "jobset-controller-manager"),
        ("kueue-system", "kueue-controller-manager"),
    ):
        deployment = api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
        assert deployment is not None
        # As the release asks: one replica, Available (KWOK plays its pod on the default pool).
        assert deployment["spec"]["replicas"] == 1
        assert deployment["status"].get("availableReplicas") == 1
    # Every webhook the release pointed at its Service now points at the local controller.
    assert stack.releases is not None
    hooks = {r.split("/", 1)[1] for r in stack.releases.repointed if r.startswith("mutating")}
    assert {"jobset-mutating-webhook-configuration", "kueue-mutating-webhook-configuration"} <= hooks


def test_the_real_schedulers_failed_scheduling_reached_provision_through_the_sink(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    assert stack.router is not None
    routed = [r for r in stack.router.routed if r.sink == "pending-tpu-pods"]
    scheduler = [
        r
        for r in routed
        if r.entry["jsonPayload"].get("reason") == "FailedScheduling"
        and r.entry["jsonPayload"].get("reportingComponent") == "default-scheduler"
    ]
    assert scheduler, [r.entry["jsonPayload"] for r in routed][:3]
    entry = scheduler[0].entry
    assert entry["resource"]["type"] == "k8s_pod"
    assert entry["labels"]["logging.gke.io/top_level_controller_type"] == "JobSet"
    assert len(stack.decisions("provision.created")) >= 3


def test_a_release_whose_role_lacks_node_update_gets_the_real_403_and_deletes_nothing(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """Ported from tests/sandbox/test_permissions.py. There the stand-in API checked the caller's
    IAM role; here the role is the function's ClusterRole in the real API server, re-applied with
    one permission fewer, and RBAC refuses the cordon."""
    permissions = [p for p in stack.kube_cluster.roles["release"] if p != "container.nodes.update"]
    api = stack.kube_cluster.client()
    api.apply_all(rbac.objects_for("release", permissions))
    name = "denied"
    try:
        jobset = demo.queued_jobset(name, 1, run_seconds=3)
        jobset["metadata"]["labels"] = {}  # not queued: straight to the scheduler
        stack.submit(jobset)
        stack.wait_for(lambda: stack.jobset_state("default", name) == "Completed", 180, f"{name} to complete")
        user = rbac.user_name("release")
        refusal = f'User "{user}" cannot patch resource "nodes" in API group "" at the cluster scope'

        def refused() -> list[dict[str, object]]:
            return [d for d in stack.decisions(function="release") if refusal in str(d.get("message"))]

        # Upstream RBAC's text, without the "requires one of [...]" GKE's IAM authorizer appends:
        # the product cannot name the permission, so it takes the 403 for a retry, never a delete.
        stack.wait_for(refused, 60, "release to meet the API server's 403")
        assert "HTTP 403" in str(refused()[0]["message"])
        owned = [
            p
            for p in stack.managed_pools()
            if ((p.get("config") or {}).get("labels") or {}).get(labels.OWNER_NAME) == name
        ]
        assert len(owned) == 1, "the pool was deleted although release could not cordon it"
    finally:
        api.apply_all(rbac.objects_for("release", stack.kube_cluster.roles["release"]))
    # Pub/Sub redelivers the terminal Event's message; with the role whole again the pool goes.
    stack.wait_for(
        lambda: (
            not [
                p
                for p in stack.managed_pools()
                if ((p.get("config") or {}).get("labels") or {}).get(labels.OWNER_NAME) == name
            ]
        ),
        90,
        f"{name}'s pool to be released",
    )
    assert stack.summary().pods_killed == 0


def test_deleting_a_running_jobset_releases_its_pool_through_the_audit_log(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """Ported from the stand-in's deletion scenario. There the router saw the delete in the kmock
    store; here the API server's audit log records it (GKE's policy: JobSet deletions) and the
    router turns that record into the Admin Activity entry the jobset-lifecycle sink exports."""
    name = "deleted-midway"
    jobset = demo.queued_jobset(name, 1, run_seconds=600)
    jobset["metadata"]["labels"] = {}
    stack.submit(jobset)
    api = stack.kube_cluster.client()
    selector = f"{labels.JOBSET_NAME}={name}"

    def running() -> bool:
        pods = api.list("/api/v1/namespaces/default/pods", label_selector=selector)
        return len(pods) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in pods)

    stack.wait_for(running, 120, f"{name}'s pods to run on their pool")
    assert stack.delete_jobset("default", name)
    assert stack.router is not None

    def audited() -> list[object]:
        return [
            r
            for r in stack.router.routed  # type: ignore[union-attr]
            if r.sink == "jobset-lifecycle"
            and str(r.entry.get("protoPayload", {}).get("resourceName", "")).endswith(f"/jobsets/{name}")
        ]

    stack.wait_for(audited, 30, "the audited deletion to be exported")
    stack.wait_for(
        lambda: (
            not [
                p
                for p in stack.managed_pools()
                if ((p.get("config") or {}).get("labels") or {}).get(labels.OWNER_NAME) == name
            ]
        ),
        120,
        f"{name}'s pool to be deleted",
    )
    # The pool went only after the JobSet's pods had: the pod GC failed none of them.
    assert stack.summary().pods_killed == 0


def _owned(stack: RealStack, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in stack.managed_pools()
        if ((p.get("config") or {}).get("labels") or {}).get(labels.OWNER_NAME) == name
    ]


def _creates(stack: RealStack, name: str) -> list[dict[str, object]]:
    return [d for d in stack.decisions("provision.created") if f"default/{name} " in str(d.get("slice"))]


def test_a_restart_under_the_failure_policy_keeps_and_reuses_the_pool(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """Ported from tests/sandbox/test_flow.py. There the simulated JobSet controller restarted the
    JobSet; here the real one does (maxRestarts), after KWOK fails attempt 0's pods."""
    name = "again"
    jobset = demo.queued_jobset(name, 1, run_seconds=3)
    jobset["metadata"]["labels"] = {}
    jobset["spec"]["failurePolicy"] = {"maxRestarts": 2}
    template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    template["metadata"]["annotations"][FAIL_UNTIL_ATTEMPT] = "1"  # attempt 0 fails
    stack.submit(jobset)
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Completed", 180, f"{name} to complete")
    stored = stack.jobset("default", name) or {}
    assert stored["status"]["restarts"] == 1
    stack.wait_for(lambda: not _owned(stack, name), 120, f"{name}'s pool to be released")
    assert len(_creates(stack, name)) == 1  # one pool for the slice across both attempts
    assert stack.summary().pods_killed == 0


def test_lost_pending_events_are_recovered_by_reconcile(stack: RealStack, outcome: demo.Outcome) -> None:
    """Ported from tests/sandbox/test_flow.py: the sink's exports of the real scheduler's
    FailedScheduling for this JobSet's pods are lost; the reconcile tick finds the pending pods."""
    assert stack.router is not None
    name = "lost"

    def is_lost_pod_event(entry: Mapping[str, Any]) -> bool:
        involved = (entry.get("jsonPayload") or {}).get("involvedObject") or {}
        return str(involved.get("name", "")).startswith(f"{name}-")

    stack.router.drop_next(is_lost_pod_event, times=10_000)
    jobset = demo.queued_jobset(name, 1, run_seconds=3)
    jobset["metadata"]["labels"] = {}
    stack.submit(jobset)
    stack.wait_for(lambda: stack.router.dropped if stack.router else [], 60, "an export to be lost")
    assert _creates(stack, name) == []  # nobody heard about the pending pods
    stack.trigger_reconcile()
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Completed", 180, f"{name} to complete")
    stack.wait_for(lambda: not _owned(stack, name), 120, f"{name}'s pool to be released")
    assert {d["function"] for d in _creates(stack, name)} == {"reconcile"}
    assert stack.summary().pods_killed == 0


def test_a_spot_stockout_falls_back_to_on_demand(stack: RealStack, outcome: demo.Outcome) -> None:
    """Ported from tests/sandbox/test_capacity_flow.py. The stockout is the GKE emulator's, as
    there; what changed is where the user reads the outcome: the real API server's Events on the
    JobSet (``kubectl describe jobset``), written by provision with its own RBAC role."""
    zone = stack.config.location
    name = "fallback"
    stack.gke.set_capacity(zone, "spot", 0)  # no Spot TPUs in the slice's zone
    try:
        jobset = demo.queued_jobset(name, 1, run_seconds=3)
        jobset["metadata"]["labels"] = {}
        jobset["metadata"]["annotations"][labels.CAPACITY_POLICY] = "spot, on-demand"
        stack.submit(jobset)
        stack.wait_for(lambda: stack.jobset_state("default", name) == "Completed", 180, f"{name} to complete")
    finally:
        stack.gke.set_capacity(zone, "spot", None)
    api = stack.kube_cluster.client()
    failed = [
        str(e.get("message"))
        for e in api.list(
            "/api/v1/namespaces/default/events",
            field_selector=f"involvedObject.kind=JobSet,involvedObject.name={name},reason={labels.REASON_FAILED}",
        )
    ]
    assert failed and all(f"falling back to on-demand@{zone} now" in m for m in failed), failed
    assert any("ZONE_RESOURCE_POOL_EXHAUSTED" in m for m in failed), failed
    # GKE accepted two creates of the slice's pool: the Spot one that stocked out, then on-demand.
    assert len(_creates(stack, name)) == 2
    stack.wait_for(lambda: not _owned(stack, name), 120, f"{name}'s pool to be released")
    assert stack.summary().pods_killed == 0


def test_a_jobset_recreated_under_the_same_name_never_loses_a_pod(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """Ported from tests/sandbox/test_occupancy_flow.py. There the stand-in API assigned the uid and
    the simulated garbage collector removed the old pods; here the real API server and its garbage
    collector do, while the new incarnation's pods may already wait for the old pools."""
    name = "reborn"
    api = stack.kube_cluster.client()
    selector = f"{labels.JOBSET_NAME}={name}"

    def pods() -> list[dict[str, Any]]:
        return api.list("/api/v1/namespaces/default/pods", label_selector=selector)

    first = demo.queued_jobset(name, 2, run_seconds=600)
    first["metadata"]["labels"] = {}
    old_uid = stack.submit(first)["metadata"]["uid"]
    stack.wait_for(
        lambda: len([p for p in pods() if (p.get("status") or {}).get("phase") == "Running"]) == 4,
        120,
        "the first incarnation to run",
    )
    old_pools = {str(p["name"]) for p in _owned(stack, name)}
    assert len(old_pools) == 2
    assert stack.delete_jobset("default", name)
    stack.wait_for(lambda: stack.jobset("default", name) is None, 30, "the JobSet to be gone")
    second = demo.queued_jobset(name, 2, run_seconds=4)
    second["metadata"]["labels"] = {}
    new_uid = stack.submit(second)["metadata"]["uid"]
    assert new_uid != old_uid
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Completed", 180, "the second to complete")
    stack.wait_for(lambda: not _owned(stack, name), 120, f"{name}'s pools to be released")
    stack.wait_for(
        lambda: not {str(p["name"]) for p in stack.managed_pools()} & old_pools, 120, "the old pools to go"
    )
    assert {p["metadata"]["labels"][labels.JOBSET_UID] for p in pods()} == {new_uid}
    assert (stack.jobset("default", name) or {})["status"].get("restarts", 0) == 0
    assert stack.summary().pods_killed == 0


PREEMPT_QUEUES = f"""
flavors:
  - {{name: v5e-2x4, accelerator: {demo.ACCELERATOR}, topology: 2x4}}
clusterQueues:
  - name: preempt-cq
    preemption: {{withinClusterQueue: LowerPriority}}
    quota: {{v5e-2x4: 16}}
localQueues:
  - {{name: preempt, namespace: default, clusterQueue: preempt-cq}}
priorityClasses:
  - {{name: low, value: 100, kind: WorkloadPriorityClass}}
  - {{name: high, value: 1000, kind: WorkloadPriorityClass}}
"""


def test_a_same_shape_preemptor_adopts_the_victims_pools(stack: RealStack, outcome: demo.Outcome) -> None:
    """Ported from tests/sandbox/test_occupancy_flow.py. The simulated Kueue's preemption is now the
    real Kueue's (withinClusterQueue: LowerPriority): it evicts the victim, the real JobSet
    controller suspends it and removes its pods, the preemptor's pods land on the victim's pools."""
    demo.apply_queues(stack, PREEMPT_QUEUES, 60)
    api = stack.kube_cluster.client()

    def v5e(name: str, run_seconds: float, priority: str) -> dict[str, Any]:
        jobset = demo.queued_jobset(name, 2, run_seconds=run_seconds)
        jobset["metadata"]["labels"] = {demo.QUEUE_NAME_LABEL: "preempt", PRIORITY_CLASS: priority}
        return jobset

    def running(name: str) -> list[dict[str, Any]]:
        pods = api.list("/api/v1/namespaces/default/pods", label_selector=f"{labels.JOBSET_NAME}={name}")
        up = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
        return up if len(up) == 4 else []

    def pools_of(pods: list[dict[str, Any]]) -> set[str]:
        return {
            str(
                (api.get(f"/api/v1/nodes/{p['spec']['nodeName']}") or {})["metadata"]["labels"][
                    labels.NODEPOOL
                ]
            )
            for p in pods
        }

    stack.submit(v5e("victim", 600, "low"))
    victim_pools = pools_of(stack.wait_for(lambda: running("victim"), 120, "the victim to run"))
    assert len(victim_pools) == 2
    stack.submit(v5e("preemptor", 20, "high"))
    stack.wait_for(lambda: stack.jobset_state("default", "victim") == "Suspended", 60, "the preemption")
    landed = stack.wait_for(lambda: running("preemptor"), 120, "the preemptor to run")
    assert pools_of(landed) == victim_pools  # straight onto the victim's pools
    time.sleep(SUSPEND_GRACE + 0.5)  # the victim is now suspended past its grace
    stack.trigger_reconcile()
    stack.wait_for(
        lambda: {str(p["name"]) for p in _owned(stack, "preemptor")} == victim_pools,
        60,
        "the preemptor to adopt both pools",
    )
    assert stack.jobset_state("default", "preemptor") == "Running"
    stack.wait_for(lambda: stack.jobset_state("default", "preemptor") == "Completed", 120, "the preemptor")
    assert (stack.jobset("default", "preemptor") or {})["status"].get("restarts", 0) == 0
    assert _creates(stack, "preemptor") == []  # it never needed a pool of its own
    assert stack.delete_jobset("default", "victim")  # readmitted now; its 600 s are not waited for
    for name in ("victim", "preemptor"):
        stack.wait_for(lambda n=name: not _owned(stack, n), 120, f"{name}'s pools to be released")  # type: ignore[misc]
    assert stack.summary().pods_killed == 0


def test_a_tpu7x_multislice_gets_the_products_workload_policy_once(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """Ported from tests/sandbox/test_flow.py. The policy is the Compute emulator's, as there; the
    pool's Nodes now carry the topology its policy names (GKE has none on the pool) and the real
    scheduler places the 2x2x2 pods only on such Nodes."""
    name = "iron"
    inserts = stack.compute.count("insert")
    jobset = tpu_jobset(
        name,
        replicas=2,
        accelerator="tpu7x",
        topology="2x2x2",
        run_seconds=3,
        annotations={labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL},
    )
    jobset["metadata"].pop("uid", None)
    stack.submit(jobset)
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Completed", 180, f"{name} to complete")
    stack.wait_for(lambda: not _owned(stack, name), 120, f"{name}'s pools to be released")
    assert stack.compute.count("insert") == inserts + 1
    region = stack.config.location.rsplit("-", 1)[0]
    assert stack.compute.exists(stack.config.project, region, "tpuprov-tpu7x-2-2-2")
    assert len(_creates(stack, name)) == 2
    assert stack.summary().pods_killed == 0


def test_a_create_gke_refuses_once_is_redelivered_and_succeeds(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """Ported from tests/sandbox/test_faults.py: the fault is the GKE emulator's, as there; the
    pending pod that triggers the retry is the real scheduler's."""
    name = "flaky"
    fired = stack.gke.faults_fired("error:create")
    stack.gke.fail_next("create", 503, "The service is currently unavailable.")
    jobset = demo.queued_jobset(name, 1, run_seconds=3)
    jobset["metadata"]["labels"] = {}
    stack.submit(jobset)
    stack.wait_for(lambda: stack.jobset_state("default", name) == "Completed", 180, f"{name} to complete")
    stack.wait_for(lambda: not _owned(stack, name), 120, f"{name}'s pool to be released")
    assert stack.gke.faults_fired("error:create") == fired + 1
    deliveries = [d for d in stack.relay.deliveries if d.function == "provision"]
    refused = {d.message_id for d in deliveries if d.status == 503}
    assert refused and refused <= {d.message_id for d in deliveries if d.acked}
    assert len(_creates(stack, name)) == 1
    assert stack.summary().pods_killed == 0


def test_a_flex_start_slice_waits_for_capacity_without_failing(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """Ported from tests/sandbox/test_capacity_flow.py. The wait is the GKE emulator's capacity
    model, as there; the pods that pend meanwhile are the real scheduler's, and the Nodes appear
    when GKE grants the slice."""
    zone = stack.config.location
    name = "flex"
    api = stack.kube_cluster.client()
    stack.gke.set_capacity(zone, "flex-start", 0)  # none until the test says so
    try:
        jobset = demo.queued_jobset(name, 1, run_seconds=3)
        jobset["metadata"]["labels"] = {}
        template = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        template["spec"]["nodeSelector"][labels.FLEX_START] = "true"
        stack.submit(jobset)
        pools = stack.wait_for(
            lambda: [p for p in _owned(stack, name) if p.get("status") == "RUNNING"], 60, "a RUNNING pool"
        )
        pool = str(pools[0]["name"])
        assert (pools[0].get("config") or {}).get("flexStart") is True
        for _ in range(4):  # reconcile sweeps while GKE waits leave the pool alone
            stack.trigger_reconcile()
            time.sleep(0.5)
            assert api.list(nodes.NODES, label_selector=f"{labels.NODEPOOL}={pool}") == []
        phases = {
            (p.get("status") or {}).get("phase")
            for p in api.list(
                "/api/v1/namespaces/default/pods", label_selector=f"{labels.JOBSET_NAME}={name}"
            )
        }
        assert phases == {"Pending"}
    finally:
        stack.gke.set_capacity(zone, "flex-start", None)  # capacity arrives
    deadline = time.monotonic() + 180
    while stack.jobset_state("default", name) != "Completed":
        assert time.monotonic() < deadline, f"{name} did not complete"
        stack.trigger_reconcile()  # GKE looks at capacity when it is called
        time.sleep(1.0)
    stack.wait_for(lambda: not _owned(stack, name), 120, f"{name}'s pool to be released")
    failed = api.list(
        "/api/v1/namespaces/default/events",
        field_selector=f"involvedObject.name={name},reason={labels.REASON_FAILED}",
    )
    assert failed == []
    assert len(_creates(stack, name)) == 1
    assert stack.summary().pods_killed == 0


def test_pods_on_nodes_that_vanish_under_them_count_as_killed(
    stack: RealStack, outcome: demo.Outcome
) -> None:
    """The summary's kill count is read from the real pods: Nodes removed under running pods (as a
    pool deleted behind the product's back would) leave pods the pod GC is bound to fail."""
    name = "victim"
    jobset = demo.queued_jobset(name, 1, run_seconds=600)
    jobset["metadata"]["labels"] = {}
    stack.submit(jobset)
    api = stack.kube_cluster.client()
    selector = f"{labels.JOBSET_NAME}={name}"

    def running() -> list[dict[str, object]]:
        pods = api.list("/api/v1/namespaces/default/pods", label_selector=selector)
        ok = len(pods) == 2 and all((p.get("status") or {}).get("phase") == "Running" for p in pods)
        return pods if ok else []

    pods = stack.wait_for(running, 120, f"{name}'s pods to run")
    before = stack.summary().pods_killed
    node_names = {str(pod["spec"]["nodeName"]) for pod in pods}  # type: ignore[index]
    pools = {
        str((api.get(f"/api/v1/nodes/{n}") or {})["metadata"]["labels"][labels.NODEPOOL]) for n in node_names
    }
    for pool in pools:
        nodes.delete_pool_nodes(api, pool)
    assert stack.summary().pods_killed == before + 2
    stack.delete_jobset("default", name)
