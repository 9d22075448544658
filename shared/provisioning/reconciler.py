"""The reconcile sweep: a stateless, scheduled safety net under the event-driven functions.

Events can be lost, late or reordered; the sweep looks at what is (managed pools, JobSets, pending
pods) and fixes what events missed: it releases pools whose JobSet is gone, over, replaced or
suspended too long, recycles pools GKE failed to provision, and requests slices for pending pods
that have none. Every release goes through ``Releaser.dispose``, so a pool some live JobSet runs on
is adopted or kept, never deleted. It lifts cordons a crashed release left on pools it keeps, and
never touches a pool without the product's marker.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import NotEligible, Refused, TransientError
from shared.core.settings import Settings
from shared.provisioning.guard import stale_cordons
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.releaser import Releaser, Verdict, is_managed, jobset_ref, judge
from shared.tpu.nodepools import STATUS_ERROR, STATUS_STOPPING, NodePoolInfo
from shared.tpu.slices import slice_request

log = logs.get("reconcile")
_PENDING = "status.phase=Pending"


@dataclasses.dataclass
class Summary:
    """The sweep's one-line report."""

    pools_seen: int = 0
    deleted: int = 0
    healed: int = 0
    requested: int = 0
    kept: int = 0
    adopted: int = 0
    offered: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)


class Reconciler:
    """One sweep over the cluster's managed pools, JobSets and pending JobSet pods."""

    def __init__(self, settings: Settings, gke: NodePoolAPI, kube: KubeAPI) -> None:
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.releaser = Releaser(settings, gke, kube)
        self.provisioner = Provisioner(settings, gke, kube)

    def sweep(self) -> Summary:
        """Run one sweep. Raises TransientError (after doing all it could) if part of it must be retried."""
        summary = Summary()
        listing = self.gke.list_node_pools(self.settings.cluster_path)
        pools = [p for p in listing if is_managed(p)]
        summary.pools_seen = len(pools)
        all_jobsets = self.kube.list_jobsets()
        jobsets: dict[tuple[str, str], dict[str, Any] | None] = {
            (js.get("metadata", {}).get("namespace", ""), js.get("metadata", {}).get("name", "")): js
            for js in all_jobsets
        }
        now = datetime.datetime.now(tz=datetime.UTC)

        failed = [p for p in pools if p.status == STATUS_ERROR]
        healthy = [p for p in pools if p.status != STATUS_ERROR]
        verdicts = [(p, judge(p, jobsets.get(_key(p)), self.settings, now)) for p in healthy]
        verdicts += [
            (p, Verdict(True, f"GKE could not provision it: {p.status_message or 'status ERROR'}"))
            for p in failed
        ]
        for pool in failed:  # the JobSet learns at once, whatever happens to the pool below
            self._report_failed(pool, jobsets.get(_key(pool)))
        outcome = self.releaser.dispose(verdicts, "reconcile sweep", jobsets, listing, all_jobsets)
        summary.errors.extend(outcome.retry)
        deleted_names = {p.name for p in outcome.deleted}
        summary.deleted = len(outcome.deleted)
        summary.kept = len(outcome.kept)
        summary.adopted = len(outcome.adopted)
        summary.offered = len(outcome.offered)
        summary.healed = sum(1 for p in failed if p.name in deleted_names)
        self._lift_stale_cordons(pools, deleted_names, now, summary)

        if not self.settings.drain:
            remaining = [p for p in pools if p.name not in deleted_names]
            summary.requested = self._heal_missed(remaining, deleted_names, summary)

        logs.decision(
            log,
            "reconcile.summary",
            f"pools seen {summary.pools_seen}, deleted {summary.deleted}, healed {summary.healed}, "
            f"requested {summary.requested}, kept {summary.kept}, adopted {summary.adopted}, "
            f"offered {summary.offered}",
            logging.WARNING if summary.errors else logging.INFO,
            pools_seen=summary.pools_seen,
            deleted=summary.deleted,
            healed=summary.healed,
            requested=summary.requested,
            kept=summary.kept,
            adopted=summary.adopted,
            offered=summary.offered,
            drain=self.settings.drain,
        )
        if summary.errors:
            raise TransientError("; ".join(summary.errors))
        return summary

    def _report_failed(self, pool: NodePoolInfo, jobset: dict[str, Any] | None) -> None:
        if jobset is None:
            return
        self.kube.record_event(
            jobset_ref(jobset),
            labels.REASON_FAILED,
            f"node pool {pool.name} failed to provision: {pool.status_message or 'status ERROR'}; it is "
            f"deleted (unless a workload runs on it) so the slice can be requested again",
            warning=True,
        )

    def _lift_stale_cordons(
        self, pools: list[NodePoolInfo], deleted: set[str], now: datetime.datetime, summary: Summary
    ) -> None:
        # A release that died between cordon and delete leaves nodes nothing can be scheduled on.
        keep = {p.name for p in pools if p.name not in deleted and p.status != STATUS_STOPPING}
        try:
            for name, nodes in stale_cordons(self.kube, keep, now).items():
                pool = next(p for p in pools if p.name == name)
                self.releaser.guard.uncordon(
                    pool, nodes, "the pool is kept; an earlier release did not finish"
                )
        except TransientError as exc:
            summary.errors.append(exc.why)

    def _heal_missed(self, pools: list[NodePoolInfo], just_deleted: set[str], summary: Summary) -> int:
        # Pools deleted in this sweep are still listed by GKE (STOPPING); a pod that needs the same
        # name must wait for the next sweep or event rather than collide with the deletion.
        known = {p.name for p in pools} | just_deleted
        requested = 0
        seen: set[str] = set()
        # Only pending pods can need a slice; the API server filters them (a cluster of 50,000
        # running pods then costs a few small pages, not the whole pod table).
        for pod in self.kube.list_pods(label_selector=labels.JOBSET_NAME, field_selector=_PENDING):
            try:
                name = slice_request(pod).pool_name
            except (NotEligible, Refused):
                continue  # provision reports refusals when the pod's own events arrive
            if name in known or name in seen:
                continue
            seen.add(name)
            try:
                outcome = self.provisioner.provision_pod(pod, pools=list(pools))
            except TransientError as exc:
                summary.errors.append(exc.why)
                continue
            requested += len(outcome.requested)
            known.update(outcome.requested)
        return requested


def _key(pool: NodePoolInfo) -> tuple[str, str]:
    return (pool.labels.get(labels.OWNER_NAMESPACE, ""), pool.labels.get(labels.OWNER_NAME, ""))
