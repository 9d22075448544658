"""``tpuprov bench``: cold start, warm per-event overhead, storm economy and memory, in one run.

Starts the GKE emulator in-process and a real kube-apiserver (etcd + API server), runs each part
against them, and returns one JSON-safe report whose ``targets`` say which published figure holds.
Rendering and writing live in ``sandbox.bench.report``.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandbox.bench import admission as bench_admission
from sandbox.bench import cluster as bench_cluster
from sandbox.bench import coldstart as bench_coldstart
from sandbox.bench import declared as bench_declared
from sandbox.bench import env as bench_env
from sandbox.bench import fanout as bench_fanout
from sandbox.bench import forged as bench_forged
from sandbox.bench import handover as bench_handover
from sandbox.bench import multikueue as bench_multikueue
from sandbox.bench import overhead as bench_overhead
from sandbox.bench import storm as bench_storm
from sandbox.bench import waves as bench_waves
from sandbox.bench.procs import REFERENCE_TARGET
from sandbox.sim import reserved as sim_reserved
from sandbox.sim import stockout as sim_stockout

COLD_START_MAX_SECONDS = 0.8
COLD_START_MAX_FRACTION_OF_REFERENCE = 1 / 3
OVERHEAD_P99_MAX_MS = 20.0
READS_PER_EVENT_MAX = 2.0
SECONDS_TO_ALL_CREATES_MAX = 10.0
FANOUT_SECONDS_MAX = 6.0
RECONCILE_SECONDS_MAX = 30.0
RECONCILE_RSS_MAX_MIB = 256.0
# The fleet issue's bar: one instance serving storms from 10 clusters at once costs per event what
# one cluster's storm costs, within 10% (the clusters share nothing but the instance).
FLEET_CLUSTERS = 10
FLEET_RATIO_MAX = 1.10
# Both runs of that comparison coalesce over the whole replay. The window is wall time: replayed
# as fast as one instance answers, ten clusters' storms take ten times one cluster's, so at the
# deployed 5 s each cluster's repeats would outlive the window that its own storm, arriving at the
# scheduler's pace beside the others, would not (measured: 2.4x the reads at 5 s, 1.0x at 300 s).
FLEET_COALESCE_SECONDS = 300


@dataclass(frozen=True)
class BenchConfig:
    """What to run and how big."""

    launches: int = 5
    events: int = 1000
    storm: bench_storm.StormShape = field(default_factory=bench_storm.StormShape)
    fanout: bench_fanout.FanOutShape = field(default_factory=bench_fanout.FanOutShape)
    cluster: bench_cluster.ClusterShape = field(default_factory=bench_cluster.ClusterShape)
    cold_start: bool = True
    simulation: bool = True  # the virtual-time waves (seconds of real time)
    handover: bool = True  # the queued same-shape workload on the real stack (about 3 minutes)
    handover_shape: bench_handover.HandoverShape = field(default_factory=bench_handover.HandoverShape)
    # Kueue's real MultiKueue, one worker stocked out (three control planes, about 3 minutes; None: skipped).
    multikueue: bench_multikueue.MultiKueueShape | None = field(
        default_factory=bench_multikueue.MultiKueueShape
    )
    # Suspended JobSets declaring a million pods against a baseline (None: skipped).
    declared: bench_declared.DeclaredShape | None = field(default_factory=bench_declared.DeclaredShape)
    # Forged and missing pods' entries mixed with a real JobSet's, to one provision (None: skipped).
    forged: bench_forged.ForgedShape | None = field(default_factory=bench_forged.ForgedShape)
    # The warm overhead again with the storm from this many clusters at once (0 or 1: skipped).
    fleet_clusters: int = FLEET_CLUSTERS
    log_dir: Path | None = None  # function process logs; a temporary directory when None


def _finite(value: float, digits: int = 4) -> float | None:
    # JSON has no infinity: a figure that was never reached (e.g. not all creates) is null.
    return round(value, digits) if math.isfinite(value) else None


def _target(name: str, value: float, limit: float, unit: str, ok: bool | None = None) -> dict[str, Any]:
    met = value <= limit if ok is None else ok
    return {"name": name, "value": _finite(value), "limit": limit, "unit": unit, "met": met}


def _cold_targets(cold: list[dict[str, Any]]) -> list[dict[str, Any]]:
    medians = {(c["target"], c["kind"]): c["median_s"] for c in cold}
    reference = medians.get((REFERENCE_TARGET, "ack"), 0.0)
    targets = []
    for function in ("provision", "release"):
        value = medians.get((function, "ack"))
        if value is None:
            continue
        targets.append(_target(f"cold start {function} (median)", value, COLD_START_MAX_SECONDS, "s"))
        if reference:
            targets.append(
                _target(
                    f"cold start {function} / reference",
                    value / reference,
                    COLD_START_MAX_FRACTION_OF_REFERENCE,
                    "ratio",
                )
            )
    return targets


def _fleet_targets(
    one: bench_overhead.OverheadResult, fleet: bench_overhead.OverheadResult
) -> list[dict[str, Any]]:
    """The fleet's per-event overhead (p50: p99 of in-process milliseconds is the machine's noise)
    and reads per event, each as a ratio to one cluster's; and every cluster got each slice once."""
    p50 = bench_env.percentile
    ratio = p50(fleet.overhead, 50) / p50(one.overhead, 50) if p50(one.overhead, 50) else math.inf
    reads = fleet.reads_per_event / one.reads_per_event if one.reads_per_event else math.inf
    per_cluster = fleet.creates / fleet.clusters
    return [
        _target(
            f"fleet overhead p50 vs one cluster ({fleet.clusters} clusters)", ratio, FLEET_RATIO_MAX, "ratio"
        ),
        _target(
            f"fleet reads per event vs one cluster ({fleet.clusters} clusters)",
            reads,
            FLEET_RATIO_MAX,
            "ratio",
        ),
        _target(
            "fleet creates per cluster = one cluster's",
            per_cluster,
            one.creates,
            "creates",
            ok=fleet.creates == one.creates * fleet.clusters,
        ),
    ]


