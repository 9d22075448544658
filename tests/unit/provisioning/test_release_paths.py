"""Every release path over the stateful fakes: a pool a live JobSet runs on is adopted or kept, never deleted.

Release, reconcile (orphan, terminal, suspend grace, ERROR recycling) and uid mismatch all go through
``Releaser.dispose``; these tests put another JobSet's pod on the pool and check the pool survives
with the right owner, its nodes schedulable, and the decision visible as Events.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.errors import TransientError
from shared.provisioning.outcomes import CREATED, EXISTS
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler
from shared.provisioning.release.releaser import Releaser
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_ERROR, NodePoolInfo
from shared.tpu.slices import build_node_pool, slice_request
from tests.unit.provisioning.releases import (
    CLUSTER,
    SETTINGS,
    ago,
    events,
    finish,
    finished_beside_queued,
    land,
    now,
    owner,
    queue,
    schedulable,
    submit,
    suspend,
    with_pools,
)


def test_release_hands_a_pool_to_the_jobset_admitted_onto_it(gke: FakeGke, kube: FakeKube) -> None:
    # Case 1: a queued JobSet is admitted as A completes; its pod binds to A's idle pool.
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a")
    b = tpu_jobset("b", "team-a", replicas=1)
    land(kube, b, pool)

    assert (
        Releaser(SETTINGS, gke, kube).release("team-a", "a", a["metadata"]["uid"], "JobSet completed") == []
    )

    assert gke.count("delete") == 0
    assert owner(gke, pool) == ("b", b["metadata"]["uid"])
    assert schedulable(kube, pool)
    assert (
        events(kube, labels.REASON_ADOPTED, "b")
        and "adopted node pool " + pool.name in events(kube, labels.REASON_ADOPTED, "b")[0]
    )
    assert any("handed node pool" in m for m in events(kube, labels.REASON_RELEASED, "a"))
    # Ownership is durable: B's own completion releases the pool at once, not at the next reconcile.
    finish(kube, "b")
    assert Releaser(SETTINGS, gke, kube).release("team-a", "b", b["metadata"]["uid"], "JobSet completed") == [
        pool.name
    ]


def test_reconcile_never_deletes_a_suspended_jobsets_pool_the_preemptor_runs_on(
    gke: FakeGke, kube: FakeKube
) -> None:
    # Case 2: Kueue suspends the victim; the preemptor lands on its pool; the suspend grace runs out.
    victim = tpu_jobset("victim", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, victim)
    suspend(kube, "victim", since=SETTINGS.suspend_grace_seconds + 60)
    preemptor = tpu_jobset("preemptor", "team-a", replicas=1)
    land(kube, preemptor, pool)

    summary = Reconciler(Services(SETTINGS, gke, kube)).sweep()

    assert (summary.deleted, summary.adopted) == (0, 1)
    assert owner(gke, pool) == ("preemptor", preemptor["metadata"]["uid"])
    assert events(kube, labels.REASON_ADOPTED, "preemptor")


def test_release_of_a_replaced_jobset_leaves_the_new_incarnation_its_pool(
    gke: FakeGke, kube: FakeKube
) -> None:
    # Case 3: deleted and recreated under the same name; the new pods bind to the old pool.
    old = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, old)
    kube.pods.clear()
    new = tpu_jobset("a", "team-a", replicas=1)
    land(kube, new, pool)

    assert (
        Releaser(SETTINGS, gke, kube).release("team-a", "a", old["metadata"]["uid"], "JobSet deleted") == []
    )
    assert owner(gke, pool) == ("a", new["metadata"]["uid"])


def test_release_of_a_deleted_jobset_keeps_a_pool_another_runs_on(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    kube.pods.clear()
    del kube.jobsets[("team-a", "a")]
    b = tpu_jobset("b", "team-a", replicas=1)
    land(kube, b, pool)
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet deleted") == []
    assert owner(gke, pool)[0] == "b"


def test_reconcile_recycles_an_error_pool_only_when_nobody_runs_on_it(gke: FakeGke, kube: FakeKube) -> None:
    busy = tpu_jobset("busy", "team-a", replicas=1)
    [busy_pool] = with_pools(gke, kube, busy)
    idle = tpu_jobset("idle", "team-a", replicas=1, topology="4x4")
    [idle_pool] = with_pools(gke, kube, idle)
    for pool in (busy_pool, idle_pool):
        gke.mark(CLUSTER, pool.name, STATUS_ERROR, "ZONE_RESOURCE_POOL_EXHAUSTED")
    kube.pods = {k: p for k, p in kube.pods.items() if p["metadata"]["labels"][labels.JOBSET_NAME] == "busy"}

    now = datetime.datetime.now(tz=datetime.UTC).timestamp()
    first = Reconciler(Services(SETTINGS, gke, kube, wall_clock=lambda: now)).sweep()
    assert (first.backing_off, first.healed) == (2, 0)  # both wait out their stockout backoff
    later = now + SETTINGS.stockout_backoff_seconds
    summary = Reconciler(Services(SETTINGS, gke, kube, wall_clock=lambda: later)).sweep()

    assert busy_pool.name in gke.pools[CLUSTER]
    assert idle_pool.name not in gke.pools[CLUSTER]
    assert (summary.healed, summary.kept) == (1, 1)
    assert events(kube, labels.REASON_FAILED, "busy") and events(kube, labels.REASON_FAILED, "idle")


def test_reconcile_records_released_on_the_jobset(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=2)
    pools = with_pools(gke, kube, a)
    finish(kube, "a", "Failed")
    assert Reconciler(Services(SETTINGS, gke, kube)).sweep().deleted == 2
    [message] = events(kube, labels.REASON_RELEASED, "a")
    assert all(p.name in message for p in pools) and "reconcile" in message
    # A sweep's Event says why each pool went (an event's trigger already does).
    assert all(f"{p.name}: JobSet team-a/a failed" in message for p in pools), message


def test_the_cordon_stops_a_pod_binding_between_the_check_and_the_delete(
    gke: FakeGke, kube: FakeKube
) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a")
    b = tpu_jobset("b", "team-a", replicas=1)
    late = submit(kube, b)[0]["metadata"]["name"]
    # The scheduler decides for B's pending pod right as the delete call goes out.
    kube.arrivals.append(("team-a", late, f"gke-c-{pool.name}-0"))
    gke.before_delete = lambda name: kube.schedule()

    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed") == [pool.name]

    # The node was cordoned first, so B's pod stayed pending (provision makes it its own pool)
    # instead of binding to a pool being deleted.
    assert kube.pods[("team-a", late)]["status"]["phase"] == "Pending"
    assert not kube.pods[("team-a", late)]["spec"].get("nodeName")
    assert sorted(c[:2] for c in kube.cordons) == [
        (f"gke-c-{pool.name}-{i}", True) for i in range(pool.node_count)
    ]


def test_a_transient_delete_failure_leaves_the_nodes_cordoned_and_the_retry_rechecks(
    gke: FakeGke, kube: FakeKube
) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a")
    gke.fail("delete", "incompatible")
    with pytest.raises(TransientError):
        Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed")
    assert not schedulable(kube, pool)
    b = tpu_jobset("b", "team-a", replicas=1)
    land(kube, b, pool)  # bound before the cordon landed, seen only now
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "redelivery") == []
    assert owner(gke, pool)[0] == "b" and schedulable(kube, pool)


def test_an_idle_pool_waits_for_a_queued_jobset_of_its_shape_then_goes(gke: FakeGke, kube: FakeKube) -> None:
    pool, queued, settings = finished_beside_queued(gke, kube, finished_ago=30)

    assert Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed") == []
    assert pool.name in gke.pools[CLUSTER] and schedulable(kube, pool)

    # Kueue admits it; its pod lands on the idle pool; the next look hands the pool over.
    queued["spec"]["suspend"] = False
    land(kube, queued, pool)
    assert Reconciler(Services(settings, gke, kube)).sweep().adopted == 1
    assert owner(gke, pool)[0] == "queued"


def test_an_unclaimed_idle_pool_is_deleted_after_the_window(gke: FakeGke, kube: FakeKube) -> None:
    pool, _, settings = finished_beside_queued(gke, kube, finished_ago=200)
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed") == [pool.name]


def test_the_deletion_of_the_jobset_an_idle_pool_waits_for_releases_it_at_once(
    gke: FakeGke, kube: FakeKube
) -> None:
    # A's release kept its pool idle for the queued JobSet of its shape; then the queued one is
    # deleted. Its release owns no pool, but it is the end of what the idle pool waited for: the pool
    # goes now, not when the handover window or the next sweep comes.
    pool, _, settings = finished_beside_queued(gke, kube, finished_ago=30)
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed") == []
    assert gke.pools[CLUSTER][pool.name].labels.get(labels.IDLE_SINCE)

    del kube.jobsets[("team-a", "queued")]
    deleted = Releaser(settings, gke, kube).release("team-a", "queued", "", "JobSet deleted", deleted=True)
    assert deleted == [pool.name]
    assert any(pool.name in m for m in events(kube, labels.REASON_RELEASED, "a"))


def test_a_jobset_deleted_while_a_pool_is_being_offered_to_it_still_releases_that_pool(
    gke: FakeGke, kube: FakeKube
) -> None:
    # A's release is offering its pool to the queued JobSet (the relabel that stamps it has not
    # landed) when the queued one is deleted. The deletion's release lists the pool unstamped: it
    # must judge it all the same, or the pool waits for a JobSet that is gone until reconcile.
    # (Seen on the real stack: a preemptor's completion and its victim's deletion a moment apart.)
    pool, _, settings = finished_beside_queued(gke, kube, finished_ago=30)
    assert not gke.pools[CLUSTER][pool.name].labels.get(labels.IDLE_SINCE)

    del kube.jobsets[("team-a", "queued")]
    deleted = Releaser(settings, gke, kube).release("team-a", "queued", "", "JobSet deleted", deleted=True)

    assert deleted == [pool.name]
    # A's own release then finds it gone: nothing offered, nothing kept.
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed") == []
    assert pool.name not in gke.pools[CLUSTER]


def test_a_deletion_reads_many_pool_owners_with_one_list_that_the_demand_check_reuses(
    gke: FakeGke, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Four finished JobSets' pools, none stamped yet, when a queued JobSet is deleted: their owners
    # come from one JobSet list (not a GET each), and the handover-demand check uses that list.
    pools = []
    for name in ("a0", "a1", "a2", "a3"):
        pools += with_pools(gke, kube, tpu_jobset(name, "team-a", replicas=1))
        finish(kube, name, when=ago(30))
    reads: list[str] = []
    for method in ("list_jobsets", "get_jobset"):
        real = getattr(kube, method)
        monkeypatch.setattr(kube, method, lambda *a, _m=method, _r=real: reads.append(_m) or _r(*a))
    settings = SETTINGS.with_overrides(idle_pool_seconds=120)  # a handover window open 30 s in

    deleted = Releaser(settings, gke, kube).release("team-a", "queued", "", "JobSet deleted", deleted=True)

    assert sorted(deleted) == sorted(p.name for p in pools)
    assert reads.count("list_jobsets") == 1
    assert "get_jobset" not in reads


def test_an_idle_pool_still_wanted_stays_through_another_jobsets_release(
    gke: FakeGke, kube: FakeKube
) -> None:
    # The same, but the queued JobSet is still there when an unrelated JobSet's release looks: the
    # idle pool keeps waiting, and the unrelated release says nothing about it.
    pool, _, settings = finished_beside_queued(gke, kube, finished_ago=30)
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed") == []
    assert Releaser(settings, gke, kube).release("team-b", "other", "", "JobSet deleted", deleted=True) == []
    assert pool.name in gke.pools[CLUSTER] and schedulable(kube, pool)
    assert gke.count("delete") == 0
    # Nor does a JobSet's end re-judge it, whoever waits (the next one may be admitted and unbound).
    del kube.jobsets[("team-a", "queued")]
    assert Releaser(settings, gke, kube).release("team-b", "other", "", "JobSet completed") == []
    assert pool.name in gke.pools[CLUSTER] and gke.count("delete") == 0


def test_an_offer_to_a_jobset_that_bought_its_own_pool_meanwhile_is_withdrawn(
    gke: FakeGke, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's release listed the pools, then the admission check bought the queued JobSet a pool of its
    # own, then A's release stamped its pool idle for it. Seen in CI: nobody took the stamped pool and
    # it lived until the next reconcile sweep. The release reads the pools again after its stamp.
    pool, queued, settings = finished_beside_queued(gke, kube, finished_ago=30)
    spec, _ = build_node_pool(settings, slice_request(expand_pods(queued)[0]), gke.get_cluster(CLUSTER))
    stamp = gke.set_node_pool_labels

    def check_creates_first(*args: Any, **kwargs: Any) -> Any:
        if spec.name not in gke.pools[CLUSTER]:
            gke.create_node_pool(CLUSTER, spec, "the admission check of team-a/queued")
        return stamp(*args, **kwargs)

    monkeypatch.setattr(gke, "set_node_pool_labels", check_creates_first)
    with pytest.raises(TransientError, match="kept for has pools of its own now"):
        Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed")
    assert gke.pools[CLUSTER][pool.name].labels.get(labels.IDLE_SINCE)  # the offer was made
    # The redelivery judges it with nobody waiting: it goes, and A's describe says so.
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed") == [pool.name]
    assert any(pool.name in m for m in events(kube, labels.REASON_RELEASED, "a"))
    assert spec.name in gke.pools[CLUSTER]  # the queued JobSet's own pool is untouched


def test_an_offer_the_waiting_jobset_still_needs_costs_one_more_listing(
    gke: FakeGke, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool, _, settings = finished_beside_queued(gke, kube, finished_ago=30)
    listings: list[str] = []
    real = gke.list_node_pools
    monkeypatch.setattr(gke, "list_node_pools", lambda c: listings.append(c) or real(c))
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed") == []
    assert gke.pools[CLUSTER][pool.name].labels.get(labels.IDLE_SINCE)
    assert len(listings) == 2  # the delivery's own, and the one after the stamp
    # Already stamped, a later look offers it again without another read.
    listings.clear()
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "redelivery") == []
    assert len(listings) == 1


def test_the_idle_window_of_a_deleted_owner_is_stamped_on_the_pool(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    kube.pods.clear()
    del kube.jobsets[("team-a", "a")]
    queue(kube, "queued")
    settings = SETTINGS.with_overrides(idle_pool_seconds=120)
    assert Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet deleted") == []
    stamp = int(gke.pools[CLUSTER][pool.name].labels[labels.IDLE_SINCE])
    assert abs(stamp - now().timestamp()) < 60
    # Later looks measure from the stamp: once it is older than the window, the pool goes.
    gke.pools[CLUSTER][pool.name] = NodePoolInfo(
        **{
            **gke.pools[CLUSTER][pool.name].__dict__,
            "labels": {**pool.labels, labels.IDLE_SINCE: str(stamp - 121)},
        }
    )
    assert Reconciler(Services(settings, gke, kube)).sweep().deleted == 1


def test_reconcile_lifts_only_its_own_stale_cordons_from_kept_pools(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=2)
    first, second = with_pools(gke, kube, a)
    kube.set_unschedulable(f"gke-c-{first.name}-0", True, "1000 tpu-provisioner is about to delete it")
    kube.nodes[f"gke-c-{second.name}-0"]["spec"]["unschedulable"] = True  # an operator's cordon
    Reconciler(Services(SETTINGS, gke, kube)).sweep()
    assert schedulable(kube, first)
    assert not schedulable(kube, second)


def test_after_unsuspend_pools_are_requested_again_within_one_event(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    pods = submit(kube, a)
    for pod in pods:
        pod["metadata"]["creationTimestamp"] = ago(5)
    service = Provisioner(Services(SETTINGS, gke, kube, known_pool_ttl=30.0))
    assert service.handle_pending_pod("team-a", pods[0]["metadata"]["name"], now()).result == CREATED
    # A duplicate event of the same pod is answered from memory (no listing).
    lists = gke.count("list")
    assert service.handle_pending_pod("team-a", pods[0]["metadata"]["name"], now()).result == EXISTS
    assert gke.count("list") == lists
    # Kueue suspends it past the grace: reconcile releases the pools (another instance).
    suspend(kube, "a", since=SETTINGS.suspend_grace_seconds + 60)
    Reconciler(Services(SETTINGS, gke, kube)).sweep()
    assert gke.managed_names(CLUSTER) == []
    # Un-suspended: the JobSet controller creates new pods; the first event requests the pool again.
    kube.jobsets[("team-a", "a")]["spec"]["suspend"] = False
    kube.jobsets[("team-a", "a")]["status"] = {}
    fresh = submit(kube, kube.jobsets[("team-a", "a")])
    for pod in fresh:
        pod["metadata"]["creationTimestamp"] = datetime.datetime.now(tz=datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
    assert service.handle_pending_pod("team-a", fresh[0]["metadata"]["name"], now()).result == CREATED


def test_provision_reports_an_error_pool_on_the_jobset_at_once(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    pods = submit(kube, a)
    service = Provisioner(Services(SETTINGS, gke, kube))
    service.handle_pending_pod("team-a", pods[0]["metadata"]["name"], now())
    [name] = gke.managed_names(CLUSTER)
    gke.mark(CLUSTER, name, STATUS_ERROR, "ZONE_RESOURCE_POOL_EXHAUSTED: no capacity")
    for _ in range(3):  # every FailedScheduling of the pod: one Event, counted
        service.handle_pending_pod("team-a", pods[0]["metadata"]["name"], now())
    [failed] = [e for e in kube.events if e["reason"] == labels.REASON_FAILED]
    assert (failed["kind"], failed["name"], failed["type"], failed["count"]) == ("JobSet", "a", "Warning", 3)
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in failed["message"] and name in failed["message"]


def test_requested_is_one_event_per_group_naming_every_pool(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=3)
    pods = submit(kube, a)
    Provisioner(Services(SETTINGS, gke, kube)).handle_pending_pod(
        "team-a", pods[0]["metadata"]["name"], now()
    )
    requested = [e for e in kube.events if e["reason"] == labels.REASON_REQUESTED]
    assert sorted(e["kind"] for e in requested) == ["JobSet", "Pod"]
    assert all(all(n in e["message"] for n in gke.managed_names(CLUSTER)) for e in requested)


@pytest.mark.parametrize(
    ("tenants", "kept"),
    [
        pytest.param('{"team-a": {"chips": 64}}', True, id="budget-fits-a-slice"),
        pytest.param('{"team-b": {"chips": 64}}', False, id="namespace-has-no-entry"),
        pytest.param('{"team-a": {"chips": 4}}', False, id="budget-below-one-slice"),
    ],
)
def test_an_idle_pool_is_kept_only_for_a_namespace_that_may_hold_it(
    gke: FakeGke, kube: FakeKube, tenants: str, kept: bool
) -> None:
    # The guardrails apply to keeping an idle pool as to buying one: a queued JobSet whose namespace
    # TENANTS lets spend nothing, or less than one slice, is no reason to keep paying for the pool.
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a", when=ago(30))
    queue(kube, "queued")
    settings = SETTINGS.with_overrides(idle_pool_seconds=120, tenants=tenants, unlimited_spending=False)

    deleted = Releaser(settings, gke, kube).release("team-a", "a", "", "JobSet completed")

    assert deleted == ([] if kept else [pool.name])
    assert (pool.name in gke.pools[CLUSTER]) is kept


@pytest.mark.parametrize("trigger", ["JobSet completed", "reconcile sweep"])
def test_a_bare_pod_naming_another_jobset_holds_nothing_and_the_release_says_so(
    gke: FakeGke, kube: FakeKube, trigger: str
) -> None:
    # A tenant pins a pod that only names JobSet "hold" (no Job made it) to A's node: A's release
    # deletes the pool anyway, and its Event names the pod it did not count, once (a sweep's Event
    # also gives each pool's reason, which must not repeat it).
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a")
    hold = queue(kube, "hold")
    kube.add_pod(
        {
            "metadata": {
                "name": "squat",
                "namespace": "team-a",
                "labels": {labels.JOBSET_NAME: "hold", labels.JOBSET_UID: hold["metadata"]["uid"]},
            },
            "spec": {"containers": [{"name": "c", "resources": {"requests": {labels.TPU_RESOURCE: "4"}}}]},
        }
    )
    kube.bind("team-a", "squat", f"gke-c-{pool.name}-0")

    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", trigger) == [pool.name]
    [message] = [m for m in events(kube, labels.REASON_RELEASED, "a") if pool.name in m]
    assert message.count(f"not counted as occupants of {pool.name}: pod(s) team-a/squat") == 1


def _admitted_now(kube: FakeKube, name: str, when: str) -> dict[str, Any]:
    """A queued JobSet Kueue has just admitted: JobSet's controller turned Suspended False (ResumeJobs)."""
    jobset = queue(kube, name)
    jobset["spec"]["suspend"] = False
    jobset["status"] = {
        "conditions": [
            {"type": "Suspended", "status": "False", "reason": "ResumeJobs", "lastTransitionTime": when}
        ]
    }
    return jobset


