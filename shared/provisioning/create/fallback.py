"""Capacity fallback: which capacity each attempt at a slice uses, and what a failed attempt leads to.

The policy (shared.tpu.capacity) orders the options; the JobSet's failure record
(shared.provisioning.create.backoff) says which one failed last and which one comes next. Provision,
resume and reconcile all go through here, so they agree on the option of every attempt:

- a create uses the recorded fallback option when there is one, else the policy's first option;
- an ERROR pool with a fallback option left is deleted at once (through the occupancy-safe
  ``Releaser``), and the delete's finished-operation entry resumes the slice on the next option;
- a quota refusal with a fallback option left is retried on it by redelivery, seconds later;
- a reservation the look before buying finds without room (nothing was sent) goes on to the next
  option in the same delivery (``SliceGroupEngine.send``);
- when no option is left the slice backs off (``backoff``) and then starts over.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import logs
from shared.core.errors import NotFoundError, Refused
from shared.core.settings import Settings
from shared.provisioning.create import backoff
from shared.provisioning.release.releaser import Releaser
from shared.tpu import capacity
from shared.tpu.capacity import CapacityOption
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import STATUS_ERROR, ClusterInfo, NodePoolInfo, NodePoolSpec
from shared.tpu.slices import SliceRequest, policy_of, slice_options, template_demand

log = logs.get("fallback")


@dataclasses.dataclass(frozen=True)
class Attempts:
    """A replicated job's capacity options in policy order, and its slices' failure records."""

    choices: tuple[CapacityOption, ...]
    failures: Mapping[str, backoff.Failure]

    def option(self, pool: str) -> CapacityOption:
        """The capacity of the next attempt at ``pool``: its recorded fallback, else the first option."""
        failure = self.failures.get(pool)
        return capacity.pick(self.choices, failure.next if failure else "")


class Exhausted(Protocol):
    """Who is told when a JobSet's slice ran out of capacity options in this cluster."""

    def short(
        self, jobset: JobSet, why: str, replicated_job: str = "", options: Sequence[str] = ()
    ) -> bool: ...


class Fallback:
    """Chooses each attempt's capacity and turns failed attempts into fallback or backoff."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        tracker: backoff.Backoff,
        cluster: Callable[[], ClusterInfo],
        releaser: Releaser,
        placement: Exhausted | None = None,
    ) -> None:
        """``placement``: told when a JobSet's slice has no capacity option left in this cluster
        and backs off (MultiKueue then places the job in another worker)."""
        self.settings = settings
        self.placement = placement
        self.gke = gke
        self.kube = kube
        self.backoff = tracker
        self.cluster = cluster
        self.releaser = releaser

    def options(self, request: SliceRequest, jobset: JobSet | None) -> tuple[CapacityOption, ...]:
        """The slice's options in policy order (Refused: a bad policy or zone)."""
        return slice_options(self.settings, request.demand, policy_of(self.settings, jobset), self.cluster())

    def report(self, request: SliceRequest, pool: NodePoolInfo) -> backoff.Failure | None:
        """A pool of this slice is in ERROR: record the attempt on the JobSet (once) and, when the
        policy has another option, delete the pool now so the next attempt can use it."""
        try:
            jobset = self.kube.get_jobset(request.slice_id.namespace, request.slice_id.jobset)
        except NotFoundError:
            return None  # reconcile deletes the pools of a JobSet that is gone
        failure = self._observe_error(jobset, pool, lambda: request.demand)
        if failure.next and pool.status == STATUS_ERROR:
            self.recycle(jobset, pool, failure)
        return failure

    def refused(
        self, request: SliceRequest, jobset: JobSet, spec: NodePoolSpec, reason: str
    ) -> backoff.Failure:
        """GKE refused this attempt's create for quota or its reservation: a new attempt (no pool)."""
        keys = [o.key for o in self.options(request, jobset)]
        failure = self.backoff.observe(
            jobset, spec.name, reason, pool_made=False, tried=capacity.key_of_spec(spec), options=keys
        )
        return self._told(jobset, failure, reason, request.slice_id.replicated_job, keys)

    def _told(
        self, jobset: JobSet, failure: backoff.Failure, why: str, replicated_job: str, keys: Sequence[str]
    ) -> backoff.Failure:
        if not failure.next and self.placement is not None:
            self.placement.short(jobset, why, replicated_job, keys)
        return failure

    def observe_owned(self, jobset: JobSet, pool: NodePoolInfo) -> backoff.Failure:
        """Reconcile's sighting of an ERROR pool (no pod at hand: the JobSet's template decides)."""
        rjob = pool.owner.replicated_job
        return self._observe_error(jobset, pool, lambda: template_demand(jobset, rjob))

    def _observe_error(
        self, jobset: JobSet, pool: NodePoolInfo, demand: Callable[[], capacity.Demand]
    ) -> backoff.Failure:
        """Record an ERROR pool's attempt with the slice's options (what its pods select, by
        ``demand``), so the record says whether the next attempt falls back or backs off."""
        try:
            choices = slice_options(self.settings, demand(), policy_of(self.settings, jobset), self.cluster())
            keys = [o.key for o in choices]
        except Refused as exc:  # a policy (or selection) gone bad: back off as without a policy
            why = f"{pool.name}: {exc.why}"
            logs.decision(log, "fallback.no_policy", why, logging.WARNING, pool=pool.name)
            keys = []
        failure = self.backoff.observe(
            jobset,
            pool.name,
            pool.status_message or "status ERROR",
            tried=capacity.key_of_pool(pool),
            options=keys,
        )
        why = f"{pool.name}: {pool.status_message or 'status ERROR'}"
        return self._told(jobset, failure, why, pool.owner.replicated_job, keys)

    def recycle(self, jobset: JobSet, pool: NodePoolInfo, failure: backoff.Failure) -> None:
        """Delete a failed pool whose slice falls back to other capacity, under the occupancy rule."""
        why = f"GKE could not provision it on {failure.option}; falling back to {failure.next}"
        if self.releaser.recycle(jobset, pool, why, "capacity fallback"):
            self.backoff.recycled(jobset, [pool.name])
            logs.decision(log, "fallback.recycled", f"deleted {pool.name}: {why}", pool=pool.name)

    def held(self, failures: Mapping[str, backoff.Failure]) -> dict[str, str]:
        """Pools of a JobSet (its ``failures`` record) that must not be created yet, with why."""
        now = self.backoff.clock()
        held: dict[str, str] = {}
        for name, failure in failures.items():
            wait = backoff.retry_at(self.settings, failure) - now
            if wait > 0:
                held[name] = (
                    f"pool {name} failed to provision (attempt {failure.attempts}); backing off, "
                    f"retried in {backoff.describe(wait)}"
                )
        return held


__all__ = ["Attempts", "Fallback"]