def _storm_targets(storm: bench_storm.StormResult) -> list[dict[str, Any]]:
    s = storm.shape.slices
    return [
        _target("storm creates == S", storm.creates, s, "calls", ok=storm.creates == s),
        _target("storm deletes == S", storm.deletes, s, "calls", ok=storm.deletes == s),
        _target("storm reads per event", storm.reads_per_event, READS_PER_EVENT_MAX, "reads"),
        _target("storm leaked pools", storm.leaked_pools, 0, "pools"),
        _target("storm non-2xx answers", storm.non_2xx, 0, "answers"),
        _target("storm time to all S creates", storm.seconds_to_all_creates, SECONDS_TO_ALL_CREATES_MAX, "s"),
    ]


def _scale_targets(
    fan: bench_fanout.FanOutResult, sweep: bench_cluster.ClusterResult
) -> list[dict[str, Any]]:
    s, accepted = fan.shape.slices, fan.creates_accepted
    return [
        _target("fan-out creates accepted == S", accepted, s, "calls", ok=accepted == s),
        _target("fan-out time to all S creates", fan.seconds_to_all_accepted, FANOUT_SECONDS_MAX, "s"),
        _target("reconcile sweep at cluster scale", sweep.sweep_seconds, RECONCILE_SECONDS_MAX, "s"),
        _target("reconcile peak RSS (worker)", sweep.rss.worker_mib, RECONCILE_RSS_MAX_MIB, "MiB"),
    ]


def _declared_targets(part: dict[str, Any]) -> list[dict[str, Any]]:
    # The goal (sandbox/bench/declared.py): a declared pod is a number in a spec and must cost
    # nothing, so each figure stays within the baseline's (1.5x + 1 s, + 32 MiB).
    pods = part["declared"]["declared_pods"]
    figures = {k: part["declared"][p][f] for k, (p, f) in _DECLARED_FIGURES.items()}
    return [
        _target(
            f"declared pods: {label}, {pods:,} declared vs baseline", figures[key], part["limits"][key], unit
        )
        for key, label, unit in (
            ("sweep_seconds", "reconcile sweep", "s"),
            ("release_seconds", "release delivery", "s"),
            ("sweep_rss_mib", "reconcile peak RSS (worker)", "MiB"),
            ("release_rss_mib", "release peak RSS (worker)", "MiB"),
        )
    ]


