"""Domain services over the stateful fakes: provision guardrails, release rules, reconcile sweep."""

import datetime

import pytest

from sandbox.jobsets import cpu_jobset, tpu_jobset
from sandbox.testing.fakes import FakeGke
from shared.core import labels
from shared.core.errors import TransientError
from shared.core.settings import Settings
from shared.provisioning.outcomes import CREATED, EXISTS, FAILED, REFUSED, SKIPPED
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler
from shared.provisioning.release.releaser import Releaser
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_ERROR, STATUS_RUNNING, NodePoolInfo

SETTINGS = Settings(unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c")
CLUSTER = SETTINGS.cluster_path


def now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


def ago(seconds):
    return (now() - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def submit(kube, jobset):
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    return pods


def provision_all(gke, kube, pods, settings=SETTINGS, ttl=0.0):
    service = Provisioner(Services(settings, gke, kube, known_pool_ttl=ttl))
    return [
        service.handle_pending_pod(p["metadata"]["namespace"], p["metadata"]["name"], now()) for p in pods
    ]


# --- provision ---------------------------------------------------------------------------------


def test_all_pods_of_two_slices_create_exactly_two_pools(gke, kube):
    pods = submit(kube, tpu_jobset("train", "team-a", replicas=2, topology="4x4", chips_per_vm=4))
    outcomes = provision_all(gke, kube, pods * 3)
    assert gke.count("create") == 2
    # The first pending pod requests every slice of its replicated job at once (see the next test).
    assert [o.result for o in outcomes].count(CREATED) == 1
    assert all(o.result in (CREATED, EXISTS) for o in outcomes)
    assert kube.reasons().count(labels.REASON_REQUESTED) == 2


def test_one_pending_pod_requests_every_slice_of_its_replicated_job(gke, kube):
    # With exclusive placement a Job may land on a sibling's pool; if only "own" pools were made on
    # demand, a Job whose pool was taken would wait forever. Pools must always equal slices.
    pods = submit(kube, tpu_jobset("train", "team-a", replicas=3, topology="2x2", chips_per_vm=4))
    provision_all(gke, kube, pods[:1])
    assert len(gke.managed_names(CLUSTER)) == 3
    assert sorted(
        gke.pools[CLUSTER][n].labels[labels.OWNER_JOB_INDEX] for n in gke.managed_names(CLUSTER)
    ) == ["0", "1", "2"]


def test_forged_pod_claiming_another_uid_is_refused(gke, kube):
    pods = submit(kube, tpu_jobset("train", "team-a", replicas=1))
    pod = pods[0]
    pod["metadata"]["labels"][labels.JOBSET_UID] = "00000000-0000-4000-8000-000000000000"
    kube.add_pod(pod)
    outcome = provision_all(gke, kube, [pod])[0]
    assert outcome.result == REFUSED and "uid" in outcome.why and gke.count("create") == 0


def test_pod_of_a_missing_jobset_creates_nothing(gke, kube):
    pods = submit(kube, tpu_jobset("train", "team-a", replicas=1))
    kube.jobsets.clear()
    assert provision_all(gke, kube, pods[:1])[0].result == SKIPPED and gke.count("create") == 0


def test_at_most_two_reads_per_event(gke, kube):
    pods = submit(kube, tpu_jobset("train", "team-a", replicas=2))
    # As deployed: the instance remembers pools it made, so duplicates cost the pod read only.
    provision_all(gke, kube, pods * 3, ttl=30.0)
    assert kube.reads + gke.count("list") <= 2 * len(pods) * 3


@pytest.mark.parametrize(
    ("channel", "auto_upgrade"),
    [("REGULAR", True), ("", False)],
    ids=["release-channel-auto-upgrade-on", "no-channel-auto-upgrade-off"],
)
def test_cluster_is_read_once_per_instance_and_decides_upgrades(kube, channel, auto_upgrade):
    gke = FakeGke(release_channel=channel)
    pods = submit(kube, tpu_jobset("train", "team-a", replicas=2))
    provision_all(gke, kube, pods * 2)
    assert gke.count("get_cluster") == 1
    assert gke.count("create") == 2
    assert {spec.auto_upgrade for spec in gke.specs.values()} == {auto_upgrade}
    assert {spec.auto_repair for spec in gke.specs.values()} == {True}


def test_failed_cluster_read_is_retried_by_redelivery_and_not_cached(kube):
    gke = FakeGke()
    pods = submit(kube, tpu_jobset("t", "team-a", replicas=1))
    service = Provisioner(Services(SETTINGS, gke, kube))
    gke.fail("get_cluster", "unavailable")
    name = pods[0]["metadata"]["name"]
    with pytest.raises(TransientError):
        service.handle_pending_pod("team-a", name, now())
    assert service.handle_pending_pod("team-a", name, now()).result == CREATED
    assert gke.count("get_cluster") == 2 and gke.count("create") == 1


def test_spot_with_reservation_is_refused_on_the_pod_and_the_jobset_that_declares_it(gke, kube):
    selectors = {labels.SPOT: "true", labels.RESERVATION_NAME: "res-1"}
    pods = submit(kube, tpu_jobset("t", "team-a", replicas=1, selectors=selectors))
    outcome = provision_all(gke, kube, pods[:1])[0]
    assert outcome.result == REFUSED and "Spot VMs cannot consume reservations" in outcome.why
    # The JobSet's own template selects both, so `kubectl describe jobset` says so too.
    assert kube.reasons() == [labels.REASON_REFUSED] * 2 and gke.count("create") == 0


def test_concurrent_create_409_is_success(gke, kube):
    pods = submit(kube, tpu_jobset("train", "team-a", replicas=1))
    service = Provisioner(Services(SETTINGS, gke, kube))
    stale = gke.list_node_pools(CLUSTER)  # an instance that listed before the other one created
    assert service.provision_pod(kube.get_pod("team-a", pods[0]["metadata"]["name"]), stale).result == CREATED
    outcome = service.provision_pod(kube.get_pod("team-a", pods[1]["metadata"]["name"]), stale)
    assert outcome.result == EXISTS and "409" in outcome.why


def test_old_event_and_missing_pod_are_skipped(gke, kube):
    service = Provisioner(Services(SETTINGS, gke, kube))
    old = now() - datetime.timedelta(seconds=SETTINGS.max_event_age_seconds + 5)
    assert service.handle_pending_pod("team-a", "x", old).result == SKIPPED
    assert service.handle_pending_pod("team-a", "gone", now()).result == SKIPPED
    assert gke.calls == []


def test_non_tpu_jobset_pod_creates_nothing(gke, kube):
    pods = submit(kube, cpu_jobset("cpu"))
    assert [o.result for o in provision_all(gke, kube, pods)] == [SKIPPED]
    assert gke.count("create") == 0


@pytest.mark.parametrize(
    ("settings", "jobset", "why"),
    [
        (SETTINGS.with_overrides(drain=True), tpu_jobset("t", "team-a"), "drain"),
        (
            SETTINGS.with_overrides(namespace_allowlist=("ml",)),
            tpu_jobset("t", "team-a"),
            "NAMESPACE_ALLOWLIST",
        ),
        (
            SETTINGS.with_overrides(allowed_accelerators=("tpu-v5p-slice",)),
            tpu_jobset("t", "team-a"),
            "ALLOWED_ACCELERATORS",
        ),
        (
            SETTINGS.with_overrides(max_chips_per_slice=8),
            tpu_jobset("t", "team-a", topology="4x4"),
            "MAX_CHIPS_PER_SLICE",
        ),
        (
            SETTINGS.with_overrides(chip_budget=20),
            tpu_jobset("t", "team-a", replicas=2, topology="4x4"),
            "budget",
        ),
        (SETTINGS, tpu_jobset("t", "team-a", accelerator="tpu-v6e-slice", topology="3x3"), "3x3"),
    ],
    ids=["drain", "namespace", "accelerator", "chips-per-slice", "budget", "bad-topology"],
)
def test_guardrails_refuse_with_event_and_no_create(gke, kube, settings, jobset, why):
    pods = submit(kube, jobset)
    outcomes = provision_all(gke, kube, pods, settings)
    refused = [o for o in outcomes if o.result == REFUSED]
    assert refused and all(why in o.why for o in refused)
    events = [e for e in kube.events if e["reason"] == labels.REASON_REFUSED]
    assert events and why in events[0]["message"] and events[0]["type"] == "Warning"
    if why == "budget":
        assert gke.count("create") == 1  # the first 16-chip slice fits in 20, the second does not
    else:
        assert gke.count("create") == 0


def test_gke_rejection_is_reported_and_acked(gke, kube):
    pods = submit(kube, tpu_jobset("t", "team-a", replicas=1))
    gke.fail("create", "rejected")
    assert provision_all(gke, kube, pods[:1])[0].result == FAILED
    assert kube.reasons() == [labels.REASON_FAILED]


@pytest.mark.parametrize("kind", ["429", "incompatible", "unavailable"])
def test_transient_gke_errors_raise_for_redelivery(gke, kube, kind):
    pods = submit(kube, tpu_jobset("t", "team-a", replicas=1))
    gke.fail("create", kind)
    with pytest.raises(TransientError):
        provision_all(gke, kube, pods[:1])
    assert provision_all(gke, kube, pods[:1])[0].result == CREATED


def test_failed_scheduling_read_before_its_condition_comes_back(gke, kube):
    # kube-scheduler's Event can reach the sink before its PodScheduled patch reaches the pod.
    (pod, *_) = submit(kube, tpu_jobset("train", "team-a", replicas=1, topology="2x2", chips_per_vm=4))
    conditions = pod["status"].pop("conditions")
    with pytest.raises(TransientError, match="before the scheduler's PodScheduled condition"):
        provision_all(gke, kube, [pod])
    assert gke.calls == []
    pod["status"]["conditions"] = conditions  # the scheduler's patch lands; the redelivery creates
    assert [o.result for o in provision_all(gke, kube, [pod])] == [CREATED]
    pod["spec"]["nodeName"] = "n1"
    del pod["status"]["conditions"]
    assert provision_all(gke, kube, [pod])[0].result == SKIPPED  # bound meanwhile: nothing to wait for


def test_kube_down_raises_transient(gke, kube):
    kube.down = True
    with pytest.raises(TransientError):
        Provisioner(Services(SETTINGS, gke, kube)).handle_pending_pod("team-a", "p", now())


# --- release -----------------------------------------------------------------------------------


def finish(jobset, kind="Completed", when=None):
    jobset["status"] = {
        "conditions": [{"type": kind, "status": "True", "reason": "x", "lastTransitionTime": when or ago(60)}]
    }
    return jobset


def running_pools(gke, kube, jobset):
    provision_all(gke, kube, submit(kube, jobset))
    for name in gke.managed_names(CLUSTER):
        gke.mark(CLUSTER, name, STATUS_RUNNING)


def unmanaged(gke):
    gke.add(
        CLUSTER,
        NodePoolInfo(
            name="default-pool", status=STATUS_RUNNING, machine_type="e2-standard-4", node_count=3, labels={}
        ),
    )


def test_completed_jobset_releases_exactly_its_pools(gke, kube):
    a, b = tpu_jobset("a", "team-a"), tpu_jobset("b", "team-a")
    running_pools(gke, kube, a)
    running_pools(gke, kube, b)
    unmanaged(gke)
    finish(kube.jobsets[("team-a", "a")])
    deleted = Releaser(SETTINGS, gke, kube).release("team-a", "a", a["metadata"]["uid"], "test")
    assert len(deleted) == 2
    left = gke.managed_names(CLUSTER)
    assert "default-pool" in left and len(left) == 3
    assert kube.reasons()[-1] == labels.REASON_RELEASED


def test_running_jobset_with_forged_finished_event_keeps_pools(gke, kube):
    a = tpu_jobset("a", "team-a")
    running_pools(gke, kube, a)
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "forged") == []
    assert gke.count("delete") == 0


def test_deleted_jobset_releases_pools_and_redelivery_is_harmless(gke, kube):
    a = tpu_jobset("a", "team-a")
    running_pools(gke, kube, a)
    del kube.jobsets[("team-a", "a")]
    releaser = Releaser(SETTINGS, gke, kube)
    assert len(releaser.release("team-a", "a", "", "deleted")) == 2
    assert releaser.release("team-a", "a", "", "deleted") == []
    assert gke.count("delete") == 2


def test_name_reused_with_new_uid_deletes_only_old_pools(gke, kube):
    old = tpu_jobset("a", "team-a", replicas=1)
    running_pools(gke, kube, old)
    new = tpu_jobset("a", "team-a", replicas=1)
    kube.pods.clear()
    running_pools(gke, kube, new)
    assert len(gke.managed_names(CLUSTER)) == 2
    deleted = Releaser(SETTINGS, gke, kube).release("team-a", "a", old["metadata"]["uid"], "old finished")
    assert len(deleted) == 1
    remaining = gke.pools[CLUSTER][gke.managed_names(CLUSTER)[0]]
    assert remaining.labels[labels.OWNER_UID] == new["metadata"]["uid"]


def test_release_grace_keeps_recently_completed(gke, kube):
    a = tpu_jobset("a", "team-a", replicas=1)
    running_pools(gke, kube, a)
    finish(kube.jobsets[("team-a", "a")], when=ago(10))
    settings = SETTINGS.with_overrides(release_grace_seconds=300)
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "completed") == []
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "completed") != []


