"""The release service: give up a JobSet's TPU pools once the JobSet is really over.

An event only nominates pools; the Kubernetes API decides. The owner's side (``judge``) says a
pool may go when its owning JobSet is gone, terminal (Completed/Failed), suspended past the grace,
or replaced by a new JobSet of the same name (uid mismatch). Then ``Releaser.dispose`` - the one
path every release goes through (release, reconcile, suspend grace, ERROR recycling) - checks who
actually runs on the pool: a pool is never deleted while a non-terminal pod of a live JobSet is
bound to one of its nodes. Its nodes are cordoned before the last check so nothing binds between
the check and the delete; an occupied pool is adopted by its occupant (ownership labels updated
through GKE, so that JobSet's end releases it) or kept, and an idle pool a waiting JobSet of the
same shape needs is kept for ``IDLE_POOL_SECONDS`` (see ``shared.provisioning.occupancy``).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import NotFoundError, RejectedError, TransientError
from shared.core.settings import Settings
from shared.provisioning import occupancy
from shared.provisioning.guard import PoolGuard
from shared.provisioning.occupancy import Verdict
from shared.tpu.jobsets import condition
from shared.tpu.nodepools import STATUS_STOPPING, NodePoolInfo

log = logs.get("release")

__all__ = ["JobSets", "Outcome", "Releaser", "Verdict", "idle_seconds", "is_managed", "judge", "owned_by"]

JobSets = dict[tuple[str, str], dict[str, Any] | None]


def is_managed(pool: NodePoolInfo) -> bool:
    """True only for pools the product created (carrying its managed-by marker)."""
    return pool.labels.get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE


def owned_by(pool: NodePoolInfo, namespace: str, name: str, uid: str = "") -> bool:
    """True if a managed pool belongs to JobSet ``namespace/name`` (any in the namespace if no name)."""
    if not is_managed(pool) or pool.labels.get(labels.OWNER_NAMESPACE) != namespace:
        return False
    if name and pool.labels.get(labels.OWNER_NAME) != name:
        return False
    return not uid or pool.labels.get(labels.OWNER_UID) == uid


def _since(timestamp: str, now: datetime.datetime) -> float:
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return float("inf")  # unknown transition time: treat as long ago rather than keep forever
    return (now - then).total_seconds()


def judge(
    pool: NodePoolInfo, jobset: dict[str, Any] | None, settings: Settings, now: datetime.datetime
) -> Verdict:
    """Decide whether ``pool`` may be deleted given its JobSet as the API shows it now (None = gone)."""
    owner = f"{pool.labels.get(labels.OWNER_NAMESPACE)}/{pool.labels.get(labels.OWNER_NAME)}"
    if jobset is None:
        return Verdict(True, f"JobSet {owner} no longer exists")
    meta = jobset.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return Verdict(True, f"JobSet {owner} is being deleted")
    pool_uid = pool.labels.get(labels.OWNER_UID, "")
    if pool_uid and meta.get("uid") and pool_uid != meta.get("uid"):
        return Verdict(
            True, f"JobSet {owner} was recreated (uid {meta.get('uid')}, pool made for {pool_uid})"
        )
    failed = condition(jobset, "Failed")
    if failed:
        return Verdict(True, f"JobSet {owner} failed ({failed.get('reason', '')})")
    completed = condition(jobset, "Completed")
    if completed:
        waited = _since(str(completed.get("lastTransitionTime", "")), now)
        if waited < settings.release_grace_seconds:
            return Verdict(
                False,
                f"JobSet {owner} completed {waited:.0f}s ago; grace is {settings.release_grace_seconds}s",
            )
        return Verdict(True, f"JobSet {owner} completed")
    if (jobset.get("spec") or {}).get("suspend"):
        suspended = condition(jobset, "Suspended")
        waited = _since(str(suspended.get("lastTransitionTime", "")), now) if suspended else 0.0
        if suspended and waited >= settings.suspend_grace_seconds:
            return Verdict(
                True, f"JobSet {owner} suspended for {waited:.0f}s (grace {settings.suspend_grace_seconds}s)"
            )
        return Verdict(
            False, f"JobSet {owner} is suspended, within the {settings.suspend_grace_seconds}s grace"
        )
    return Verdict(False, f"JobSet {owner} is still running")


def idle_seconds(
    pool: NodePoolInfo, jobset: dict[str, Any] | None, settings: Settings, now: datetime.datetime
) -> float | None:
    """How long ``pool`` has been without an owner that needs it; None when nothing says (then the
    releaser stamps ``tpuprov.dev/idle-since`` on the pool so the next look knows)."""
    stamp = pool.labels.get(labels.IDLE_SINCE, "")
    if stamp.isdigit():
        return max(0.0, now.timestamp() - int(stamp))
    if jobset is not None and (jobset.get("metadata") or {}).get("uid") == pool.labels.get(labels.OWNER_UID):
        for kind in ("Completed", "Failed"):
            cond = condition(jobset, kind)
            if cond:
                return max(0.0, _since(str(cond.get("lastTransitionTime", "")), now))
        suspended = condition(jobset, "Suspended")
        if suspended:
            waited = _since(str(suspended.get("lastTransitionTime", "")), now)
            return max(0.0, waited - settings.suspend_grace_seconds)
    return None


def jobset_ref(jobset: dict[str, Any]) -> dict[str, Any]:
    """A JobSet as an Event's involved object."""
    return {"apiVersion": f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}", "kind": "JobSet", **jobset}