_DECLARED_FIGURES = {
    "sweep_seconds": ("sweep", "seconds"),
    "release_seconds": ("release", "seconds"),
    "sweep_rss_mib": ("sweep", "rss_mib"),
    "release_rss_mib": ("release", "rss_mib"),
}


def _forged_targets(result: bench_forged.ForgedResult) -> list[dict[str, Any]]:
    # The goal (sandbox/bench/forged.py, shared/app/coalesce.py): at most one GKE listing per object
    # per coalescing window, one create per real slice, none for a forged or missing pod.
    s, lists = result.shape.slices, result.gke_calls.get("list", 0)
    return [
        _target("forged storm: GKE lists <= objects x coalescing windows", lists, result.list_bound, "calls"),
        _target(
            "forged storm: creates of the real JobSet == S",
            result.creates_real,
            s,
            "calls",
            ok=result.creates_real == s,
        ),
        _target("forged storm: creates for forged and missing pods", result.creates_other, 0, "calls"),
        _target("forged storm: non-2xx answers", result.non_2xx, 0, "answers"),
    ]


def _wave_targets(waves: list[Any]) -> list[dict[str, Any]]:
    out = []
    for r in waves:
        name = f"S={r.config.slices} C={r.config.op_limit}"
        if r.config.slices >= 64:
            ratio = r.ratio if r.ratio is not None else math.inf
            out.append(_target(f"makespan / lower bound, {name}", ratio, bench_waves.RATIO_MAX, "x"))
        out.append(_target(f"dead-lettered messages, {name}", r.dead_lettered, 0, "messages"))
        out.append(
            _target(f"wasted creates (429), {name}", r.wasted, r.waves, "calls", ok=r.wasted <= r.waves)
        )
    return out


def _stockout_dict(result: sim_stockout.StockoutResult) -> dict[str, Any]:
    return {
        "policy": result.config.policy,
        "outage_minutes": result.config.outage_minutes,
        "creates": result.creates,
        "creates_first_hour": result.creates_first_hour,
        "landed_minutes": None if result.landed_at is None else round(result.landed_at / 60, 1),
        "attempts": list(result.kinds),
        "landed_on": list(result.landed_on),
    }


def _stockout_targets(
    fallback: sim_stockout.StockoutResult, backoff: sim_stockout.StockoutResult
) -> list[dict[str, Any]]:
    landed = fallback.landed_on == ("on-demand",)
    back_in = (
        math.inf if backoff.landed_at is None else backoff.landed_at / 60 - backoff.config.outage_minutes
    )
    return [
        _target(
            "stockout with fallback: creates until on-demand runs",
            fallback.creates,
            2,
            "calls",
            ok=landed and fallback.creates <= 2,
        ),
        _target(
            "stockout without fallback: creates in the first hour", backoff.creates_first_hour, 6, "calls"
        ),
        _target("stockout without fallback: landed after capacity returned", back_in, 45, "min"),
    ]


def _reserved_dict(result: sim_reserved.ReservedResult) -> dict[str, Any]:
    return {
        "look": result.config.look,
        "slices": result.config.slices,
        "refused": result.refused,
        "accepted": result.accepted,
        "reads": result.reads,
        "landed_s": _finite(math.inf if result.landed_at is None else result.landed_at, 1),
    }


def _reserved_targets(looked: sim_reserved.ReservedResult) -> list[dict[str, Any]]:
    # The goal: a full reservation costs no refused create (before the look: one per attempt).
    landed = looked.landed_at is not None and looked.accepted == looked.config.slices
    return [
        _target(
            "full reservation: creates GKE refused per slice",
            looked.refused_per_slice,
            0,
            "calls",
            ok=landed and looked.refused == 0,
        )
    ]


