"""The provision service: from "this pod is unschedulable" to exactly one TPU node pool per slice.

Reads at most two things per event (the pod, the cluster's node pools), never waits for GKE's
operation, and relies on the deterministic pool name so that duplicates and concurrent instances
converge: a 409 on create is success.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import AlreadyExistsError, NotEligible, NotFoundError, Refused, RejectedError
from shared.core.names import label_key_problem, label_value_problem
from shared.core.settings import Settings
from shared.provisioning.known import KnownPools
from shared.tpu import catalog
from shared.tpu.jobsets import jobset_log_field, jobset_problem, replicas_of
from shared.tpu.nodepools import (
    STATUS_ERROR,
    STATUS_PROVISIONING,
    STATUS_STOPPING,
    NodePoolInfo,
    NodePoolSpec,
)
from shared.tpu.slices import SliceRequest, build_node_pool, slice_request

log = logs.get("provision")

# Outcome names double as the stable `event` field of the decision log line (prefixed "provision.").
CREATED = "created"
EXISTS = "exists"
SKIPPED = "skipped"
REFUSED = "refused"
FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the service decided for one pod, for logs, tests and the reconcile summary."""

    result: str
    why: str
    pool: str = ""
    slice: str = ""
    requested: tuple[str, ...] = ()  # every pool this call created (its own and its siblings')


# GCE resource labels: lowercase letters, digits, "_" and "-"; keys start with a letter.
_RESOURCE_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}\Z")
_RESOURCE_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}\Z")


def label_problem(spec: NodePoolSpec) -> str:
    """Why the pool's labels must not be sent ("" when every key and value is valid).

    Ownership values come from the pod's JobSet labels or annotations, and annotations are free
    text: a value such as ``a,tpuprov.dev/managed-by=x`` must be refused here rather than reach
    GKE, which hands node labels to the kubelet as one comma-separated flag.
    """
    for key, value in spec.labels.items():
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            return f"cannot label the node pool: {problem}"
    for key, value in spec.resource_labels.items():
        if not (_RESOURCE_LABEL_KEY.match(key) and _RESOURCE_LABEL_VALUE.match(value)):
            return f"cannot label the node pool: resource label {key}={value!r} is not a valid GCE label"
    return ""


def managed_chips(pools: list[NodePoolInfo]) -> int:
    """Chips held by the product's pools (those stopping are on their way out and not counted)."""
    total = 0
    for pool in pools:
        if pool.labels.get(labels.MANAGED_BY) != labels.MANAGED_BY_VALUE or pool.status == STATUS_STOPPING:
            continue
        chips = catalog.machine_type_chips(pool.machine_type) or 0
        total += chips * pool.node_count
    return total


