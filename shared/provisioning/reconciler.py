"""The reconcile sweep: a stateless, scheduled safety net under the event-driven functions.

Events can be lost, late or reordered; the sweep looks at what is (managed pools, JobSets, pending
pods) and fixes what events missed: it releases pools whose JobSet is gone, over, replaced or
suspended too long, recycles pools GKE failed to provision, and requests slices for pending pods
that have none. It never touches a pool without the product's marker.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import NotEligible, Refused, TransientError
from shared.core.settings import Settings
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.releaser import Releaser, Verdict, is_managed, judge
from shared.tpu.nodepools import STATUS_ERROR, NodePoolInfo
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
        pools = [p for p in self.gke.list_node_pools(self.settings.cluster_path) if is_managed(p)]
        summary.pools_seen = len(pools)
        jobsets = {
            (js.get("metadata", {}).get("namespace", ""), js.get("metadata", {}).get("name", "")): js
            for js in self.kube.list_jobsets()
        }
        now = datetime.datetime.now(tz=datetime.UTC)

        failed = [p for p in pools if p.status == STATUS_ERROR]
        healthy = [p for p in pools if p.status != STATUS_ERROR]
        verdicts = [(p, judge(p, jobsets.get(_key(p)), self.settings, now)) for p in healthy]
        verdicts += [
            (p, Verdict(True, f"GKE could not provision it: {p.status_message or 'status ERROR'}"))
            for p in failed
        ]
        try:
            deleted = self.releaser.delete_pools(verdicts, "reconcile sweep")
        except TransientError as exc:
            summary.errors.append(exc.why)
            deleted = []
        deleted_names = {p.name for p in deleted}
        summary.deleted = len(deleted)
        summary.kept = sum(1 for _, v in verdicts if not v.delete)
        for pool in failed:
            if pool.name not in deleted_names:
                continue
            summary.healed += 1
            jobset = jobsets.get(_key(pool))
            if jobset is not None:
                self.kube.record_event(
                    {
                        "apiVersion": f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}",
                        "kind": "JobSet",
                        **jobset,
                    },
                    labels.REASON_FAILED,
                    f"node pool {pool.name} failed to provision and was deleted so the slice can be "
                    f"requested "
                    f"again: {pool.status_message or 'status ERROR'}",
                    warning=True,
                )

        if not self.settings.drain:
            remaining = [p for p in pools if p.name not in deleted_names]
            summary.requested = self._heal_missed(remaining, deleted_names, summary)

        logs.decision(
            log,
            "reconcile.summary",
            f"pools seen {summary.pools_seen}, deleted {summary.deleted}, healed {summary.healed}, "
            f"requested {summary.requested}, kept {summary.kept}",
            logging.WARNING if summary.errors else logging.INFO,
            pools_seen=summary.pools_seen,
            deleted=summary.deleted,
            healed=summary.healed,
            requested=summary.requested,
            kept=summary.kept,
            drain=self.settings.drain,
        )
        if summary.errors:
            raise TransientError("; ".join(summary.errors))
        return summary

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
