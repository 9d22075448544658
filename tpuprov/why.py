"""What ``tpuprov why`` says: one paragraph on why a pod has, or does not have, its TPU slice.

It runs the provision function's own derivation (``slice_request``, ``jobset_problem`` and the
slice-group engine's ``plan``: the capacity option the next attempt uses and the pool spec on it) on
the pod as the API shows it now, on the views the functions' port returns, then reads the pool GKE
reports under the derived name and the product's Events, so the answer and the product's behaviour
cannot drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from shared.core import labels
from shared.core.errors import NotEligible, Refused
from shared.core.settings import Settings
from shared.provisioning.create import backoff, engine
from shared.provisioning.create.groups import Specs
from shared.tpu import capacity, catalog, selectors
from shared.tpu.jobsets import JobSet, jobset_problem
from shared.tpu.nodepools import ClusterInfo, NodePoolInfo, NodePoolSpec
from shared.tpu.nodes import Node
from shared.tpu.pods import Pod
from shared.tpu.slices import slice_request

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRODUCT_REASONS = (
    labels.REASON_REQUESTED,
    labels.REASON_REFUSED,
    labels.REASON_FAILED,
    labels.REASON_RELEASED,
)


# Kueue's JobSet webhook hands a JobSet queued to a MultiKueue ClusterQueue to MultiKueue
# (pkg/controller/jobframework/defaults.go): it runs in a worker, never where it was submitted.
MULTIKUEUE_MANAGED_BY = "kueue.x-k8s.io/multikueue"


def explain_dispatched(jobset: JobSet, events: Sequence[Mapping[str, Any]]) -> str:
    """One paragraph for a JobSet MultiKueue runs in a worker: where, and why the product chose it."""
    from shared.provisioning.placement.multikueue import REASON_CHOSEN, REASON_SHORT

    who = f"JobSet {jobset.namespace}/{jobset.name}"
    said = sorted(
        (e for e in events if e.get("reason") in (REASON_CHOSEN, REASON_SHORT)),
        key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""),
    )
    head = f"{who} is run by Kueue's MultiKueue in one of its workers; its pods and pools are there."
    if not said:
        return (
            f"{head} No worker was chosen for it yet (its Workload waits for quota, or no worker answered)."
        )
    latest = said[-1]
    shorts = [e.get("message", "") for e in said if e.get("reason") == REASON_SHORT]
    text = f"{head} Latest: {latest.get('reason')}: {latest.get('message', '')}."
    if shorts and latest.get("reason") != REASON_SHORT:
        text += f" Before that: {shorts[-1]}."
    return text


def _events_line(events: Sequence[Mapping[str, Any]]) -> str:
    mine = [e for e in events if e.get("reason") in PRODUCT_REASONS or e.get("reason") == "FailedScheduling"]
    if not mine:
        return "No tpu-provisioner Events were recorded for it."
    mine = sorted(mine, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))[-3:]
    parts = []
    for event in mine:
        count = int(event.get("count") or 1)
        times = f" (x{count})" if count > 1 else ""
        parts.append(f"{event.get('reason')}{times}: {event.get('message', '')}")
    return "Latest Events: " + "; ".join(parts) + "."


def _failed_sentence(pool: NodePoolInfo, jobset: JobSet | None, settings: Settings) -> str:
    failure = backoff.failures(jobset).get(pool.name)
    head = f"GKE could not create its pool {pool.name}: {pool.status_message or 'status ERROR'}."
    if failure is None:
        return f"{head} The next provision or reconcile run records the failure and decides what comes next."
    if failure.next:
        return (
            f"{head} Attempt {failure.attempts} used {failure.option}; the capacity policy falls back to "
            f"{failure.next}: the failed pool is deleted and the slice requested again on it."
        )
    wait = max(0.0, backoff.retry_at(settings, failure) - time.time())
    return (
        f"{head} Attempt {failure.attempts} failed and no other capacity is allowed, so the slice backs off: "
        f"the failed pool is deleted and the slice requested again in about {backoff.describe(wait)}."
    )


def _selectors_sentence(selected: Mapping[str, str], spec: NodePoolSpec, topology: str) -> str:
    """Each selector's fate on the pool the product builds: who puts the label on the nodes."""
    fates = selectors.fates(selected, selectors.spec_node_labels(spec, topology))
    gke = [f"{f.key}={f.value} ({f.detail})" for f in fates if f.fate == selectors.GKE]
    ours = [f"{f.key}={f.value}" for f in fates if f.fate == selectors.PRODUCT]
    parts = [f"GKE sets {', '.join(gke)} from the pool's configuration"] if gke else []
    if ours:
        parts.append(f"the product sets {', '.join(ours)} as node labels")
    return f"Of its node selectors, {'; '.join(parts)}." if parts else ""