def test_transient_delete_errors_raise_after_trying_all(gke, kube):
    a = tpu_jobset("a", "team-a")
    running_pools(gke, kube, a)
    del kube.jobsets[("team-a", "a")]
    gke.fail("delete", "incompatible")
    with pytest.raises(TransientError):
        Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "deleted")
    assert len(gke.managed_names(CLUSTER)) == 1  # the second pool was still deleted
    assert len(Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "deleted")) == 1


# --- reconcile ---------------------------------------------------------------------------------


def test_reconcile_cleans_orphans_terminal_suspended_and_error_pools(gke, kube):
    for name in ("orphan", "done", "susp", "young-susp", "live", "broken"):
        running_pools(gke, kube, tpu_jobset(name, "team-a", replicas=1))
    unmanaged(gke)
    kube.pods.clear()
    del kube.jobsets[("team-a", "orphan")]
    finish(kube.jobsets[("team-a", "done")], "Failed")
    for name, since in (("susp", 3600), ("young-susp", 5)):
        js = kube.jobsets[("team-a", name)]
        js["spec"]["suspend"] = True
        js["status"] = {
            "conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": ago(since)}]
        }
    broken = next(n for n, p in gke.pools[CLUSTER].items() if p.labels.get(labels.OWNER_NAME) == "broken")
    gke.mark(CLUSTER, broken, STATUS_ERROR, "ZONE_RESOURCE_POOL_EXHAUSTED: no capacity")

    # Without a stockout backoff the ERROR pool is recycled at the first sweep (the old behaviour).
    summary = Reconciler(Services(SETTINGS.with_overrides(stockout_backoff_seconds=0), gke, kube)).sweep()

    owners = sorted(p.labels.get(labels.OWNER_NAME, "-") for p in gke.pools[CLUSTER].values())
    assert owners == ["-", "live", "young-susp"]
    assert (summary.pools_seen, summary.deleted, summary.healed, summary.requested) == (6, 4, 1, 0)
    failed = [e for e in kube.events if e["reason"] == labels.REASON_FAILED]
    assert failed and "ZONE_RESOURCE_POOL_EXHAUSTED" in failed[0]["message"] and failed[0]["name"] == "broken"


