"""Declared pods: suspended JobSets declaring a million pods must cost release and reconcile nothing.

The issue: a free suspended JobSet of about a million declared pods stopped every release in the
cluster, because release and reconcile expanded every pod of every suspended JobSet in memory (the
handover's demand) at 0.17 ms and 1.8 KiB per pod: about 170 s and 1.7 GiB per delivery. The
product now reads a JobSet per replicated job (``shared.tpu.declared``), so a declared pod is a
number in a spec.

Two rows, each on a fresh real API server and GKE emulator:

* ``baseline``: K suspended JobSets queued in a Kueue LocalQueue (``kueue.x-k8s.io/queue-name``), of
  one replicated job, replicas 1 of the same 64-VM slice (64 pods per Job: K x 64 pods);
* ``declared``: the same K JobSets with as many replicas of a 64-VM v6e slice (64 pods per Job) as
  make ``declared_pods`` in all (1,000,448 for K=16: 977 replicas each, 62,528 VMs a JobSet, within
  MAX_VMS_PER_JOBSET).

Both rows have two idle managed pools of the JobSets' shape whose owner JobSets are gone, so release
and reconcile must compute the demand (every queued suspended JobSet) to decide whether to hold
them: a pool is kept (offered to the queue) only when they did. The JobSets are written through the
API server as an admin (single objects: loading is cheap). Then (a) one reconcile sweep in a
reconcile function process (after a warm-up sweep) and (b) a JobSet-deleted audit entry for each
gone owner to a release function process, the second one measured (the first builds the process's
API clients): time to 2xx and the worker's peak RSS, with the Kubernetes requests and GKE calls each
cost.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from google.cloud import container_v1

from sandbox.bench import env as bench_env
from sandbox.bench.env import BenchEnv
from sandbox.bench.procs import DeliveryError, FunctionProcess, first_2xx, launched, peak_rss, post
from sandbox.bench.storm import Delivery
from sandbox.jobsets import tpu_jobset
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.gke_messages import spec_to_node_pool
from shared.events import entries as logentries
from shared.tpu import catalog
from shared.tpu.declared import declared_request
from shared.tpu.slices import build_node_pool

ACCELERATOR = "tpu-v6e-slice"
CHIPS_PER_VM = 4
NAMESPACE = bench_env.NAMESPACES[0]
# Kueue's constants.QueueLabel: a suspended JobSet naming a LocalQueue is queued, waiting for
# admission (one its owner suspended without it is no demand: nothing will bring its pods).
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
QUEUE = "bench-queue"
# The idle pools' owners: never stored, so release and reconcile find them gone. The first one's
# release is the release process's first API work (it builds its clients: the Kubernetes client's
# import alone takes about half a second), the second one's is the measured delivery.
GONE_OWNERS = ("gone-owner-a", "gone-owner-b")

# The goal, from the physical limit: a declared pod is a number in a JobSet's spec, so it must cost
# nothing. Each figure within 1.5x of the baseline's plus 1 s of noise (the cost was about
# 170 s for a million pods), peak RSS within the baseline's plus 32 MiB (the issue's: 1.7 GiB).
TIME_FACTOR_MAX = 1.5
TIME_SLACK_SECONDS = 1.0
RSS_SLACK_MIB = 32.0


@dataclasses.dataclass(frozen=True)
class DeclaredShape:
    """K suspended JobSets declaring ``declared_pods`` in all, of slices of ``topology``."""

    jobsets: int = 16
    declared_pods: int = 1_000_000
    topology: str = "16x16"  # v6e: 64 VMs of 4 chips, one pod per VM (no v6e/v5p shape has 100 VMs)

    @property
    def vms(self) -> int:
        """VMs (and so pods) of one slice, one Job."""
        return catalog.resolve(ACCELERATOR, self.topology, CHIPS_PER_VM).num_vms

    @property
    def replicas(self) -> int:
        """Replicas of each JobSet's replicated job so that the K JobSets declare ``declared_pods``."""
        return max(1, -(-self.declared_pods // (self.jobsets * self.vms)))


@dataclasses.dataclass(frozen=True)
class Cost:
    """One delivery's cost: time to 2xx, the function worker's peak RSS, the API calls it made."""

    seconds: float
    rss_mib: float  # the gunicorn worker's VmHWM (the leader's is apart)
    kube_requests: int
    gke_calls: dict[str, int]


@dataclasses.dataclass(frozen=True)
class Row:
    """One row: what the K JobSets declare, and what a sweep and a release cost with them loaded."""

    name: str
    jobsets: int
    replicas: int
    pods_per_job: int
    declared_pods: int
    setup_seconds: float
    sweep: Cost  # a sweep after a warm-up sweep
    release_first: Cost  # the release process's first delivery: it builds its clients
    release: Cost  # the next one: the measured release
    pools_kept: int  # idle pools that outlived both (held for a queued JobSet of their shape)


@dataclasses.dataclass(frozen=True)
class DeclaredResult:
    """The baseline and the declared row."""

    shape: DeclaredShape
    baseline: Row
    declared: Row

    def limits(self) -> dict[str, float]:
        """The goal's limit for each of the declared row's figures."""
        b = self.baseline
        return {
            "sweep_seconds": TIME_FACTOR_MAX * b.sweep.seconds + TIME_SLACK_SECONDS,
            "release_seconds": TIME_FACTOR_MAX * b.release.seconds + TIME_SLACK_SECONDS,
            "sweep_rss_mib": b.sweep.rss_mib + RSS_SLACK_MIB,
            "release_rss_mib": b.release.rss_mib + RSS_SLACK_MIB,
        }

    def figures(self) -> dict[str, float]:
        """The declared row's figures, by the names ``limits`` uses."""
        d = self.declared
        return {
            "sweep_seconds": d.sweep.seconds,
            "release_seconds": d.release.seconds,
            "sweep_rss_mib": d.sweep.rss_mib,
            "release_rss_mib": d.release.rss_mib,
        }

    def met(self) -> bool:
        """Whether every declared figure is within its limit."""
        limits = self.limits()
        return all(value <= limits[name] for name, value in self.figures().items())


def suspended_jobsets(count: int, replicas: int, pods_per_job: int, topology: str) -> list[dict[str, Any]]:
    """``count`` suspended TPU JobSets queued in a LocalQueue (as Kueue holds them until admission),
    ``replicas`` Jobs of ``pods_per_job`` pods each."""
    jobsets = []
    for index in range(count):
        jobset = tpu_jobset(
            f"queued-{index:03d}",
            NAMESPACE,
            replicas=replicas,
            topology=topology,
            chips_per_vm=CHIPS_PER_VM,
            vms=pods_per_job,
        )
        jobset["spec"]["suspend"] = True
        jobset["metadata"]["labels"] = {KUEUE_QUEUE_LABEL: QUEUE}
        jobsets.append(jobset)
    return jobsets


def seed_idle_pool(env: BenchEnv, owner_name: str, topology: str) -> str:
    """A RUNNING managed pool of the slice shape, built as provision builds it, for JobSet
    ``owner_name``, which is not in the API server (its owner is gone, its nodes none); its name."""
    owner = tpu_jobset(owner_name, NAMESPACE, replicas=1, topology=topology, chips_per_vm=CHIPS_PER_VM)
    cluster = GkeNodePoolAPI(endpoint=env.settings.gke_api_endpoint).get_cluster(env.settings.cluster_path)
    spec, _ = build_node_pool(env.settings, declared_request(owner, "slice", 0), cluster)
    env.gke.state.create_pool(
        env.settings.cluster_path, container_v1.NodePool.pb(spec_to_node_pool(spec)), lambda _m: None
    )
    env.gke.finish_operations()
    return spec.name


def _gke_kinds(env: BenchEnv, since: int) -> dict[str, int]:
    return dict(sorted(Counter(call.method for call in env.gke.calls[since:]).items()))


def _cost(env: BenchEnv, fn: FunctionProcess, delivery: Delivery) -> Cost:
    """Post one delivery, which must answer 2xx; what it cost (peak RSS: the process's so far)."""
    env.kube.clear_requests()
    since = len(env.gke.calls)
    began = time.perf_counter()
    status = post(fn.url, *delivery, timeout=600.0)
    seconds = time.perf_counter() - began
    if not 200 <= status < 300:
        raise DeliveryError(f"{fn.target} answered {status}:\n{fn.process.tail()}")
    kube_requests = len(env.kube.requests)
    return Cost(seconds, peak_rss(fn.pid).worker_mib, kube_requests, _gke_kinds(env, since))


def measure_row(
    env: BenchEnv, name: str, shape: DeclaredShape, replicas: int, pods_per_job: int, log_dir: Path
) -> Row:
    """Load the K JobSets and the idle pools into ``env``, then time a sweep and a release."""
    started = time.perf_counter()
    bench_env.load(env.kube, suspended_jobsets(shape.jobsets, replicas, pods_per_job, shape.topology))
    pools = [seed_idle_pool(env, owner, shape.topology) for owner in GONE_OWNERS]
    setup = time.perf_counter() - started
    tick = bench_env.binary_delivery(bench_env.ignored_entry())  # the sweep ignores the payload
    with launched("reconcile", env.function_env("reconcile"), log_dir) as fn:
        first_2xx(fn, *tick, timeout=600.0)  # up, warm, one sweep done
        env.gke.finish_operations()  # the warm-up's relabels (the idle stamps) are done
        sweep = _cost(env, fn, tick)
    env.gke.finish_operations()
    first, measured = (
        bench_env.binary_delivery(
            logentries.jobset_delete_audit_entry(bench_env.CLUSTER_ID, NAMESPACE, owner)
        )
        for owner in GONE_OWNERS
    )
    with launched("release", env.function_env("release"), log_dir) as fn:
        first_2xx(fn, *bench_env.binary_delivery(bench_env.ignored_entry()))
        release_first = _cost(env, fn, first)
        env.gke.finish_operations()
        release = _cost(env, fn, measured)
    env.gke.finish_operations()
    left = {p.get("name") for p in env.managed_pools()}
    return Row(
        name=name,
        jobsets=shape.jobsets,
        replicas=replicas,
        pods_per_job=pods_per_job,
        declared_pods=shape.jobsets * replicas * pods_per_job,
        setup_seconds=setup,
        sweep=sweep,
        release_first=release_first,
        release=release,
        pools_kept=sum(1 for pool in pools if pool in left),
    )


def run(
    shape: DeclaredShape,
    log_dir: Path,
    started: Callable[[], AbstractContextManager[BenchEnv]] = bench_env.started,
    progress: Callable[[str], None] | None = None,
) -> DeclaredResult:
    """The baseline row, then the declared row, each on a fresh API server and GKE emulator."""
    say = progress or (lambda _msg: None)
    rows = []
    # The baseline declares one slice a JobSet (pods per Job = its VMs, or provision would refuse it
    # and it would be no demand): everything the declared row has but the replicas.
    for name, replicas, pods_per_job in (("baseline", 1, shape.vms), ("declared", shape.replicas, shape.vms)):
        say(f"declared pods: {name}, {shape.jobsets} suspended JobSets x {replicas} x {pods_per_job} pods")
        with started() as env:
            rows.append(measure_row(env, name, shape, replicas, pods_per_job, log_dir / name))
    return DeclaredResult(shape, rows[0], rows[1])


def as_dict(result: DeclaredResult) -> dict[str, Any]:
    """A JSON-safe report (the goal's limits and whether each was met included)."""
    limits, figures = result.limits(), result.figures()

    def row(r: Row) -> dict[str, Any]:
        out = dataclasses.asdict(r)
        out["setup_seconds"] = round(r.setup_seconds, 3)
        for part in ("sweep", "release_first", "release"):
            out[part]["seconds"] = round(out[part]["seconds"], 4)
        return out

    return {
        "shape": {
            **dataclasses.asdict(result.shape),
            "replicas": result.shape.replicas,
            "vms": result.shape.vms,
        },
        "baseline": row(result.baseline),
        "declared": row(result.declared),
        "limits": {k: round(v, 4) for k, v in limits.items()},
        "met": {k: figures[k] <= limits[k] for k in limits},
        "goal": (
            f"each time within {TIME_FACTOR_MAX}x the baseline's + {TIME_SLACK_SECONDS:.0f} s, "
            f"peak RSS within the baseline's + {RSS_SLACK_MIB:.0f} MiB"
        ),
    }
