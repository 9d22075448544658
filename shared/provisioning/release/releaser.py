"""The release service: give up a JobSet's TPU pools once the JobSet is really over.

An event only nominates pools; the Kubernetes API decides. The owner's side (``judge``) says a
pool may go when its owning JobSet is gone, terminal (Completed/Failed), suspended past the grace,
or replaced by a new JobSet of the same name (uid mismatch). Then ``Releaser.dispose`` - the one
path every release goes through (release, reconcile, suspend grace, ERROR recycling) - checks who
actually runs on the pool: a pool is never deleted while a non-terminal pod of a live JobSet is
bound to one of its nodes. Its nodes are cordoned before the last check so nothing binds between
the check and the delete; an occupied pool is adopted by its occupant (ownership labels updated
through GKE, so that JobSet's end releases it) or kept, and an idle pool a waiting JobSet of the
same shape needs is kept for ``IDLE_POOL_SECONDS`` (see ``shared.provisioning.release.occupancy``).

A JobSet's release also looks for pools its pods ran on that are still labelled for their former
owner (kept idle for it, and nobody saw it run there): it adopts them first, so each pool is deleted
by the release of the JobSet that ran on it last and that JobSet's Events name it.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import NotFoundError, OperationLimitError, RejectedError, TransientError
from shared.core.settings import Settings
from shared.provisioning.release import occupancy
from shared.provisioning.release.guard import MANAGED_NODES, PoolGuard
from shared.provisioning.release.occupancy import Verdict
from shared.provisioning.release.verdicts import idle_seconds, judge, workload_hold
from shared.provisioning.tenancy import spending
from shared.provisioning.tenancy.ownership import Owners, PodChains
from shared.provisioning.tenancy.spending import Spending
from shared.tpu import catalog
from shared.tpu.jobsets import JobSet, is_suspended, jobset_ref
from shared.tpu.nodepools import SERVING, STATUS_STOPPING, NodePoolInfo, Reservation
from shared.tpu.nodes import Node
from shared.tpu.workloads import WorkloadView

log = logs.get("release")

__all__ = ["JobSets", "Outcome", "Releaser", "Verdict", "idle_seconds", "is_managed", "judge", "owned_by"]

JobSets = dict[tuple[str, str], JobSet | None]
# Up to this many pool owners are read one by one (a GET each); more are listed at once.
_OWNER_GETS = 3


def is_managed(pool: NodePoolInfo) -> bool:
    """True only for pools the product created (carrying its managed-by marker)."""
    return pool.managed


def owned_by(pool: NodePoolInfo, namespace: str, name: str, uid: str = "") -> bool:
    """True if a managed pool belongs to JobSet ``namespace/name`` (any in the namespace if no name)."""
    if not is_managed(pool) or pool.owner.namespace != namespace:
        return False
    if name and pool.owner.name != name:
        return False
    return not uid or pool.owner.uid == uid


@dataclasses.dataclass
class Outcome:
    """What one ``dispose`` did."""

    deleted: list[NodePoolInfo] = dataclasses.field(default_factory=list)
    adopted: list[tuple[NodePoolInfo, occupancy.Occupant]] = dataclasses.field(default_factory=list)
    kept: list[tuple[NodePoolInfo, str]] = dataclasses.field(default_factory=list)
    offered: list[NodePoolInfo] = dataclasses.field(default_factory=list)
    retry: list[str] = dataclasses.field(default_factory=list)


class Holds:
    """Why a suspended JobSet's pools are kept for its Kueue Workload (``verdicts.workload_hold``),
    from the Workloads as Kueue writes them: one list per namespace, reused for ``ttl`` seconds (a
    delivery judges many pools of the same namespace)."""

    def __init__(
        self, settings: Settings, kube: KubeAPI, ttl: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.ttl = ttl
        self.clock = clock
        self._listed: dict[str, tuple[float, list[WorkloadView]]] = {}

    def _workloads(self, namespace: str) -> list[WorkloadView]:
        cached = self._listed.get(namespace)
        if cached is not None and self.clock() - cached[0] < self.ttl:
            return cached[1]
        try:
            found = self.kube.list_workloads(namespace)
        except NotFoundError:
            found = []  # Kueue is not installed: no Workload holds anything
        if len(self._listed) > 256:
            self._listed.clear()
        self._listed[namespace] = (self.clock(), found)
        return found

    def of(self, jobset: JobSet | None, now: datetime.datetime) -> str:
        """Why ``jobset`` (suspended) keeps its pools for its Workload, "" when it does not."""
        if jobset is None or not is_suspended(jobset):
            return ""
        meta = jobset.meta
        # Kueue makes the Workload with a controller reference to the JobSet (its uid).
        mine = [
            w for w in self._workloads(meta.namespace) if w.owner_kind == "JobSet" and w.owner_uid == meta.uid
        ]
        for workload in mine:
            hold = workload_hold(workload, self.settings.admission_check_name, self.settings, now)
            if hold:
                return hold
        return ""


def _spare(
    theirs: Iterable[NodePoolInfo],
    listing: Iterable[NodePoolInfo],
    adopted: Iterable[tuple[NodePoolInfo, occupancy.Occupant]],
    ran_on: Mapping[str, occupancy.Occupant],
) -> list[tuple[NodePoolInfo, Verdict]]:
    """Of ``theirs`` (pools of live owners that the released JobSet ran on last), each whose owner
    is labelled for the same slice on another pool, once this delivery's adoptions are counted.

    JobSet's exclusive placement puts a slice's pods on whichever pool of its shape the leader
    lands on, so two same-shape JobSets often run each on the other's pool. Without this the pool
    the first ran on stays its live owner's, who never runs there, and goes at that owner's release:
    the JobSet that ran on it last is never named. Its verdict here is a placeholder: the dispose
    hands the pool to ``ran_on``'s JobSet (none runs there, the occupancy check makes sure) and
    that JobSet's verdict decides.
    """
    now = {p.name: p for p in listing if p.status != STATUS_STOPPING}
    for pool, taker in adopted:
        if pool.name in now:
            now[pool.name] = dataclasses.replace(pool, labels=occupancy.adopted_labels(pool, taker))
    found = []
    for pool in theirs:
        if pool.name not in ran_on:
            continue
        slot = pool.owner
        if not slot.uid:
            continue
        twin = next((p.name for p in now.values() if p.name != pool.name and p.owner == slot), "")
        if twin:
            why = f"{slot.describe()} runs that slice on {twin}: {pool.name} is spare"
            found.append((pool, Verdict(True, why)))
    return found


@dataclasses.dataclass
class _Delivery:
    """One ``dispose`` call: what it was given and what it found, for its Events. Kept per call, not
    on the Releaser, which one instance's concurrent deliveries share."""

    trigger: str
    jobsets: JobSets  # the JobSets read, by (namespace, name); None: gone
    listing: list[NodePoolInfo]
    outcome: Outcome
    now: datetime.datetime
    # By pool: pods naming a JobSet that prove none (from the last look at it), why a deleted one went.
    pretending: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    deleted_why: dict[str, str] = dataclasses.field(default_factory=dict)

    def pretenders(self, pool: str) -> str:
        """What a delete's reason and Event add about pods on ``pool`` that name a JobSet but hold
        nothing ("" for none), from the last look at its pods (no read of its own)."""
        found = self.pretending.get(pool)
        if not found:
            return ""
        return (
            f"; not counted as occupants of {pool}: pod(s) {', '.join(found)}, which name a JobSet in "
            "their labels but were made by none of its Jobs"
        )

    def sweep_reasons(self, names: list[str]) -> str:
        """Why each pool went, for a sweep's Event: an event-driven release's trigger is the reason
        ("JobSet completed"), a sweep's ("reconcile sweep") is not, so ``kubectl describe`` says it."""
        if not self.trigger.startswith("reconcile"):
            return ""
        # The pretenders' sentence ends the stored reason (the delete's log line carries it) and
        # ends the Event on its own, so it is cut here: it is said once.
        said = [
            f"{n}: {self.deleted_why[n].removesuffix(self.pretenders(n))}"
            for n in sorted(names)
            if self.deleted_why.get(n)
        ]
        return f" ({'; '.join(said)})" if said else ""


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
        self.owners = Owners(settings, kube)
        self.holds = Holds(settings, kube)
        self.spending = Spending(settings, kube)

    def may_own(
        self, pool: NodePoolInfo, taker: occupancy.Occupant, listing: Sequence[NodePoolInfo] = ()
    ) -> str:
        """Why JobSet ``taker`` may not become ``pool``'s owner ("" when it may): the guardrails of its
        namespace and its budget apply to taking a pool as they do to buying one; ``listing``: the
        delivery's pools, which the budget counts."""
        namespace = taker.namespace
        if self.settings.namespace_allowlist and namespace not in self.settings.namespace_allowlist:
            return f"namespace {namespace!r} is not in NAMESPACE_ALLOWLIST"
        accelerator = catalog.accelerator_for_machine_type(pool.machine_type)
        if self.settings.allowed_accelerators and accelerator not in self.settings.allowed_accelerators:
            return f"accelerator {accelerator!r} is not in ALLOWED_ACCELERATORS"
        if not self.settings.spending_stated:
            return ""  # taking a pool buys nothing; creates are what an unstated limit stops
        if pool.owner.namespace == namespace and not self.settings.tenant_entries:
            return ""  # the same namespace's pool changes hands: nothing more is spent
        reservation = Reservation(*_reservation_parts(pool.reservation)) if pool.reservation else None
        refusal, _ = self.spending.refusal(
            namespace, spending.pool_chips(pool), reservation, list(listing) or [pool], exclude=pool.name
        )
        return refusal

    def judge(self, pool: NodePoolInfo, jobset: JobSet | None, now: datetime.datetime) -> Verdict:
        """The owner's verdict on ``pool``, a suspended owner's Kueue Workload consulted."""
        return judge(pool, jobset, self.settings, now, self.holds.of(jobset, now))

    def release(
        self,
        namespace: str,
        name: str,
        uid: str,
        trigger: str,
        deleted: bool = False,
        listing: list[NodePoolInfo] | None = None,
    ) -> list[str]:
        """Release the pools of JobSet ``namespace/name`` (all JobSets in ``namespace`` if ``name`` is "");
        ``deleted``: the trigger is the JobSet's deletion (then the pools held idle are judged too);
        ``listing``: the cluster's pools, when the caller has just listed them.

        Returns the pools deleted. Raises TransientError after attempting every pool if any delete
        must be retried, so one stuck pool does not hold the others back.
        """
        # The event's uid (when it has one) narrows the nomination to that JobSet's pools; the API
        # check below still decides whether each may go.
        if listing is None:
            listing = self.gke.list_node_pools(self.settings.cluster_path)
        pools = [p for p in listing if owned_by(p, namespace, name, uid)]
        jobsets: JobSets = {}
        ran_on = self._ran_on(namespace, name, uid, listing, pools, jobsets) if name else {}
        # The pools kept idle for a waiting JobSet of their shape: a queued JobSet leaves the queue
        # without running only by its deletion, which may take what they wait for, so they are judged
        # again now rather than at the window's end. Not on a JobSet's end: the next queued one may
        # have just been admitted, its pods not yet bound, and a cordon then would make them pend.
        held: set[str] = set()
        all_jobsets = None
        if deleted:
            all_jobsets = self._read_owners(listing, jobsets)
            held = {p.name for p in listing if _held_idle(p) or self._may_be_offered(p, jobsets)}
            held -= {p.name for p in pools} | set(ran_on)
        if not pools and not ran_on and not held:
            logs.decision(
                log,
                "release.nothing",
                f"{trigger}: no managed pools for {namespace}/{name or '*'}",
                jobset=f"{namespace}/{name}",
            )
            return []
        for user in ran_on.values():  # its Events go on it; its finished pods keep it out of occupancy
            self._jobset(jobsets, user.namespace, user.name)
        pools += [p for p in listing if p.name in ran_on or p.name in held]
        for pool in pools:
            self._jobset(jobsets, *pool.owner.key)
        now = datetime.datetime.now(tz=datetime.UTC)
        verdicts = [(p, self.judge(p, jobsets[p.owner.key], now)) for p in pools]
        # Another JobSet's pool whose owner still needs it is none of this release's business...
        theirs = [p for p, v in verdicts if not v.delete and (p.name in ran_on or p.name in held)]
        verdicts = [(p, v) for p, v in verdicts if v.delete or (p.name not in ran_on and p.name not in held)]
        outcome = self.dispose(verdicts, trigger, jobsets, listing, all_jobsets, last_users=ran_on)
        # ...unless its owner now holds that slice on another pool: the two swapped (each ran on the
        # other's), and this delivery just handed the owner the pool it runs on. The spare one is
        # this JobSet's, which ran there last, under its own verdict.
        spare = _spare(theirs, listing, outcome.adopted, ran_on)
        if spare:
            swapped = self.dispose(spare, trigger, jobsets, listing, all_jobsets, last_users=ran_on)
            outcome.deleted += swapped.deleted
            outcome.retry += swapped.retry
        if outcome.retry:
            raise TransientError("; ".join(outcome.retry))
        return [p.name for p in outcome.deleted]

    def release_if_owner_over(self, pool_name: str, trigger: str) -> list[str]:
        """Release the JobSet of a pool whose create just finished, when that JobSet is over
        (finished, deleted, or recreated under its name): a create sent while its pods were pending
        can land after the JobSet's own release listed its pools (GKE creates take minutes; the
        sandbox's slow-operations scenario showed the race), and nothing else would release it
        before the reconcile sweep. One pool listing (provision's role lists pools; it has no
        ``container.nodePools.get``, infra/roles.json), handed on to the release, and one JobSet
        read; the pools deleted."""
        listing = self.gke.list_node_pools(self.settings.cluster_path)
        pool = next((p for p in listing if p.name == pool_name), None)
        if pool is None:
            return []
        owner = pool.owner
        if not is_managed(pool) or not owner.name or pool.status == STATUS_STOPPING:
            return []
        jobset = self._jobset({}, owner.namespace, owner.name)
        recreated = jobset is not None and bool(owner.uid) and jobset.meta.uid != owner.uid
        if occupancy.is_live(jobset) and not recreated:
            return []
        return self.release(owner.namespace, owner.name, owner.uid, trigger, listing=listing)

    def _read_owners(self, listing: list[NodePoolInfo], jobsets: JobSets) -> list[JobSet] | None:
        """The owners of the running managed pools not stamped idle, into ``jobsets``: one GET each
        (later, as needed) for a few; for more, one list, returned so that the handover-demand
        check reuses it (a cluster of many JobSets costs one call, not one per pool)."""
        owners = {p.owner.key for p in listing if _unstamped_running(p)} - set(jobsets)
        if len(owners) <= _OWNER_GETS:
            return None
        all_jobsets = self.kube.list_jobsets()
        found = {js.key: js for js in all_jobsets}
        jobsets.update({key: found.get(key) for key in owners})
        return all_jobsets

    def _may_be_offered(self, pool: NodePoolInfo, jobsets: JobSets) -> bool:
        """Whether ``pool`` may be in the middle of being kept idle for a waiting JobSet: a running
        managed pool, not stamped yet, whose owner is over. Another delivery (its owner's release)
        may be stamping it for the very JobSet whose deletion this is; its relabel lands after this
        listing, so the stamp alone would miss it and the pool would wait for a JobSet that is gone
        until reconcile looks. Judged now like a stamped one (GKE refuses a delete while the relabel
        runs, and the retry sees the stamp)."""
        return _unstamped_running(pool) and not occupancy.is_live(self._jobset(jobsets, *pool.owner.key))

    def _ran_on(
        self,
        namespace: str,
        name: str,
        uid: str,
        listing: list[NodePoolInfo],
        own: list[NodePoolInfo],
        jobsets: JobSets,
    ) -> dict[str, occupancy.Occupant]:
        """Managed pools labelled for another JobSet that this JobSet's pods ran on (two reads and
        one per Job of those pods, none when the listing has no such pool)."""
        mine = {p.name for p in own}
        others = {p.name for p in listing if is_managed(p) and p.status != STATUS_STOPPING} - mine
        if not others:
            return {}
        pods = self.kube.list_pods(namespace, label_selector=f"{labels.JOBSET_NAME}={name}")
        if not any(pod.node_name for pod in pods):
            return {}
        nodes = self.kube.list_nodes(MANAGED_NODES)
        pool_of = {n.name: n.pool for n in nodes}
        # Only pods bound to another JobSet's pool need proving their JobSet's own.
        candidates = [p for p in pods if pool_of.get(p.node_name) in others]
        chains = PodChains(self.owners, jobsets).of(candidates)
        ran = occupancy.last_runs(nodes, candidates, chains, namespace, name, uid)
        return {pool: user for pool, user in ran.items() if pool in others}

    def recycle(self, jobset: JobSet, pool: NodePoolInfo, why: str, trigger: str) -> bool:
        """Delete one failed pool of ``jobset`` under the occupancy rule (capacity fallback and the
        admission check recycle a pool GKE could not provision this way); whether it was deleted,
        TransientError when the delete must be retried."""
        meta = jobset.meta
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
        all_jobsets: list[JobSet] | None = None,
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
        now = datetime.datetime.now(tz=datetime.UTC)
        d = _Delivery(trigger, jobsets, listing, Outcome(), now)
        outcome = d.outcome
        may_own = functools.partial(self.may_own, listing=listing)
        waiting: list[occupancy.Demand] | None = None
        stamped: list[tuple[NodePoolInfo, dict[str, str]]] = []  # offered for the first time here
        for pool, verdict in verdicts:
            fields = {"pool": pool.name, "jobset": pool.owner.describe()}
            if not verdict.delete:
                logs.decision(log, "release.kept", f"kept {pool.name}: {verdict.why}", **fields)
                outcome.kept.append((pool, verdict.why))
                continue
            if pool.status == STATUS_STOPPING:
                logs.decision(log, "release.stopping", f"{pool.name} is already being deleted", **fields)
                continue
            try:
                nodes = self.guard.nodes(pool)
                found = self._occupants(pool, nodes, d)
                last = None if found else last_users.get(pool.name)
                taking = (
                    occupancy.decide(pool, verdict, [], [], 0.0, self.settings, last, may_own)
                    if last
                    else None
                )
                # ADOPT by the last user: the pool as it was, its heir and why, recorded as a
                # handover only once the pool outlives this delivery (deleted, it was never handed).
                heir = None
                if taking is not None and taking.adopter is not None:
                    heir = (pool, taking.adopter, taking.why)
                    pool, verdict = self._inherit(pool, taking.adopter, d)
                    fields = {"pool": pool.name, "jobset": pool.owner.describe()}
                inherited = heir is not None
                idle = idle_seconds(pool, jobsets.get(pool.owner.key), self.settings, now)
                # Drain mode winds everything down: no pool is held for anyone.
                if (
                    not found
                    and waiting is None
                    and not adopt_only
                    and self.settings.idle_pool_seconds > 0
                    and not self.settings.drain
                ):
                    waiting, all_jobsets = self._demand(listing, all_jobsets)
                decision = occupancy.decide(
                    pool, verdict, found, waiting or [], idle or 0.0, self.settings, may_own=may_own
                )
                if adopt_only and decision.action != occupancy.ADOPT:
                    continue
                admitted = (
                    occupancy.just_admitted_taker(pool, waiting or [])
                    if decision.action == occupancy.DELETE and pool.status in SERVING
                    else None
                )
                if admitted is not None:
                    # Not cordoned, not held: looked at again on the redelivery, when the admitted
                    # JobSet's pods have bound here (an adoption) or have pools of their own (a delete).
                    why = f"{decision.why}; not deleted yet: {admitted.who} may land on it"
                    self.guard.uncordon(pool, nodes, why)
                    outcome.retry.append(f"{pool.name}: {why}")
                    logs.decision(
                        log, "release.deferred", f"{pool.name} looked at again shortly: {why}", **fields
                    )
                    continue
                if decision.action == occupancy.DELETE:
                    self.guard.cordon(pool, nodes, decision.why)
                    nodes = self.guard.nodes(pool)
                    taker = self._taken_meanwhile(heir[0] if heir is not None else pool, nodes)
                    if taker:
                        self._leave(pool, nodes, taker, d, fields)
                        continue
                    found = self._occupants(pool, nodes, d)
                    if found:  # someone bound just before the cordon: they keep or take the pool
                        decision = occupancy.decide(
                            pool, verdict, found, [], 0.0, self.settings, may_own=may_own
                        )
                if decision.action == occupancy.DELETE:
                    # An inherited pool: the last user took it over, and it goes (recorded once GKE
                    # took the delete, before the delete's own line, in the order they happened).
                    self._delete(pool, decision.why + d.pretenders(pool.name), d, fields, heir)
                    continue
                self.guard.uncordon(pool, nodes, decision.why)
                if decision.action == occupancy.ADOPT and decision.adopter is not None:
                    self._adopt(pool, decision.adopter, decision.why, d, fields)
                elif decision.action == occupancy.OFFER:
                    # The stamp is the offer's record: the admission check hands over only stamped
                    # pools, and a later release re-judges them when what they wait for goes. An
                    # owner merely suspended gets none (readmitted, it would leave a stale one).
                    stamp = {}
                    if not pool.labels.get(labels.IDLE_SINCE) and not occupancy.is_live(
                        jobsets.get(pool.owner.key)
                    ):
                        stamp = {labels.IDLE_SINCE: str(int(now.timestamp() - (idle or 0.0)))}
                    if stamp or inherited:
                        self._relabel(pool, {**pool.labels, **stamp}, decision.why, inherited)
                    if heir is not None:
                        self._record_adoption(*heir, d, fields)
                    if stamp:
                        stamped.append((pool, fields))
                    outcome.offered.append(pool)
                    logs.decision(log, "release.offered", f"kept {pool.name} idle: {decision.why}", **fields)
                else:
                    if heir is not None:  # it outlives this delivery: its labels must say whose it is now
                        self._relabel(pool, pool.labels, decision.why, billing=True)
                        self._record_adoption(*heir, d, fields)
                    outcome.kept.append((pool, decision.why))
                    logs.decision(log, "release.kept", f"kept {pool.name}: {decision.why}", **fields)
            except TransientError as exc:
                outcome.retry.append(f"{pool.name}: {exc.why}")
                logs.decision(
                    log, "release.retry", f"{pool.name} must be retried: {exc.why}", logging.WARNING, **fields
                )
        if stamped:
            self._withdraw_stale_offers(stamped, all_jobsets, outcome)
        self._report(d)
        return outcome

    # -- steps ------------------------------------------------------------------------------------

    def _jobset(self, jobsets: JobSets, namespace: str, name: str) -> JobSet | None:
        key = (namespace, name)
        if key not in jobsets:
            try:
                jobsets[key] = self.kube.get_jobset(namespace, name)
            except NotFoundError:
                jobsets[key] = None
        return jobsets[key]

    def _occupants(self, pool: NodePoolInfo, nodes: list[Node], d: _Delivery) -> list[occupancy.Occupant]:
        pods = self.guard.pods_on(nodes)
        chains = PodChains(self.owners, d.jobsets).of(pods)
        d.pretending[pool.name] = occupancy.pretenders(pool, nodes, pods, chains)
        return occupancy.occupants(pool, nodes, pods, d.jobsets, chains)

    def _demand(
        self, listing: list[NodePoolInfo], all_jobsets: list[JobSet] | None
    ) -> tuple[list[occupancy.Demand], list[JobSet]]:
        """The demand idle pools may be kept for, and the JobSets it was read from (listed when
        ``all_jobsets`` is None)."""
        if all_jobsets is None:
            all_jobsets = self.kube.list_jobsets()
        now = datetime.datetime.now(tz=datetime.UTC)
        found = occupancy.demand(all_jobsets, listing, self.settings, self.spending.never_holds, now)
        return found, all_jobsets

    def _withdraw_stale_offers(
        self,
        stamped: list[tuple[NodePoolInfo, dict[str, str]]],
        all_jobsets: list[JobSet] | None,
        outcome: Outcome,
    ) -> None:
        """Look at the pools again after stamping them idle: the delivery's listing is seconds old,
        and the admission check may have bought the waiting JobSet pools of its own meanwhile (it
        hands over only pools it sees stamped). Both sides write, then read: the check lists the
        pools again after its creates (``AdmissionPools.withdraw_offers``), this reads them after
        its stamps, so one of the two always sees the other. A pool nobody waits for any more is
        looked at again on the redelivery, where its owner's verdict deletes it: without this it
        stayed idle until the reconcile sweep (up to one tick plus the handover window of cost)."""
        waiting, _ = self._demand(self.gke.list_node_pools(self.settings.cluster_path), all_jobsets)
        for pool, fields in stamped:
            if occupancy.waiting_taker(pool, waiting) is not None:
                continue
            why = "the JobSet it was kept for has pools of its own now"
            outcome.offered = [p for p in outcome.offered if p.name != pool.name]
            outcome.retry.append(f"{pool.name}: {why}")
            logs.decision(log, "release.withdrawn", f"{pool.name} is no longer kept idle: {why}", **fields)

    def _delete(
        self,
        pool: NodePoolInfo,
        why: str,
        d: _Delivery,
        fields: dict[str, str],
        heir: tuple[NodePoolInfo, occupancy.Occupant, str] | None = None,
    ) -> None:
        """Start deleting ``pool`` (nothing more when it is gone or GKE refuses).
        ``heir`` (the pool as its maker had it, the JobSet that took it over, why) is recorded only
        when GKE took it: a pool already gone was never handed to anyone."""
        d.deleted_why[pool.name] = why
        why = f"{why} ({d.trigger})"
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
        except OperationLimitError:
            # GKE runs one operation per pool at a time: the refusal may be another delivery's
            # handover of this very pool (its relabel, begun after this one's look at the Nodes).
            # Then the adoption won; the cordon must not stay on the new owner's pool until
            # reconcile lifts it, and the redelivery would no longer judge the pool as this owner's.
            taker = self._owner_now(heir[0] if heir is not None else pool)
            if taker:
                self._leave(pool, self.guard.nodes(pool), taker, d, fields)
                return
            raise
        # A TransientError propagates to dispose: the nodes stay cordoned and the retry re-checks.
        self.forget(pool.name)
        if heir is not None:
            self._record_adoption(*heir, d, fields)
        d.outcome.deleted.append(pool)
        logs.decision(log, "release.deleted", f"deleting {pool.name}: {why}", **fields)

    def _adopt(
        self, pool: NodePoolInfo, adopter: occupancy.Occupant, why: str, d: _Delivery, fields: dict[str, str]
    ) -> None:
        self._relabel(pool, occupancy.adopted_labels(pool, adopter), f"{why} ({d.trigger})", billing=True)
        self._record_adoption(pool, adopter, why, d, fields)

    def _taken_meanwhile(self, listed: NodePoolInfo, nodes: Iterable[Node]) -> str:
        """``namespace/name`` of the JobSet another delivery handed the pool to after this one listed
        it (``listed``: the pool as listed then); "" when it is still the owner ``listed`` names.

        Two deliveries may judge one pool at once (release runs ten per instance, on several
        instances): one hands it to the JobSet that ran on it last while the other, from an older
        listing, deletes it. GKE runs one operation per pool at a time (a delete during the relabel
        is refused as an incompatible operation and retried) and writes the new labels on the running
        Nodes (``UpdateNodePoolRequest.labels``), which the look after the cordon reads. Nodes that
        name another owner are checked against a fresh listing (they may lag an earlier handover):
        whichever operation came first wins, and the other delivery stands back.
        """
        if not any(n.labels.get(labels.OWNER_UID, listed.owner.uid) != listed.owner.uid for n in nodes):
            return ""
        return self._owner_now(listed)

    def _owner_now(self, listed: NodePoolInfo) -> str:
        """``namespace/name`` of the pool's owner in a fresh listing when it is no longer the one
        ``listed`` names; "" when the pool is gone (a delete says so) or still as listed."""
        now = next(
            (p for p in self.gke.list_node_pools(self.settings.cluster_path) if p.name == listed.name), None
        )
        if now is None or now.owner.uid == listed.owner.uid:
            return ""
        return now.owner.describe()

    def _leave(
        self, pool: NodePoolInfo, nodes: list[Node], taker: str, d: _Delivery, fields: dict[str, str]
    ) -> None:
        """Another delivery handed ``pool`` on after this one listed it: the adoption wins, the delete
        is dropped, and the Event on the JobSet this delivery judged says so."""
        why = f"not deleted: {taker} took {pool.name} over meanwhile"
        self.guard.uncordon(pool, nodes, why)
        d.outcome.kept.append((pool, why))
        logs.decision(log, "release.taken", f"kept {pool.name}: {why}", **fields)
        judged = d.jobsets.get(pool.owner.key)
        if judged is not None and judged.meta.uid == pool.owner.uid:
            self.kube.record_event(jobset_ref(judged), labels.REASON_RELEASED, f"{why} ({d.trigger})")

    def _inherit(
        self, pool: NodePoolInfo, user: occupancy.Occupant, d: _Delivery
    ) -> tuple[NodePoolInfo, Verdict]:
        """The finished JobSet that ran on ``pool`` last takes it over at its own release; the pool as
        its own and that JobSet's verdict on it. Its labels are written, and the handover recorded,
        only if the pool outlives this delivery: a relabel is a GKE operation, and GKE refuses a delete
        while one runs on the pool; a pool deleted at once was never anyone's but its maker's."""
        taken = dataclasses.replace(pool, labels=occupancy.adopted_labels(pool, user))
        return taken, self.judge(taken, d.jobsets.get((user.namespace, user.name)), d.now)

    def _relabel(self, pool: NodePoolInfo, new: Mapping[str, str], why: str, billing: bool) -> None:
        # The billing labels move with the node labels, in the same operation (one per pool at a time).
        owner = (
            labels.billing_labels(new.get(labels.OWNER_NAMESPACE, ""), new.get(labels.OWNER_NAME, ""))
            if billing
            else None
        )
        self.gke.set_node_pool_labels(self.settings.cluster_path, pool.name, new, why, resource_labels=owner)

    def _record_adoption(
        self, pool: NodePoolInfo, adopter: occupancy.Occupant, why: str, d: _Delivery, fields: dict[str, str]
    ) -> None:
        trigger, jobsets = d.trigger, d.jobsets
        d.outcome.adopted.append((pool, adopter))
        logs.decision(log, "release.adopted", f"{adopter.describe()} adopts {pool.name}: {why}", **fields)
        taker = jobsets.get((adopter.namespace, adopter.name))
        running = occupancy.is_live(taker)  # else it is over: it adopts at its own release
        tense = "run" if running else "ran"
        if taker is not None:
            self.kube.record_event(
                jobset_ref(taker),
                labels.REASON_ADOPTED,
                f"adopted node pool {pool.name} (made for {pool.owner.describe()}): {adopter.pods} of its "
                "pods "
                + ("run there; it is released when this JobSet ends" if running else "ran there last"),
            )
        old = jobsets.get((pool.owner.namespace, pool.owner.name))
        if old is not None and old.meta.uid == pool.owner.uid:
            self.kube.record_event(
                jobset_ref(old),
                labels.REASON_RELEASED,
                f"handed node pool {pool.name} to {adopter.describe()}, whose pods {tense} on it ({trigger})",
            )

    def _report(self, d: _Delivery) -> None:
        by_owner: dict[tuple[str, str, str], list[str]] = {}
        for pool in d.outcome.deleted:
            key = (
                pool.owner.namespace,
                pool.owner.name,
                pool.owner.uid,
            )
            by_owner.setdefault(key, []).append(pool.name)
        for (namespace, name, uid), names in sorted(by_owner.items()):
            jobset = d.jobsets.get((namespace, name))
            # A gone JobSet has nowhere to show an Event; a recreated one is not the pools' owner.
            if jobset is None or (uid and jobset.meta.uid != uid):
                continue
            self.kube.record_event(
                jobset_ref(jobset),
                labels.REASON_RELEASED,
                f"released node pools {', '.join(sorted(names))}: {d.trigger}"
                + d.sweep_reasons(names)
                + "".join(d.pretenders(n) for n in sorted(names)),
            )


def _reservation_parts(value: str) -> tuple[str, str]:
    """(name, project) of a pool's reservation as GKE lists it: a name, or a shared path."""
    if value.startswith("projects/"):
        parts = value.split("/")
        return parts[-1], parts[1]
    return value, ""


def _unstamped_running(pool: NodePoolInfo) -> bool:
    """A serving managed pool not (yet) stamped idle: one a release may be about to offer, or be
    offering now (RECONCILING while GKE applies the stamp)."""
    return is_managed(pool) and pool.status in SERVING and not pool.labels.get(labels.IDLE_SINCE)


def _held_idle(pool: NodePoolInfo) -> bool:
    """A managed pool release keeps idle for a waiting JobSet (its ``idle-since`` stamp, which only
    this product writes: GKE node-pool labels are not the cluster's to change)."""
    return is_managed(pool) and pool.status != STATUS_STOPPING and bool(pool.labels.get(labels.IDLE_SINCE))
