"""GKE's operation slots and API quota: how wide a fan-out may go, and resuming when a slot frees.

GKE runs a limited number of node-pool operations per cluster at a time and answers the next one
with 429 "Too many operations: cluster "c" hits the concurrent operations quota N" (naming N) or,
while a conflicting operation runs, 400 "Cluster is running incompatible operation ..." (naming no
number): the adapter raises ``OperationLimitError`` with GKE's N when it names one. Its API also
has a per-project quota of requests a minute (3000 by default), refused with 429 "Quota exceeded for
quota metric ...": ``RequestQuotaError``. Nothing else tells a client the limit, so it is learnt:

* ``Pace`` is what one function instance believes (a hint it may lose at any time; in-flight
  operations are always read from GKE's listing, never remembered): the width of the next round of
  creates, and the cluster's operation limit once GKE refused a create. A fan-out starts
  ``CREATE_CONCURRENCY`` wide and doubles each round GKE accepts every create (slow start); a
  concurrency refusal halves the width, after which it grows by one a round, and sets the limit to
  GKE's number, or, when GKE names none, to the operations it was running when it refused. Such a
  learnt limit is probed one create beyond at each fan-out that reaches it and grows when GKE
  accepts the probe.
* ``RequestRate`` paces the creates so that no 60 s window holds more than ``GKE_REQUESTS_PER_MINUTE``.
* ``Slots`` owns both and is handed the provisioner's collaborators explicitly (it imports no
  provisioner): ``free`` slots by the listing, ``send_all`` (the rounds of a fan-out) and ``resume``.

Slices that must wait are acknowledged, not redelivered (a wait of hours would exhaust Pub/Sub's
delivery attempts). GKE's audit entry of each finished operation reaches provision
(``sinks/nodepool-operations.filter``) and ``resume`` requests the waiting slices at once; the
reconcile sweep is the safety net.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.cloud.retry import Budget
from shared.core import labels, logs
from shared.core.errors import NotEligible, OperationLimitError, Refused, RequestQuotaError, TpuProvError
from shared.core.settings import Settings
from shared.provisioning.create.fanout import FanOut, fan_out
from shared.provisioning.create.known import KnownPools, group_of
from shared.provisioning.outcomes import Outcome
from shared.tpu.nodepools import (
    STATUS_ERROR,
    STATUS_PROVISIONING,
    STATUS_RECONCILING,
    STATUS_STOPPING,
    NodePoolInfo,
)
from shared.tpu.pods import Pod
from shared.tpu.slices import slice_request

log = logs.get("provision")

T = TypeVar("T")

# Pool states that hold one of the cluster's operation slots (an operation is running on the pool).
BUSY = (STATUS_PROVISIONING, STATUS_STOPPING, STATUS_RECONCILING)
WINDOW_SECONDS = 60.0


def busy(pools: list[NodePoolInfo]) -> int:
    """Operations running on the cluster by the listing."""
    return sum(1 for p in pools if p.status in BUSY)


def free(limit: int | None, pools: list[NodePoolInfo]) -> int | None:
    """Free operation slots given the listing, None when the quota is unknown."""
    if limit is None:
        return None
    return max(0, limit - busy(pools))


# -- the learning policy (pure) --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pace:
    """What an instance believes of GKE's pace: a hint, rebuilt from the settings on a cold start."""

    width: int  # creates sent at once in the next round
    limit: int | None = None  # operations GKE runs at once on the cluster; None until it refused one
    fixed: bool = False  # the limit is GKE's own figure or configured: never probed past
    growing: bool = True  # slow start (doubling) until the first refusal; one more a round after

    def room(self, running: int) -> int | None:
        """Creates GKE may accept with ``running`` operations under way (None: no limit known yet).
        A learnt limit gets one create more: the probe that finds out whether it has grown."""
        if self.limit is None:
            return None
        return max(0, self.limit + (0 if self.fixed else 1) - running)