def _admission_targets(part: dict[str, Any]) -> list[dict[str, Any]]:
    # One pool-create time whatever S: the slowest create (6 min) plus three sink delays.
    out = []
    shape = part["shape"]
    one_create = shape["create_seconds"][1] + 3 * shape["sink_delay"]
    for row in part["ready"]:
        value = math.inf if row["check_s"] is None else row["check_s"]
        out.append(
            _target(
                f"admission check: reservation to all slices ready, S={row['slices']}", value, one_create, "s"
            )
        )
    for row in part["fanout"]:
        s = row["slices"]
        if row["op_limit"] < s:
            # GKE's limit is below S and unknown to the product: it learns it and fills it.
            out.append(
                _target(
                    f"admission check: GKE operations at once, S={s}, limit {row['op_limit']} learnt",
                    row["max_operations"],
                    row["op_limit"],
                    "ops",
                    ok=row["max_operations"] == row["op_limit"] and row["learnt_limit"] == row["op_limit"],
                )
            )
        else:
            value = math.inf if row["all_accepted_s"] is None else row["all_accepted_s"]
            # Rounds of 1 s (CREATE_CONCURRENCY wide, doubling up to CREATE_CONCURRENCY_MAX), after
            # the QuotaReserved Event's sink delay.
            bound = row["rounds_bound"] * row["create_latency_s"] + shape["sink_delay"]
            out.append(
                _target(f"admission check: all creates accepted, S={s} at 1 s per create", value, bound, "s")
            )
        out.append(
            _target(
                f"admission check: GKE requests in the busiest minute, S={s}, limit {row['op_limit']}",
                row["busiest_minute_requests"],
                bench_admission.GKE_REQUESTS_PER_MINUTE,
                "calls",
            )
        )
    stock = part["stockout"]
    step = stock["backoff_step_s"]
    to_retry = math.inf if stock["stockout_to_retry_s"] is None else stock["stockout_to_retry_s"]
    out += [
        _target(
            "admission check, 1 of 4 slices stocked out: quota released after the stockout",
            to_retry,
            step,
            "s",
        ),
        _target(
            "admission check, 1 of 4 slices stocked out: requeue after",
            stock["requeue_after_s"],
            step,
            "s",
            ok=0 < stock["requeue_after_s"] <= step,
        ),
        _target(
            "admission check, 1 of 4 slices stocked out: creates", stock["creates"], stock["slices"], "calls"
        ),
    ]
    return out


def _handover_targets(result: bench_handover.HandoverResult) -> list[dict[str, Any]]:
    n = result.shape.jobsets
    creates_max = bench_handover.CONCURRENT + bench_handover.CREATES_SLACK
    later = max(0, n - bench_handover.CONCURRENT)
    handed = len(result.split(True))
    return [
        _target(f"handover creates, {n} queued JobSets", result.creates, creates_max, "calls"),
        _target(
            "handover JobSets run on handed-over pools == N - 2", handed, later, "JobSets", ok=handed == later
        ),
        _target("handover JobSets completed == N", result.completed, n, "JobSets", ok=result.completed == n),
        _target("handover leaked pools", len(result.pools_leaked), 0, "pools"),
        _target("handover pods killed by a pool deletion", result.pods_killed, 0, "pods"),
    ]


def multikueue_targets(result: bench_multikueue.MultiKueueResult) -> list[dict[str, Any]]:
    """The MultiKueue part's targets: the physical floor (one failed attempt, then one create, each
    ``D``) plus Kueue's dispatch and the events' route; one failed attempt's pools in the other worker."""
    d, slices = result.shape.op_seconds, result.shape.slices
    ready_max = result.floor_seconds + bench_multikueue.OVERHEAD_SECONDS
    attempt = slices * (2 * d + bench_multikueue.OVERHEAD_SECONDS)
    ready = result.seconds_to_ready if result.seconds_to_ready is not None else float("inf")
    return [
        _target("multikueue: submission to all slices ready, one worker stocked out", ready, ready_max, "s"),
        _target(
            "multikueue: the job ran in the worker with capacity",
            1 if result.ran_in == bench_multikueue.STOCKED else 0,
            1,
            "",
            ok=result.ran_in == bench_multikueue.STOCKED,
        ),
        _target(
            "multikueue: pool-seconds in the worker that did not run it",
            result.loser_pool_seconds,
            attempt,
            "s",
        ),
        _target(
            "multikueue: creates in the stocked-out worker <= slices",
            result.creates.get(bench_multikueue.SHORT, 0),
            slices,
            "calls",
        ),
        _target(
            "multikueue: the next job of the shape, submission to all slices ready (floor 1 x D)",
            result.next_seconds_to_ready if result.next_seconds_to_ready is not None else float("inf"),
            d + bench_multikueue.OVERHEAD_SECONDS,
            "s",
        ),
        _target(
            "multikueue: the next job's creates in the stocked-out worker",
            result.next_creates_in_short if result.next_creates_in_short is not None else slices,
            0,
            "calls",
        ),
        _target("multikueue: leaked pools", len(result.pools_leaked), 0, "pools"),
        _target("multikueue: pods killed", result.pods_killed, 0, "pods"),
    ]


