"""Warm per-event overhead: time inside the function minus time spent in the API adapters.

Deliveries go through functions-framework's in-process app (``sandbox.testing.fnclient``) against the
emulators. A WSGI wrapper times each request inside the app (CloudEvent parsing, decoding,
decisions, JSON logging); wrappers on the instance's ``GkeNodePoolAPI`` and ``KubeClient`` methods
time the API calls (client-library work included, since it is paid per call, not per event). The
difference is what the product itself costs per event.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sandbox.bench import env as bench_env
from sandbox.bench.env import BenchEnv
from sandbox.bench.storm import V6E_TOPOLOGY_BY_HOSTS, storm_deliveries
from sandbox.jobsets import tpu_jobset
from sandbox.testing.fnclient import FunctionClient
from shared.app import entry
from shared.core import logs

GKE_METHODS = (
    "get_cluster",
    "list_node_pools",
    "get_node_pool",
    "create_node_pool",
    "delete_node_pool",
    "set_node_pool_labels",
    "get_operation",
)
KUBE_METHODS = (
    "get_pod",
    "list_pods",
    "list_nodes",
    "set_unschedulable",
    "get_jobset",
    "list_jobsets",
    "record_event",
)
MAX_REDELIVERIES = 5  # per delivery, before a 503 fails the run
READ_METHODS = frozenset(
    {"get_cluster", "list_node_pools", "get_node_pool", "get_operation", "get_pod", "list_pods"}
    | {"get_jobset", "list_jobsets", "list_nodes"}
)


class IoClock:
    """Accumulates time and reads spent inside wrapped adapter methods (per thread)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def reset(self) -> None:
        """Start a new event on this thread."""
        self._local.seconds = 0.0
        self._local.reads = 0

    @property
    def seconds(self) -> float:
        """API time of the current event on this thread."""
        return float(getattr(self._local, "seconds", 0.0))

    @property
    def reads(self) -> int:
        """API reads of the current event on this thread."""
        return int(getattr(self._local, "reads", 0))

    def wrap(self, adapter: Any, names: Iterable[str]) -> None:
        """Shadow each named method of ``adapter`` (this instance only) with a timed one."""
        for name in names:
            setattr(adapter, name, self._timed(name, getattr(adapter, name)))

    def _timed(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        is_read = name in READ_METHODS

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._local.seconds = self.seconds + time.perf_counter() - started
                self._local.reads = self.reads + (1 if is_read else 0)

        return timed


@dataclass
class OverheadResult:
    """Per-event samples (seconds) of the warm in-process run."""

    events: int = 0
    creates: int = 0
    total: list[float] = field(default_factory=list)
    io: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)
    max_reads_per_event: int = 0
    reads: list[int] = field(default_factory=list)  # API reads of each event
    redeliveries: int = 0  # deliveries answered 503 (redeliver) and posted again
    clusters: int = 1

    @property
    def reads_per_event(self) -> float:
        return sum(self.reads) / len(self.reads) if self.reads else 0.0

    def summary(self) -> dict[str, float]:
        """p50/p99 in milliseconds, and the mean API reads per event."""
        out: dict[str, float] = {}
        for name, values in (("overhead", self.overhead), ("total", self.total), ("io", self.io)):
            out[f"{name}_p50_ms"] = round(bench_env.percentile(values, 50) * 1000, 2)
            out[f"{name}_p99_ms"] = round(bench_env.percentile(values, 99) * 1000, 2)
        out["reads_per_event"] = round(self.reads_per_event, 3)
        return out


class _TimedApp:
    """WSGI middleware recording how long each request spent inside the function's app."""

    def __init__(self, app: Callable[..., Any], clock: IoClock) -> None:
        self.app = app
        self.clock = clock
        self.last = 0.0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        self.clock.reset()
        started = time.perf_counter()
        try:
            return self.app(environ, start_response)
        finally:
            self.last = time.perf_counter() - started


def measure(
    env: BenchEnv,
    events: int = 1000,
    slices: int = 32,
    hosts: int = 4,
    seed: int = 7,
    coalesce_seconds: int | None = None,
) -> OverheadResult:
    """Post at least ``events`` storm-shaped pending-pod deliveries in-process; time each one. With
    a fleet (``env.clusters``), each cluster sends that storm, all at once and mixed, to the one
    instance (``events`` per cluster); each cluster is warmed first, as one cluster is."""
    rng = random.Random(seed)
    repeats = max(1, math.ceil(events / (slices * hosts * 1.1)))
    topology = V6E_TOPOLOGY_BY_HOSTS[hosts]
    _, warm_pods = env.submit(tpu_jobset("overhead-warmup", "team-b", replicas=2, topology=topology))
    _, pods = env.submit(tpu_jobset("overhead", "team-a", replicas=slices, topology=topology))
    warmup, _ = storm_deliveries(warm_pods, 2, 0.0, rng, env.clusters)
    deliveries, _ = storm_deliveries(pods, repeats, 0.10, rng, env.clusters)
    while len(deliveries) < events * len(
        env.clusters
    ):  # rounding can leave a few short; top up with duplicates
        deliveries.append(rng.choice(deliveries))

    settings = env.settings
    if coalesce_seconds is not None:  # EVENT_COALESCE_SECONDS for this run (see the fleet bench)
        settings = dataclasses.replace(settings, event_coalesce_seconds=coalesce_seconds)
    runtime = entry.reset_runtime(settings)
    assert runtime is not None
    with open(os.devnull, "w", encoding="utf-8") as sink:
        # Lines are still formatted as JSON (that is per-event work); only the writing is discarded.
        logs.configure(env.settings.project_id, stream=sink)
        try:
            clock = IoClock()
            clock.wrap(runtime.gke(), GKE_METHODS)  # the instance's one GKE client
            for member in runtime.members():  # each cluster's own Kubernetes client
                clock.wrap(member.kube(), KUBE_METHODS)
            fn = FunctionClient("provision", project=bench_env.PROJECT)
            timed = _TimedApp(fn.app.wsgi_app, clock)
            fn.app.wsgi_app = timed
            for headers, body in warmup:
                fn.post_raw(headers, body)
            result = OverheadResult()
            creates_before = env.gke.count("create")
            queue = list(deliveries)
            attempts: dict[int, int] = {}
            while queue:
                headers, body = queue.pop(0)
                response = fn.post_raw(headers, body)
                result.total.append(timed.last)
                result.io.append(clock.seconds)
                result.overhead.append(max(0.0, timed.last - clock.seconds))
                result.max_reads_per_event = max(result.max_reads_per_event, clock.reads)
                result.reads.append(clock.reads)
                if response.status_code == 503 and attempts.get(id(body), 0) < MAX_REDELIVERIES:
                    # The product asked for a redelivery (a GKE call failed on the way): Pub/Sub
                    # brings it back, here at the end of the queue; it is counted, not fatal.
                    attempts[id(body)] = attempts.get(id(body), 0) + 1
                    result.redeliveries += 1
                    queue.append((headers, body))
                elif response.status_code != 200:
                    raise RuntimeError(f"provision answered {response.status_code}: {response.data!r}")
            result.events = len(deliveries)
            result.clusters = len(env.clusters)
            result.creates = env.gke.count("create") - creates_before
        finally:
            logs.configure(env.settings.project_id)
            entry.reset_runtime(None)
    return result
