"""One handler per event-driven function: the decoded event in, the orchestrators' decision out.

Entrypoints call these through ``shared.app.entry.handle``; keeping them here (not in ``main.py``) makes
them importable and testable, and keeps the entrypoints to a few lines.
"""

from __future__ import annotations

import logging
from typing import Any

from shared.app.coalesce import Coalescer
from shared.app.entry import Runtime
from shared.core import logs
from shared.core.errors import TransientError
from shared.events import envelope as events
from shared.provisioning.admission.check import AdmissionChecker
from shared.provisioning.create.known import KNOWN_POOL_TTL_SECONDS
from shared.provisioning.create.policies import WorkloadPolicies
from shared.provisioning.outcomes import CREATED, SKIPPED, Outcome
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler, Summary
from shared.provisioning.release.releaser import Releaser
from shared.provisioning.services import Services

log = logs.get("handlers")


def _ignore(function: str, why: str, **fields: Any) -> None:
    logs.decision(log, f"{function}.ignored", why, logging.INFO, **fields)


def _foreign(runtime: Runtime, cluster: events.ClusterId) -> str:
    s = runtime.settings
    if (cluster.project, cluster.location, cluster.name) != (s.project_id, s.location, s.cluster_name):
        return f"event is for cluster {cluster.path}, this deployment manages {s.cluster_path}"
    return ""


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


def services(runtime: Runtime) -> Services:
    """The instance's shared services, built once and handed to every orchestrator below (one
    account of GKE's slots and request quota, one backoff, fallback and releaser)."""
    return runtime.service(
        "services",
        lambda rt: Services(
            rt.settings, rt.gke(), rt.kube(), known_pool_ttl=KNOWN_POOL_TTL_SECONDS, policies=policies(rt)
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


def releaser(runtime: Runtime) -> Releaser:
    """The instance's releaser (the services' own)."""
    return services(runtime).releaser


def provision(runtime: Runtime, cloud_event: Any) -> Outcome | None:
    """Handle a delivery on the pending-pods topic: a pending pod, or a finished node-pool operation."""
    decoded = events.decode_cloud_event(cloud_event)
    event = decoded.event
    if isinstance(event, events.NodePoolOperationDone):
        foreign = _foreign(runtime, event.cluster)
        if foreign:
            _ignore("provision", foreign)
            return None
        key = f"operation:{event.method}:{event.pool}"
        if _decided(runtime, "provision", key):
            return None
        # A slot of the cluster's operation quota is free: waiting slices go now, not at a backoff.
        with logs.bound(pool=event.pool):
            requested = provisioner(runtime).resume(event.pool)
            if event.method == "CreateNodePool":
                # A pool is up: Workloads waiting for the admission check may be Ready (or have
                # slices still to request) now, not at the next reconcile sweep.
                results = admission_checker(runtime).sweep(f"{event.method} of {event.pool} finished")
                requested.extend(name for result in results for name in result.created)
                if any(result.waiting_for_nodes for result in results):
                    # GKE's operation ends as the VMs register; their Nodes turn Ready seconds later.
                    # Redelivery looks again then, instead of leaving the Workload to the next sweep.
                    raise TransientError("admission check: every pool RUNNING, waiting for Nodes Ready")
        coalescer(runtime).note(key, f"resumed after {event.method}")
        return Outcome(
            CREATED if requested else SKIPPED, f"resumed after {event.method}", requested=tuple(requested)
        )
    if isinstance(event, events.WorkloadQuotaReserved):
        foreign = _foreign(runtime, event.cluster)
        if foreign:
            _ignore("provision", foreign)
            return None
        key = f"workload:{event.namespace}/{event.name}"
        if _decided(runtime, "provision", key):
            return None
        with logs.bound(workload=f"{event.namespace}/{event.name}"):
            result = admission_checker(runtime).handle(event.namespace, event.name, "QuotaReserved")
        why = f"admission check {result.state}: {result.why}" if result.state else result.why
        coalescer(runtime).note(key, why)
        return Outcome(CREATED if result.created else SKIPPED, why, requested=result.created)
    if not isinstance(event, events.PodUnschedulable):
        _ignore("provision", f"not a pending-pod event: {getattr(event, 'reason', event.kind)}")
        return None
    foreign = _foreign(runtime, event.cluster)
    if foreign:
        _ignore("provision", foreign)
        return None
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
    foreign = _foreign(runtime, event.cluster)
    if foreign:
        _ignore("release", foreign)
        return None
    key = f"jobset:{type(event).__name__}:{event.namespace}/{event.name}"
    if _decided(runtime, "release", key):
        return None
    service = releaser(runtime)
    with logs.bound(jobset=f"{event.namespace}/{event.name}"):
        result: list[str] = service.release(
            event.namespace, event.name, uid, trigger, deleted=isinstance(event, events.JobSetDeleted)
        )
    coalescer(runtime).note(key, f"released {', '.join(result) or 'nothing'}")
    return result


def reconcile(runtime: Runtime, cloud_event: Any) -> Summary:
    """Handle a scheduler tick on the reconcile topic (the payload does not matter)."""
    summary: Summary = reconciler(runtime).sweep()
    # The admission check: keep it Active (Kueue holds ClusterQueues using an inactive check
    # inactive) and look at every Workload still Pending on it (a lost QuotaReserved Event).
    checker = admission_checker(runtime)
    if checker.keep_active():
        checker.sweep()
    return summary
