"""One handler per event-driven function: the decoded event in, the orchestrators' decision out.

Entrypoints call these through ``shared.app.entry.handle``; keeping them here (not in ``main.py``) makes
them importable and testable, and keeps the entrypoints to a few lines.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from concurrent import futures
from typing import Any

from shared.app.coalesce import Coalescer
from shared.app.entry import Runtime
from shared.cloud.ports import KubeAPI
from shared.core import logs
from shared.core.errors import PermanentError, TransientError
from shared.events import envelope as events
from shared.provisioning.admission.check import AdmissionChecker
from shared.provisioning.create.known import KNOWN_POOL_TTL_SECONDS
from shared.provisioning.create.policies import WorkloadPolicies
from shared.provisioning.create.reservations import ReservationLook
from shared.provisioning.outcomes import CREATED, SKIPPED, Outcome
from shared.provisioning.placement.multikueue import MultiKueuePlacement
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler, Summary
from shared.provisioning.release.releaser import Releaser
from shared.provisioning.services import Services

log = logs.get("handlers")


def _ignore(function: str, why: str, **fields: Any) -> None:
    logs.decision(log, f"{function}.ignored", why, logging.INFO, **fields)


def _member(runtime: Runtime, function: str, cluster: events.ClusterId) -> Runtime | None:
    """The runtime of the fleet cluster the event names; None (said, counted, no API call) when
    the cluster is not in the fleet. The first event of such a cluster is logged at INFO, the
    rest at DEBUG with their count: a chatty foreign project does not flood the log."""
    member = runtime.member(cluster.path)
    if member is not None:
        return member
    seen = runtime.outsider(cluster.path)
    settings = runtime.settings
    fleet = ", ".join(settings.fleet_paths) or "no cluster"
    if settings.fleet_projects:
        fleet += f"; and the clusters of {', '.join(settings.fleet_projects)} labelled {settings.fleet_label}"
    logs.decision(
        log,
        f"{function}.ignored",
        f"event is for cluster {cluster.path}, outside this deployment's fleet ({fleet})",
        logging.INFO if seen == 1 else logging.DEBUG,
        cluster=cluster.path,
        count=seen,
    )
    return None


# Node-pool operations whose end can make a Workload's slices ready: a create, and the relabel that
# hands an idle pool over (``admission.pools.take_idle``). Without the second a Workload that took
# an idle pool waited for the next reconcile tick: its check was evaluated while the relabel ran,
# and no other event of its came.
POOL_READYING_METHODS = frozenset({"CreateNodePool", "UpdateNodePool"})


def coalescer(runtime: Runtime) -> Coalescer:
    """The instance's memory of objects decided in the last few seconds (``shared.app.coalesce``)."""
    return runtime.service("coalescer", lambda rt: Coalescer(window=rt.settings.event_coalesce_seconds))


def _decided(runtime: Runtime, function: str, key: str) -> bool:
    """Whether ``key`` was decided less than the coalescing window ago (then this delivery is
    answered from that decision, with no API call; a debug line says so)."""
    why = coalescer(runtime).recent(key)
    if why is None:
        return False
    window = coalescer(runtime).window
    logs.decision(
        log, f"{function}.coalesced", f"{key} was decided less than {window:.0f}s ago: {why}", logging.DEBUG
    )
    return True


def policies(runtime: Runtime) -> WorkloadPolicies:
    """The instance's tpu7x workload-policy service (built once; its Compute client on first need)."""
    return runtime.service("policies", lambda rt: WorkloadPolicies(rt.settings, rt.compute()))


def reservation_look(runtime: Runtime) -> ReservationLook:
    """The instance's look at reservations before buying (built once; its Compute client on first need)."""
    return runtime.service("reservations", lambda rt: ReservationLook(rt.settings, rt.reservations()))


class _Peers:
    """The fleet's clusters as one member's services reach them (``FleetPeers``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def paths(self) -> list[str]:
        return [m.settings.cluster_path for m in self.runtime.members()]

    def kube(self, path: str) -> KubeAPI | None:
        member = self.runtime.member(path)
        return member.kube() if member is not None else None

    def capacity(self, path: str) -> Services | None:
        member = self.runtime.member(path)
        return services(member) if member is not None else None


def services(runtime: Runtime) -> Services:
    """The instance's shared services, built once and handed to every orchestrator below (one
    account of GKE's slots and request quota, one backoff, fallback and releaser)."""
    return runtime.service(
        "services",
        lambda rt: Services(
            rt.settings,
            rt.gke(),
            rt.kube(),
            known_pool_ttl=KNOWN_POOL_TTL_SECONDS,
            policies=policies(rt),
            reservations=reservation_look(rt),
            peers=_Peers(rt),
        ),
    )


def provisioner(runtime: Runtime) -> Provisioner:
    """The instance's Provisioner (built once, on the instance's services)."""
    return runtime.service("provisioner", lambda rt: Provisioner(services(rt)))


def admission_checker(runtime: Runtime) -> AdmissionChecker:
    """The instance's Kueue admission check controller (built once, on the instance's services)."""
    return runtime.service("admission", lambda rt: AdmissionChecker(services(rt)))