def start(settings: Settings) -> Pace:
    """The pace of a fresh instance: ``CREATE_CONCURRENCY`` wide, ``GKE_OPERATION_LIMIT`` if set."""
    width = max(1, min(settings.create_concurrency, settings.create_concurrency_max))
    limit = settings.gke_operation_limit or None
    return Pace(width, limit, fixed=limit is not None)


def after_round(
    pace: Pace, widest: int, accepted: int, running: int, refusal: OperationLimitError | None
) -> Pace:
    """The pace after a round of creates: ``accepted`` of them accepted, ``running`` operations under
    way at GKE afterwards (the listing's plus those accepted), ``refusal`` GKE's concurrency answer
    (None when none; its ``limit`` the quota GKE named); ``widest`` is CREATE_CONCURRENCY_MAX."""
    if refusal is not None:
        stated = refusal.limit
        if pace.fixed and stated is None:
            limit, fixed = pace.limit, True  # a configured or stated figure outlives a busy cluster
        elif stated is not None:
            limit, fixed = stated, True
        else:  # GKE named no number: it ran what was in flight and no more
            limit, fixed = max(1, running), False
        return Pace(max(1, pace.width // 2), limit, fixed, growing=False)
    width = pace.width + accepted if pace.growing else pace.width + 1
    limit = pace.limit
    if limit is not None and not pace.fixed and running > limit:
        limit = running  # the probe was accepted: GKE runs more than it did when it refused
    return dataclasses.replace(pace, width=max(1, min(widest, width)), limit=limit)


# -- the request quota -------------------------------------------------------------------------------


class RequestRate:
    """At most ``per_minute`` requests in any 60 s window (a sliding log, exact; thread-safe)."""

    def __init__(
        self,
        per_minute: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self.sleep = sleep
        self._sent: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self._sent and self._sent[0] <= now - WINDOW_SECONDS:
            self._sent.popleft()

    def take(self, wanted: int, budget: Budget) -> int:
        """Grant up to ``wanted`` requests now (recorded as sent), waiting for the window to free one
        when none is left and the budget allows; 0 when the budget ends first."""
        while True:
            with self._lock:
                now = self.clock()
                self._expire(now)
                granted = min(wanted, self.per_minute - len(self._sent))
                if granted > 0:
                    self._sent.extend([now] * granted)
                    return granted
                wait = self._sent[0] + WINDOW_SECONDS - now
            if wait >= budget.remaining():
                return 0
            budget.pause(wait)

    def spent(self) -> None:
        """GKE said the project's quota is spent (other clients share it): send nothing for a window."""
        with self._lock:
            now = self.clock()
            self._sent.extend([now] * max(0, self.per_minute - len(self._sent)))

    def in_window(self) -> int:
        """Requests sent in the last 60 s."""
        with self._lock:
            self._expire(self.clock())
            return len(self._sent)


def _concurrency_refusal(result: FanOut[Any]) -> OperationLimitError | None:
    return next((e for _, e in result.sent if isinstance(e, OperationLimitError)), None)


def _quota_refusal(result: FanOut[Any]) -> bool:
    return any(isinstance(e, RequestQuotaError) for _, e in result.sent)


# -- the accountant ------------------------------------------------------------------------------------


class Slots:
    """An account of GKE's operation slots and request quota. The instance's service graph
    (``shared.provisioning.services.Services``) builds one and hands it to provision, the admission
    check and reconcile alike, so an instance never spends GKE's per-minute quota twice."""

    def __init__(
        self,
        settings: Settings,
        gke: NodePoolAPI,
        kube: KubeAPI,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.gke = gke
        self.kube = kube
        self.pace = start(settings)
        self.rate = RequestRate(settings.gke_requests_per_minute, clock, sleep)
        self.rounds = 0  # rounds of creates sent by this instance (the benchmark times them)
        self._lock = threading.Lock()

    @property
    def operation_limit(self) -> int | None:
        """The cluster's operation limit as configured, stated by GKE or learnt (None: unknown)."""
        return self.pace.limit

    def free(self, pools: list[NodePoolInfo]) -> int | None:
        """Creates GKE may accept now by the listing, None while no limit is known."""
        return self.pace.room(busy(pools))

    def send_all(
        self, items: Sequence[T], send: Callable[[T], None], budget: Budget, running: int
    ) -> FanOut[T]:
        """Send ``items`` in rounds as wide as the pace allows, ``running`` operations under way by
        the listing; stop at GKE's first concurrency or quota refusal, the end of the budget or of
        the free slots. What was not sent is handed back (the caller defers or waits for it)."""
        sent: list[tuple[T, TpuProvError | None]] = []
        queue = list(items)
        stopped = ""
        while queue:
            with self._lock:
                pace = self.pace
            room = pace.room(running)
            size = min(len(queue), pace.width, len(queue) if room is None else room)
            if size == 0:
                stopped = f"no free GKE operation slot ({running} running, limit {pace.limit})"
                break
            size = self.rate.take(size, budget)
            if size == 0:
                stopped = f"GKE_REQUESTS_PER_MINUTE {self.rate.per_minute} spent until the deadline"
                break
            batch, queue = queue[:size], queue[size:]
            self.rounds += 1
            result = fan_out(batch, send, size, budget)
            sent += result.sent
            accepted = sum(1 for _, error in result.sent if error is None)
            running += accepted
            refusal = _concurrency_refusal(result)
            with self._lock:
                self.pace = after_round(
                    self.pace, self.settings.create_concurrency_max, accepted, running, refusal
                )
            if _quota_refusal(result):
                self.rate.spent()
                stopped = "GKE answered that the project's API quota is spent"
            if result.unsent or result.stopped or stopped:
                queue = result.unsent + queue
                stopped = result.stopped or stopped
                break
        return FanOut(sent=sent, unsent=queue, stopped=stopped)

    def resume(
        self,
        known: KnownPools,
        provision: Callable[[Pod, list[NodePoolInfo]], Outcome],
        pool: str = "",
    ) -> list[str]:
        """Request waiting slices (pending JobSet pods without their pool), oldest pod first, while
        slots last.

        ``pool`` is the pool whose operation ended: the instance forgets what it remembered of it, so
        a create that ended in ERROR (a stockout) is reported on its JobSet now, through the same path
        as a pending pod's event. Each slice is requested by ``provision`` (one pending pod's slice
        given a listing: the provisioner's, its whole replicated job, the JobSet read deciding) under
        ``known``'s single flight. Returns the pools requested.
        """
        if pool:
            known.forget(pool)
        cluster = self.settings.cluster_path
        pods = self.kube.list_pods(label_selector=labels.JOBSET_NAME, field_selector="status.phase=Pending")
        pods.sort(key=lambda p: p.created_at or 0.0)
        pools = self.gke.list_node_pools(cluster)
        requested: list[str] = []
        done: set[str] = set()
        for pod in pods:
            try:
                request = slice_request(pod)
            except (NotEligible, Refused):
                continue
            name = request.pool_name
            existing = next((p for p in pools if p.name == name), None)
            if name in done or (existing is not None and existing.status != STATUS_ERROR):
                continue
            if existing is None and self.free(pools) == 0:
                continue  # no slot for a create; failed pools further down are still reported
            # A pending pod's event in this instance may be creating this group right now (its create
            # landed after the listing above): wait for it, and leave a pool it just created alone
            # instead of sending a second create that GKE answers 409.
            with known.single_flight(group_of(request.slice_id)):
                if existing is None and known.known(name, pod.created_at):
                    done.add(name)
                    continue
                outcome = provision(pod, pools)
            requested += outcome.requested
            done.update(outcome.requested)
            done.add(name)
            if outcome.requested:
                pools = self.gke.list_node_pools(cluster)  # the slots those creates took
        logs.decision(
            log,
            "provision.resumed",
            f"a node-pool operation finished: requested {len(requested)} waiting pool(s)",
            requested=len(requested),
        )
        return requested