@dataclasses.dataclass
class Outcome:
    """What one ``dispose`` did."""

    deleted: list[NodePoolInfo] = dataclasses.field(default_factory=list)
    adopted: list[tuple[NodePoolInfo, occupancy.Occupant]] = dataclasses.field(default_factory=list)
    kept: list[tuple[NodePoolInfo, str]] = dataclasses.field(default_factory=list)
    offered: list[NodePoolInfo] = dataclasses.field(default_factory=list)
    retry: list[str] = dataclasses.field(default_factory=list)


class Releaser:
    """Releases the pools of finished or vanished JobSets, never one a live JobSet runs on."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        sleep: Callable[[float], None] = time.sleep,
        forget: Callable[[str], None] | None = None,
    ) -> None:
        """``forget(pool)`` is told about every pool deleted (an instance-local cache may hold it)."""
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.guard = PoolGuard(kube, settings.cordon_settle_seconds, sleep)
        self.forget = forget or (lambda name: None)

    def release(self, namespace: str, name: str, uid: str, trigger: str) -> list[str]:
        """Release the pools of JobSet ``namespace/name`` (all JobSets in ``namespace`` if ``name`` is "").

        Returns the pools deleted. Raises TransientError after attempting every pool if any delete
        must be retried, so one stuck pool does not hold the others back.
        """
        # The event's uid (when it has one) narrows the nomination to that JobSet's pools; the API
        # check below still decides whether each may go.
        listing = self.gke.list_node_pools(self.settings.cluster_path)
        pools = [p for p in listing if owned_by(p, namespace, name, uid)]
        if not pools:
            logs.decision(
                log,
                "release.nothing",
                f"{trigger}: no managed pools for {namespace}/{name or '*'}",
                jobset=f"{namespace}/{name}",
            )
            return []
        jobsets: JobSets = {}
        for owner in sorted({p.labels.get(labels.OWNER_NAME, "") for p in pools}):
            self._jobset(jobsets, namespace, owner)
        now = datetime.datetime.now(tz=datetime.UTC)
        verdicts = [
            (p, judge(p, jobsets[(namespace, p.labels.get(labels.OWNER_NAME, ""))], self.settings, now))
            for p in pools
        ]
        outcome = self.dispose(verdicts, trigger, jobsets, listing)
        if outcome.retry:
            raise TransientError("; ".join(outcome.retry))
        return [p.name for p in outcome.deleted]

    def dispose(
        self,
        verdicts: Iterable[tuple[NodePoolInfo, Verdict]],
        trigger: str,
        jobsets: JobSets,
        listing: list[NodePoolInfo],
        all_jobsets: list[dict[str, Any]] | None = None,
    ) -> Outcome:
        """Carry out each owner verdict under the occupancy rule; the only path to a pool delete.

        ``jobsets`` caches JobSets by (namespace, name) (None = gone) and is filled as needed;
        ``all_jobsets`` (reconcile has it) saves the listing the handover-demand check needs.
        Transient failures are collected in ``Outcome.retry`` after every pool was attempted.
        """
        outcome = Outcome()
        now = datetime.datetime.now(tz=datetime.UTC)
        waiting: list[occupancy.Demand] | None = None
        for pool, verdict in verdicts:
            fields = {"pool": pool.name, "jobset": _owner(pool)}
            if not verdict.delete:
                logs.decision(log, "release.kept", f"kept {pool.name}: {verdict.why}", **fields)
                outcome.kept.append((pool, verdict.why))
                continue
            if pool.status == STATUS_STOPPING:
                logs.decision(log, "release.stopping", f"{pool.name} is already being deleted", **fields)
                continue
            try:
                nodes = self.guard.nodes(pool)
                found = self._occupants(pool, nodes, jobsets)
                owner = jobsets.get(
                    (pool.labels.get(labels.OWNER_NAMESPACE, ""), pool.labels.get(labels.OWNER_NAME, ""))
                )
                idle = idle_seconds(pool, owner, self.settings, now)
                # Drain mode winds everything down: no pool is held for anyone.
                if (
                    not found
                    and waiting is None
                    and self.settings.idle_pool_seconds > 0
                    and not self.settings.drain
                ):
                    waiting = self._demand(listing, all_jobsets)
                decision = occupancy.decide(pool, verdict, found, waiting or [], idle or 0.0, self.settings)
                if decision.action == occupancy.DELETE:
                    self.guard.cordon(pool, nodes, decision.why)
                    nodes = self.guard.nodes(pool)
                    found = self._occupants(pool, nodes, jobsets)
                    if found:  # someone bound just before the cordon: they keep or take the pool
                        decision = occupancy.decide(pool, verdict, found, [], 0.0, self.settings)
                if decision.action == occupancy.DELETE:
                    self._delete(pool, decision.why, trigger, outcome, fields)
                    continue
                self.guard.uncordon(pool, nodes, decision.why)
                if decision.action == occupancy.ADOPT and decision.adopter is not None:
                    self._adopt(pool, decision.adopter, decision.why, trigger, jobsets, outcome, fields)
                elif decision.action == occupancy.OFFER:
                    if idle is None:
                        stamp = {**pool.labels, labels.IDLE_SINCE: str(int(now.timestamp()))}
                        self.gke.set_node_pool_labels(
                            self.settings.cluster_path, pool.name, stamp, decision.why
                        )
                    outcome.offered.append(pool)
                    logs.decision(log, "release.offered", f"kept {pool.name} idle: {decision.why}", **fields)
                else:
                    outcome.kept.append((pool, decision.why))
                    logs.decision(log, "release.kept", f"kept {pool.name}: {decision.why}", **fields)
            except TransientError as exc:
                outcome.retry.append(f"{pool.name}: {exc.why}")
                logs.decision(
                    log, "release.retry", f"{pool.name} must be retried: {exc.why}", logging.WARNING, **fields
                )
        self._report(outcome, trigger, jobsets)
        return outcome

    # -- steps ------------------------------------------------------------------------------------

    def _jobset(self, jobsets: JobSets, namespace: str, name: str) -> dict[str, Any] | None:
        key = (namespace, name)
        if key not in jobsets:
            try:
                jobsets[key] = self.kube.get_jobset(namespace, name)
            except NotFoundError:
                jobsets[key] = None
        return jobsets[key]

    def _occupants(
        self, pool: NodePoolInfo, nodes: list[dict[str, Any]], jobsets: JobSets
    ) -> list[occupancy.Occupant]:
        pods = self.guard.pods_on(nodes)
        for pod in pods:
            name = (pod.get("metadata") or {}).get("labels", {}).get(labels.JOBSET_NAME)
            if name:
                self._jobset(jobsets, str(pod["metadata"].get("namespace") or "default"), str(name))
        return occupancy.occupants(pool, nodes, pods, jobsets)

    def _demand(
        self, listing: list[NodePoolInfo], all_jobsets: list[dict[str, Any]] | None
    ) -> list[occupancy.Demand]:
        if all_jobsets is None:
            all_jobsets = self.kube.list_jobsets()
        return occupancy.demand(all_jobsets, (p.name for p in listing), self.settings)

    def _delete(
        self, pool: NodePoolInfo, why: str, trigger: str, outcome: Outcome, fields: dict[str, str]
    ) -> None:
        why = f"{why} ({trigger})"
        try:
            self.gke.delete_node_pool(self.settings.cluster_path, pool.name, why)
        except NotFoundError:
            logs.decision(log, "release.gone", f"{pool.name} was already deleted", **fields)
            self.forget(pool.name)
            return
        except RejectedError as exc:
            logs.decision(
                log,
                "release.rejected",
                f"GKE refused to delete {pool.name}: {exc.why}",
                logging.ERROR,
                **fields,
            )
            return
        # A TransientError propagates to dispose: the nodes stay cordoned and the retry re-checks.
        self.forget(pool.name)
        outcome.deleted.append(pool)
        logs.decision(log, "release.deleted", f"deleting {pool.name}: {why}", **fields)

    def _adopt(
        self,
        pool: NodePoolInfo,
        adopter: occupancy.Occupant,
        why: str,
        trigger: str,
        jobsets: JobSets,
        outcome: Outcome,
        fields: dict[str, str],
    ) -> None:
        new_labels = occupancy.adopted_labels(pool, adopter)
        self.gke.set_node_pool_labels(self.settings.cluster_path, pool.name, new_labels, f"{why} ({trigger})")
        outcome.adopted.append((pool, adopter))
        logs.decision(log, "release.adopted", f"{adopter.describe()} adopts {pool.name}: {why}", **fields)
        taker = jobsets.get((adopter.namespace, adopter.name))
        if taker is not None:
            self.kube.record_event(
                jobset_ref(taker),
                labels.REASON_ADOPTED,
                f"adopted node pool {pool.name} (made for {_owner(pool)}): {adopter.pods} of its pods run "
                f"there; it is released when this JobSet ends",
            )
        old = jobsets.get(
            (pool.labels.get(labels.OWNER_NAMESPACE, ""), pool.labels.get(labels.OWNER_NAME, ""))
        )
        if old is not None and (old.get("metadata") or {}).get("uid") == pool.labels.get(labels.OWNER_UID):
            self.kube.record_event(
                jobset_ref(old),
                labels.REASON_RELEASED,
                f"handed node pool {pool.name} to {adopter.describe()}, whose pods run on it ({trigger})",
            )

    def _report(self, outcome: Outcome, trigger: str, jobsets: JobSets) -> None:
        by_owner: dict[tuple[str, str, str], list[str]] = {}
        for pool in outcome.deleted:
            key = (
                pool.labels.get(labels.OWNER_NAMESPACE, ""),
                pool.labels.get(labels.OWNER_NAME, ""),
                pool.labels.get(labels.OWNER_UID, ""),
            )
            by_owner.setdefault(key, []).append(pool.name)
        for (namespace, name, uid), names in sorted(by_owner.items()):
            jobset = jobsets.get((namespace, name))
            # A gone JobSet has nowhere to show an Event; a recreated one is not the pools' owner.
            if jobset is None or (uid and (jobset.get("metadata") or {}).get("uid") != uid):
                continue
            self.kube.record_event(
                jobset_ref(jobset),
                labels.REASON_RELEASED,
                f"released node pools {', '.join(sorted(names))}: {trigger}",
            )


def _owner(pool: NodePoolInfo) -> str:
    return f"{pool.labels.get(labels.OWNER_NAMESPACE, '')}/{pool.labels.get(labels.OWNER_NAME, '')}"