def test_reconcile_requests_missed_creations_once_per_slice(gke, kube):
    submit(kube, tpu_jobset("lost", "team-a", replicas=2))
    summary = Reconciler(Services(SETTINGS, gke, kube)).sweep()
    assert summary.requested == 2 and gke.count("create") == 2
    assert Reconciler(Services(SETTINGS, gke, kube)).sweep().requested == 0
    assert gke.count("create") == 2


def test_reconcile_in_drain_mode_cleans_but_never_creates(gke, kube):
    running_pools(gke, kube, tpu_jobset("orphan", "team-a", replicas=1))
    del kube.jobsets[("team-a", "orphan")]
    submit(kube, tpu_jobset("lost", "team-a", replicas=1))
    summary = Reconciler(Services(SETTINGS.with_overrides(drain=True), gke, kube)).sweep()
    assert (summary.deleted, summary.requested) == (1, 0)
    assert gke.count("create") == 1  # only the one made before drain


def test_reconcile_never_touches_unmanaged_pools(gke, kube):
    unmanaged(gke)
    gke.add(
        CLUSTER,
        NodePoolInfo(
            name="their-tpus",
            status=STATUS_ERROR,
            machine_type="ct6e-standard-4t",
            node_count=4,
            labels={"team": "x"},
        ),
    )
    assert Reconciler(Services(SETTINGS, gke, kube)).sweep().deleted == 0
    assert gke.count("delete") == 0