def test_a_pool_is_not_deleted_while_a_jobset_admitted_just_now_may_land_on_it(
    gke: FakeGke, kube: FakeKube
) -> None:
    # Kueue admits C as A completes; C's pods do not exist yet. Deleting A's pool now would leave
    # them Pending and buy a new pool: the release asks to look again, without a cordon or a hold.
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a", when=ago(5))
    c = _admitted_now(kube, "c", ago(2))

    with pytest.raises(TransientError, match="admitted just now"):
        Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed")
    assert pool.name in gke.pools[CLUSTER] and schedulable(kube, pool)
    assert not gke.pools[CLUSTER][pool.name].labels.get(labels.IDLE_SINCE)  # nothing held for it

    # The redelivery: C's pod bound to the pool, which becomes C's.
    land(kube, c, pool)
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed") == []
    assert owner(gke, pool)[0] == "c"


def test_a_jobset_admitted_long_ago_defers_nothing(gke: FakeGke, kube: FakeKube) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a", when=ago(5))
    _admitted_now(kube, "c", ago(600))
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed") == [pool.name]


def test_a_jobset_admitted_just_now_with_pools_of_its_own_still_defers_the_delete(
    gke: FakeGke, kube: FakeKube
) -> None:
    # The admission check bought C its own pool, but C's pods select the shape, not that pool: the
    # scheduler may bind C's leader to A's free pool, and exclusive placement pins its followers
    # there. A cordon now would leave them Pending (seen on the real stack), so A's pool waits.
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a", when=ago(5))
    c = _admitted_now(kube, "c", ago(2))
    spec, _ = build_node_pool(SETTINGS, slice_request(expand_pods(c)[0]), gke.get_cluster(CLUSTER))
    gke.create_node_pool(CLUSTER, spec, "the admission check of team-a/c")

    with pytest.raises(TransientError, match="admitted just now, its pods perhaps not bound yet"):
        Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed")
    assert pool.name in gke.pools[CLUSTER] and schedulable(kube, pool)
    # Half a minute after the admission its pods had their chance: the pool goes.
    _admitted_now(kube, "c", ago(60))
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed") == [pool.name]