def reconciler(runtime: Runtime) -> Reconciler:
    """The instance's reconcile sweep (built once, on the instance's services)."""
    return runtime.service("reconciler", lambda rt: Reconciler(services(rt)))


def multikueue(runtime: Runtime) -> MultiKueuePlacement:
    """The instance's MultiKueue placement (the services' own)."""
    return services(runtime).multikueue


def releaser(runtime: Runtime) -> Releaser:
    """The instance's releaser (the services' own)."""
    return services(runtime).releaser


def provision(runtime: Runtime, cloud_event: Any) -> Outcome | None:
    """Handle a delivery on the pending-pods topic: a pending pod, or a finished node-pool operation."""
    event = events.decode_cloud_event(cloud_event).event
    if not isinstance(
        event, events.NodePoolOperationDone | events.WorkloadQuotaReserved | events.PodUnschedulable
    ):
        _ignore("provision", f"not a pending-pod event: {getattr(event, 'reason', event.kind)}")
        return None
    member = _member(runtime, "provision", event.cluster)
    if member is None:
        return None
    logs.annotate(cluster=event.cluster.path)
    return _provision(member, event)


def _provision(
    runtime: Runtime,
    event: events.NodePoolOperationDone | events.WorkloadQuotaReserved | events.PodUnschedulable,
) -> Outcome | None:
    if isinstance(event, events.NodePoolOperationDone):
        # One key per operation: a redelivery of its entry is coalesced, the pool's next operation
        # is not (a handover's relabel can finish seconds after the release's relabel of the same
        # pool, and its end is what makes the Workload's slices ready). Without an id (a manual
        # publish), the entry's time tells operations apart.
        key = f"operation:{event.method}:{event.pool}:{event.operation or event.timestamp.isoformat()}"
        if _decided(runtime, "provision", key):
            return None
        # A slot of the cluster's operation quota is free: waiting slices go now, not at a backoff.
        with logs.bound(pool=event.pool):
            requested = provisioner(runtime).resume(event.pool)
            if event.method in POOL_READYING_METHODS:
                # A pool is up, or an idle one was relabelled for a Workload (the handover's
                # UpdateNodePool): Workloads waiting for the admission check may be Ready (or have
                # slices still to request) now, not at the next reconcile sweep.
                results = admission_checker(runtime).sweep(f"{event.method} of {event.pool} finished")
                requested.extend(name for result in results for name in result.created)
                if event.method == "CreateNodePool" and not event.failed:
                    # A pool that came up after its JobSet ended goes now, not at reconcile.
                    releaser(runtime).release_if_owner_over(
                        event.pool, f"CreateNodePool of {event.pool} finished after its JobSet ended"
                    )
                    # GKE just delivered capacity of the pool's shape here: MultiKueue's record of
                    # it short in this worker goes.
                    multikueue(runtime).pool_up(event.pool)
                if any(result.waiting_for_nodes for result in results):
                    # GKE's operation ends as the VMs register; their Nodes turn Ready seconds later.
                    # Redelivery looks again then, instead of leaving the Workload to the next sweep.
                    raise TransientError("admission check: every pool RUNNING, waiting for Nodes Ready")
        coalescer(runtime).note(key, f"resumed after {event.method}")
        return Outcome(
            CREATED if requested else SKIPPED, f"resumed after {event.method}", requested=tuple(requested)
        )
    if isinstance(event, events.WorkloadQuotaReserved):
        # One key per reservation of one object: a redelivery of its entry is coalesced, but not
        # the reservation of a new Workload of the same name (MultiKueue's next copy of a manager's
        # Workload comes seconds after the last was removed) nor a new reservation after an eviction.
        key = f"workload:{event.namespace}/{event.name}:{event.uid}:{event.timestamp.isoformat()}"
        if _decided(runtime, "provision", key):
            return None
        with logs.bound(workload=f"{event.namespace}/{event.name}"):
            result = admission_checker(runtime).handle(event.namespace, event.name, "QuotaReserved")
        why = f"admission check {result.state}: {result.why}" if result.state else result.why
        coalescer(runtime).note(key, why)
        return Outcome(CREATED if result.created else SKIPPED, why, requested=result.created)
    # GKE's controller labels name the JobSet even when the pod is already gone.
    owner = event.controller_name if event.controller_type == "JobSet" else ""
    jobset = {"jobset": f"{event.namespace}/{owner}"} if owner else {}
    key = f"pod:{event.namespace}/{event.pod}"
    if _decided(runtime, "provision", key):
        return None
    with logs.bound(pod=f"{event.namespace}/{event.pod}", **jobset):
        outcome = provisioner(runtime).handle_pending_pod(event.namespace, event.pod, event.timestamp)
    coalescer(runtime).note(key, f"{outcome.result}: {outcome.why}")
    return outcome


