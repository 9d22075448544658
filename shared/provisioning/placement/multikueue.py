"""Under Kueue's MultiKueue: the one worker that runs (and buys for) a manager's Workload.

What Kueue v0.19.2 does (pkg/controller/admissionchecks/multikueue/workload.go, read and tested in
tests/sandbox/real/test_multikueue.py):

* the manager sends a copy of its Workload to each worker it nominates (AllAtOnce: every connected
  one; ``nominateAndSynchronizeWorkers``): same namespace and name, the origin label, no owner;
* each worker's Kueue reserves quota for its copy and runs its own admission checks;
* the first copy **Admitted** wins (``reconcileGroup``: ``bestMatchByCondition(WorkloadAdmitted)``):
  the manager writes ``status.clusterName``, removes every other copy and only then creates the
  JobSet in the winner (``jobset_multikueue_adapter.go`` ``SyncJob``).

So the product's check in the workers decides where the job runs: it is ``Ready`` in the one worker
chosen here and stays ``Pending`` in the others, which create nothing. The chosen worker's pools are
created for the JobSet MultiKueue creates there once its copy is admitted (the pending-pod path:
that JobSet owns them, and its end or deletion releases them), so nothing is bought for a copy that
may lose. The choice is the same in every worker (it is a function of what all of them read): the
workers the manager nominated, in the fleet's configured order (the managed cluster, then
``FLEET_CLUSTERS``), skipping those where capacity for this job was short less than
``MULTIKUEUE_SHORTAGE_SECONDS`` ago.

When the chosen worker cannot get the capacity (its create is refused or its pool fails and the
capacity policy has no further option there), :meth:`MultiKueuePlacement.short` records the
shortage on the manager's JobSet and sets the worker copy's check to ``Retry``: Kueue evicts it
there, the manager resets its own check and sends new copies (``MultiKueueRedoAdmissionOnEvictionInWorker``,
GA in 0.18), and the choice moves on to the next worker. The JobSet MultiKueue had created in the
short worker is deleted with the copy, and release deletes its pools.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from shared.cloud.ports import KubeAPI
from shared.core import labels, logs
from shared.core.errors import ConflictError, NotFoundError
from shared.core.settings import Settings
from shared.tpu.jobsets import JobSet
from shared.tpu.workloads import (
    MULTIKUEUE_ORIGIN_LABEL,
    PENDING,
    PREBUILT_WORKLOAD,
    READY,
    RETRY,
    WorkloadView,
)

log = logs.get("multikueue")

# On the manager's JobSet: {worker: when capacity for it was short there (RFC 3339)}. The JobSet's
# owner could edit it, which steers only that owner's own job.
SHORTAGES = f"{labels.PRODUCT_DOMAIN}/multikueue-shortages"
REASON_CHOSEN = "TPUWorkerChosen"
REASON_SHORT = "TPUWorkerShort"


class FleetPeers(Protocol):
    """The fleet as one cluster's services see it."""

    def paths(self) -> list[str]:
        """Every fleet cluster's path, in the fleet's configured order."""
        ...

    def kube(self, path: str) -> KubeAPI | None:
        """That fleet cluster's Kubernetes API (None: not in the fleet)."""
        ...


@dataclasses.dataclass(frozen=True)
class Placed:
    """The admission check's state for a worker copy and its message."""

    state: str
    message: str


@dataclasses.dataclass(frozen=True)
class Placement:
    """The worker chosen for a manager's Workload (a MultiKueueCluster name) and why."""

    worker: str
    why: str


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _time(text: str) -> float | None:
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def shortages(jobset: JobSet, now: float, seconds: float) -> dict[str, float]:
    """Workers where capacity for ``jobset`` was short less than ``seconds`` ago, with when."""
    try:
        raw = json.loads(jobset.meta.annotations.get(SHORTAGES) or "{}")
    except ValueError:
        return {}
    if not isinstance(raw, Mapping):
        return {}
    found = {}
    for worker, when in raw.items():
        at = _time(str(when))
        if at is not None and now - at < seconds:
            found[str(worker)] = at
    return found


def choose(candidates: Sequence[str], short: Mapping[str, float]) -> Placement:
    """The first candidate (configured order) with no recent shortage; when every one had one, the
    one short longest ago (capacity may be back there first)."""
    if not candidates:
        raise ValueError("no candidate worker")
    for worker in candidates:
        if worker not in short:
            skipped = [w for w in candidates if w in short]
            why = "first in the fleet's order"
            if skipped:
                why += f" whose capacity was not short recently ({', '.join(skipped)} short)"
            return Placement(worker, why)
    worker = min(candidates, key=lambda w: short[w])
    return Placement(worker, f"capacity was short in every worker recently; {worker}'s longest ago")