def test_a_delivery_beside_another_on_the_same_releaser_keeps_what_it_found(
    gke: FakeGke, kube: FakeKube
) -> None:
    # Release serves ten deliveries at once per instance (infra/main.tf `concurrency`), all on the
    # instance's one Releaser: another delivery starting and ending in the middle of a sweep must not
    # wipe what the sweep found (why each pool went, the pods that merely named a JobSet) from its Event.
    first, second = with_pools(gke, kube, tpu_jobset("a", "team-a", replicas=2))
    [other] = with_pools(gke, kube, tpu_jobset("b", "team-a", replicas=1))
    finish(kube, "a")
    finish(kube, "b")
    for index, pool in enumerate((first, second)):
        squat = f"squat-{index}"
        kube.add_pod(
            {
                "metadata": {"name": squat, "namespace": "team-a", "labels": {labels.JOBSET_NAME: "hold"}},
                "spec": {
                    "containers": [{"name": "c", "resources": {"requests": {labels.TPU_RESOURCE: "4"}}}]
                },
            }
        )
        kube.bind("team-a", squat, f"gke-c-{pool.name}-0")
    settles: list[float] = []

    def settle(seconds: float) -> None:  # the wait after a cordon: b's delivery runs meanwhile
        settles.append(seconds)
        if len(settles) == 2:
            assert releaser.release("team-a", "b", "", "JobSet completed") == [other.name]

    releaser = Releaser(SETTINGS.with_overrides(cordon_settle_seconds=1), gke, kube, sleep=settle)

    assert sorted(releaser.release("team-a", "a", "", "reconcile sweep")) == sorted([first.name, second.name])
    assert len(settles) == 3  # a's two pools and b's one
    [message] = events(kube, labels.REASON_RELEASED, "a")
    for index, pool in enumerate((first, second)):
        assert f"{pool.name}: JobSet team-a/a completed" in message
        assert message.count(f"not counted as occupants of {pool.name}: pod(s) team-a/squat-{index}") == 1
    [theirs] = events(kube, labels.REASON_RELEASED, "b")
    assert first.name not in theirs and second.name not in theirs


