"""The reconcile sweep: a stateless, scheduled safety net under the event-driven functions.

Events can be lost, late or reordered; the sweep looks at what is (managed pools, JobSets, pending
pods) and fixes what events missed: it releases pools whose JobSet is gone, over, replaced or
suspended too long, recycles pools GKE failed to provision once their stockout backoff is over
(``shared.provisioning.create.backoff``), and requests slices for pending pods that have none. Every
release goes through ``Releaser.dispose``, so a pool some live JobSet runs on is adopted or kept,
never deleted. It lifts cordons a crashed release left on pools it keeps, and
never touches a pool without the product's marker.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable, Iterable

from shared.core import labels, logs
from shared.core.errors import NotEligible, OperationLimitError, Refused, TransientError
from shared.provisioning.create import backoff
from shared.provisioning.outcomes import WAITING
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.release.guard import stale_cordons
from shared.provisioning.release.releaser import JobSets, Verdict, is_managed
from shared.provisioning.services import Services
from shared.provisioning.tenancy.guardrails import managed_chips
from shared.tpu import drift
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import STATUS_ERROR, STATUS_RUNNING, STATUS_STOPPING, NodePoolInfo
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
    backing_off: int = 0  # failed pools kept in place until their stockout backoff is over
    errors: list[str] = dataclasses.field(default_factory=list)


class Reconciler:
    """One sweep over the cluster's managed pools, JobSets and pending JobSet pods."""

    def __init__(self, services: Services) -> None:
        """``services``: the instance's one service graph; its ``wall_clock`` dates the sweep (tests
        pass a fake one to walk through a backoff)."""
        self.services = services
        self.settings = services.settings
        self.gke = services.gke
        self.kube = services.kube
        self.clock = services.wall_clock
        self.releaser = services.releaser
        self.provisioner = Provisioner(services)
        self.backoff = services.backoff  # one failure record writer for the whole sweep

    def sweep(self) -> Summary:
        """Run one sweep. Raises TransientError (after doing all it could) if part of it must be retried."""
        summary = Summary()
        listing = self.gke.list_node_pools(self.settings.cluster_path)
        pools = [p for p in listing if is_managed(p)]
        summary.pools_seen = len(pools)
        all_jobsets = self.kube.list_jobsets()
        jobsets: JobSets = {js.key: js for js in all_jobsets}
        now = datetime.datetime.fromtimestamp(self.clock(), tz=datetime.UTC)

        failed = [p for p in pools if p.status == STATUS_ERROR]
        healthy = [p for p in pools if p.status != STATUS_ERROR]
        verdicts = [(p, self.releaser.judge(p, jobsets.get(p.owner.key), now)) for p in healthy]
        verdicts += self._failed_verdicts(failed, jobsets, now, summary)
        outcome = self.releaser.dispose(verdicts, "reconcile sweep", jobsets, listing, all_jobsets)
        summary.errors.extend(outcome.retry)
        deleted_names = {p.name for p in outcome.deleted}
        self._track_failures(failed, healthy, deleted_names, jobsets, summary)
        summary.deleted = len(outcome.deleted)
        summary.kept = len(outcome.kept)
        summary.adopted = len(outcome.adopted)
        summary.offered = len(outcome.offered)
        summary.healed = sum(1 for p in failed if p.name in deleted_names)
        self._lift_stale_cordons(pools, deleted_names, now, summary)
        self._report_drift([p for p in healthy if p.name not in deleted_names])

        if not self.settings.drain:
            remaining = [p for p in pools if p.name not in deleted_names]
            summary.requested = self._heal_missed(remaining, deleted_names, summary)

        logs.decision(
            log,
            "reconcile.summary",
            f"pools seen {summary.pools_seen}, deleted {summary.deleted}, healed {summary.healed}, "
            f"requested {summary.requested}, kept {summary.kept}, adopted {summary.adopted}, "
            f"offered {summary.offered}, backing off {summary.backing_off}",
            logging.WARNING if summary.errors else logging.INFO,
            pools_seen=summary.pools_seen,
            chips=managed_chips(pools),
            deleted=summary.deleted,
            healed=summary.healed,
            requested=summary.requested,
            kept=summary.kept,
            adopted=summary.adopted,
            offered=summary.offered,
            backing_off=summary.backing_off,
            drain=self.settings.drain,
        )
        if summary.errors:
            raise TransientError("; ".join(summary.errors))
        return summary

    def _failed_verdicts(
        self, failed: list[NodePoolInfo], jobsets: JobSets, now: datetime.datetime, summary: Summary
    ) -> list[tuple[NodePoolInfo, Verdict]]:
        """Which pools GKE failed to provision go now: those nobody wants any more, and those whose
        stockout backoff is over. The others stay (no nodes, no cost) and keep provision off them."""
        verdicts: list[tuple[NodePoolInfo, Verdict]] = []
        for pool in failed:
            jobset = jobsets.get(pool.owner.key)
            reason = pool.status_message or "status ERROR"
            owner = self.releaser.judge(pool, jobset, now)
            if owner.delete or jobset is None:
                verdicts.append((pool, Verdict(True, f"GKE could not provision it ({reason}); {owner.why}")))
                continue
            try:  # the JobSet learns at once (one Event per attempt), whatever happens to the pool
                failure = self.provisioner.fallback.observe_owned(jobset, pool)
            except TransientError as exc:
                summary.errors.append(exc.why)
                continue
            wait = backoff.retry_at(self.settings, failure) - self.clock()
            if wait > 0:
                summary.backing_off += 1
                logs.decision(
                    log,
                    "reconcile.backing_off",
                    f"pool {pool.name} failed (attempt {failure.attempts}); recycled in {wait:.0f}s",
                    pool=pool.name,
                    attempts=failure.attempts,
                )
                continue
            why = f"GKE could not provision it ({reason}); attempt {failure.attempts} " + (
                f"falls back to {failure.next}" if failure.next else "backed off"
            )
            verdicts.append((pool, Verdict(True, why)))
        return verdicts

    def _track_failures(
        self,
        failed: list[NodePoolInfo],
        healthy: list[NodePoolInfo],
        deleted: set[str],
        jobsets: JobSets,
        summary: Summary,
    ) -> None:
        """Keep each JobSet's failure record true: recycled pools make the next failure a new
        attempt; a slice whose pool runs starts from scratch."""
        recycled = _by_jobset(p for p in failed if p.name in deleted)
        landed = _by_jobset(p for p in healthy if p.status == STATUS_RUNNING and p.name not in deleted)
        for key, names in recycled.items():
            jobset = jobsets.get(key)
            if jobset is not None:
                self._record(summary, self.backoff.recycled, jobset, names)
        for key, names in landed.items():
            jobset = jobsets.get(key)
            if jobset is not None and set(names) & set(backoff.failures(jobset, self.clock())):
                self._record(summary, self.backoff.landed, jobset, names)

    @staticmethod
    def _record(
        summary: Summary,
        write: Callable[[JobSet, Iterable[str]], None],
        jobset: JobSet,
        names: list[str],
    ) -> None:
        try:
            write(jobset, names)
        except TransientError as exc:
            summary.errors.append(exc.why)

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

    def _report_drift(self, pools: list[NodePoolInfo]) -> None:
        # Reported, never acted on here: a pool is replaced for drift only when provision sees a
        # pending pod of its slice (REPLACE_DRIFTED_POOLS), where the guard can tell it is unused.
        for pool in pools:
            found = drift.drift(pool, drift.expected_spec(self.settings, pool))
            if found:
                logs.decision(
                    log,
                    "reconcile.drift",
                    f"node pool {pool.name} was built under other settings: {drift.summary(found)}",
                    pool=pool.name,
                    settings=[d.setting for d in found],
                    replace=self.settings.replace_drifted_pools,
                )

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
            except OperationLimitError as exc:
                # GKE has no operation slot left: every further group would only collect a 429. The
                # finished operations' audit entries resume the waiting slices.
                logs.decision(log, "reconcile.waiting", f"stopped requesting: {exc.why}")
                break
            except TransientError as exc:
                summary.errors.append(exc.why)
                continue
            requested += len(outcome.requested)
            known.update(outcome.requested)
            pools = pools + [_provisioning(name) for name in outcome.requested]
            if outcome.result == WAITING:
                break  # every slot is taken (and counted): the rest waits for a finished operation
        return requested


def _provisioning(name: str) -> NodePoolInfo:
    # A pool this sweep just requested, as the next listing would show it (it holds an operation slot).
    return NodePoolInfo(name=name, status="PROVISIONING")


def _by_jobset(pools: Iterable[NodePoolInfo]) -> dict[tuple[str, str], list[str]]:
    grouped: dict[tuple[str, str], list[str]] = {}
    for pool in pools:
        grouped.setdefault(pool.owner.key, []).append(pool.name)
    return grouped