def _stamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MultiKueuePlacement:
    """Answers the check for MultiKueue's worker copies (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        kube: KubeAPI,
        peers: FleetPeers | None,
        wall_clock: Callable[[], float],
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.peers = peers
        self.wall_clock = wall_clock

    @property
    def on(self) -> bool:
        return bool(self.settings.multikueue_manager) and self.peers is not None

    def _manager(self) -> KubeAPI | None:
        assert self.peers is not None
        return self.peers.kube(self.settings.multikueue_manager)

    def _fleet_names(self) -> list[str]:
        assert self.peers is not None
        return [_name(p) for p in self.peers.paths()]

    def verdict(self, copy: WorkloadView) -> Placed | None:
        """The check's state for a worker copy of a manager's Workload; None for any other Workload
        (and when no MULTIKUEUE_MANAGER is set: the check answers it as any Workload)."""
        if not copy.origin or not self.on:
            return None
        manager = self._manager()
        where = self.settings.multikueue_manager
        if manager is None:
            return Placed(PENDING, f"MULTIKUEUE_MANAGER {where} is not a cluster of this deployment's fleet")
        try:
            original = manager.get_workload(copy.namespace, copy.name)
        except NotFoundError:
            return Placed(PENDING, f"the manager's Workload {copy.key} is gone; MultiKueue removes this copy")
        me = self.settings.cluster_name
        if original.cluster_name:
            placement = Placement(original.cluster_name, "MultiKueue placed it there")
        else:
            fleet = self._fleet_names()
            candidates = [w for w in fleet if w in original.nominated]
            if me not in candidates:
                unknown = [w for w in original.nominated if w not in fleet]
                nominated = ", ".join(candidates) or "none"
                why = f"{me} is not one of the workers the manager nominated in the fleet ({nominated})"
                if unknown:
                    why += (
                        f"; {', '.join(unknown)} name no fleet cluster "
                        "(a MultiKueueCluster is named as its GKE cluster)"
                    )
                return Placed(PENDING, why)
            short: dict[str, float] = {}
            jobset: JobSet | None = None
            if original.owner_kind == "JobSet":
                try:
                    jobset = manager.get_jobset(copy.namespace, original.owner_name)
                    short = shortages(jobset, self.wall_clock(), self.settings.multikueue_shortage_seconds)
                except NotFoundError:
                    pass
            placement = choose(candidates, short)
            if placement.worker == me:
                self._tell(
                    manager,
                    original,
                    REASON_CHOSEN,
                    f"runs in {me} ({self.settings.location}): {placement.why}",
                )
        if placement.worker != me:
            return Placed(
                PENDING, f"MultiKueue: runs in {placement.worker}, {placement.why}; nothing is bought here"
            )
        return Placed(
            READY,
            f"MultiKueue: runs here ({me}, {self.settings.location}), {placement.why}; its TPU slices are "
            "created for the JobSet MultiKueue creates here once this copy is admitted",
        )

    def short(self, jobset: JobSet, why: str) -> bool:
        """Capacity for ``jobset`` (a JobSet MultiKueue created in this worker) is short here with
        no option left: record it on the manager's JobSet and set this copy's check to Retry so that
        MultiKueue places the job again, elsewhere. Whether it did."""
        if not self.on or jobset.meta.labels.get(MULTIKUEUE_ORIGIN_LABEL) is None:
            return False
        workload_name = jobset.meta.annotations.get(PREBUILT_WORKLOAD) or jobset.meta.labels.get(
            PREBUILT_WORKLOAD
        )
        manager = self._manager()
        if not workload_name or manager is None:
            return False
        me = self.settings.cluster_name
        try:
            original = manager.get_workload(jobset.namespace, workload_name)
            copy = self.kube.get_workload(jobset.namespace, workload_name)
        except NotFoundError:
            return False
        if original.cluster_name != me or copy.origin != jobset.meta.labels.get(MULTIKUEUE_ORIGIN_LABEL):
            return False
        current = copy.check(self.settings.admission_check_name)
        if current is not None and current.state == RETRY:
            return True  # said already (reconcile sees the failed pool again): Kueue is evicting it
        now = self.wall_clock()
        if original.owner_kind == "JobSet":
            self._record_shortage(manager, jobset.namespace, original.owner_name, me, now)
        message = f"capacity short in {me} ({self.settings.location}): {why}; MultiKueue places the job again"
        self.kube.set_admission_check_state(
            copy.namespace,
            copy.name,
            {
                "name": self.settings.admission_check_name,
                "state": RETRY,
                "message": message[:32768],
                "lastTransitionTime": _stamp(now),
            },
        )
        self._tell(manager, original, REASON_SHORT, message, warning=True)
        logs.decision(log, "multikueue.short", f"Workload {copy.key}: {message}", logging.WARNING, worker=me)
        return True

    def _record_shortage(self, manager: KubeAPI, namespace: str, name: str, worker: str, now: float) -> None:
        for _ in range(3):  # a concurrent write of the JobSet: read again and retry
            try:
                jobset = manager.get_jobset(namespace, name)
                record = shortages(jobset, now, self.settings.multikueue_shortage_seconds)
                stamps = {w: _stamp(t) for w, t in record.items()}
                stamps[worker] = _stamp(now)
                manager.annotate_jobset(
                    namespace,
                    name,
                    {SHORTAGES: json.dumps(stamps, sort_keys=True)},
                    jobset.meta.resource_version,
                    f"capacity short in {worker}",
                )
                return
            except ConflictError:
                continue
            except NotFoundError:
                return

    def _tell(
        self, manager: KubeAPI, original: WorkloadView, reason: str, message: str, warning: bool = False
    ) -> None:
        manager.record_event(original.ref, reason, message, warning=warning)
        if original.owner_kind == "JobSet":
            manager.record_event(original.jobset_ref, reason, message, warning=warning)
