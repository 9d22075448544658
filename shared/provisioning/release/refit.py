"""A slice's pool that no longer fits its pods: replaced when nobody runs on it, refused otherwise.

A pool built under node settings that have since changed (config drift, ``shared.tpu.drift``) goes
the same guarded way when REPLACE_DRIFTED_POOLS is on, except that a busy one is simply kept: its
pods can still land on it.

The pool name is derived from the slice, not from what its pods select, so a JobSet whose pods
change their selectors under the same uid finds its old pool by name. The usual cause is Kueue:
a JobSet suspended and re-admitted under another flavor within SUSPEND_GRACE_SECONDS gets pods
selecting, say, Spot VMs while its pool (kept through the grace) runs on-demand VMs. Those pods
could never land there, and the pool bills until release.

The decision (docs/functions.md "Pods land"): the pool is deleted through the same cordon / occupancy check
as any release (``shared.provisioning.release.guard``) when it is the slice's own, RUNNING and no JobSet
pod runs on it; a later pending event of the slice then creates it as the pods now ask. A pool
another JobSet's pods run on (or one handed to another JobSet) is never deleted: the pod is
refused with the reason instead, and the pool goes the usual way once that workload ends.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels
from shared.core.errors import NotFoundError
from shared.core.settings import Settings
from shared.provisioning.outcomes import REFUSED, REPLACED, WAITING, Outcome, logged
from shared.provisioning.release.guard import PoolGuard
from shared.tpu import drift
from shared.tpu.jobsets import jobset_ref
from shared.tpu.nodepools import STATUS_RUNNING, STATUS_RUNNING_WITH_ERROR, NodePoolInfo, NodePoolSpec
from shared.tpu.pods import Pod
from shared.tpu.slices import SliceRequest


def _jobset_pods(pods: list[Pod]) -> list[Pod]:
    # A DaemonSet's pod runs on every node and holds nothing; any live JobSet pod holds the pool.
    return [p for p in pods if p.jobset_value(labels.JOBSET_NAME) and not p.finished]


def _owned_by_slice(pool: NodePoolInfo, request: SliceRequest) -> bool:
    """Whether ``pool`` carries this very slice as its owner: the whole identity (namespace, JobSet,
    uid, replicated job, index), never the uid alone. The request comes from a pod proven to be its
    JobSet's (``shared.provisioning.tenancy.ownership``), so a delete here is always the owner's own."""
    sid = request.slice_id
    return pool.managed and (
        pool.owner.namespace,
        pool.owner.name,
        pool.owner.uid,
        pool.owner.replicated_job,
        pool.owner.job_index,
    ) == (sid.namespace, sid.jobset, sid.jobset_uid, sid.replicated_job, str(sid.job_index))


class Refit:
    """Replace (or refuse over) a slice's existing pool that its pods can no longer land on."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.guard = PoolGuard(kube, settings.cordon_settle_seconds, sleep)

    def handle(
        self, pod: Pod, request: SliceRequest, pool: NodePoolInfo, misfit: str, slice_desc: str
    ) -> Outcome:
        """Decide for a pool of the slice's name that ``misfit`` says the pod cannot run on."""
        if not _owned_by_slice(pool, request):
            return self._refuse(pod, request, pool, misfit, "it is not this JobSet's own pool", slice_desc)
        if pool.status not in (STATUS_RUNNING, STATUS_RUNNING_WITH_ERROR):
            # An operation runs on it (create, label update): GKE refuses a delete meanwhile. The next
            # pending event of the slice looks again.
            why = f"pool {pool.name} no longer fits the pod ({misfit}); it is replaced once it is RUNNING"
            return logged(Outcome(WAITING, why, pool.name, slice_desc))
        busy = self._delete_if_idle(pool, f"pool {pool.name} no longer fits the pod: {misfit}")
        if busy:
            reason = f"{busy} JobSet pod(s) run on it, and a pool is never replaced under a workload"
            return self._refuse(pod, request, pool, misfit, reason, slice_desc)
        return self._replaced(
            pod, request, pool, f"deleted node pool {pool.name} to build it again: {misfit}", slice_desc
        )

    def for_drift(
        self,
        pod: Pod,
        request: SliceRequest,
        pool: NodePoolInfo | None,
        spec: NodePoolSpec,
        slice_desc: str,
    ) -> tuple[Outcome | None, str]:
        """For the slice's existing pool (if any) built under other settings than ``spec``'s: the
        outcome of replacing it (REPLACE_DRIFTED_POOLS), or None and a note for the caller's line."""
        drifted = drift.summary(drift.drift(pool, spec)) if pool is not None else ""
        if pool is None or not drifted:
            return None, ""
        if not self.settings.replace_drifted_pools:
            return (
                None,
                f"; built under other settings ({drifted}), reported only (REPLACE_DRIFTED_POOLS=false)",
            )
        replaced = self.replace_drifted(pod, request, pool, drifted, slice_desc)
        note = f"; built under other settings ({drifted}), kept: replaced only when RUNNING, own and unused"
        return replaced, "" if replaced is not None else note

    def replace_drifted(
        self, pod: Pod, request: SliceRequest, pool: NodePoolInfo, drifted: str, slice_desc: str
    ) -> Outcome | None:
        """Replace the slice's own pool built under settings that have since changed (``drifted``
        names them), when RUNNING and nobody runs on it; None when it is kept (the pod can still
        land there, so nothing is refused: the caller goes on as for any existing pool)."""
        own = _owned_by_slice(pool, request)
        if not own or pool.status not in (STATUS_RUNNING, STATUS_RUNNING_WITH_ERROR):
            return None
        busy = self._delete_if_idle(pool, f"pool {pool.name} was built under other settings: {drifted}")
        if busy:
            return None
        message = f"deleted node pool {pool.name} to build it under the current settings ({drifted})"
        return self._replaced(pod, request, pool, message, slice_desc)

    def _delete_if_idle(self, pool: NodePoolInfo, why: str) -> int:
        """Cordon, settle, re-check and delete the pool unless a JobSet pod runs there; the number of
        such pods (0 when deleted), the pool then uncordoned."""
        nodes = self.guard.nodes(pool)
        busy = _jobset_pods(self.guard.pods_on(nodes))
        if not busy:
            self.guard.cordon(pool, nodes, why)
            nodes = self.guard.nodes(pool)
            busy = _jobset_pods(self.guard.pods_on(nodes))
        if busy:
            self.guard.uncordon(pool, nodes, "a JobSet pod runs there: the pool is kept")
            return len(busy)
        # Already gone (NotFoundError): the next pending event creates it anew all the same.
        with contextlib.suppress(NotFoundError):
            self.gke.delete_node_pool(self.settings.cluster_path, pool.name, why)
        return 0

    def _replaced(
        self, pod: Pod, request: SliceRequest, pool: NodePoolInfo, message: str, slice_desc: str
    ) -> Outcome:
        self.kube.record_event(jobset_ref(None, request.slice_id), labels.REASON_RELEASED, message)
        self.kube.record_event(pod.ref(), labels.REASON_RELEASED, message)
        return logged(Outcome(REPLACED, message, pool.name, slice_desc), logging.WARNING)

    def _refuse(
        self,
        pod: Pod,
        request: SliceRequest,
        pool: NodePoolInfo,
        misfit: str,
        reason: str,
        slice_desc: str,
    ) -> Outcome:
        why = f"node pool {pool.name} no longer fits the pod ({misfit}) and is not replaced: {reason}"
        self.kube.record_event(pod.ref(), labels.REASON_REFUSED, why, warning=True)
        self.kube.record_event(jobset_ref(None, request.slice_id), labels.REASON_REFUSED, why, warning=True)
        return logged(Outcome(REFUSED, why, pool.name, slice_desc), logging.WARNING)
