"""Reconcile at cluster scale: one sweep over thousands of nodes, tens of thousands of pods.

The cluster is written through the real API server as an admin from a thread pool (nodes, JobSets,
pods; timed as setup, apart from the sweep) and into the GKE emulator's state (managed pools); the
request counters come from the API server's audit log, which records only the functions. List pages
cost what the real API server takes to serve them: the report gives the median time of one page of
``page_size`` pods, measured before the sweep. The reconcile function runs as its own
functions-framework process, so its peak RSS is the product's and not the emulators'.

Shape: ``tpu_jobsets`` JobSets of one 4-host v6e slice each own a RUNNING managed pool; their pods
are mostly Running with ``pending_pods`` still Pending (nodes coming up); the other JobSets are CPU
JobSets whose Running pods fill the cluster up to ``pods``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.cloud import container_v1

from sandbox.bench import env as bench_env
from sandbox.bench.env import BenchEnv
from sandbox.bench.procs import DeliveryError, PeakRss, first_2xx, launched, peak_rss, post
from sandbox.jobsets import cpu_jobset, tpu_jobset
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.gke_messages import spec_to_node_pool
from shared.tpu.jobsets import expand_pods
from shared.tpu.slices import build_node_pool, slice_request


@dataclass(frozen=True)
class ClusterShape:
    """How big the cluster is and how many items a list page holds.

    Every object is written through the real API server (about two requests each; about 65 objects
    a second on the shared 2-core bench machine), so the default is a tenth of the 50,000-pod
    cluster the stand-in API was loaded with, which would take over ten minutes to load."""

    nodes: int = 500
    pods: int = 5000
    jobsets: int = 100
    tpu_jobsets: int = 30  # each owns one managed pool
    pending_pods: int = 100
    page_size: int = 500  # KUBE_LIST_PAGE_SIZE


@dataclass
class ClusterResult:
    """What one sweep cost."""

    shape: ClusterShape
    objects: int  # written through the API server
    setup_seconds: float  # the load, apart from the sweep
    page_seconds: float  # median time the real API server takes to serve one page of page_size pods
    sweep_seconds: float  # tick delivered until the function answered 2xx
    list_pages: int  # list requests the Kubernetes API served during the sweep
    kube_requests: int
    gke_creates: int
    gke_deletes: int
    rss: PeakRss


def _node(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": f"gke-node-{index:05d}", "labels": {"kubernetes.io/hostname": f"n{index}"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _running(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    return pod


def build(env: BenchEnv, shape: ClusterShape) -> int:
    """Write the cluster into both emulators; returns the number of Kubernetes objects written."""
    if not 0 < shape.tpu_jobsets <= shape.jobsets:
        raise ValueError("need 0 < tpu_jobsets <= jobsets")
    nodes = [_node(i) for i in range(shape.nodes)]
    cpu_jobsets = shape.jobsets - shape.tpu_jobsets
    # The API server assigns each JobSet its uid, which its pods and pools carry: store them first.
    jobsets = bench_env.load(
        env.kube,
        [
            tpu_jobset(f"tpu-{index:04d}", bench_env.NAMESPACES[index % 2], replicas=1, topology="4x4")
            for index in range(shape.tpu_jobsets)
        ]
        + [
            cpu_jobset(f"cpu-{index:04d}", bench_env.NAMESPACES[index % 2], uid=str(uuid.uuid4()))
            for index in range(cpu_jobsets)
        ],
    )
    pods: list[dict[str, Any]] = []
    pending = shape.pending_pods
    # Pools as provision builds them for this cluster (its release channel decides auto-upgrade).
    cluster = GkeNodePoolAPI(endpoint=env.settings.gke_api_endpoint).get_cluster(env.settings.cluster_path)
    for jobset in jobsets[: shape.tpu_jobsets]:
        slice_pods = expand_pods(jobset)
        spec, _ = build_node_pool(env.settings, slice_request(slice_pods[0]), cluster)
        pb = container_v1.NodePool.pb(spec_to_node_pool(spec))
        env.gke.state.create_pool(env.settings.cluster_path, pb, lambda _machine_type: None)
        for pod in slice_pods:
            if pending > 0:
                pending -= 1
                pods.append(pod)
            else:
                pods.append(_running(pod, f"gke-node-{len(pods) % shape.nodes:05d}"))
    per_jobset = max(1, -(-(shape.pods - len(pods)) // max(1, cpu_jobsets)))
    for index, jobset in enumerate(jobsets[shape.tpu_jobsets :]):
        template = _running(expand_pods(jobset)[0], "")
        for replica in range(min(per_jobset, shape.pods - len(pods))):
            pod = {**template, "metadata": {**template["metadata"], "name": f"cpu-{index:04d}-{replica}"}}
            pod["spec"] = {**template["spec"], "nodeName": f"gke-node-{len(pods) % shape.nodes:05d}"}
            pods.append(pod)
    bench_env.load(env.kube, nodes)
    bench_env.load(env.kube, pods)
    return len(nodes) + len(jobsets) + len(pods)


def page_seconds(env: BenchEnv, page_size: int, samples: int = 5) -> float:
    """Median time the API server takes to serve the first page of ``page_size`` pods (as an admin)."""
    times = []
    for _ in range(samples):
        began = time.perf_counter()
        env.kube.admin.request("GET", "/api/v1/pods", query={"limit": str(page_size)})
        times.append(time.perf_counter() - began)
    return bench_env.median(times)


def run(env: BenchEnv, shape: ClusterShape, log_dir: Path) -> ClusterResult:
    """Build the cluster, then time one reconcile sweep in a function process and read its peak RSS."""
    started = time.perf_counter()
    written = build(env, shape)
    setup = time.perf_counter() - started
    env.gke.set_latency(None)
    tick = bench_env.binary_delivery(bench_env.ignored_entry())  # the sweep ignores the payload
    page = page_seconds(env, shape.page_size)
    function_env = {**env.function_env("reconcile"), "KUBE_LIST_PAGE_SIZE": str(shape.page_size)}
    with launched("reconcile", function_env, log_dir) as fn:
        first_2xx(fn, *bench_env.binary_delivery(bench_env.ignored_entry()))  # up, warm, one sweep done
        env.kube.clear_requests()
        before = env.counters()
        began = time.perf_counter()
        status = post(fn.url, *tick, timeout=300.0)
        seconds = time.perf_counter() - began
        if not 200 <= status < 300:
            raise DeliveryError(f"reconcile answered {status}:\n{fn.process.tail()}")
        spent = env.counters() - before
        rss = peak_rss(fn.pid)
        requests = env.kube.requests
    pages = sum(1 for method, path in requests if method == "GET" and "limit=" in path)
    return ClusterResult(
        shape=shape,
        objects=written,
        setup_seconds=setup,
        page_seconds=page,
        sweep_seconds=seconds,
        list_pages=pages,
        kube_requests=len(requests),
        gke_creates=spent.gke_creates,
        gke_deletes=spent.gke_deletes,
        rss=rss,
    )
