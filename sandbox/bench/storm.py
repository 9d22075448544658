"""Storm economy: one big multislice JobSet whose every pod reports FailedScheduling again and again.

S slices x H hosts, R events per pod, ~10% delivered twice, all shuffled, posted concurrently (as
Cloud Run's request concurrency would) to ONE functions-framework process over HTTP. The emulators'
counters then say what the storm cost: exactly S creates, reads per event, and after the JobSet's
completion event reaches the release function, exactly S deletes and no pool left behind.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox.bench import env as bench_env
from sandbox.bench.env import BenchEnv
from sandbox.bench.procs import DeliveryError, PeakRss, first_2xx, launched, peak_rss, post
from sandbox.jobsets import tpu_jobset
from shared.events.envelope import ClusterId
from shared.tpu.pods import Pod

Delivery = tuple[dict[str, str], bytes]
# v6e slices of ct6e-standard-4t VMs (4 chips each): hosts -> the topology GKE accepts for them.
V6E_TOPOLOGY_BY_HOSTS = {1: "2x2", 2: "2x4", 4: "4x4", 8: "4x8", 16: "8x8", 32: "8x16", 64: "16x16"}


def v6e_topology(hosts: int) -> str:
    """The v6e topology whose slice has ``hosts`` VMs of 4 chips each (a clear error for any other)."""
    try:
        return V6E_TOPOLOGY_BY_HOSTS[hosts]
    except KeyError:
        raise ValueError(f"hosts must be one of {sorted(V6E_TOPOLOGY_BY_HOSTS)}") from None


@dataclass(frozen=True)
class StormShape:
    """The storm's size: ``slices`` x ``hosts`` pods, ``repeats`` events each, plus duplicates."""

    slices: int = 64
    hosts: int = 4
    repeats: int = 3
    duplicate_fraction: float = 0.10
    concurrency: int = 8
    seed: int = 20260101

    @property
    def topology(self) -> str:
        """The v6e topology whose slice has ``hosts`` VMs of 4 chips each."""
        return v6e_topology(self.hosts)


@dataclass
class StormResult:
    """What one storm cost and how fast one instance absorbed it."""

    shape: StormShape
    events: int  # deliveries to provision (duplicates included)
    duplicates: int
    creates: int
    deletes: int
    provision_reads: int
    release_events: int
    release_reads: int
    leaked_pools: int
    non_2xx: int
    seconds: float  # first delivery until the last answer
    seconds_to_all_creates: float  # first delivery until the S-th create reached GKE
    provision_rss: PeakRss
    release_rss: PeakRss

    @property
    def events_per_second(self) -> float:
        """Deliveries handled per second by the one provision instance."""
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def reads_per_event(self) -> float:
        """API reads (GKE + Kubernetes) per provision delivery."""
        return self.provision_reads / self.events if self.events else 0.0


def storm_deliveries(
    pods: Sequence[dict[str, Any]],
    repeats: int,
    duplicate_fraction: float,
    rng: random.Random,
    clusters: Sequence[ClusterId] = (bench_env.CLUSTER_ID,),
) -> tuple[list[Delivery], int]:
    """``repeats`` distinct FailedScheduling messages per pod, some delivered twice, shuffled; with
    several ``clusters``, that storm from each of them, all mixed (every cluster's storm at once)."""
    messages = [
        bench_env.binary_delivery(bench_env.pending_entry(pod, cluster))
        for cluster in clusters
        for pod in pods
        for _ in range(repeats)
    ]
    duplicates = rng.sample(messages, round(len(messages) * duplicate_fraction))
    deliveries = messages + duplicates
    rng.shuffle(deliveries)
    return deliveries, len(duplicates)