class Provisioner:
    """Turns pending TPU pods into node-pool create requests, within the guardrails."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        known_pool_ttl: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``known_pool_ttl`` > 0 lets the instance skip the listing for pools it saw that recently."""
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.known_pools = KnownPools(known_pool_ttl, clock)

    # -- entry points -----------------------------------------------------------------------------

    def handle_pending_pod(
        self, namespace: str, pod_name: str, event_time: datetime.datetime | None
    ) -> Outcome:
        """Handle a FailedScheduling-style event for ``namespace/pod_name``."""
        if event_time is not None:
            age = (datetime.datetime.now(tz=datetime.UTC) - event_time).total_seconds()
            if age > self.settings.max_event_age_seconds:
                return self._done(
                    Outcome(SKIPPED, f"event is {age:.0f}s old (max {self.settings.max_event_age_seconds}s)")
                )
        try:
            pod = self.kube.get_pod(namespace, pod_name)
        except NotFoundError:
            return self._done(Outcome(SKIPPED, f"pod {namespace}/{pod_name} no longer exists"))
        return self.provision_pod(pod)

    def provision_pod(self, pod: dict[str, Any], pools: list[NodePoolInfo] | None = None) -> Outcome:
        """Request the slice a pending pod needs (``pools``: a listing the caller already has)."""
        # Every decision line about this pod carries the JobSet it claims to belong to.
        with logs.bound(**jobset_log_field(pod)):
            return self._provision_pod(pod, pools)

    def _provision_pod(self, pod: dict[str, Any], pools: list[NodePoolInfo] | None) -> Outcome:
        meta = pod.get("metadata") or {}
        who = f"{meta.get('namespace')}/{meta.get('name')}"
        try:
            request = slice_request(pod)
        except NotEligible as exc:
            return self._done(Outcome(SKIPPED, f"pod {who}: {exc.why}"))
        except Refused as exc:
            return self._refuse(pod, exc.why, "")
        slice_desc = request.slice_id.describe()
        try:
            spec, shape = build_node_pool(self.settings, request)
        except Refused as exc:
            return self._refuse(pod, exc.why, slice_desc)
        refusal = label_problem(spec) or self._guardrail(request, shape.total_chips)
        if refusal:
            return self._refuse(pod, refusal, slice_desc, spec.name)

        if pools is not None:  # the caller's listing decides (reconcile); no instance memory involved
            return self._request(pod, request, spec, shape, slice_desc, pools)
        # One decision at a time per replicated job in this instance: the first event requests the
        # whole group, the others then find their pool remembered instead of racing to a 409.
        sid = request.slice_id
        with self.known_pools.single_flight(
            f"{sid.namespace}/{sid.jobset}/{sid.jobset_uid}/{sid.replicated_job}"
        ):
            if self.known_pools.known(spec.name, _created(pod)):
                why = f"pool {spec.name} was seen to exist less than {self.known_pools.ttl:.0f}s ago"
                return self._done(Outcome(EXISTS, why, spec.name, slice_desc))
            pools = self.gke.list_node_pools(self.settings.cluster_path)
            return self._request(pod, request, spec, shape, slice_desc, pools)

    def _request(
        self,
        pod: dict[str, Any],
        request: SliceRequest,
        spec: NodePoolSpec,
        shape: catalog.SliceShape,
        slice_desc: str,
        pools: list[NodePoolInfo],
    ) -> Outcome:
        """Create the slice's pool unless the listing has it or the chip budget forbids it."""
        pools = list(pools)  # extended with what this call creates; the caller's listing stays as given
        existing = next((p for p in pools if p.name == spec.name), None)
        if existing is not None:
            why = f"pool {spec.name} already exists ({existing.status})"
            if existing.status in (STATUS_ERROR, STATUS_STOPPING):
                self.known_pools.forget(spec.name)  # on its way out: the next event must list again
            else:
                self.known_pools.remember(spec.name)
            if existing.status == STATUS_ERROR:
                why += "; reconcile recycles failed pools"
                # The JobSet hears about it now, not at the next reconcile (aggregated: one Event).
                self.kube.record_event(
                    _jobset_ref(request),
                    labels.REASON_FAILED,
                    f"node pool {spec.name} for {slice_desc} failed to provision: "
                    f"{existing.status_message or 'status ERROR'}; it is recycled by the next reconcile",
                    warning=True,
                )
            return self._done(Outcome(EXISTS, why, spec.name, slice_desc))
        # About to spend money: the JobSet itself (not the pod's claims) decides. This read happens
        # once per slice group, not per event.
        try:
            jobset = self.kube.get_jobset(request.slice_id.namespace, request.slice_id.jobset)
        except NotFoundError:
            return self._done(
                Outcome(SKIPPED, f"JobSet of {slice_desc} does not exist", spec.name, slice_desc)
            )
        problem = jobset_problem(jobset, request.slice_id)
        if problem:
            return self._refuse(pod, problem, slice_desc, spec.name)
        outcome = self._create(pod, request, spec, shape, slice_desc, pools)
        created = [spec.name] if outcome.result == CREATED else []
        # Every pool of the replicated job is requested together: with exclusive placement any Job may
        # land on any free pool of its shape, so a Job whose "own" pool another Job took must still
        # find one. Requesting them all at once keeps pools == slices whatever the landing order.
        for index in range(replicas_of(jobset, request.slice_id.replicated_job)):
            if index == request.slice_id.job_index:
                continue
            sibling = dataclasses.replace(
                request, slice_id=dataclasses.replace(request.slice_id, job_index=index)
            )
            sibling_spec, _ = build_node_pool(self.settings, sibling)
            if any(p.name == sibling_spec.name for p in pools) or self.known_pools.known(sibling_spec.name):
                continue
            if (
                self._create(pod, sibling, sibling_spec, shape, sibling.slice_id.describe(), pools).result
                == CREATED
            ):
                created.append(sibling_spec.name)
        if created:
            # One Event per group, naming every pool: on the JobSet and on the pod that asked.
            names = ", ".join(created)
            message = f"requested node pools {names} for {request.slice_id.replicated_job}: {outcome.why}"
            self.kube.record_event(_jobset_ref(request, jobset), labels.REASON_REQUESTED, message)
            self.kube.record_event(_ref(pod), labels.REASON_REQUESTED, message)
        return dataclasses.replace(outcome, requested=tuple(created))

    def _create(
        self,
        pod: dict[str, Any],
        request: SliceRequest,
        spec: NodePoolSpec,
        shape: catalog.SliceShape,
        slice_desc: str,
        pools: list[NodePoolInfo],
    ) -> Outcome:
        """Create one slice's pool within the chip budget; the listing is updated with it."""
        if self.settings.chip_budget:
            in_use = managed_chips(pools)
            if in_use + shape.total_chips > self.settings.chip_budget:
                why = (
                    f"chip budget exceeded: {in_use} chips in managed pools + {shape.total_chips} requested "
                    f"> CHIP_BUDGET {self.settings.chip_budget}"
                )
                return self._refuse(pod, why, slice_desc, spec.name)

        why = (
            f"{slice_desc} pending: {shape.num_vms} x {shape.machine_type} "
            f"({request.accelerator} {shape.topology}, {shape.total_chips} chips)"
        )
        try:
            self.gke.create_node_pool(self.settings.cluster_path, spec, why)
        except AlreadyExistsError:
            self.known_pools.remember(spec.name)
            return self._done(
                Outcome(EXISTS, f"pool {spec.name} already exists (409)", spec.name, slice_desc)
            )
        except RejectedError as exc:
            self.kube.record_event(
                _ref(pod), labels.REASON_FAILED, f"GKE rejected pool {spec.name}: {exc.why}", warning=True
            )
            return self._done(
                Outcome(FAILED, f"GKE rejected pool {spec.name}: {exc.why}", spec.name, slice_desc),
                logging.ERROR,
            )
        self.known_pools.remember(spec.name)
        pools.append(
            NodePoolInfo(
                name=spec.name,
                status=STATUS_PROVISIONING,
                machine_type=spec.machine_type,
                node_count=spec.node_count,
                labels=dict(spec.labels),
            )
        )
        return self._done(Outcome(CREATED, why, spec.name, slice_desc))

    # -- helpers ----------------------------------------------------------------------------------

    def _guardrail(self, request: SliceRequest, chips: int) -> str:
        s = self.settings
        ns = request.slice_id.namespace
        if s.drain:
            return "drain mode is on: no node pools are created"
        if s.namespace_allowlist and ns not in s.namespace_allowlist:
            return f"namespace {ns!r} is not in NAMESPACE_ALLOWLIST"
        if s.allowed_accelerators and request.accelerator not in s.allowed_accelerators:
            return f"accelerator {request.accelerator!r} is not in ALLOWED_ACCELERATORS"
        if chips > s.max_chips_per_slice:
            return f"slice of {chips} chips exceeds MAX_CHIPS_PER_SLICE {s.max_chips_per_slice}"
        return ""

    def _refuse(self, pod: dict[str, Any], why: str, slice_desc: str, pool: str = "") -> Outcome:
        self.kube.record_event(_ref(pod), labels.REASON_REFUSED, why, warning=True)
        return self._done(Outcome(REFUSED, why, pool, slice_desc), logging.WARNING)

    def _done(self, outcome: Outcome, level: int = logging.INFO) -> Outcome:
        logs.decision(
            log, f"provision.{outcome.result}", outcome.why, level, pool=outcome.pool, slice=outcome.slice
        )
        return outcome


def _ref(pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod.get("metadata") or {}}


def _jobset_ref(request: SliceRequest, jobset: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JobSet of a slice as an Event's involved object (from the pod's claims when not read)."""
    sid = request.slice_id
    meta = (jobset or {}).get("metadata") or {
        "name": sid.jobset,
        "namespace": sid.namespace,
        "uid": sid.jobset_uid,
    }
    return {
        "apiVersion": f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": meta,
    }


def _created(pod: dict[str, Any]) -> float | None:
    """The pod's creationTimestamp in Unix seconds (None when absent or unreadable)."""
    stamp = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None
    except ValueError:
        return None
