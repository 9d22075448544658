"""Forged-event storm: entries anyone with ``roles/logging.logWriter`` can write, routed to provision.

The issue: the sinks route any FailedScheduling-shaped entry to provision, and anyone allowed to
write log entries in the project can write them. Each used to cost a GKE listing, and GKE's request
quota (3000 requests a minute per project) is shared with the creates that matter. Provision now
coalesces repeated events per object (``shared.app.coalesce``): one decision per object per
EVENT_COALESCE_SECONDS (5 s by default) per instance.

One provision function process at its default window gets ``deliveries`` pending-pod entries, one
after another as fast as it answers (a single client in a tight loop), shuffled over three kinds of
target, a third each:

* ``forged``: one real pending pod that belongs to no JobSet's Job: a bare pod with a TPU request
  whose labels claim slice S (one past the last) of the real JobSet, written by an attacker;
* ``ghosts``: pod names that do not exist (the entries name the real JobSet as their controller);
* ``real``: the pending pods of a real JobSet of S slices x H hosts (``env.submit``: the JobSet, its
  Jobs and their pods, as the controllers make them).

Measured: GKE calls by kind (the emulator's call log), Kubernetes reads and writes (the API
server's audit log), creates (and whose slice each was for), and wall time.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.bench import env as bench_env
from sandbox.bench.env import BenchEnv
from sandbox.bench.procs import PeakRss, first_2xx, launched, peak_rss, post
from sandbox.bench.storm import Delivery, until_older_than_memory_rule, v6e_topology
from sandbox.jobsets import tpu_jobset
from shared.core import labels
from shared.events import entries as logentries
from shared.tpu.jobsets import template_pod
from shared.tpu.slices import slice_request

NAMESPACE = bench_env.NAMESPACES[0]
REAL = "real-train"
TARGET_KINDS = ("forged", "ghosts", "real")


@dataclasses.dataclass(frozen=True)
class ForgedShape:
    """``deliveries`` entries over one forged pod, ``ghosts`` missing pods and a real JobSet's pods."""

    deliveries: int = 500
    ghosts: int = 50
    slices: int = 4
    hosts: int = 2  # v6e 2x4: two VMs of four chips
    seed: int = 20260115

    @property
    def topology(self) -> str:
        """The v6e topology whose slice has ``hosts`` VMs of 4 chips each."""
        return v6e_topology(self.hosts)