class _CreateWatch:
    """Notes when the GKE emulator has seen ``wanted`` creates (polled on a thread, 5 ms resolution)."""

    def __init__(self, env: BenchEnv, wanted: int, baseline: int) -> None:
        self.env, self.wanted, self.baseline = env, wanted, baseline
        self.reached_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-create-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.env.gke.count("create") - self.baseline >= self.wanted:
                self.reached_at = time.perf_counter()
                return
            self._stop.wait(0.005)

    def __enter__(self) -> _CreateWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _deliver_all(url: str, deliveries: Sequence[Delivery], concurrency: int) -> int:
    """Post every delivery with ``concurrency`` threads; the number of non-2xx answers."""

    def one(delivery: Delivery) -> bool:
        status = post(url, delivery[0], delivery[1])
        return 200 <= status < 300

    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="bench-storm") as pool:
        return sum(1 for ok in pool.map(one, deliveries) if not ok)


def _wait_pools_gone(env: BenchEnv, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while env.managed_pools() and time.monotonic() < deadline:
        env.gke.finish_operations()
        time.sleep(0.05)
    return len(env.managed_pools())


def until_older_than_memory_rule(pods: Sequence[dict[str, Any]]) -> None:
    """Wait until every pod is over two seconds old. The scheduler logs FailedScheduling for a pending
    pod again and again for minutes, while provision answers from its memory of a pool only for a
    pod created over a second before it saw the pool (creation times have whole seconds): a storm
    squeezed into its pods' first second would measure that rule instead of the storm."""
    newest = max(Pod.parse(p).created_at or 0.0 for p in pods)  # what provision compares against
    wait = newest + 2.0 - time.time()
    if wait > 0:
        time.sleep(wait)


def run(
    env: BenchEnv,
    shape: StormShape,
    log_dir: Path,
    name: str = "storm",
    progress: Callable[[str], None] | None = None,
) -> StormResult:
    """Run one storm through a provision process, then release through a release process."""
    rng = random.Random(shape.seed)
    jobset, pods = env.submit(
        tpu_jobset(name, "team-a", replicas=shape.slices, topology=shape.topology, chips_per_vm=4)
    )
    deliveries, duplicates = storm_deliveries(pods, shape.repeats, shape.duplicate_fraction, rng)
    ignored = bench_env.binary_delivery(bench_env.ignored_entry())
    with launched("provision", env.function_env("provision"), log_dir) as fn:
        first_2xx(fn, *ignored)  # up and warm before the clock starts (cold start is measured apart)
        until_older_than_memory_rule(pods)
        before = env.counters()
        with _CreateWatch(env, shape.slices, before.gke_creates) as watch:
            started = time.perf_counter()
            non_2xx = _deliver_all(fn.url, deliveries, shape.concurrency)
            seconds = time.perf_counter() - started
        provision = env.counters() - before
        provision_rss = peak_rss(fn.pid)
    if progress is not None:
        progress(f"storm: {len(deliveries)} deliveries in {seconds:.1f}s, {provision.gke_creates} creates")
    env.gke.finish_operations()
    env.complete(jobset)
    completion = bench_env.binary_delivery(bench_env.completion_entry(jobset))
    with launched("release", env.function_env("release"), log_dir) as fn:
        first_2xx(fn, *ignored)
        before = env.counters()
        release_deliveries = [completion, completion]  # Pub/Sub delivers at least once
        for headers, body in release_deliveries:
            status = post(fn.url, headers, body)
            if not 200 <= status < 300:
                raise DeliveryError(f"release answered {status}:\n{fn.process.tail()}")
        release = env.counters() - before
        release_rss = peak_rss(fn.pid)
    leaked = _wait_pools_gone(env)
    return StormResult(
        shape=shape,
        events=len(deliveries),
        duplicates=duplicates,
        creates=provision.gke_creates,
        deletes=release.gke_deletes,
        provision_reads=provision.reads,
        release_events=len(release_deliveries),
        release_reads=release.reads,
        leaked_pools=leaked,
        non_2xx=non_2xx,
        seconds=seconds,
        seconds_to_all_creates=(watch.reached_at - started) if watch.reached_at else float("inf"),
        provision_rss=provision_rss,
        release_rss=release_rss,
    )