# --- one service graph per instance -----------------------------------------------------------------


def test_one_instance_builds_its_services_once_and_every_orchestrator_shares_them(gke, kube):
    # As a controller's main wires its reconcilers: one account of GKE's operation slots and request
    # quota (two would each spend GKE_REQUESTS_PER_MINUTE), one backoff, fallback and releaser.
    from shared.app import entry, handlers
    from shared.provisioning.create.policies import WorkloadPolicies

    runtime = entry.Runtime(SETTINGS)
    runtime._cache.update({"gke": gke, "kube": kube, "service:policies": WorkloadPolicies(SETTINGS, None)})  # type: ignore[arg-type]
    provision = handlers.provisioner(runtime)
    check = handlers.admission_checker(runtime)
    sweep = handlers.reconciler(runtime)
    assert provision.slots is check.pools.slots is sweep.provisioner.slots
    assert provision.backoff is check.backoff is sweep.backoff
    assert provision.fallback is check.fallback is sweep.provisioner.fallback
    assert provision.handover.releaser is check.pools.releaser is sweep.releaser is handlers.releaser(runtime)
    assert provision.known_pools is sweep.provisioner.known_pools
    # and each orchestrator itself once per instance
    assert handlers.provisioner(runtime) is provision and handlers.admission_checker(runtime) is check


