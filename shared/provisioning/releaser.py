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

A JobSet's release also looks for pools its pods ran on that are still labelled for their former
owner (kept idle for it, and nobody saw it run there): it adopts them first, so each pool is deleted
by the release of the JobSet that ran on it last and that JobSet's Events name it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import NotFoundError, RejectedError, TransientError
from shared.core.meta import Meta
from shared.core.settings import Settings
from shared.provisioning import occupancy
from shared.provisioning.guard import MANAGED_NODES, PoolGuard
from shared.provisioning.occupancy import Verdict
from shared.provisioning.verdicts import idle_seconds, judge
from shared.tpu.jobsets import jobset_ref
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
        ran_on = self._ran_on(namespace, name, uid, listing, pools) if name else {}
        if not pools and not ran_on:
            logs.decision(
                log,
                "release.nothing",
                f"{trigger}: no managed pools for {namespace}/{name or '*'}",
                jobset=f"{namespace}/{name}",
            )
            return []
        jobsets: JobSets = {}
        for user in ran_on.values():  # its Events go on it; its finished pods keep it out of occupancy
            self._jobset(jobsets, user.namespace, user.name)
        pools += [p for p in listing if p.name in ran_on]
        for pool in pools:
            self._jobset(jobsets, *_key(pool))
        now = datetime.datetime.now(tz=datetime.UTC)
        verdicts = [(p, judge(p, jobsets[_key(p)], self.settings, now)) for p in pools]
        # Another JobSet's pool whose owner still needs it is none of this release's business.
        verdicts = [(p, v) for p, v in verdicts if v.delete or p.name not in ran_on]
        outcome = self.dispose(verdicts, trigger, jobsets, listing, last_users=ran_on)
        if outcome.retry:
            raise TransientError("; ".join(outcome.retry))
        return [p.name for p in outcome.deleted]

    def _ran_on(
        self, namespace: str, name: str, uid: str, listing: list[NodePoolInfo], own: list[NodePoolInfo]
    ) -> dict[str, occupancy.Occupant]:
        """Managed pools labelled for another JobSet that this JobSet's pods ran on (two reads, none
        when the listing has no such pool)."""
        mine = {p.name for p in own}
        others = {p.name for p in listing if is_managed(p) and p.status != STATUS_STOPPING} - mine
        if not others:
            return {}
        pods = self.kube.list_pods(namespace, label_selector=f"{labels.JOBSET_NAME}={name}")
        if not any((pod.get("spec") or {}).get("nodeName") for pod in pods):
            return {}
        ran = occupancy.last_runs(self.kube.list_nodes(MANAGED_NODES), pods, namespace, name, uid)
        return {pool: user for pool, user in ran.items() if pool in others}

    def recycle(self, jobset: dict[str, Any], pool: NodePoolInfo, why: str, trigger: str) -> bool:
        """Delete one failed pool of ``jobset`` under the occupancy rule (capacity fallback and the
        admission check recycle a pool GKE could not provision this way); whether it was deleted,
        TransientError when the delete must be retried."""
        meta = Meta.of(jobset)
        outcome = self.dispose(
            [(pool, Verdict(True, why))], trigger, {(meta.namespace, meta.name): jobset}, [pool]
        )
        if outcome.retry:
            raise TransientError("; ".join(outcome.retry))
        return bool(outcome.deleted)

    def dispose(
        self,
        verdicts: Iterable[tuple[NodePoolInfo, Verdict]],
        trigger: str,
        jobsets: JobSets,
        listing: list[NodePoolInfo],
        all_jobsets: list[dict[str, Any]] | None = None,
        last_users: Mapping[str, occupancy.Occupant] | None = None,
        adopt_only: bool = False,
    ) -> Outcome:
        """Carry out each owner verdict under the occupancy rule; the only path to a pool delete.

        ``jobsets`` caches JobSets by (namespace, name) (None = gone) and is filled as needed;
        ``all_jobsets`` (reconcile has it) saves the listing the handover-demand check needs;
        ``last_users`` names, by pool, the released JobSet whose finished pods ran there last (with
        nobody live on the pool, that JobSet takes it over and its own verdict decides);
        ``adopt_only`` (provision) carries out adoptions and leaves every other decision to release.
        Transient failures are collected in ``Outcome.retry`` after every pool was attempted.
        """
        last_users = last_users or {}
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
                last = None if found else last_users.get(pool.name)
                taking = occupancy.decide(pool, verdict, [], [], 0.0, self.settings, last) if last else None
                inherited = taking is not None and taking.adopter is not None  # ADOPT by the last user
                if taking is not None and taking.adopter is not None:
                    pool, verdict = self._inherit(
                        pool, taking.adopter, taking.why, trigger, jobsets, outcome, fields, now
                    )
                    fields = {"pool": pool.name, "jobset": _owner(pool)}
                idle = idle_seconds(pool, jobsets.get(_key(pool)), self.settings, now)
                # Drain mode winds everything down: no pool is held for anyone.
                if (
                    not found
                    and waiting is None
                    and not adopt_only
                    and self.settings.idle_pool_seconds > 0
                    and not self.settings.drain
                ):
                    waiting = self._demand(listing, all_jobsets)
                decision = occupancy.decide(pool, verdict, found, waiting or [], idle or 0.0, self.settings)
                if adopt_only and decision.action != occupancy.ADOPT:
                    continue
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
                    if idle is None or inherited:
                        stamp = {labels.IDLE_SINCE: str(int(now.timestamp()))} if idle is None else {}
                        self._relabel(pool, {**pool.labels, **stamp}, decision.why, inherited)
                    outcome.offered.append(pool)
                    logs.decision(log, "release.offered", f"kept {pool.name} idle: {decision.why}", **fields)
                else:
                    if inherited:  # it outlives this delivery: its labels must say whose it is now
                        self._relabel(pool, pool.labels, decision.why, billing=True)
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
            meta = Meta.of(pod)
            name = meta.labels.get(labels.JOBSET_NAME)
            if name:
                self._jobset(jobsets, meta.namespace, name)
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
        self._relabel(pool, occupancy.adopted_labels(pool, adopter), f"{why} ({trigger})", billing=True)
        self._record_adoption(pool, adopter, why, trigger, jobsets, outcome, fields)

    def _inherit(
        self,
        pool: NodePoolInfo,
        user: occupancy.Occupant,
        why: str,
        trigger: str,
        jobsets: JobSets,
        outcome: Outcome,
        fields: dict[str, str],
        now: datetime.datetime,
    ) -> tuple[NodePoolInfo, Verdict]:
        """The finished JobSet that ran on ``pool`` last takes it over at its own release; the pool as
        its own and that JobSet's verdict on it. Its labels are written only if the pool outlives this
        delivery: a relabel is a GKE operation, and GKE refuses a delete while one runs on the pool."""
        self._record_adoption(pool, user, why, trigger, jobsets, outcome, fields)
        taken = dataclasses.replace(pool, labels=occupancy.adopted_labels(pool, user))
        return taken, judge(taken, jobsets.get((user.namespace, user.name)), self.settings, now)

    def _relabel(self, pool: NodePoolInfo, new: Mapping[str, str], why: str, billing: bool) -> None:
        # The billing labels move with the node labels, in the same operation (one per pool at a time).
        owner = labels.billing_labels(new.get(labels.OWNER_NAME, "")) if billing else None
        self.gke.set_node_pool_labels(self.settings.cluster_path, pool.name, new, why, resource_labels=owner)

    def _record_adoption(
        self,
        pool: NodePoolInfo,
        adopter: occupancy.Occupant,
        why: str,
        trigger: str,
        jobsets: JobSets,
        outcome: Outcome,
        fields: dict[str, str],
    ) -> None:
        outcome.adopted.append((pool, adopter))
        logs.decision(log, "release.adopted", f"{adopter.describe()} adopts {pool.name}: {why}", **fields)
        taker = jobsets.get((adopter.namespace, adopter.name))
        running = occupancy.is_live(taker)  # else it is over: it adopts at its own release
        tense = "run" if running else "ran"
        if taker is not None:
            self.kube.record_event(
                jobset_ref(taker),
                labels.REASON_ADOPTED,
                f"adopted node pool {pool.name} (made for {_owner(pool)}): {adopter.pods} of its pods "
                + ("run there; it is released when this JobSet ends" if running else "ran there last"),
            )
        old = jobsets.get(
            (pool.labels.get(labels.OWNER_NAMESPACE, ""), pool.labels.get(labels.OWNER_NAME, ""))
        )
        if old is not None and Meta.of(old).uid == pool.labels.get(labels.OWNER_UID, ""):
            self.kube.record_event(
                jobset_ref(old),
                labels.REASON_RELEASED,
                f"handed node pool {pool.name} to {adopter.describe()}, whose pods {tense} on it ({trigger})",
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
            if jobset is None or (uid and Meta.of(jobset).uid != uid):
                continue
            self.kube.record_event(
                jobset_ref(jobset),
                labels.REASON_RELEASED,
                f"released node pools {', '.join(sorted(names))}: {trigger}",
            )


def _key(pool: NodePoolInfo) -> tuple[str, str]:
    return (pool.labels.get(labels.OWNER_NAMESPACE, ""), pool.labels.get(labels.OWNER_NAME, ""))


def _owner(pool: NodePoolInfo) -> str:
    return f"{pool.labels.get(labels.OWNER_NAMESPACE, '')}/{pool.labels.get(labels.OWNER_NAME, '')}"
