"""One handler per event-driven function: decoded event in, one domain service call out.

Entrypoints call these through ``shared.app.entry.handle``; keeping them here (not in ``main.py``) makes
them importable and testable, and keeps the entrypoints to a few lines.
"""

from __future__ import annotations

import logging
from typing import Any

from shared.app.entry import Runtime
from shared.core import logs
from shared.core.errors import TransientError
from shared.events import envelope as events
from shared.provisioning.admission_check import AdmissionChecker
from shared.provisioning.known import KNOWN_POOL_TTL_SECONDS
from shared.provisioning.outcomes import CREATED, SKIPPED, Outcome
from shared.provisioning.policies import WorkloadPolicies
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.reconciler import Reconciler, Summary
from shared.provisioning.releaser import Releaser

log = logs.get("handlers")


def _ignore(function: str, why: str, **fields: Any) -> None:
    logs.decision(log, f"{function}.ignored", why, logging.INFO, **fields)


def _foreign(runtime: Runtime, cluster: events.ClusterId) -> str:
    s = runtime.settings
    if (cluster.project, cluster.location, cluster.name) != (s.project_id, s.location, s.cluster_name):
        return f"event is for cluster {cluster.path}, this deployment manages {s.cluster_path}"
    return ""


def policies(runtime: Runtime) -> WorkloadPolicies:
    """The instance's tpu7x workload-policy service (built once; its Compute client on first need)."""
    return runtime.service("policies", lambda rt: WorkloadPolicies(rt.settings, rt.compute()))


def provisioner(runtime: Runtime) -> Provisioner:
    """The instance's Provisioner (built once)."""
    return runtime.service(
        "provisioner",
        lambda rt: Provisioner(
            rt.settings,
            rt.gke(),
            rt.kube(),
            known_pool_ttl=KNOWN_POOL_TTL_SECONDS,
            policies=policies(rt),
        ),
    )


def admission_checker(runtime: Runtime) -> AdmissionChecker:
    """The instance's Kueue admission check controller (built once)."""
    return runtime.service(
        "admission",
        lambda rt: AdmissionChecker(rt.settings, rt.gke(), rt.kube(), policies=policies(rt)),
    )


def provision(runtime: Runtime, cloud_event: Any) -> Outcome | None:
    """Handle a delivery on the pending-pods topic: a pending pod, or a finished node-pool operation."""
    decoded = events.decode_cloud_event(cloud_event)
    event = decoded.event
    if isinstance(event, events.NodePoolOperationDone):
        foreign = _foreign(runtime, event.cluster)
        if foreign:
            _ignore("provision", foreign)
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
        return Outcome(
            CREATED if requested else SKIPPED, f"resumed after {event.method}", requested=tuple(requested)
        )
    if isinstance(event, events.WorkloadQuotaReserved):
        foreign = _foreign(runtime, event.cluster)
        if foreign:
            _ignore("provision", foreign)
            return None
        with logs.bound(workload=f"{event.namespace}/{event.name}"):
            result = admission_checker(runtime).handle(event.namespace, event.name, "QuotaReserved")
        why = f"admission check {result.state}: {result.why}" if result.state else result.why
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
    with logs.bound(pod=f"{event.namespace}/{event.pod}", **jobset):
        return provisioner(runtime).handle_pending_pod(event.namespace, event.pod, event.timestamp)


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
    service = runtime.service("releaser", lambda rt: Releaser(rt.settings, rt.gke(), rt.kube()))
    with logs.bound(jobset=f"{event.namespace}/{event.name}"):
        result: list[str] = service.release(event.namespace, event.name, uid, trigger)
        return result


def reconcile(runtime: Runtime, cloud_event: Any) -> Summary:
    """Handle a scheduler tick on the reconcile topic (the payload does not matter)."""
    service = runtime.service(
        "reconciler", lambda rt: Reconciler(rt.settings, rt.gke(), rt.kube(), policies=policies(rt))
    )
    summary: Summary = service.sweep()
    # The admission check: keep it Active (Kueue holds ClusterQueues using an inactive check
    # inactive) and look at every Workload still Pending on it (a lost QuotaReserved Event).
    checker = admission_checker(runtime)
    if checker.keep_active():
        checker.sweep()
    return summary