def test_each_fleet_cluster_has_its_own_service_graph_and_an_outsider_none(gke, kube):
    # GKE counts operations and request quota per cluster: one cluster's slots, backoffs and
    # learnt limits must not be another's. The GKE client itself names the cluster in every call.
    from shared.app import entry, handlers

    second = "projects/p2/locations/us-east5-b/clusters/second"
    runtime = entry.Runtime(SETTINGS.with_overrides(fleet_clusters=(second,)))
    runtime._cache.update({"gke": gke, "kube": kube})
    member = runtime.member(second)
    assert member is not None and runtime.member(SETTINGS.cluster_path) is runtime
    assert member.member(second) is member and runtime.members() == [runtime, member]
    assert member.settings.cluster_path == second and member.gke() is gke
    assert runtime.member("projects/p/locations/l/clusters/unknown") is None
    member._cache["kube"] = kube
    mine, theirs = handlers.provisioner(runtime), handlers.provisioner(member)
    assert mine is not theirs and mine.slots is not theirs.slots and mine.backoff is not theirs.backoff


def test_events_of_clusters_outside_the_fleet_are_counted_in_bounded_memory():
    from shared.app import entry

    runtime = entry.Runtime(SETTINGS)
    for n in range(entry.OUTSIDERS_KEPT + 50):
        runtime.outsider(f"projects/x/locations/l/clusters/c{n}")
    assert runtime.outsider("projects/x/locations/l/clusters/c0") == 2  # still counted by name
    assert len(runtime.outsiders) == entry.OUTSIDERS_KEPT + 1  # the rest under "other"
    assert runtime.outsiders["other"] == 50