def release(runtime: Runtime, cloud_event: Any) -> list[str] | None:
    """Handle a delivery on the JobSet-lifecycle topic (terminal Events and audited deletions)."""
    decoded = events.decode_cloud_event(cloud_event)
    event = decoded.event
    if isinstance(event, events.JobSetFinished):
        trigger = f"JobSet {event.outcome.lower()} ({event.reason})"
        uid = event.uid
    elif isinstance(event, events.JobSetDeleted):
        trigger = f"JobSet deleted by {event.principal or 'unknown'}"
        uid = ""
    else:
        _ignore("release", f"not a JobSet lifecycle event: {getattr(event, 'reason', event.kind)}")
        return None
    member = _member(runtime, "release", event.cluster)
    if member is None:
        return None
    key = f"jobset:{type(event).__name__}:{event.namespace}/{event.name}"
    if _decided(member, "release", key):
        return None
    service = releaser(member)
    logs.annotate(cluster=event.cluster.path)
    with logs.bound(jobset=f"{event.namespace}/{event.name}"):
        result: list[str] = service.release(
            event.namespace, event.name, uid, trigger, deleted=isinstance(event, events.JobSetDeleted)
        )
    coalescer(member).note(key, f"released {', '.join(result) or 'nothing'}")
    return result


def reconcile(runtime: Runtime, cloud_event: Any) -> dict[str, Summary]:
    """Handle a scheduler tick on the reconcile topic (the payload does not matter): sweep every
    fleet cluster, side by side, each bounded by RECONCILE_CLUSTER_SECONDS; the sweeps by cluster.

    One cluster's failure (unreachable, denied, rate-limited) is its own: every other sweep runs
    to its end, then the tick is redelivered for the failed ones (a second sweep of a healthy
    cluster finds nothing to do). A sweep that outlives its bound goes on in the background and
    that cluster is skipped until it ends, so a slow cluster neither starves the others nor piles
    sweeps up.
    """
    members = runtime.members()
    if not members:
        _ignore("reconcile", "no cluster to sweep: set CLUSTER_NAME or FLEET_CLUSTERS")
        return {}
    if len(members) == 1:  # a fleet of one: swept in the delivery itself, its error its answer
        [member] = members
        logs.annotate(cluster=member.settings.cluster_path)
        return {member.settings.cluster_path: _sweep(member)}
    bound = runtime.settings.reconcile_cluster_seconds
    pool = _sweeps()
    started = {m.settings.cluster_path: _start_sweep(pool, m) for m in members}
    running = {path: f for path, f in started.items() if f is not None}
    futures.wait(running.values(), timeout=bound)
    summaries: dict[str, Summary] = {}
    failed: list[str] = []
    for path, future in running.items():
        if not future.done():
            logs.decision(
                log,
                "reconcile.overran",
                f"the sweep of {path} is still running after {bound}s; it goes on, and the next "
                "tick skips the cluster until it ends",
                logging.WARNING,
                cluster=path,
            )
            continue
        error = future.exception()
        if error is None:
            summaries[path] = future.result()
            continue
        if not isinstance(error, TransientError | PermanentError):
            raise error  # a bug: the 500 and its traceback, as for any other delivery
        logs.decision(
            log, "reconcile.failed", f"the sweep of {path} failed: {error.why}", logging.ERROR, cluster=path
        )
        if isinstance(error, TransientError):
            failed.append(f"{path}: {error.why}")
    if failed:
        raise TransientError("; ".join(failed))
    return summaries


# Sweeps of different clusters that run at once; more fleet clusters queue for a free worker.
RECONCILE_WORKERS = 8
_sweep_pool: futures.ThreadPoolExecutor | None = None
_sweep_pool_lock = threading.Lock()


def _sweeps() -> futures.ThreadPoolExecutor:
    """The process's workers for fleet sweeps (one pool, whatever runtime a test installs)."""
    global _sweep_pool
    with _sweep_pool_lock:
        if _sweep_pool is None:
            _sweep_pool = futures.ThreadPoolExecutor(RECONCILE_WORKERS, "reconcile")
        return _sweep_pool


def _sweep(member: Runtime) -> Summary:
    summary: Summary = reconciler(member).sweep()
    # The admission check: keep it Active (Kueue holds ClusterQueues using an inactive check
    # inactive) and look at every Workload still Pending on it (a lost QuotaReserved Event).
    checker = admission_checker(member)
    if checker.keep_active():
        checker.sweep()
    return summary


def _start_sweep(pool: futures.ThreadPoolExecutor, member: Runtime) -> futures.Future[Summary] | None:
    """Submit ``member``'s sweep unless its previous one is still running (None then)."""
    path = member.settings.cluster_path
    busy: threading.Lock = member.service("sweeping", lambda rt: threading.Lock())
    if not busy.acquire(blocking=False):
        logs.decision(
            log,
            "reconcile.skipped",
            f"skipping {path}: its previous sweep is still running",
            logging.WARNING,
            cluster=path,
        )
        return None
    context = contextvars.copy_context()  # the delivery's bound log fields go with the sweep

    def sweep() -> Summary:
        try:
            with logs.bound(cluster=path):
                return _sweep(member)
        finally:
            busy.release()

    return pool.submit(context.run, sweep)