def test_a_jobset_recreated_while_its_release_runs_keeps_the_pool_its_new_pods_run_on(
    gke: FakeGke, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen on the real components (tests/sandbox/real/test_realstack.py, "reborn"): the delete's
    # release read the JobSet by name before the user created it again; the new incarnation's pod
    # then bound to the old pool. Judged by that first read, the pod "named a JobSet but was made by
    # none of its Jobs", and the pool was deleted under it.
    old = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, old)
    kube.pods.clear()
    del kube.jobsets[("team-a", "a")]
    new = tpu_jobset("a", "team-a", replicas=1)
    read = kube.get_jobset

    def get_jobset(namespace: str, name: str) -> Any:
        try:
            return read(namespace, name)
        finally:
            if ("team-a", "a") not in kube.jobsets:  # right after the release's first read
                land(kube, new, pool)

    monkeypatch.setattr(kube, "get_jobset", get_jobset)

    assert (
        Releaser(SETTINGS, gke, kube).release("team-a", "a", old["metadata"]["uid"], "JobSet deleted") == []
    )
    assert gke.count("delete") == 0
    assert owner(gke, pool) == ("a", new["metadata"]["uid"])
    assert schedulable(kube, pool)
    [adopted] = events(kube, labels.REASON_ADOPTED, "a")
    assert pool.name in adopted