def _pool_sentence(pool: NodePoolInfo, nodes_ready: int, jobset: JobSet | None, settings: Settings) -> str:
    if pool.status == "RUNNING" and pool.flex_start and nodes_ready == 0:
        return (
            f"Its flex-start pool {pool.name} exists and waits for GKE to obtain the slice's "
            f"{pool.node_count} VMs; the pods land as soon as the nodes register (no retry is needed)."
        )
    if pool.status == "RUNNING":
        return (
            f"Its pool {pool.name} ({pool.machine_type} x {pool.node_count}) is RUNNING with "
            f"{nodes_ready}/{pool.node_count} nodes Ready, so the scheduler can bind it as soon as the "
            f"nodes register; if it stays Pending, read its FailedScheduling message below."
        )
    if pool.status in ("PROVISIONING", "RECONCILING"):
        return (
            f"Its pool {pool.name} was requested and GKE is still creating it ({pool.status}); "
            f"multi-host TPU pools take minutes."
        )
    if pool.status == "ERROR":
        return _failed_sentence(pool, jobset, settings)
    if pool.status == "STOPPING":
        return f"Its pool {pool.name} is being deleted; the slice is requested again once it is gone."
    return f"Its pool {pool.name} is {pool.status}."


def explain(
    pod: Pod,
    jobset: JobSet | None,
    events: Sequence[Mapping[str, Any]],
    pools: Sequence[NodePoolInfo],
    nodes: Sequence[Node],
    settings: Settings,
    cluster: ClusterInfo | None = None,
) -> str:
    """One paragraph: where the pod stands with respect to its TPU slice, and what happens next;
    ``cluster`` as GKE describes it (its zones and release channel shape the pool, as in provision)."""
    who = f"Pod {pod.key}"
    by_pool = {p.name: p for p in pools}
    node_pool = {n.name: n.pool for n in nodes}
    tail = _events_line(events)
    if pod.finished:
        return f"{who} has finished ({pod.phase}); it needs no slice any more. {tail}"
    if pod.node_name:
        pool_name = node_pool.get(pod.node_name, "")
        pool = by_pool.get(pool_name)
        if pool is None:
            return f"{who} runs on node {pod.node_name} (node pool {pool_name or 'unknown'}). {tail}"
        owner = pool.owner.describe()
        managed = pool.managed
        whose = (
            f"a tpu-provisioner pool owned by JobSet {owner}"
            if managed
            else "a pool the product does not manage"
        )
        return f"{who} has its slice: it runs on node {pod.node_name} of {pool.name}, {whose}. {tail}"
    try:
        request = slice_request(pod)
    except NotEligible as exc:
        return f"{who} is not one tpu-provisioner acts on: {exc.why}. {tail}"
    except Refused as exc:
        return f"{who} was refused a slice: {exc.why}. Fix the pod spec; nothing is created for it. {tail}"
    if jobset is None:
        return (
            f"{who} claims JobSet {request.slice_id.namespace}/{request.slice_id.jobset}, which does not "
            f"exist; no pool is created for it. {tail}"
        )
    if jobset.suspended:
        queue = jobset.meta.labels.get(KUEUE_QUEUE_LABEL)
        if queue and jobset.terminal is None:
            return (
                f"{who} waits for Kueue: its JobSet {jobset.meta.namespace}/{jobset.meta.name} is suspended "
                f"in queue {queue} until its quota fits; pools are requested once Kueue admits it. {tail}"
            )
    problem = jobset_problem(jobset, request.slice_id)
    if problem:
        return f"{who} gets no new pool: {problem}. {tail}"
    try:
        # The create provision would send now, planned as the engine plans it: on the policy's first
        # option, or the fallback the slice's failure record names.
        failures = backoff.failures(jobset)
        [create] = engine.plan(settings, cluster, jobset, [request], Specs(settings, cluster), failures)
    except catalog.UnsupportedShape as exc:
        return f"{who} asks for a TPU shape the catalog does not offer: {exc}. {tail}"
    except Refused as exc:
        return f"{who} was refused a slice: {exc.why}. {tail}"
    pool_spec, shape = create.spec, create.shape
    pool = by_pool.get(pool_spec.name)
    needs = (
        f"It needs {shape.machine_type} x {shape.num_vms} ({shape.total_chips} chips, {shape.topology}) "
        f"on {capacity.key_of_spec(pool_spec)}."
    )
    needs = f"{needs} {_selectors_sentence(request.selected, pool_spec, shape.topology)}".rstrip()
    misfit = selectors.misfit(request.selected, pool, pool_spec) if pool is not None else ""
    if pool is not None and misfit and pool.status not in ("ERROR", "STOPPING"):
        return (
            f"{who}: {needs} Its pool {pool.name} exists but no longer fits the pod: {misfit}. Provision "
            f"deletes it and builds it again once no JobSet pod runs on it (never under a workload). {tail}"
        )
    if pool is None:
        if settings.drain:
            return f"{who}: {needs} Drain mode is on, so nothing is created. {tail}"
        return (
            f"{who}: {needs} No pool {pool_spec.name} exists yet: provision requests it on the pod's next "
            f"FailedScheduling event, or the reconcile sweep does within 5 minutes. If neither happens, "
            f"check the pending-tpu-pods log sink and the provision dead-letter topic. {tail}"
        )
    ready = sum(1 for n in nodes if n.pool == pool.name and n.ready)
    return f"{who}: {needs} {_pool_sentence(pool, ready, jobset, settings)} {tail}"
