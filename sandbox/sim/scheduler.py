"""kube-scheduler as the virtual-time simulations need it: a pending pod binds once its slice's pool
is RUNNING; until then its FailedScheduling event is published again every ``every`` seconds."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from sandbox.sim.engine import Simulation
from sandbox.sim.gke import SimGke
from sandbox.testing.fakes import FakeKube
from shared.tpu.slices import slice_request


def schedule(
    sim: Simulation,
    kube: FakeKube,
    gke: SimGke,
    pods: Sequence[dict[str, Any]],
    publish: Callable[[tuple[str, str, str]], None],
    every: float,
) -> None:
    """Start the scheduler's loop for ``pods`` at time 0 (``publish`` gets ("pod", namespace, name))."""
    pool_of = {pod["metadata"]["name"]: slice_request(pod).pool_name for pod in pods}

    def failed_scheduling(pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        pool = gke.pools.get(pool_of[meta["name"]])
        if pool is not None and pool.status == "RUNNING":
            # The pool is up: the scheduler binds the pod, which stops being a candidate.
            stored = kube.pods[(meta["namespace"], meta["name"])]
            stored["spec"]["nodeName"] = f"{pool_of[meta['name']]}-node"
            stored["status"] = {"phase": "Running"}
            return
        publish(("pod", meta["namespace"], meta["name"]))
        sim.after(every, lambda: failed_scheduling(pod))

    for pod in pods:
        sim.at(0.0, functools.partial(failed_scheduling, pod))


__all__ = ["schedule"]
