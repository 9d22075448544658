"""Cold start: from process launch to the first 2xx, per function, beside the eager-import reference.

Each launch is a fresh ``functions-framework`` process polled with one real binary-mode CloudEvent
until it answers. Launches are interleaved round-robin across probes so that noise from a shared
machine hits every function alike, and one unrecorded warm-up round first makes sure every
module's bytecode is cached (as it is in a built container image).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox.bench import env as bench_env
from sandbox.bench.env import BenchEnv, Counters
from sandbox.bench.procs import REFERENCE_TARGET, DeliveryError, first_2xx, launched
from sandbox.jobsets import tpu_jobset
from shared.cloud.gke import GkeNodePoolAPI
from shared.tpu.slices import build_node_pool, slice_request

Delivery = tuple[dict[str, str], bytes]
Check = Callable[[Counters], str]  # "" when the calls a probe made are the expected ones


@dataclass(frozen=True)
class Probe:
    """What a launch is asked to handle first."""

    target: str
    kind: str  # "ack": no API call expected; "first-create" / "first-delete" / "sweep": real work
    description: str


PROBES = (
    Probe("provision", "ack", "ignored entry, acked without API calls"),
    Probe("release", "ack", "ignored entry, acked without API calls"),
    Probe(REFERENCE_TARGET, "ack", "ignored entry, acked without API calls"),
    Probe("setup_cluster", "ack", "ignored entry, acked without API calls"),
    Probe("apply_kueue", "ack", "ignored entry, acked without API calls"),
    Probe("reconcile", "sweep", "scheduler tick: one sweep against the emulators"),
    Probe("provision", "first-create", "pending pod: get pod, list pools, create, record Event"),
    Probe(REFERENCE_TARGET, "first-create", "pending pod: get pod, list pools, create, record Event"),
    Probe("release", "first-delete", "JobSet completed: list pools, get JobSet, delete, record Event"),
)


@dataclass
class ColdStart:
    """Launch-to-first-2xx samples (seconds) of one probe."""

    target: str
    kind: str
    description: str
    samples: list[float] = dataclasses.field(default_factory=list)

    @property
    def median(self) -> float:
        """Median over the recorded launches."""
        return bench_env.median(self.samples)


def _expect_none(delta: Counters) -> str:
    return "" if delta == Counters(0, 0, 0, 0, 0) else f"expected no API call, saw {delta}"


def _expect_create(delta: Counters) -> str:
    return "" if delta.gke_creates == 1 else f"expected exactly one create, saw {delta}"


def _expect_delete(delta: Counters) -> str:
    return "" if delta.gke_deletes == 1 else f"expected exactly one delete, saw {delta}"


def _expect_anything(delta: Counters) -> str:
    return ""


def _prepare(env: BenchEnv, probe: Probe, run: str) -> tuple[Delivery, Check]:
    """The delivery a launch is polled with, and how to check the calls it caused."""
    if probe.kind == "ack":
        return bench_env.binary_delivery(bench_env.ignored_entry()), _expect_none
    if probe.kind == "sweep":
        return bench_env.binary_delivery(bench_env.ignored_entry()), _expect_anything
    # Single-host slices: one pod, one pool per JobSet, a fresh JobSet per launch.
    jobset, pods = env.submit(tpu_jobset(f"cold-{run}", "team-a", replicas=1, topology="2x2"))
    if probe.kind == "first-create":
        return bench_env.binary_delivery(bench_env.pending_entry(pods[0])), _expect_create
    api = GkeNodePoolAPI(endpoint=env.gke.url)
    spec, _ = build_node_pool(
        env.settings, slice_request(pods[0]), api.get_cluster(env.settings.cluster_path)
    )
    api.create_node_pool(env.settings.cluster_path, spec, "bench setup")
    env.gke.finish_operations()
    env.complete(jobset)
    return bench_env.binary_delivery(bench_env.completion_entry(jobset)), _expect_delete


def measure(
    env: BenchEnv,
    launches: int,
    log_dir: Path,
    probes: tuple[Probe, ...] = PROBES,
    progress: Callable[[str], None] | None = None,
) -> list[ColdStart]:
    """Launch every probe's function ``launches`` times (plus a warm-up round) and time each."""
    results = [ColdStart(p.target, p.kind, p.description) for p in probes]
    for round_no in range(launches + 1):
        for index, (probe, result) in enumerate(zip(probes, results, strict=True)):
            (headers, body), check = _prepare(env, probe, f"{round_no}-{index}")
            before = env.counters()
            with launched(probe.target, env.function_env(probe.target), log_dir) as fn:
                seconds = first_2xx(fn, headers, body)
            problem = check(env.counters() - before)
            if problem:
                raise DeliveryError(f"cold start of {probe.target} ({probe.kind}): {problem}")
            if round_no > 0:  # round 0 only warms the bytecode cache
                result.samples.append(seconds)
        if progress is not None:
            progress(f"cold start: round {round_no}/{launches} done")
    return results
