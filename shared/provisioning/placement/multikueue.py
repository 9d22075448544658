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
may lose.

The choice is made once per manager Workload and recorded on its JobSet (``PLACEMENT``), by
whichever worker's check answers first; every other worker reads it. It is made from data
(``shared.provisioning.placement.outlook``): of the workers the manager nominated, one with a
reservation that has room for every slice first, then one with nothing known against it, then one
where the job's shape was short recently (the fleet's record on the manager's MultiKueueCluster),
then one where this very job was short less than ``MULTIKUEUE_SHORTAGE_SECONDS`` ago; the fleet's
configured order (the managed cluster, then ``FLEET_CLUSTERS``) breaks ties. A recorded worker
that is no longer nominated (MultiKueue lost its connection) is chosen again from the others.

When the chosen worker cannot get the capacity (its create is refused or its pool fails and the
capacity policy has no further option there), :meth:`MultiKueuePlacement.short` records the
shortage on the manager's JobSet (removing its recorded choice) and on its MultiKueueCluster of the
worker (for later jobs of the shape), and sets the worker copy's check to ``Retry``: Kueue evicts it
there, the manager resets its own check and sends new copies (``MultiKueueRedoAdmissionOnEvictionInWorker``,
GA in 0.18), and the choice moves on to the next worker. The JobSet MultiKueue had created in the
short worker is deleted with the copy, and release deletes its pools.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import ConflictError, NotEligible, NotFoundError, Refused
from shared.core.settings import Settings
from shared.events.fields import ClusterId
from shared.provisioning.placement import outlook as outlooks
from shared.provisioning.placement.outlook import (
    CAPACITY_SHORT,
    JOB_SHORT,
    OPEN,
    ROOM,
    Outlook,
    PeerCapacity,
    parse_time,
    stamp,
)
from shared.tpu import catalog
from shared.tpu.declared import declared_request
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import STATUS_RUNNING, NodePoolInfo
from shared.tpu.workloads import (
    MULTIKUEUE_ORIGIN_LABEL,
    PENDING,
    PREBUILT_WORKLOAD,
    READY,
    RETRY,
    WorkloadSlice,
    WorkloadView,
)

log = logs.get("multikueue")

# On the manager's JobSet: {worker: when capacity for it was short there (RFC 3339)}. The JobSet's
# owner could edit it, which steers only that owner's own job.
SHORTAGES = f"{labels.PRODUCT_DOMAIN}/multikueue-shortages"
# On the manager's JobSet: the worker chosen for its Workload, {"workload": uid, "worker": name,
# "why": text, "at": RFC 3339}. Written once, conditionally on the JobSet's resourceVersion, by
# whichever worker's check answers first, and read by every other: the choice is made from reads
# (GKE, Compute Engine) that two workers could make a second apart and see differently, and a
# recorded choice makes exactly one of them Ready however they interleave. Removed with a shortage.
PLACEMENT = f"{labels.PRODUCT_DOMAIN}/multikueue-placement"
REASON_CHOSEN = "TPUWorkerChosen"
REASON_SHORT = "TPUWorkerShort"
_WRITE_ATTEMPTS = 3  # conditional writes retried after a conflict, each after a fresh read


class FleetPeers(Protocol):
    """The fleet as one cluster's services see it."""

    def paths(self) -> list[str]:
        """Every fleet cluster's path, in the fleet's configured order."""
        ...

    def kube(self, path: str) -> KubeAPI | None:
        """That fleet cluster's Kubernetes API (None: not in the fleet)."""
        ...

    def capacity(self, path: str) -> PeerCapacity | None:
        """That fleet cluster's own view of its capacity (None: not in the fleet)."""
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
        at = parse_time(str(when))
        if at is not None and now - at < seconds:
            found[str(worker)] = at
    return found


def recorded(jobset: JobSet | None, workload_uid: str) -> Placement | None:
    """The choice recorded on the manager's JobSet for the Workload ``workload_uid`` (None: none, or
    one made for another Workload of the JobSet)."""
    if jobset is None:
        return None
    try:
        raw = json.loads(jobset.meta.annotations.get(PLACEMENT) or "{}")
    except ValueError:
        return None
    if not isinstance(raw, Mapping) or not raw.get("worker") or str(raw.get("workload")) != workload_uid:
        return None
    return Placement(str(raw["worker"]), str(raw.get("why") or "recorded"))


