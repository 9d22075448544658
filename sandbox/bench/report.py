"""Render a ``sandbox.bench.runner`` report as Markdown and write it (and the JSON) to a results folder.

The Markdown is the "Performance figures" section of docs/performance.md, where the published figures live.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPRODUCE = "make bench   # or: .venv/bin/tpuprov bench --out bench-results"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def _cold_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in report.get("cold_start", []):
        samples = ", ".join(f"{s:.2f}" for s in c["samples_s"])
        rows.append([f"`{c['target']}`", c["probe"], f"**{c['median_s']:.2f} s**", samples])
    return rows


def _wave_lines(report: dict[str, Any]) -> list[str]:
    sim = report.get("simulation")
    if not sim:
        return []
    rows = []
    for r in sim["runs"]:
        c = r["config"]
        makespan = "never" if r["makespan_s"] is None else f"{r['makespan_s'] / 60:.1f} min"
        rows.append(
            [
                str(c["slices"]),
                str(c["op_limit"]),
                makespan,
                f"{r['lower_bound_s'] / 60:.0f} min",
                "-" if r["ratio"] is None else f"**{r['ratio']:.3f}**",
                str(r["wasted"]),
                str(r["waves"]),
                str(r["dead_lettered"]),
                str(r["deliveries"]),
            ]
        )
    w = sim["without_finished_operations"]
    w_makespan = "never" if w["makespan_s"] is None else f"{w['makespan_s'] / 60:.1f} min"
    return [
        "**Waves under GKE's operation limit** (virtual time, `sandbox/sim`): the real provision and "
        "reconcile services against a GKE that runs C node-pool operations at once, each taking "
        "D = 5 min (uniform within 20%); Pub/Sub with infra's retry policy (10-600 s, 10 attempts, "
        "then dead letter); "
        "FailedScheduling repeated every 5 min per pending pod; reconcile every 5 min; the audit entry "
        "of each finished operation delivered to provision 5 s later. Lower bound: ceil(S/C) x D with "
        "the nominal D (drawn durations can beat it).",
        "",
        *_table(
            [
                "S",
                "C",
                "makespan",
                "lower bound",
                "ratio",
                "wasted (429)",
                "waves",
                "dead-lettered",
                "deliveries",
            ],
            rows,
        ),
        "",
        f"Without the finished-operation events (S=64, C=5): makespan {w_makespan}, "
        f"{w['wasted']} wasted creates, {w['dead_lettered']} dead-lettered, {w['deliveries']} deliveries.",
        "",
    ]


def _stockout_lines(report: dict[str, Any]) -> list[str]:
    runs = report.get("stockout")
    if not runs:
        return []
    rows = []
    for label, r in (
        ("fallback `spot, on-demand`", runs["fallback"]),
        ("no fallback (pods select Spot)", runs["backoff"]),
    ):
        landed = "never" if r["landed_minutes"] is None else f"{r['landed_minutes']} min"
        rows.append(
            [
                label,
                f"{r['outage_minutes']:.0f} min",
                " -> ".join(r["attempts"]),
                str(r["creates_first_hour"]),
                f"**{landed}**",
                ", ".join(r["landed_on"]),
            ]
        )
    return [
        "**Stockouts** (virtual time, `sandbox/sim/stockout.py`): one v5e 2x4 slice; Spot in its zone "
        "is empty for the outage, on-demand is available; creates and deletes take 2 min; "
        "FailedScheduling and reconcile every 5 min; finished-operation entries 5 s after each "
        "operation; default backoff (5 min doubling to 30 min).",
        "",
        *_table(
            ["policy", "Spot outage", "attempts", "creates in 1st hour", "running after", "landed on"], rows
        ),
        "",
    ]


def _reserved_lines(report: dict[str, Any]) -> list[str]:
    runs = report.get("reserved")
    if not runs:
        return []
    rows = [
        [
            label,
            str(r["slices"]),
            str(r["refused"]),
            str(r["accepted"]),
            str(r["reads"]),
            "never" if r["landed_s"] is None else f"{r['landed_s']:.0f} s",
        ]
        for label, r in (("read before buying", runs["look"]), ("create and see (before)", runs["blind"]))
    ]
    return [
        "**A full reservation** (virtual time, `sandbox/sim/reserved.py`): v6e 2x4 slices, policy "
        "`reservation:res-full, reservation:res-room`; res-full is taken by a running pool, res-room "
        "has room for all; creates take 2 min.",
        "",
        *_table(
            ["how", "slices", "creates GKE refused", "accepted", "reservation reads", "all running"], rows
        ),
        "",
    ]


def admission_lines(report: dict[str, Any]) -> list[str]:
    """The admission-check part as Markdown lines (none when the simulation was skipped)."""
    part = report.get("admission")
    if not part:
        return []
    ready = [
        [str(r["slices"]), f"**{_minutes(r['check_s'])}**", _minutes(r["pending_pod_path_s"])]
        for r in part["ready"]
    ]
    fanout = [
        [
            str(r["slices"]),
            f"{r['op_limit']} (learnt: {_or(r['learnt_limit'], 'never refused')})",
            f"{r['concurrency']} -> {r['widest_round']}",
            f"**{_seconds(r['all_accepted_s'])}**",
            str(r["max_operations"]),
            str(r["busiest_minute_requests"]),
            str(r["refused_429"]),
            str(r["quota_refused"]),
        ]
        for r in part["fanout"]
    ]
    st = part["stockout"]
    return [
        "**Slices before pods** (virtual time, `sandbox/bench/admission.py`): the product's admission "
        "check against a GKE whose pool creates take 4-6 min (operation limit 20), Kueue's QuotaReserved "
        "Event and each finished create delivered 5 s later. Today's path for the same JobSet "
        "(`sandbox/sim/scenario.py`): first pending pod, FailedScheduling through the sink, creates.",
        "",
        *_table(
            ["S", "reservation -> all slices ready", "pending-pod path: pod -> all pools RUNNING"], ready
        ),
        "",
        "Fan-out at 1 s per CreateNodePool: rounds from CREATE_CONCURRENCY, doubling while GKE accepts "
        "them (up to CREATE_CONCURRENCY_MAX); the operation limit learnt from GKE's 429; GKE's API quota "
        "3000 requests/min enforced by the simulated GKE (every call counted):",
        "",
        *_table(
            [
                "S",
                "GKE op limit",
                "round width",
                "reservation -> all creates accepted",
                "most ops at once",
                "busiest minute (requests)",
                "429 too many ops",
                "429 quota",
            ],
            fanout,
        ),
        "",
        f"One slice of {st['slices']} stocked out: the check said Retry "
        f"{_seconds(st['stockout_to_retry_s'])} after the pool failed "
        f"({_seconds(st['reservation_to_retry_s'])} after the reservation), requeueAfterSeconds "
        f"{st['requeue_after_s']} (backoff step {st['backoff_step_s']} s), {st['creates']} creates.",
        "",
    ]


def _or(value: object, instead: str) -> str:
    return instead if value is None else str(value)


def _minutes(value: float | None) -> str:
    return "never" if value is None else f"{value / 60:.1f} min"


def multikueue_lines(report: dict[str, Any]) -> list[str]:
    """The MultiKueue part as Markdown lines (none when the part was skipped)."""
    m = report.get("multikueue")
    if not m:
        return []
    d, slices = m["shape"]["op_seconds"], m["shape"]["slices"]
    ready = "never" if m["seconds_to_ready"] is None else f"{m['seconds_to_ready']:.1f} s"
    creates = ", ".join(f"{k} {v}" for k, v in m["creates"].items())
    return [
        f"**MultiKueue, one region stocked out** (Kueue v0.19.2's real MultiKueue over three control "
        f"planes): a {slices}-slice v5e JobSet submitted to the manager; the first worker of the "
        f"fleet's order has no capacity for it; GKE's operations take D = {d:.0f} s and a stockout "
        f"shows at the create's end. The floor is 2 x D = {m['floor_seconds']:.0f} s (one failed "
        "attempt, then the creates elsewhere).",
        "",
        *_table(
            ["figure", "value"],
            [
                ["submission to every slice RUNNING", f"**{ready}** in {m['ran_in'] or 'no worker'}"],
                ["create requests per worker (both jobs)", creates],
                [
                    "the next job of the shape: submission to every slice RUNNING (floor 1 x D)",
                    "never"
                    if m.get("next_seconds_to_ready") is None
                    else f"**{m['next_seconds_to_ready']:.1f} s**, "
                    f"{m.get('next_creates_in_short')} creates in the stocked-out worker",
                ],
                [
                    "pool-seconds in the worker that did not run it",
                    f"**{m['loser_pool_seconds']:.0f} s**, of pools GKE failed (no VM runs in them)",
                ],
                [
                    "reference: a check buying in every worker, both with capacity",
                    f"at least {m['naive_loser_pool_seconds']:.0f} s of running slices thrown away in the "
                    "loser (computed); the product: 0 creates there (tests/sandbox/real/test_multikueue.py)",
                ],
                ["pools leaked / pods killed", f"{len(m['pools_leaked'])} / {m['pods_killed']}"],
                ["setup of the three clusters", f"{m['setup_seconds']:.0f} s"],
            ],
        ),
        "",
        *([f"Problems: {'; '.join(m['problems'])}.", ""] if m["problems"] else []),
    ]


def handover_lines(report: dict[str, Any]) -> list[str]:
    """The handover part as Markdown lines (none when the part was skipped)."""
    h = report.get("handover")
    if not h:
        return []
    n, concurrent = h["shape"]["jobsets"], h["concurrent"]

    def cell(split: dict[str, Any]) -> list[str]:
        if not split["count"]:
            return ["0", "-", "-"]
        return [str(split["count"]), f"{split['median_s']:.2f} s", f"{split['max_s']:.2f} s"]

    problems = h["problems"]
    return [
        f"**Handover on a queued workload** (the real stack: API server, scheduler, JobSet and Kueue "
        f"controllers, KWOK nodes): {n} "
        f"same-shape JobSets of one v5e 2x4 slice queued at once in a ClusterQueue whose quota fits "
        f"{concurrent}; each later JobSet's pods land on a finished one's idle nodes and the product "
        f"adopts the pool instead of deleting it. Admission = Kueue's Admitted Event on the Workload; "
        f"Running = the scheduler's Scheduled Event of its last pod. Creates take "
        f"{h['gke_op_seconds']:.1f} s in the emulator (minutes on GKE), "
        f"so the fresh figure is a floor.",
        "",
        *_table(
            ["figure", "value"],
            [
                ["GKE create requests (without handover: one per JobSet)", f"**{h['creates']}** (vs {n})"],
                [
                    "pools adopted (TPUSliceAdopted) / deleted / leaked",
                    (f"{h['pools_adopted']} / {h['pools_deleted']} / {len(h['pools_leaked'])}"),
                ],
                ["pods killed by a pool deletion", str(h["pods_killed"])],
                ["JobSets completed", f"{h['completed']} of {n}"],
                ["whole run", f"{h['seconds']:.1f} s"],
            ],
        ),
        "",
        *_table(
            ["admission to Running", "JobSets", "median", "max"],
            [
                ["on fresh pools (without handover)", *cell(h["fresh"])],
                ["on handed-over pools", *cell(h["handed_over"])],
            ],
        ),
        "",
        *([f"Problems: {'; '.join(problems)}.", ""] if problems else []),
    ]


def _scale_lines(report: dict[str, Any]) -> list[str]:
    f, c = report.get("fanout"), report.get("reconcile_scale")
    if not f or not c:
        return []
    fs, cs = f["shape"], c["shape"]
    return [
        f"**Fan-out under GKE's pace**: one pending-pod event of a JobSet of {fs['slices']} single-host "
        f"slices; the GKE emulator holds each create {fs['create_latency']} s, runs operations for "
        f"minutes and allows {fs['op_limit']} running operations per cluster; `CREATE_CONCURRENCY` "
        f"{fs['concurrency']}. Creates sent one after another would take "
        f"{fs['slices'] * fs['create_latency']:.0f} s.",
        "",
        *_table(
            ["figure", "value"],
            [
                ["time until GKE accepted all S creates", _seconds(f["seconds_to_all_accepted"])],
                ["deliveries (first + redeliveries)", str(f["deliveries"])],
                ["creates sent / accepted", f"{f['creates_sent']} / {f['creates_accepted']}"],
                [
                    "creates answered 429 / 400 (operation limit)",
                    f"{f['too_many_operations']} / {f['incompatible_operation']}",
                ],
                ["most creates in flight at GKE", str(f["max_in_flight"])],
            ],
        ),
        "",
        f"**Reconcile at cluster scale**: {cs['nodes']} nodes, {cs['pods']} pods, {cs['jobsets']} JobSets, "
        f"{cs['tpu_jobsets']} managed pools ({cs['pending_pods']} pods pending), on a real kube-apiserver "
        f"(one page of {cs['page_size']} pods served in {c['page_seconds'] * 1000:.0f} ms, median); one "
        "sweep in a reconcile function process (after a warm-up sweep). The cluster is a tenth of the "
        "50,000 pods the stand-in API held: every object now goes through the API server, and a load "
        "that size would take over ten minutes here.",
        "",
        *_table(
            ["figure", "value"],
            [
                ["sweep (tick to 2xx)", f"**{c['sweep_seconds']:.2f} s**"],
                ["Kubernetes list pages / requests", f"{c['list_pages']} / {c['kube_requests']}"],
                ["GKE creates / deletes", f"{c['gke_creates']} / {c['gke_deletes']}"],
                [
                    "peak RSS, reconcile (worker / leader+worker)",
                    f"{c['rss']['worker_mib']:.0f} / {c['rss']['instance_mib']:.0f} MiB",
                ],
                [
                    "setup (objects written through the API server, not timed in the sweep)",
                    f"{c['setup_seconds']:.1f} s",
                ],
            ],
        ),
        "",
    ]


def _mib(value: float) -> str:
    return f"{value:.0f} MiB"


def declared_lines(report: dict[str, Any]) -> list[str]:
    """The declared-pods part as Markdown lines (none when the part was skipped)."""
    part = report.get("declared_pods")
    if not part:
        return []
    shape, limits, met = part["shape"], part["limits"], part["met"]
    base, d = part["baseline"], part["declared"]

    def row(r: dict[str, Any]) -> list[str]:
        return [
            r["name"],
            f"{r['jobsets']} x {r['replicas']:,} x {r['pods_per_job']}",
            f"{r['declared_pods']:,}",
            f"{r['sweep']['seconds']:.2f} s",
            _mib(r["sweep"]["rss_mib"]),
            f"{r['release']['seconds']:.2f} s",
            _mib(r["release"]["rss_mib"]),
            f"{r['release_first']['seconds']:.2f} s",
            f"{r['pools_kept']} of 2",
        ]

    def limit(key: str, text: str) -> str:
        return f"<= {text}" + ("" if met[key] else " **NO**")

    def calls(cost: dict[str, Any]) -> str:
        return (
            f"{cost['kube_requests']} Kubernetes requests and {sum(cost['gke_calls'].values())} GKE call(s)"
        )

    same = all(base[p]["kube_requests"] == d[p]["kube_requests"] for p in ("sweep", "release")) and all(
        base[p]["gke_calls"] == d[p]["gke_calls"] for p in ("sweep", "release")
    )
    return [
        "**Declared pods** (a free suspended JobSet of about a million declared pods used to stop every "
        "release: release and reconcile expanded every pod of every suspended JobSet, at 0.17 ms and "
        f"1.8 KiB a pod): {shape['jobsets']} suspended JobSets queued in a Kueue LocalQueue, on a real "
        f"kube-apiserver, declaring {d['declared_pods']:,} pods in all ({d['replicas']:,} replicas of a "
        f"{shape['vms']}-VM v6e {shape['topology']} slice each), against a baseline of the same JobSets "
        "with one replica of one pod; two idle managed pools of their shape whose owner JobSets are gone, "
        "so every delivery must compute the demand (a pool is kept for the queue only then). One "
        "reconcile sweep (after a warm-up sweep) in a reconcile function process; a JobSet-deleted "
        "audit entry for each gone owner to a release function process, the second measured (the first "
        "builds the process's API clients); each row on a fresh API server and GKE emulator. "
        f"Goal: {part['goal']}.",
        "",
        *_table(
            [
                "row",
                "JobSets x replicas x pods per Job",
                "declared pods",
                "sweep (tick to 2xx)",
                "sweep peak RSS",
                "release (delivery to 2xx)",
                "release peak RSS",
                "first release (clients built)",
                "idle pools kept",
            ],
            [
                row(base),
                row(d),
                [
                    "goal",
                    "",
                    "",
                    limit("sweep_seconds", f"{limits['sweep_seconds']:.2f} s"),
                    limit("sweep_rss_mib", _mib(limits["sweep_rss_mib"])),
                    limit("release_seconds", f"{limits['release_seconds']:.2f} s"),
                    limit("release_rss_mib", _mib(limits["release_rss_mib"])),
                    "",
                    "",
                ],
            ],
        ),
        "",
        f"A sweep cost {calls(d['sweep'])}, a release {calls(d['release'])}, "
        + ("in both rows." if same else f"(baseline: {calls(base['sweep'])}; {calls(base['release'])})."),
        "",
    ]


def forged_lines(report: dict[str, Any]) -> list[str]:
    """The forged-event storm as Markdown lines (none when the part was skipped)."""
    f = report.get("forged_storm")
    if not f:
        return []
    shape, d, o = f["shape"], f["deliveries"], f["objects"]
    calls = ", ".join(f"{kind} {count}" for kind, count in f["gke_calls"].items()) or "none"
    lists = f["gke_calls"].get("list", 0)
    return [
        f"**Forged-event storm** (anyone with `roles/logging.logWriter` can write entries the sinks "
        "route to provision; each used to cost a GKE listing, and GKE's request quota is shared with the "
        f"creates): {f['shape']['deliveries']} pending-pod entries, shuffled, a third each naming a real "
        "pending pod that belongs to no JobSet's Job (a bare pod whose labels claim a slice of the real "
        f"JobSet), {shape['ghosts']} pod names that do not exist, and the pending pods of a real JobSet of "
        f"{shape['slices']} slices x {shape['hosts']} hosts; posted one after another, as fast as one "
        f"provision function process answers, at its default `EVENT_COALESCE_SECONDS` "
        f"({f['window_seconds']:.0f} s).",
        "",
        *_table(
            ["figure", "value"],
            [
                [
                    "deliveries (forged pod / missing pods / real pods)",
                    f"{d['forged']} / {d['ghosts']} / {d['real']}",
                ],
                [
                    "distinct objects named (forged / missing / real)",
                    f"{o['forged']} / {o['ghosts']} / {o['real']}",
                ],
                ["GKE calls by kind", calls],
                [
                    "GKE lists (goal: at most one per object per coalescing window)",
                    f"**{lists}** (<= {f['distinct_objects']} objects x {f['windows']} window(s))",
                ],
                [
                    "creates: the real JobSet's slices / any other",
                    f"{f['creates_real']} of {shape['slices']} / {f['creates_other']}",
                ],
                ["Kubernetes reads / writes", f"{f['kube_reads']} / {f['kube_writes']}"],
                ["non-2xx answers", str(f["non_2xx"])],
                ["whole storm", f"{f['seconds']:.2f} s ({f['events_per_second']:.0f} deliveries/s)"],
                [
                    "peak RSS, provision (worker / leader+worker)",
                    f"{f['rss']['worker_mib']:.0f} / {f['rss']['instance_mib']:.0f} MiB",
                ],
            ],
        ),
        "",
    ]


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: one table per part, then the targets (docs/performance.md's section)."""
    machine = report["machine"]
    lines = [
        "## Performance figures",
        "",
        f"Measured {report['generated']} on {machine['cpus']} CPUs, Python {machine['python']} "
        f"({machine['platform']}), against the local GKE emulator and a real kube-apiserver. Reproduce with:",
        "",
        "```sh",
        REPRODUCE,
        "```",
        "",
    ]
    if report.get("cold_start"):
        launches = report["config"]["launches"]
        lines += [
            f"**Cold start**: process launch to first 2xx under `functions-framework`, median of {launches} "
            "launches (after one warm-up round). `reference` is the naive design: the same handler with "
            "functions_framework, cloudevents, container_v1, pubsub_v1, google.cloud.logging and "
            "kubernetes imported eagerly.",
            "",
            *_table(["function", "first delivery", "median", "samples (s)"], _cold_rows(report)),
            "",
        ]
    o = report["overhead"]
    lines += [
        f"**Warm per-event overhead** ({o['events']} pending-pod events, {o['creates']} creates; "
        f"{o['delivery']}): time inside the function minus time inside the GKE/Kubernetes adapters.",
        "",
        *_table(
            ["", "p50", "p99"],
            [
                [
                    "overhead (product)",
                    f"{o['overhead_p50_ms']:.2f} ms",
                    f"**{o['overhead_p99_ms']:.2f} ms**",
                ],
                ["API adapters", f"{o['io_p50_ms']:.2f} ms", f"{o['io_p99_ms']:.2f} ms"],
                ["total in function", f"{o['total_p50_ms']:.2f} ms", f"{o['total_p99_ms']:.2f} ms"],
            ],
        ),
        "",
    ]
    fleet = report.get("fleet_overhead")
    if fleet:
        one, many = fleet["one_cluster"], fleet["fleet"]
        lines += [
            f"**A fleet at once**: the same storm from each of {many['clusters']} clusters, mixed, to one "
            f"instance ({many['events']} events, {many['creates']} creates), against one cluster's "
            f"({one['events']} events); both coalesce over {fleet['coalesce_seconds']} s, the whole replay.",
            "",
            *_table(
                ["", "one cluster", f"{many['clusters']} clusters"],
                [
                    ["overhead p50", f"{one['overhead_p50_ms']:.2f} ms", f"{many['overhead_p50_ms']:.2f} ms"],
                    ["overhead p99", f"{one['overhead_p99_ms']:.2f} ms", f"{many['overhead_p99_ms']:.2f} ms"],
                    [
                        "API reads per event",
                        f"{one['reads_per_event']:.3f}",
                        f"{many['reads_per_event']:.3f}",
                    ],
                    ["redeliveries", str(one["redeliveries"]), str(many["redeliveries"])],
                ],
            ),
            "",
        ]
    s = report["storm"]
    shape = s["shape"]
    lines += [
        f"**Storm economy**: one JobSet of {shape['slices']} slices x {shape['hosts']} hosts, "
        f"{shape['repeats']} FailedScheduling events per pod, {s['duplicates']} duplicates, shuffled: "
        f"{s['events']} deliveries to {s['delivery']}, sent once every pod is over 2 s old (a "
        "pending pod's events repeat for minutes); then the JobSet's completion event "
        f"(delivered {s['release_events']} times) to one release process.",
        "",
        *_table(
            ["figure", "value"],
            [
                ["GKE creates / deletes", f"{s['creates']} / {s['deletes']}"],
                ["API reads per provision event (GKE + Kubernetes; budget 2)", f"{s['reads_per_event']:.2f}"],
                ["API reads for the release deliveries", str(s["release_reads"])],
                ["pools left after release", str(s["leaked_pools"])],
                ["events/s handled by one instance", f"{s['events_per_second']:.0f}"],
                ["time until all S creates were issued", _seconds(s["seconds_to_all_creates"])],
                ["whole storm", f"{s['seconds']:.2f} s"],
                [
                    "peak RSS, provision (worker / leader+worker)",
                    f"{s['provision_rss']['worker_mib']:.0f} / {s['provision_rss']['instance_mib']:.0f} MiB",
                ],
                [
                    "peak RSS, release (worker / leader+worker)",
                    f"{s['release_rss']['worker_mib']:.0f} / {s['release_rss']['instance_mib']:.0f} MiB",
                ],
            ],
        ),
        "",
        *_scale_lines(report),
        *declared_lines(report),
        *forged_lines(report),
        *handover_lines(report),
        *multikueue_lines(report),
        *_wave_lines(report),
        *_stockout_lines(report),
        *_reserved_lines(report),
        *admission_lines(report),
        "**Targets**",
        "",
        *_table(
            ["target", "measured", "limit", "met"],
            [
                [
                    t["name"],
                    "never" if t["value"] is None else f"{t['value']:.3g} {t['unit']}",
                    f"{t['limit']:.3g} {t['unit']}",
                    "yes" if t["met"] else "**NO**",
                ]
                for t in report["targets"]
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def write(report: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``bench.json`` and ``bench.md`` into ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "bench.json"
    md_path = out_dir / "bench.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown(report), encoding="utf-8")
    return json_path, md_path
