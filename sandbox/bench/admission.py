"""Quota reservation to all slices ready under the admission check, in virtual time.

The product's ``AdmissionChecker`` runs against the virtual-time GKE (``sandbox.sim.gke.SimGke``:
pool creates take minutes, at most ``op_limit`` operations run per cluster, 429 beyond) and the
stateful Kubernetes fake holding the Workload, its JobSet and the flavor. The deliveries a cluster
would make are scheduled on the virtual clock: Kueue's ``QuotaReserved`` Event ``sink_delay``
seconds after the reservation, a finished create's audit entry ``sink_delay`` after it ends (the
pool's Nodes register Ready with it), and a redelivery ``redelivery`` seconds after a delivery that
asked for one. The figure is the virtual time from the reservation to the check's ``Ready``.

    python -m sandbox.bench.admission
"""

from __future__ import annotations

import dataclasses
import random
import sys
from typing import Any, TextIO

from sandbox.jobsets import tpu_jobset
from sandbox.sim.engine import Simulation
from sandbox.sim.gke import SimGke
from sandbox.testing.fakes import FakeKube
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.admission_check import AdmissionChecker, CheckResult

SETTINGS = Settings(project_id="sim", location="us-east5-b", cluster_name="c", create_concurrency=8)


@dataclasses.dataclass(frozen=True)
class Shape:
    slices: int
    op_limit: int = 20
    create_seconds: tuple[float, float] = (240.0, 360.0)  # a TPU pool create: four to six minutes
    sink_delay: float = 5.0  # Cloud Logging -> Pub/Sub -> function
    redelivery: float = 10.0  # Pub/Sub's minimum backoff in infra


@dataclasses.dataclass(frozen=True)
class Result:
    shape: Shape
    seconds_to_ready: float
    creates_accepted: int
    creates_refused: int  # answered "too many operations"
    deliveries: int


def _workload(slices: int) -> tuple[dict[str, Any], dict[str, Any]]:
    jobset = tpu_jobset(
        "train",
        "team-a",
        replicas=slices,
        topology="2x4",
        accelerator="tpu-v5-lite-podslice",
        chips_per_vm=4,
        uid="js-uid",
    )
    jobset["spec"]["suspend"] = True
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "jobset-train-0",
            "namespace": "team-a",
            "uid": "wl-uid",
            "ownerReferences": [{"kind": "JobSet", "name": "train", "uid": "js-uid", "controller": True}],
        },
        "spec": {"podSets": [{"name": "slice", "count": 2 * slices}]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admission": {
                "clusterQueue": "q",
                "podSetAssignments": [
                    {"name": "slice", "flavors": {labels.TPU_RESOURCE: "vlp"}, "count": 2 * slices}
                ],
            },
            "admissionChecks": [{"name": SETTINGS.admission_check_name, "state": "Pending", "message": ""}],
        },
    }
    return jobset, workload


def run(shape: Shape, seed: int = 1) -> Result:
    sim = Simulation()
    kube = FakeKube()
    jobset, workload = _workload(shape.slices)
    kube.add_jobset(jobset)
    kube.add_workload(workload)
    kube.flavors["vlp"] = {"spec": {"nodeLabels": {}}}
    deliveries = [0]
    ready_at: list[float] = []

    # One warm function instance: what it learnt from GKE (the operation limit) stays.
    checker: list[AdmissionChecker] = []

    def deliver(look: str) -> None:
        deliveries[0] += 1
        if not checker:
            checker.append(AdmissionChecker(SETTINGS, gke, kube, wall_clock=sim.clock))
        check = checker[0]
        if look == "QuotaReserved":
            results: list[CheckResult] = [check.handle("team-a", "jobset-train-0", look)]
        else:
            results = check.sweep(look)
        if any(r.state == "Ready" for r in results) and not ready_at:
            ready_at.append(sim.now)
        # As the provision handler: a finished create whose Workload waits only for Nodes is redelivered.
        if look != "QuotaReserved" and any(r.waiting_for_nodes for r in results):
            sim.after(shape.redelivery, lambda: deliver(look))

    def finished(_operation: str, pool: str) -> None:
        info = gke.pools.get(pool)
        if info is not None and info.status == "RUNNING":
            kube.add_pool_nodes(info)
        sim.after(shape.sink_delay, lambda: deliver(f"CreateNodePool of {pool} finished"))

    rng = random.Random(seed)
    low, high = shape.create_seconds
    gke = SimGke(
        sim, shape.op_limit, lambda r: r.uniform(low, high), seed=rng.randrange(1 << 30), on_finished=finished
    )
    sim.after(shape.sink_delay, lambda: deliver("QuotaReserved"))
    sim.run(until=6 * 3600, stop=lambda: bool(ready_at))
    return Result(
        shape,
        ready_at[0] if ready_at else float("inf"),
        gke.stats.creates_accepted,
        gke.stats.wasted,
        deliveries[0],
    )


def main(out: TextIO = sys.stdout) -> int:
    print("slices  op_limit  reservation->Ready  creates accepted  refused (429)  deliveries", file=out)
    for slices in (1, 4, 16, 64):
        result = run(Shape(slices))
        minutes = result.seconds_to_ready / 60
        print(
            f"{slices:6d}  {result.shape.op_limit:8d}  {minutes:15.1f} min  {result.creates_accepted:16d}  "
            f"{result.creates_refused:13d}  {result.deliveries:10d}",
            file=out,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