@dataclasses.dataclass(frozen=True)
class ForgedResult:
    """What the storm cost."""

    shape: ForgedShape
    window_seconds: float  # EVENT_COALESCE_SECONDS of the process (its default)
    deliveries: dict[str, int]  # per target kind
    objects: dict[str, int]  # distinct objects named, per target kind
    non_2xx: int
    seconds: float  # first delivery until the last answer
    gke_calls: dict[str, int]  # by kind, during the storm
    kube_reads: int
    kube_writes: int
    creates_real: int  # creates of the real JobSet's declared slices
    creates_other: int  # creates of any other pool (a forged or ghost pod's)
    real_pools: int  # managed pools of the real JobSet after the storm
    rss: PeakRss

    @property
    def distinct_objects(self) -> int:
        """Objects the entries named (pods, real or not)."""
        return sum(self.objects.values())

    @property
    def windows(self) -> int:
        """Coalescing windows an object can be decided in during the storm: floor(T / window) + 1."""
        return int(self.seconds // self.window_seconds) + 1 if self.window_seconds > 0 else self.total

    @property
    def total(self) -> int:
        """Deliveries in all."""
        return sum(self.deliveries.values())

    @property
    def list_bound(self) -> int:
        """The goal's bound on GKE listings: at most one per object per coalescing window."""
        return self.distinct_objects * self.windows

    @property
    def events_per_second(self) -> float:
        """Deliveries answered per second by the one instance."""
        return self.total / self.seconds if self.seconds else 0.0


def forged_pod(jobset: dict[str, Any], job_index: int) -> dict[str, Any]:
    """A bare pending pod an attacker writes: the real JobSet's labels for a Job it does not have,
    a TPU request and selectors, and no controller (no Job made it)."""
    rjob = jobset["spec"]["replicatedJobs"][0]
    pod = template_pod(jobset, rjob, job_index)
    pod["metadata"].pop("ownerReferences", None)
    pod["metadata"]["name"] = f"{REAL}-forged-{job_index}"
    return pod


def ghost_entry(name: str) -> dict[str, Any]:
    """A FailedScheduling entry for pod ``name``, which does not exist, naming the real JobSet."""
    return logentries.pod_event_entry(
        bench_env.CLUSTER_ID, NAMESPACE, name, str(uuid.uuid4()), controller=("JobSet", REAL)
    )


def _created_pool(summary: str) -> str:
    # The emulator's create summary: "name=<pool> machineType=... nodes=... topology=...".
    for part in summary.split():
        if part.startswith("name="):
            return part.removeprefix("name=")
    return ""


def plan(
    shape: ForgedShape, forged: dict[str, Any], real: list[dict[str, Any]], rng: random.Random
) -> list[tuple[str, str, Delivery]]:
    """(kind, pod name, delivery) for every delivery, shuffled: a third each to the forged pod, the
    ghosts (round robin) and the real pods (round robin). Entries are built now, so they are fresh."""
    ghosts = [f"{REAL}-slice-{rng.randrange(100, 10**6)}-0-r0" for _ in range(shape.ghosts)]
    out: list[tuple[str, str, Delivery]] = []
    for i in range(shape.deliveries):
        kind, turn = TARGET_KINDS[i % 3], i // 3
        if kind == "forged":
            name, entry = forged["metadata"]["name"], bench_env.pending_entry(forged)
        elif kind == "ghosts":
            name = ghosts[turn % len(ghosts)]
            entry = ghost_entry(name)
        else:
            pod = real[turn % len(real)]
            name, entry = pod["metadata"]["name"], bench_env.pending_entry(pod)
        out.append((kind, name, bench_env.binary_delivery(entry)))
    rng.shuffle(out)
    return out


def run(
    env: BenchEnv, shape: ForgedShape, log_dir: Path, progress: Callable[[str], None] | None = None
) -> ForgedResult:
    """Write the real JobSet and the forged pod, then storm one provision process with the entries."""
    if shape.deliveries < 3 or shape.ghosts < 1:
        raise ValueError("need at least 3 deliveries and 1 ghost")
    rng = random.Random(shape.seed)
    jobset, pods = env.submit(
        tpu_jobset(REAL, NAMESPACE, replicas=shape.slices, topology=shape.topology, chips_per_vm=4)
    )
    forged = env.kube.put(forged_pod(jobset, shape.slices))
    wanted = {slice_request(pod).pool_name for pod in pods}
    deliveries = plan(shape, forged, pods, rng)
    kinds = Counter(kind for kind, _, _ in deliveries)
    objects = {k: len({name for kind, name, _ in deliveries if kind == k}) for k in TARGET_KINDS}
    ignored = bench_env.binary_delivery(bench_env.ignored_entry())
    window = float(env.settings.event_coalesce_seconds)  # the function's env leaves it at its default
    with launched("provision", env.function_env("provision"), log_dir) as fn:
        first_2xx(fn, *ignored)  # up and warm before the clock starts
        until_older_than_memory_rule([*pods, forged])
        env.kube.clear_requests()
        since = len(env.gke.calls)
        before = env.counters()
        non_2xx = 0
        started = time.perf_counter()
        for _kind, _name, (headers, body) in deliveries:
            status = post(fn.url, headers, body)
            non_2xx += not 200 <= status < 300
        seconds = time.perf_counter() - started
        spent = env.counters() - before
        calls = env.gke.calls[since:]
        rss = peak_rss(fn.pid)
    creates = [_created_pool(c.summary) for c in calls if c.method == "create"]
    if progress is not None:
        progress(f"forged storm: {len(deliveries)} deliveries in {seconds:.1f}s, {len(creates)} creates")
    real_pools = [
        p
        for p in env.managed_pools()
        if (p.get("config") or {}).get("labels", {}).get(labels.OWNER_NAME) == REAL
    ]
    return ForgedResult(
        shape=shape,
        window_seconds=window,
        deliveries={k: kinds[k] for k in TARGET_KINDS},
        objects=objects,
        non_2xx=non_2xx,
        seconds=seconds,
        gke_calls=dict(sorted(Counter(c.method for c in calls).items())),
        kube_reads=spent.kube_reads,
        kube_writes=spent.kube_writes,
        creates_real=sum(1 for name in creates if name in wanted),
        creates_other=sum(1 for name in creates if name not in wanted),
        real_pools=len(real_pools),
        rss=rss,
    )


def as_dict(result: ForgedResult) -> dict[str, Any]:
    """A JSON-safe report (derived figures included)."""
    out = dataclasses.asdict(result)
    out["seconds"] = round(result.seconds, 3)
    out["distinct_objects"] = result.distinct_objects
    out["windows"] = result.windows
    out["list_bound"] = result.list_bound
    out["events_per_second"] = round(result.events_per_second, 1)
    return out
