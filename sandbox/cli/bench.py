"""``tpuprov bench``: measure cold start, per-event overhead, storm economy and memory locally.

A ``tpuprov.commands`` entry point (``sandbox.cli``). The benchmark itself lives in
``sandbox.bench``; it is imported only when the subcommand runs, so the other commands never pay for it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` subcommand."""
    parser = subparsers.add_parser(
        "bench", help="benchmark the functions against local emulators and write JSON + Markdown results"
    )
    parser.add_argument("--out", type=Path, default=Path("bench-results"), help="results directory")
    parser.add_argument("--launches", type=int, default=5, help="cold-start launches per function (>= 1)")
    parser.add_argument("--events", type=int, default=1000, help="warm events for the overhead figure")
    parser.add_argument("--slices", type=int, default=64, help="storm: slices of the JobSet (S)")
    parser.add_argument(
        "--hosts", type=int, default=4, choices=(1, 2, 4, 8, 16), help="storm: hosts per slice (H)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="storm: FailedScheduling events per pod (R)")
    parser.add_argument("--concurrency", type=int, default=8, help="storm: concurrent deliveries")
    parser.add_argument("--fanout-slices", type=int, default=64, help="fan-out: slices of the wide JobSet")
    parser.add_argument("--cluster-nodes", type=int, default=500, help="reconcile at scale: nodes")
    parser.add_argument("--cluster-pods", type=int, default=5000, help="reconcile at scale: pods")
    parser.add_argument("--cluster-jobsets", type=int, default=100, help="reconcile at scale: JobSets")
    parser.add_argument(
        "--cluster-pools", type=int, default=30, help="reconcile at scale: managed pools (<= JobSets)"
    )
    parser.add_argument(
        "--declared-pods",
        type=int,
        default=1_000_000,
        help="declared pods: pods the suspended JobSets declare in all (against a 1-pod baseline)",
    )
    parser.add_argument(
        "--declared-jobsets", type=int, default=16, help="declared pods: suspended JobSets (K)"
    )
    parser.add_argument(
        "--forged-events", type=int, default=500, help="forged storm: pending-pod entries (>= 3)"
    )
    parser.add_argument(
        "--forged-ghosts", type=int, default=50, help="forged storm: pod names that do not exist"
    )
    parser.add_argument("--skip-declared", action="store_true", help="skip the declared-pods part")
    parser.add_argument("--skip-forged", action="store_true", help="skip the forged-event storm")
    parser.add_argument("--skip-cold-start", action="store_true", help="skip the (slowest) cold-start part")
    parser.add_argument("--skip-simulation", action="store_true", help="skip the virtual-time waves part")
    parser.add_argument("--skip-handover", action="store_true", help="skip the queued same-shape workload")
    parser.add_argument(
        "--skip-multikueue", action="store_true", help="skip the MultiKueue part (three control planes)"
    )
    parser.add_argument(
        "--handover-jobsets", type=int, default=8, help="handover: same-shape JobSets queued (e.g. 20)"
    )
    parser.add_argument(
        "--fleet-clusters",
        type=int,
        default=10,
        help="fleet overhead: clusters whose storms one instance serves at once (1: skip; default 10)",
    )
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the function processes' logs here")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit 0 when every target is met, 1 when one is missed, 2 on bad input."""
    counts: tuple[int, ...] = (
        args.launches,
        args.events,
        args.slices,
        args.repeats,
        args.concurrency,
        args.fanout_slices,
    )
    counts += (args.handover_jobsets, args.declared_pods, args.declared_jobsets, args.forged_ghosts)
    counts += (args.forged_events - 2,)  # a third of the entries for each kind of target
    scale = (args.cluster_nodes, args.cluster_pods, args.cluster_jobsets, args.cluster_pools)
    if min(counts) < 1 or min(scale) < 1 or args.cluster_pools > args.cluster_jobsets:
        print(
            "tpuprov bench: counts must be >= 1 (--forged-events >= 3, --cluster-pools <= --cluster-jobsets)",
            file=sys.stderr,
        )
        return 2
    from sandbox.bench import report as bench_report
    from sandbox.bench import runner as bench
    from sandbox.bench.cluster import ClusterShape
    from sandbox.bench.declared import DeclaredShape
    from sandbox.bench.fanout import FanOutShape
    from sandbox.bench.forged import ForgedShape
    from sandbox.bench.handover import HandoverShape
    from sandbox.bench.multikueue import MultiKueueShape
    from sandbox.bench.storm import StormShape

    config = bench.BenchConfig(
        launches=args.launches,
        events=args.events,
        storm=StormShape(
            slices=args.slices, hosts=args.hosts, repeats=args.repeats, concurrency=args.concurrency
        ),
        fanout=FanOutShape(slices=args.fanout_slices),
        cluster=ClusterShape(
            nodes=args.cluster_nodes,
            pods=args.cluster_pods,
            jobsets=args.cluster_jobsets,
            tpu_jobsets=args.cluster_pools,
            pending_pods=min(100, args.cluster_pools),
        ),
        cold_start=not args.skip_cold_start,
        simulation=not args.skip_simulation,
        handover=not args.skip_handover,
        handover_shape=HandoverShape(jobsets=args.handover_jobsets),
        multikueue=None if args.skip_multikueue else MultiKueueShape(),
        fleet_clusters=args.fleet_clusters,
        declared=None
        if args.skip_declared
        else DeclaredShape(jobsets=args.declared_jobsets, declared_pods=args.declared_pods),
        forged=None
        if args.skip_forged
        else ForgedShape(deliveries=args.forged_events, ghosts=args.forged_ghosts),
        log_dir=args.log_dir,
    )
    try:
        report = bench.run(config, progress=lambda line: print(line, file=sys.stderr, flush=True))
    except FileNotFoundError as exc:
        print(f"tpuprov bench: {exc}", file=sys.stderr)
        return 2
    json_path, md_path = bench_report.write(report, args.out)
    print(bench_report.markdown(report))
    print(f"wrote {json_path} and {md_path} (docs/performance.md's figures)", file=sys.stderr)
    missed = [t["name"] for t in report["targets"] if not t["met"]]
    if missed:
        print(f"tpuprov bench: targets missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0