def fanout_dict(fan: bench_fanout.FanOutResult) -> dict[str, Any]:
    """The fan-out result as JSON-safe data."""
    out = asdict(fan)
    out["seconds_to_all_accepted"] = _finite(fan.seconds_to_all_accepted, 3)
    return out


def cluster_dict(sweep: bench_cluster.ClusterResult) -> dict[str, Any]:
    """The reconcile-at-scale result as JSON-safe data."""
    out = asdict(sweep)
    out["setup_seconds"] = round(sweep.setup_seconds, 3)
    out["sweep_seconds"] = round(sweep.sweep_seconds, 3)
    out["page_seconds"] = round(sweep.page_seconds, 4)
    return out


def storm_dict(storm: bench_storm.StormResult) -> dict[str, Any]:
    """The storm result as JSON-safe data (derived rates included)."""
    out = asdict(storm)
    out["events_per_second"] = round(storm.events_per_second, 1)
    out["reads_per_event"] = round(storm.reads_per_event, 3)
    out["seconds"] = round(storm.seconds, 3)
    out["seconds_to_all_creates"] = _finite(storm.seconds_to_all_creates, 3)
    out["delivery"] = (
        f"one functions-framework process (gunicorn, 1 worker) over HTTP, "
        f"{storm.shape.concurrency} concurrent client threads"
    )
    return out