def test_a_delete_refused_while_another_delivery_hands_the_pool_on_leaves_it_uncordoned(
    gke: FakeGke, kube: FakeKube
) -> None:
    """#30: the delete GKE refuses because another delivery's relabel (a handover) runs on the pool:
    the adoption won, so the cordon goes at once (not at the next reconcile) and A's Event says so."""
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a")
    b = tpu_jobset("b", "team-a", replicas=1, uid="b-uid")
    submit(kube, b)

    def handed_on(method: str, target: str) -> None:
        if method == "delete" and target == pool.name:  # the other delivery's relabel landed first
            taken = gke.pools[CLUSTER][pool.name]
            new = {**taken.labels, labels.OWNER_NAME: "b", labels.OWNER_UID: "b-uid"}
            gke.pools[CLUSTER][pool.name] = dataclasses.replace(taken, labels=new)
            gke.on_call = None

    gke.on_call = handed_on
    gke.fail("delete", "incompatible")
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed") == []
    assert owner(gke, pool)[0] == "b" and schedulable(kube, pool)
    kept = events(kube, labels.REASON_RELEASED, "a")
    assert any(f"not deleted: team-a/b took {pool.name} over meanwhile" in m for m in kept), kept


def test_a_delete_refused_for_a_busy_cluster_keeps_the_cordon_for_the_retry(
    gke: FakeGke, kube: FakeKube
) -> None:
    a = tpu_jobset("a", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, a)
    finish(kube, "a")
    gke.fail("delete", "incompatible")  # nobody took the pool: the retry deletes it
    with pytest.raises(TransientError):
        Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "JobSet completed")
    assert not schedulable(kube, pool)
    assert Releaser(SETTINGS, gke, kube).release("team-a", "a", "", "redelivery") == [pool.name]


def test_a_pool_whose_create_ends_after_its_jobset_ended_is_released_then(
    gke: FakeGke, kube: FakeKube
) -> None:
    """The JobSet's own release listed its pools before this create landed (the real-stack slow
    operations scenario): the create's end is the next moment anything looks at the pool."""
    done = tpu_jobset("done", "team-a", replicas=1)
    [pool] = with_pools(gke, kube, done)
    releaser = Releaser(SETTINGS, gke, kube)
    assert releaser.release_if_owner_over(pool.name, "CreateNodePool finished") == []  # still running
    assert gke.count("delete") == 0
    finish(kube, "done")
    lists = gke.count("list")
    assert releaser.release_if_owner_over(pool.name, "CreateNodePool finished") == [pool.name]
    assert gke.count("list") == lists + 1  # the release decides on the listing that found the pool
    assert releaser.release_if_owner_over("no-such-pool", "CreateNodePool finished") == []