def choose(candidates: Sequence[str], short: Mapping[str, float]) -> Placement:
    """The configured order and this job's own shortages alone (a Workload no JobSet owns, whose
    choice cannot be recorded: every worker must reach the same answer from the same reads)."""
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


def rank(candidates: Sequence[str], looks: Mapping[str, Outlook]) -> Placement:
    """The best-ranked candidate (``shared.provisioning.placement.outlook``), the fleet's order
    breaking ties, and why: its own reason, and what put the workers before it in order behind."""
    if not candidates:
        raise ValueError("no candidate worker")
    order = {w: i for i, w in enumerate(candidates)}
    best = min(candidates, key=lambda w: (looks[w].rank, order[w]))
    chosen = looks[best]
    if chosen.rank == ROOM:
        why = chosen.why
    elif chosen.rank == OPEN:
        why = f"first in the fleet's order with nothing known against it ({chosen.why})"
    else:
        why = f"every worker is worse off: {chosen.why}"
    # Every worker before it in the fleet's order ranked worse (an equal one would have won).
    passed = [looks[w] for w in candidates[: order[best]]]
    if passed:
        why += "; not " + "; not ".join(f"{o.worker}: {o.why}" for o in passed)
    return Placement(best, why)


class MultiKueuePlacement:
    """Answers the check for MultiKueue's worker copies (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        kube: KubeAPI,
        peers: FleetPeers | None,
        wall_clock: Callable[[], float],
        gke: NodePoolAPI | None = None,
    ) -> None:
        """``gke``: this cluster's node pools (``pool_up`` reads the pool that came up)."""
        self.settings = settings
        self.kube = kube
        self.peers = peers
        self.wall_clock = wall_clock
        self.gke = gke

    @property
    def on(self) -> bool:
        return bool(self.settings.multikueue_manager) and self.peers is not None

    def _manager(self) -> KubeAPI | None:
        assert self.peers is not None
        return self.peers.kube(self.settings.multikueue_manager)

    def _fleet(self) -> dict[str, str]:
        """Fleet cluster name -> path, in the fleet's order."""
        assert self.peers is not None
        return {_name(p): p for p in self.peers.paths()}

    def verdict(
        self, copy: WorkloadView, slices_of: Callable[[JobSet], Sequence[WorkloadSlice]] | None = None
    ) -> Placed | None:
        """The check's state for a worker copy of a manager's Workload; None for any other Workload
        (and when no MULTIKUEUE_MANAGER is set: the check answers it as any Workload). ``slices_of``
        gives the TPU slices of the manager's JobSet as this worker derives them (its flavors)."""
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
            fleet = self._fleet()
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
            placement = self._place(manager, original, candidates, slices_of)
        if placement.worker != me:
            return Placed(
                PENDING, f"MultiKueue: runs in {placement.worker}, {placement.why}; nothing is bought here"
            )
        return Placed(
            READY,
            f"MultiKueue: runs here ({me}, {self.settings.location}), {placement.why}; its TPU slices are "
            "created for the JobSet MultiKueue creates here once this copy is admitted",
        )

    def _place(
        self,
        manager: KubeAPI,
        original: WorkloadView,
        candidates: Sequence[str],
        slices_of: Callable[[JobSet], Sequence[WorkloadSlice]] | None,
    ) -> Placement:
        """The recorded choice for ``original`` while its worker is still nominated; else a new one,
        made from the workers' outlooks and recorded (a conflict: read again, someone chose)."""
        if original.owner_kind != "JobSet":
            placement = choose(candidates, {})
            if placement.worker == self.settings.cluster_name:
                self._tell(manager, original, REASON_CHOSEN, self._chosen(placement))
            return placement
        placement = choose(candidates, {})
        for _ in range(_WRITE_ATTEMPTS):
            try:
                jobset = manager.get_jobset(original.namespace, original.owner_name)
            except NotFoundError:
                return placement  # the JobSet is gone: MultiKueue removes the copies
            kept = recorded(jobset, original.uid)
            if kept is not None and kept.worker in candidates:
                return kept
            placement = self._decide(manager, jobset, candidates, slices_of)
            entry = {"workload": original.uid, "worker": placement.worker, "why": placement.why}
            entry["at"] = stamp(self.wall_clock())
            try:
                manager.annotate_jobset(
                    jobset.namespace,
                    jobset.name,
                    {PLACEMENT: json.dumps(entry, sort_keys=True)},
                    jobset.meta.resource_version,
                    f"MultiKueue worker chosen: {placement.worker}",
                )
            except ConflictError:
                continue
            except NotFoundError:
                return placement
            said = self._chosen(placement)
            self._tell(manager, original, REASON_CHOSEN, said)
            logs.decision(
                log, "multikueue.chosen", f"Workload {original.key}: {said}", worker=placement.worker
            )
            return placement
        return placement

    def _chosen(self, placement: Placement) -> str:
        """The TPUWorkerChosen message: the worker, its location (from its cluster path), and why."""
        path = self._fleet().get(placement.worker, "")
        location = f" ({ClusterId.from_path(path).location})" if path else ""
        return f"runs in {placement.worker}{location}: {placement.why}"

    def _decide(
        self,
        manager: KubeAPI,
        jobset: JobSet,
        candidates: Sequence[str],
        slices_of: Callable[[JobSet], Sequence[WorkloadSlice]] | None,
    ) -> Placement:
        assert self.peers is not None
        now = self.wall_clock()
        job_short = shortages(jobset, now, self.settings.multikueue_shortage_seconds)
        try:
            slices = list(slices_of(jobset)) if slices_of is not None else []
        except Refused:
            slices = []  # the chosen worker's check and pods say what is wrong with it
        fleet = self._fleet()
        looks: dict[str, Outlook] = {}
        for worker in candidates:
            if worker in job_short:
                ago = int(now - job_short[worker])
                looks[worker] = Outlook(
                    worker, JOB_SHORT, f"capacity for this job was short there {ago}s ago"
                )
                continue
            peer = self.peers.capacity(fleet[worker])
            if peer is None:
                looks[worker] = Outlook(worker, OPEN, "not in the fleet")
                continue
            looks[worker] = outlooks.outlook(
                worker, peer, jobset, slices, self._fleet_shortages(manager, worker, now), now
            )
        return rank(candidates, looks)

    def _fleet_shortages(self, manager: KubeAPI, worker: str, now: float) -> dict[str, outlooks.Shortage]:
        try:
            view = manager.get_multikueue_cluster(worker)
        except NotFoundError:
            return {}
        return outlooks.shortages_of(view.annotations, now, self.settings.multikueue_shortage_seconds)

    def short(self, jobset: JobSet, why: str, replicated_job: str = "", options: Sequence[str] = ()) -> bool:
        """Capacity for ``jobset`` (a JobSet MultiKueue created in this worker) is short here with
        no option left (``options``: the capacity options of ``replicated_job`` tried): record it on
        the manager's JobSet and on its MultiKueueCluster of this worker, and set this copy's check
        to Retry so that MultiKueue places the job again, elsewhere. Whether it did."""
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
        self._record_fleet_shortage(manager, jobset, replicated_job, options, now)
        message = f"capacity short in {me} ({self.settings.location}): {why}; MultiKueue places the job again"
        self.kube.set_admission_check_state(
            copy.namespace,
            copy.name,
            {
                "name": self.settings.admission_check_name,
                "state": RETRY,
                "message": message[:32768],
                "lastTransitionTime": stamp(now),
            },
        )
        self._tell(manager, original, REASON_SHORT, message, warning=True)
        logs.decision(log, "multikueue.short", f"Workload {copy.key}: {message}", logging.WARNING, worker=me)
        return True

    def _record_shortage(self, manager: KubeAPI, namespace: str, name: str, worker: str, now: float) -> None:
        """This job's shortage in ``worker``, and its recorded choice removed (the next copies choose
        again, with the shortage)."""
        for _ in range(_WRITE_ATTEMPTS):  # a concurrent write of the JobSet: read again and retry
            try:
                jobset = manager.get_jobset(namespace, name)
                record = shortages(jobset, now, self.settings.multikueue_shortage_seconds)
                stamps = {w: stamp(t) for w, t in record.items()}
                stamps[worker] = stamp(now)
                manager.annotate_jobset(
                    namespace,
                    name,
                    {SHORTAGES: json.dumps(stamps, sort_keys=True), PLACEMENT: None},
                    jobset.meta.resource_version,
                    f"capacity short in {worker}",
                )
                return
            except ConflictError:
                continue
            except NotFoundError:
                return

    def _record_fleet_shortage(
        self, manager: KubeAPI, jobset: JobSet, replicated_job: str, options: Sequence[str], now: float
    ) -> None:
        """The shape of ``replicated_job`` short in this worker, on the manager's MultiKueueCluster
        of it, for every later job of the shape (``outlook``). Best effort: without the record the
        next job of the shape tries here once, as this one did."""
        if not replicated_job or not options:
            return
        try:
            request = declared_request(jobset, replicated_job, 0)
            shape = catalog.resolve(request.accelerator, request.topology, request.chips_per_vm)
        except (NotEligible, Refused, catalog.UnsupportedShape):
            return
        key = outlooks.shape_key(shape.accelerator, shape.topology)
        me = self.settings.cluster_name
        seconds = self.settings.multikueue_shortage_seconds
        for _ in range(_WRITE_ATTEMPTS):
            try:
                view = manager.get_multikueue_cluster(me)
                manager.annotate_multikueue_cluster(
                    me,
                    {CAPACITY_SHORT: outlooks.with_shortage(view.annotations, key, options, now, seconds)},
                    view.resource_version,
                    f"{key} short in {me}",
                )
                return
            except ConflictError:
                continue
            except NotFoundError:
                return  # no MultiKueueCluster of this name: workers are named as their clusters

    def pool_up(self, name: str) -> bool:
        """Pool ``name``'s create operation ended well in this worker: ``capacity_back`` with it as
        GKE describes it now (nothing is read outside MultiKueue)."""
        if not self.on or self.gke is None:
            return False
        # The listing, not a get: provision's role lists pools already and needs no new permission.
        pools = self.gke.list_node_pools(self.settings.cluster_path)
        pool = next((p for p in pools if p.name == name), None)
        return pool is not None and self.capacity_back(pool)

    def capacity_back(self, pool: NodePoolInfo) -> bool:
        """``pool`` came up RUNNING in this worker (its create operation just ended): GKE delivered
        capacity of its shape here now, so the fleet's record of that shape short here is removed
        and the next job of the shape may be placed here again. Whether a record was removed. Best
        effort, as the record itself: left alone, it expires after MULTIKUEUE_SHORTAGE_SECONDS."""
        if not self.on or pool.status != STATUS_RUNNING or not pool.managed or not pool.tpu_topology:
            return False
        accelerator = catalog.accelerator_for_machine_type(pool.machine_type)
        manager = self._manager()
        if accelerator is None or manager is None:
            return False
        try:
            shape = catalog.resolve(
                accelerator, pool.tpu_topology, catalog.machine_type_chips(pool.machine_type) or 0
            )
        except catalog.UnsupportedShape:
            return False
        key = outlooks.shape_key(shape.accelerator, shape.topology)
        me = self.settings.cluster_name
        now, seconds = self.wall_clock(), self.settings.multikueue_shortage_seconds
        for _ in range(_WRITE_ATTEMPTS):
            try:
                view = manager.get_multikueue_cluster(me)
                if key not in outlooks.shortages_of(view.annotations, now, seconds):
                    return False
                manager.annotate_multikueue_cluster(
                    me,
                    {CAPACITY_SHORT: outlooks.without_shortage(view.annotations, key, now, seconds)},
                    view.resource_version,
                    f"{key} delivered in {me}",
                )
            except ConflictError:
                continue
            except NotFoundError:
                return False
            why = f"{key} is no longer short in {me}: pool {pool.name} came up RUNNING"
            logs.decision(log, "multikueue.capacity_back", why, worker=me, pool=pool.name)
            return True
        return False

    def _tell(
        self, manager: KubeAPI, original: WorkloadView, reason: str, message: str, warning: bool = False
    ) -> None:
        manager.record_event(original.ref, reason, message, warning=warning)
        if original.owner_kind == "JobSet":
            manager.record_event(original.jobset_ref, reason, message, warning=warning)