def run(config: BenchConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the benchmark and return the report."""
    say = progress or (lambda _msg: None)
    with tempfile.TemporaryDirectory(prefix="tpuprov-bench-") as scratch:
        log_dir = config.log_dir or Path(scratch)
        report: dict[str, Any] = {
            "generated": datetime.datetime.now(tz=datetime.UTC).isoformat(timespec="seconds"),
            "machine": {
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
                "platform": platform.platform(terse=True),
            },
            "config": {
                "launches": config.launches,
                "events": config.events,
                "storm": asdict(config.storm),
                "fanout": asdict(config.fanout),
                "cluster": asdict(config.cluster),
                "handover": asdict(config.handover_shape) if config.handover else None,
                "declared": asdict(config.declared) if config.declared else None,
                "forged": asdict(config.forged) if config.forged else None,
            },
        }
        targets: list[dict[str, Any]] = []
        if config.cold_start:
            with bench_env.started() as env:
                cold = bench_coldstart.measure(env, config.launches, log_dir, progress=say)
            report["cold_start"] = [
                {
                    "target": c.target,
                    "kind": c.kind,
                    "probe": c.description,
                    "median_s": round(c.median, 4),
                    "samples_s": [round(x, 4) for x in c.samples],
                }
                for c in cold
            ]
            targets += _cold_targets(report["cold_start"])
        with bench_env.started() as env:
            say("overhead: posting events in-process")
            overhead = bench_overhead.measure(env, config.events)
        report["overhead"] = {
            "events": overhead.events,
            "creates": overhead.creates,
            "max_reads_per_event": overhead.max_reads_per_event,
            "delivery": "functions-framework app in-process (Flask test client), emulators over HTTP",
            **overhead.summary(),
        }
        targets.append(
            _target("warm overhead p99", report["overhead"]["overhead_p99_ms"], OVERHEAD_P99_MAX_MS, "ms")
        )
        if config.fleet_clusters > 1:
            say(f"fleet overhead: one cluster's storm, then the same from {config.fleet_clusters} at once")
            runs = {}
            for clusters in (1, config.fleet_clusters):
                with bench_env.started(fleet=clusters) as env:
                    runs[clusters] = bench_overhead.measure(
                        env, config.events, coalesce_seconds=FLEET_COALESCE_SECONDS
                    )
            one, fleet = runs[1], runs[config.fleet_clusters]
            report["fleet_overhead"] = {
                "coalesce_seconds": FLEET_COALESCE_SECONDS,
                **{
                    key: {
                        "clusters": run.clusters,
                        "events": run.events,
                        "creates": run.creates,
                        "redeliveries": run.redeliveries,
                        "max_reads_per_event": run.max_reads_per_event,
                        **run.summary(),
                    }
                    for key, run in (("one_cluster", one), ("fleet", fleet))
                },
            }
            targets += _fleet_targets(one, fleet)
        with bench_env.started() as env:
            storm = bench_storm.run(env, config.storm, log_dir, progress=say)
        report["storm"] = storm_dict(storm)
        targets += _storm_targets(storm)
        with bench_env.started() as env:
            say(f"fan-out: {config.fanout.slices} creates at {config.fanout.create_latency}s each")
            fan = bench_fanout.run(env, config.fanout)
        with bench_env.started() as env:
            say(f"reconcile: {config.cluster.pods} pods, {config.cluster.nodes} nodes")
            sweep = bench_cluster.run(env, config.cluster, log_dir)
        report["fanout"] = fanout_dict(fan)
        report["reconcile_scale"] = cluster_dict(sweep)
        targets += _scale_targets(fan, sweep)
        if config.declared is not None:
            declared = bench_declared.run(config.declared, log_dir / "declared", progress=say)
            report["declared_pods"] = bench_declared.as_dict(declared)
            targets += _declared_targets(report["declared_pods"])
        if config.forged is not None:
            storm_shape = config.forged
            say(f"forged storm: {storm_shape.deliveries} entries: a forged pod, missing pods, a real JobSet")
            with bench_env.started() as env:
                forged = bench_forged.run(env, storm_shape, log_dir / "forged", progress=say)
            report["forged_storm"] = bench_forged.as_dict(forged)
            targets += _forged_targets(forged)
        if config.handover:
            shape = config.handover_shape
            say(f"handover: {shape.jobsets} same-shape JobSets through a queue that runs 2 at a time")
            handover = bench_handover.run(shape)
            report["handover"] = bench_handover.as_dict(handover)
            targets += _handover_targets(handover)
        if config.multikueue is not None:
            say("multikueue: a 2-slice JobSet to a MultiKueue manager whose first worker is stocked out")
            placed = bench_multikueue.run(config.multikueue)
            report["multikueue"] = bench_multikueue.as_dict(placed)
            targets += multikueue_targets(placed)
        if config.simulation:
            say("simulation: S slices through GKE's operation limit, in virtual time")
            waves, without = bench_waves.run_all()
            report["simulation"] = {
                "runs": [bench_waves.as_dict(r) for r in waves],
                "without_finished_operations": bench_waves.as_dict(without),
            }
            targets += _wave_targets(waves)
            say("simulation: Spot stocked out for 20 min (60 min without fallback), in virtual time")
            fallback = sim_stockout.run(
                sim_stockout.StockoutConfig(policy="spot, on-demand", select_spot=False)
            )
            backoff = sim_stockout.run(sim_stockout.StockoutConfig(outage_minutes=60, horizon_hours=8))
            report["stockout"] = {"fallback": _stockout_dict(fallback), "backoff": _stockout_dict(backoff)}
            targets += _stockout_targets(fallback, backoff)
            say("simulation: a full reservation before another with room, in virtual time")
            looked = sim_reserved.run(sim_reserved.ReservedConfig(look=True))
            blind = sim_reserved.run(sim_reserved.ReservedConfig(look=False))
            report["reserved"] = {"look": _reserved_dict(looked), "blind": _reserved_dict(blind)}
            targets += _reserved_targets(looked)
            say("simulation: the Kueue admission check (S slices before pods), in virtual time")
            report["admission"] = bench_admission.measure_all()
            targets += _admission_targets(report["admission"])
        report["targets"] = targets
        report["all_met"] = all(t["met"] for t in targets)
        return report
