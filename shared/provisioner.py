"""The provision service: from "this pod is unschedulable" to exactly one TPU node pool per slice.

Reads at most two things per event (the pod, the cluster's node pools), never waits for GKE's
operation, and relies on the deterministic pool name so that duplicates and concurrent instances
converge: a 409 on create is success.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

from shared import catalog, labels, logs
from shared.errors import AlreadyExistsError, NotFoundError, RejectedError
from shared.kube import KubeAPI
from shared.nodepools import STATUS_ERROR, STATUS_STOPPING, NodePoolAPI, NodePoolInfo
from shared.settings import Settings
from shared.slices import NotEligible, Refused, SliceRequest, build_node_pool, slice_request

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

    def __init__(self, settings: Settings, gke: NodePoolAPI, kube: KubeAPI) -> None:
        self.settings = settings
        self.gke = gke
        self.kube = kube

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
        refusal = self._guardrail(request, shape.total_chips)
        if refusal:
            return self._refuse(pod, refusal, slice_desc, spec.name)

        if pools is None:
            pools = self.gke.list_node_pools(self.settings.cluster_path)
        existing = next((p for p in pools if p.name == spec.name), None)
        if existing is not None:
            why = f"pool {spec.name} already exists ({existing.status})"
            if existing.status == STATUS_ERROR:
                why += "; reconcile recycles failed pools"
            return self._done(Outcome(EXISTS, why, spec.name, slice_desc))
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
        self.kube.record_event(_ref(pod), labels.REASON_REQUESTED, f"requested node pool {spec.name}: {why}")
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
