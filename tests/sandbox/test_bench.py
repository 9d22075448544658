"""The benchmark at small scale, asserting what it COUNTS (never timing), plus the instance cache it led to.

One exception: the declared-pods part's goal is relative (declared pods against a baseline, 1.5x
+ 1 s and + 32 MiB), and the cost it guards against was minutes and gigabytes, so it is asserted.

The storm runs against real functions-framework processes and both emulators; the cache tests run
the Provisioner over the stateful fakes with a controllable clock.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from sandbox.bench import cluster as bench_cluster
from sandbox.bench import coldstart as bench_coldstart
from sandbox.bench import declared as bench_declared
from sandbox.bench import env as bench_env
from sandbox.bench import fanout as bench_fanout
from sandbox.bench import forged as bench_forged
from sandbox.bench import handover as bench_handover
from sandbox.bench import overhead as bench_overhead
from sandbox.bench import report as bench_report
from sandbox.bench import runner as bench_runner
from sandbox.bench import storm as bench_storm
from sandbox.bench.procs import REFERENCE_TARGET
from sandbox.jobsets import tpu_jobset
from sandbox.testing.clock import FakeClock
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core.settings import Settings
from shared.provisioning.outcomes import CREATED, EXISTS
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import STATUS_ERROR, STATUS_STOPPING
from tpuprov import main as cli

SETTINGS = Settings(unlimited_spending=True, project_id="p", location="us-east5-b", cluster_name="c")
CLUSTER = SETTINGS.cluster_path


@pytest.fixture
def env():
    with bench_env.started() as started:
        yield started


# --- the benchmark, small ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(
    "shape",
    [
        bench_storm.StormShape(slices=8, hosts=2, repeats=3, concurrency=6, seed=1),
        bench_storm.StormShape(slices=5, hosts=1, repeats=4, duplicate_fraction=0.3, concurrency=4, seed=2),
    ],
    ids=["8x2x3-10pct-dups", "5x1x4-30pct-dups"],
)
def test_storm_costs_exactly_one_create_and_one_delete_per_slice(env, tmp_path, shape):
    result = bench_storm.run(env, shape, tmp_path)
    assert result.events == round(shape.slices * shape.hosts * shape.repeats * (1 + shape.duplicate_fraction))
    assert result.non_2xx == 0
    assert result.creates == shape.slices
    assert result.deletes == shape.slices
    assert result.provision_reads <= 2 * result.events
    # The occupancy guard reads each deleted pool's nodes before and after cordoning them.
    assert result.release_reads <= 2 * result.release_events + 2 * shape.slices
    assert result.leaked_pools == 0
    assert env.managed_pools() == []
    assert result.provision_rss.worker_mib > 0


@pytest.mark.slow
@pytest.mark.integration
def test_overhead_run_reads_at_most_twice_per_event_and_creates_each_slice_once(env):
    result = bench_overhead.measure(env, events=120, slices=6, hosts=2)
    assert result.events >= 120
    assert len(result.overhead) == len(result.total) == result.events
    assert result.creates == 6
    # The first event of a replicated job also reads the JobSet before spending money (3 reads);
    # every other event costs at most 2, and the storm test bounds the average by 2.
    assert 1 <= result.max_reads_per_event <= 3
    names = sorted(p["name"] for p in env.managed_pools())
    assert len(names) == 6 + 2  # the measured JobSet's slices plus the warm-up JobSet's two


@pytest.mark.slow
@pytest.mark.integration
def test_cold_start_probes_ack_without_calls_and_first_create_creates_once(env, tmp_path):
    wanted = {("provision", "ack"), (REFERENCE_TARGET, "ack"), ("provision", "first-create")}
    probes = tuple(p for p in bench_coldstart.PROBES if (p.target, p.kind) in wanted)
    results = bench_coldstart.measure(env, launches=1, log_dir=tmp_path, probes=probes)
    assert [(r.target, r.kind, len(r.samples)) for r in results] == [
        ("provision", "ack", 1),
        (REFERENCE_TARGET, "ack", 1),
        ("provision", "first-create", 1),
    ]
    # Two rounds (warm-up + one) of the first-create probe: one fresh pool each, nothing else.
    assert env.gke.count("create") == 2
    assert len(env.managed_pools()) == 2


@pytest.mark.slow
@pytest.mark.integration
# Every part of the bench, small, one after another: about 5 minutes on a loaded 2-core machine,
# which the suite's default 300 s does not leave room for.
@pytest.mark.timeout(600)
def test_cli_writes_json_and_markdown_reports(tmp_path, capsys):
    out = tmp_path / "results"
    argv = [
        "bench",
        "--skip-cold-start",
        "--skip-handover",
        "--skip-multikueue",
        "--events",
        "40",
        "--out",
        str(out),
        "--fanout-slices",
        "6",
    ]
    argv += ["--cluster-nodes", "20", "--cluster-pods", "200", "--cluster-jobsets", "10"]
    argv += ["--cluster-pools", "4"]
    argv += ["--declared-pods", "6400", "--declared-jobsets", "2"]
    argv += ["--forged-events", "30", "--forged-ghosts", "5"]
    # Exit 1 would mean a timing target was missed on a loaded machine: timings are make bench's
    # business, so only the counts are judged here.
    assert cli.main([*argv, "--slices", "3", "--hosts", "2", "--repeats", "2", "--concurrency", "3"]) in (
        0,
        1,
    )
    report = json.loads((out / "bench.json").read_text())
    assert report["storm"]["creates"] == report["storm"]["deletes"] == 3
    # Reads per event of a 12-event storm depend on when the instance's 30 s memory of pools is
    # consulted (load-dependent); the storm tests above bound the reads with room for that.
    timed = {"s", "ms", "ratio", "MiB", "reads"}
    assert all(t["met"] for t in report["targets"] if t["unit"] not in timed), report["targets"]
    assert {t["name"] for t in report["targets"]} >= {"storm creates == S", "warm overhead p99"}
    markdown = (out / "bench.md").read_text()
    assert markdown.startswith("## Performance") and "make bench" in markdown
    assert "| GKE creates / deletes | 3 / 3 |" in markdown
    assert report["fanout"]["creates_accepted"] == 6
    assert report["reconcile_scale"]["gke_creates"] == 0
    assert "**Reconcile at cluster scale**" in markdown and "**Fan-out under GKE's pace**" in markdown
    assert "## Performance" in capsys.readouterr().out
    # The admission check's figures run in virtual time: every one of them is judged here.
    admission = [t for t in report["targets"] if t["name"].startswith("admission check")]
    assert len(admission) == 12 and all(t["met"] for t in admission), admission
    assert "**Slices before pods**" in markdown
    assert report["declared_pods"]["declared"]["declared_pods"] == 2 * 50 * 64
    assert report["forged_storm"]["creates_real"] == 4
    assert "**Declared pods**" in markdown and "**Forged-event storm**" in markdown
    # Ten clusters' storms to one instance: each cluster's slices created once, in its own cluster.
    fleet = report["fleet_overhead"]
    assert (
        fleet["fleet"]["clusters"] == 10 and fleet["fleet"]["creates"] == 10 * fleet["one_cluster"]["creates"]
    )
    assert "**A fleet at once**" in markdown


@pytest.mark.slow
@pytest.mark.integration
def test_fanout_part_sends_every_create_once_within_the_concurrency(env):
    shape = bench_fanout.FanOutShape(slices=10, create_latency=0.1, op_limit=10, concurrency=4)
    result = bench_fanout.run(env, shape)
    assert (result.deliveries, result.creates_sent, result.creates_accepted) == (1, 10, 10)
    assert result.too_many_operations == result.incompatible_operation == 0
    # A round of four (CREATE_CONCURRENCY), all accepted, then one twice as wide for the other six.
    assert result.max_in_flight == 6
    assert env.gke.running_operations(env.settings.cluster_path) == 10  # realism switched off after


@pytest.mark.slow
@pytest.mark.integration
def test_cluster_part_sweeps_a_preloaded_cluster_with_paged_selective_lists(env, tmp_path):
    shape = bench_cluster.ClusterShape(
        nodes=30, pods=400, jobsets=12, tpu_jobsets=5, pending_pods=6, page_size=10
    )
    result = bench_cluster.run(env, shape, tmp_path)
    assert result.objects == 30 + 12 + 400
    assert len(env.managed_pools()) == 5
    # Every pool belongs to a running JobSet and every pending pod's slice exists: nothing to do.
    assert (result.gke_creates, result.gke_deletes) == (0, 0)
    # JobSets in two pages of ten; the six pending pods (of 400) in one page; the managed pools'
    # nodes (none here: the nodes are CPU nodes) in one page, read for cordons left by a crash.
    assert result.list_pages == 4
    assert result.rss.worker_mib > 0


@pytest.mark.slow
@pytest.mark.integration
def test_handover_part_creates_pools_for_the_queue_not_for_every_jobset():
    # 4 same-shape JobSets, 2 at a time: the first 2 get fresh pools, the other 2 take them over.
    # Runs long enough that the adopters still run when the first pair's release looks at the
    # pools, on a loaded machine too (the handover needs running pods to hand the pools to).
    result = bench_handover.run(bench_handover.HandoverShape(jobsets=4, run_seconds=4.0, timeout=150))
    print(result.timeline)  # pytest shows it when the test failed
    assert result.problems == []
    assert result.completed == 4
    assert result.creates == result.pools_created == 2
    # Each of the last 2 ran on a pool handed over to it. The real scheduler may also bind a JobSet's
    # pods to another same-shape pool than the one offered or made for it, which the product adopts
    # too (no create either): at most an offer and a claim per JobSet, never a ping-pong.
    assert 2 <= result.pools_adopted <= 2 * 4
    assert result.pools_deleted == 2
    assert result.pools_leaked == []
    assert result.pods_killed == 0
    assert [t.handed_over for t in result.timings] == [False, False, True, True]
    assert all(t.seconds is not None for t in result.timings)
    report = {"handover": bench_handover.as_dict(result)}
    assert report["handover"]["fresh"]["count"] == report["handover"]["handed_over"]["count"] == 2
    lines = bench_report.handover_lines(report)
    assert "| GKE create requests (without handover: one per JobSet) | **2** (vs 4) |" in lines
    assert f"| pools adopted (TPUSliceAdopted) / deleted / leaked | {result.pools_adopted} / 2 / 0 |" in lines


@pytest.mark.slow
@pytest.mark.integration
def test_declared_pods_cost_release_and_reconcile_nothing(tmp_path):
    # The goal (sandbox/bench/declared.py, from the physical limit): a declared pod is a number in a
    # spec, so a million of them cost what the baseline costs: 1.5x its time + 1 s, + 32 MiB.
    shape = bench_declared.DeclaredShape()
    result = bench_declared.run(shape, tmp_path)
    baseline, declared = result.baseline, result.declared
    assert baseline.declared_pods == shape.jobsets * shape.vms  # one slice each
    assert declared.declared_pods >= 1_000_000
    # Held for the queue in both rows: the demand was computed, over every queued JobSet (without it
    # the gone owners' pools would have been deleted).
    assert baseline.pools_kept == declared.pools_kept == 2
    # The same API calls whatever the JobSets declare.
    for part in ("sweep", "release_first", "release"):
        ours, base = getattr(declared, part), getattr(baseline, part)
        assert (ours.kube_requests, ours.gke_calls) == (base.kube_requests, base.gke_calls), part
    limits, figures = result.limits(), result.figures()
    assert all(figures[k] <= limits[k] for k in limits), (figures, limits)
    lines = bench_report.declared_lines({"declared_pods": bench_declared.as_dict(result)})
    assert any(f"| declared | {shape.jobsets} x 977 x 64 | 1,000,448 |" in line for line in lines), lines


@pytest.mark.slow
@pytest.mark.integration
def test_forged_storm_lists_once_per_object_per_window_and_creates_only_real_slices(env, tmp_path):
    shape = bench_forged.ForgedShape()
    result = bench_forged.run(env, shape, tmp_path)
    assert result.total == 500 and result.non_2xx == 0
    assert result.objects == {"forged": 1, "ghosts": 50, "real": shape.slices * shape.hosts}
    assert result.window_seconds == 5  # EVENT_COALESCE_SECONDS left at its default
    # The goal: GKE lists bounded by the objects named, at most one per object per window.
    assert result.gke_calls.get("list", 0) <= result.list_bound
    # Exactly one create per slice of the real JobSet; none for the forged pod or the missing ones.
    assert result.creates_real == shape.slices == result.real_pools
    assert result.creates_other == 0
    assert result.gke_calls.get("create", 0) == shape.slices
    assert "delete" not in result.gke_calls and "update" not in result.gke_calls
    lines = bench_report.forged_lines({"forged_storm": bench_forged.as_dict(result)})
    assert (
        f"| creates: the real JobSet's slices / any other | {shape.slices} of {shape.slices} / 0 |" in lines
    )


def test_cli_rejects_non_positive_counts(tmp_path, capsys):
    assert cli.main(["bench", "--slices", "0", "--out", str(tmp_path)]) == 2
    assert "must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "bench.json").exists()


# --- the instance-local cache of pools known to exist --------------------------------------------


def pending(kube, name="train", replicas=1):
    jobset = tpu_jobset(name, "team-a", replicas=replicas, topology="4x4")
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    return pods


def deliver(service, pod):
    meta = pod["metadata"]
    return service.handle_pending_pod(meta["namespace"], meta["name"], None)


def test_duplicates_within_the_ttl_cost_one_read_and_no_listing():
    gke, kube, clock = FakeGke(), FakeKube(), FakeClock(1000.0)
    service = Provisioner(Services(SETTINGS, gke, kube, known_pool_ttl=30, clock=clock))
    pods = pending(kube)
    assert deliver(service, pods[0]).result == CREATED
    reads_before, lists_before = kube.reads, gke.count("list")
    outcomes = [deliver(service, pod) for pod in pods * 5]
    assert {o.result for o in outcomes} == {EXISTS}
    assert kube.reads - reads_before == len(outcomes)
    assert gke.count("list") == lists_before
    assert gke.count("create") == 1


def test_a_pool_deleted_behind_the_cache_is_created_again_once_the_ttl_expires():
    gke, kube, clock = FakeGke(), FakeKube(), FakeClock(1000.0)
    service = Provisioner(Services(SETTINGS, gke, kube, known_pool_ttl=30, clock=clock))
    pods = pending(kube)
    assert deliver(service, pods[0]).result == CREATED
    [name] = gke.managed_names(CLUSTER)
    gke.delete_node_pool(CLUSTER, name, "reconcile recycled it")
    clock.now += 29
    assert deliver(service, pods[0]).result == EXISTS
    clock.now += 2
    assert deliver(service, pods[0]).result == CREATED
    assert gke.managed_names(CLUSTER) == [name]


@pytest.mark.parametrize("status", [STATUS_ERROR, STATUS_STOPPING], ids=["error", "stopping"])
def test_pools_on_their_way_out_are_never_remembered(status):
    # Without a stockout backoff: this is about the instance's memory, not about waiting out failures.
    settings = SETTINGS.with_overrides(stockout_backoff_seconds=0)
    gke, kube, clock = FakeGke(), FakeKube(), FakeClock(1000.0)
    service = Provisioner(Services(settings, gke, kube, known_pool_ttl=30, clock=clock))
    pods = pending(kube)
    assert deliver(service, pods[0]).result == CREATED
    [name] = gke.managed_names(CLUSTER)
    fresh = Provisioner(Services(settings, gke, kube, known_pool_ttl=30, clock=clock))
    gke.mark(CLUSTER, name, status)
    assert deliver(fresh, pods[0]).result == EXISTS  # listed, in its final state
    gke.delete_node_pool(CLUSTER, name, "gone")
    assert deliver(fresh, pods[0]).result == CREATED


def test_a_callers_listing_bypasses_the_cache():
    gke, kube, clock = FakeGke(), FakeKube(), FakeClock(1000.0)
    service = Provisioner(Services(SETTINGS, gke, kube, known_pool_ttl=30, clock=clock))
    pods = pending(kube)
    assert deliver(service, pods[0]).result == CREATED
    gke.delete_node_pool(CLUSTER, gke.managed_names(CLUSTER)[0], "gone")
    outcome = service.provision_pod(kube.get_pod("team-a", pods[0]["metadata"]["name"]), pools=[])
    assert outcome.result == CREATED


def test_without_a_ttl_nothing_is_remembered():
    gke, kube = FakeGke(), FakeKube()
    service = Provisioner(Services(SETTINGS, gke, kube))
    pods = pending(kube)
    for pod in pods * 3:
        deliver(service, pod)
    assert gke.count("list") == len(pods) * 3
    assert gke.count("create") == 1


class SlowListGke(FakeGke):
    """Listing takes a while, so concurrent deliveries overlap between list and create."""

    def list_node_pools(self, cluster):
        time.sleep(0.02)
        return super().list_node_pools(cluster)


@pytest.mark.parametrize("ttl", [0.0, 30.0], ids=["no-ttl", "ttl"])
def test_concurrent_deliveries_for_one_slice_send_one_create(ttl):
    gke, kube = SlowListGke(), FakeKube()
    service = Provisioner(Services(SETTINGS, gke, kube, known_pool_ttl=ttl))
    pods = pending(kube, replicas=2)  # two slices of four hosts
    start = threading.Barrier(len(pods) * 2)
    outcomes = []

    def run(pod):
        start.wait()
        outcomes.append(deliver(service, pod))

    threads = [threading.Thread(target=run, args=(pod,)) for pod in pods * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert gke.count("create") == 2
    # One delivery requests the whole replicated job; every other one finds its pool.
    assert [o.result for o in outcomes].count(CREATED) == 1
    assert sum(len(o.requested) for o in outcomes) == 2
    assert len(gke.managed_names(CLUSTER)) == 2


def test_multikueue_targets_hold_the_run_to_the_floor_and_one_failed_attempt() -> None:
    from sandbox.bench import multikueue as bench_multikueue

    shape = bench_multikueue.MultiKueueShape(slices=2, op_seconds=10.0)
    good = bench_multikueue.MultiKueueResult(
        shape,
        ran_in="central",
        seconds_to_ready=31.0,
        creates={"west": 2, "central": 4},
        loser_pool_seconds=44.0,
        next_seconds_to_ready=14.0,
        next_creates_in_short=0,
    )
    targets = {t["name"]: t for t in bench_runner.multikueue_targets(good)}
    assert all(t["met"] for t in targets.values()), targets
    assert targets["multikueue: submission to all slices ready, one worker stocked out"]["limit"] == 40.0
    # Stuck in the stocked-out worker: never ready, the wrong worker, pools held there.
    stuck = bench_multikueue.MultiKueueResult(
        shape, ran_in="", seconds_to_ready=None, creates={"west": 6, "central": 0}, loser_pool_seconds=600.0
    )
    missed = {t["name"] for t in bench_runner.multikueue_targets(stuck) if not t["met"]}
    assert missed == {
        "multikueue: submission to all slices ready, one worker stocked out",
        "multikueue: the job ran in the worker with capacity",
        "multikueue: pool-seconds in the worker that did not run it",
        "multikueue: creates in the stocked-out worker <= slices",
        # The next job of the shape never ran (the fleet learnt nothing).
        "multikueue: the next job of the shape, submission to all slices ready (floor 1 x D)",
        "multikueue: the next job's creates in the stocked-out worker",
    }
    lines = bench_report.multikueue_lines({"multikueue": bench_multikueue.as_dict(good)})
    assert "| submission to every slice RUNNING | **31.0 s** in central |" in lines
    assert any("**14.0 s**, 0 creates in the stocked-out worker" in line for line in lines), lines
    assert bench_report.multikueue_lines({}) == []
