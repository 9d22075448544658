"""Stockout and quota backoff: how often a slice GKE could not provision is tried again.

A TPU stockout can last hours. Recycling the failed pool at every sweep would cost a create, a
delete and an Event every few minutes for as long as it lasts, so each failed attempt of a slice
waits longer before the next: ``STOCKOUT_BACKOFF_SECONDS`` doubled per attempt, capped at
``STOCKOUT_BACKOFF_MAX_SECONDS``.

The functions are stateless; the backoff is derived from one durable fact per slice, kept on the
JobSet that wants it (annotation ``tpuprov.dev/slice-failures``)::

    {"<pool>": {"attempts": K, "failedAt": <unix seconds>, "recycled": <bool>,
                "option": "spot@us-east5-b", "next": "on-demand@us-east5-b", "rounds": R}}

``attempts`` counts failed creates, ``failedAt`` is when the product first saw the latest one, and
``recycled`` says whether that failure's pool is gone (reconcile deleted it, or the create was
answered with a quota error and no pool was made): the next ERROR pool seen is then a new attempt.
``option`` is the capacity that attempt asked for and ``next`` the one the capacity policy
(shared.tpu.capacity) tries next, at once; when the policy has none left, ``next`` is empty and
the slice waits ``backoff(rounds)`` (``rounds``: how often the whole policy failed) before starting
over. Until ``retryAt`` reconcile keeps an ERROR pool in place (it has no nodes and costs nothing;
provision sees it listed and creates nothing) and provision creates no missing pool.

Why an annotation and not the Events' counts: the JobSet is read anyway before any create, so the
gate costs no extra call; it survives the API server's Event TTL; writes are conditional on the
resourceVersion, so two functions seeing the same failure count it once; and it is visible in
``kubectl describe jobset``. The ``TPUSliceFailed`` Event of an attempt keeps one message (pool,
GKE's reason, attempt, retry time), so repeated sightings aggregate into its ``count``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from shared.cloud.ports import KubeAPI
from shared.core import labels, logs
from shared.core.errors import ConflictError, NotFoundError, TransientError
from shared.core.settings import Settings
from shared.tpu import capacity
from shared.tpu.jobsets import JobSet, jobset_ref

log = logs.get("backoff")

_WRITE_ATTEMPTS = 3  # conditional writes retried after a conflict, each after a fresh read


@dataclasses.dataclass(frozen=True)
class Failure:
    """The latest failed attempt of one slice, as recorded on its JobSet."""

    attempts: int
    failed_at: float  # Unix seconds
    recycled: bool = False
    option: str = ""  # the capacity option this attempt used (CapacityOption.key)
    next: str = ""  # the option tried next, at once; "" = back off, then start over
    rounds: int = 0  # times every option of the policy failed (the backoff exponent)

    @property
    def backoff_rounds(self) -> int:
        """Failed rounds that set the wait (at least one: this failure ended a round)."""
        return max(1, self.rounds)

    def to_json(self) -> dict[str, Any]:
        """The annotation entry."""
        entry: dict[str, Any] = {
            "attempts": self.attempts,
            "failedAt": int(self.failed_at),
            "recycled": self.recycled,
        }
        if self.option:
            entry["option"] = self.option
        if self.next:
            entry["next"] = self.next
        if self.rounds:
            entry["rounds"] = self.rounds
        return entry


def delay(settings: Settings, attempts: int) -> int:
    """Seconds to wait after failed attempt number ``attempts`` (1-based) before the next one."""
    base, cap = settings.stockout_backoff_seconds, settings.stockout_backoff_max_seconds
    if attempts < 1 or base == 0:
        return 0
    # Bounded exponent: past the cap the doubling no longer matters (and 2**big stays cheap).
    return min(cap, base * 2 ** min(attempts - 1, 32))


def retry_at(settings: Settings, failure: Failure) -> float:
    """When the slice may be tried again: at once with the policy's next option, else after backoff."""
    return failure.failed_at + (0 if failure.next else delay(settings, failure.backoff_rounds))


# How far ahead of this instance's clock a recorded failure may be stamped: clocks of Cloud Run
# instances agree to well within this. The annotation sits on the tenant's own JobSet, so a later
# stamp is the tenant's writing, not the product's; it is ignored rather than obeyed (it would
# postpone the slice's next create, and the recycling of its ERROR pool, as long as it says).
MAX_CLOCK_SKEW_SECONDS = 60.0


def failures(jobset: JobSet | None, now: float | None = None) -> dict[str, Failure]:
    """The recorded failures of a JobSet's slices by pool name (malformed entries, and entries
    stamped after ``now`` plus ``MAX_CLOCK_SKEW_SECONDS``, are ignored)."""
    latest = (time.time() if now is None else now) + MAX_CLOCK_SKEW_SECONDS
    raw = jobset.meta.annotations.get(labels.SLICE_FAILURES, "") if jobset is not None else ""
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}  # a hand-edited annotation must not block the JobSet: start counting afresh
    found: dict[str, Failure] = {}
    for pool, entry in data.items() if isinstance(data, dict) else ():
        try:
            found[str(pool)] = Failure(
                int(entry["attempts"]),
                float(entry["failedAt"]),
                bool(entry.get("recycled", False)),
                str(entry.get("option", "")),
                str(entry.get("next", "")),
                # Records from before capacity fallback: every attempt was a round of its own.
                int(entry.get("rounds", 0 if "option" in entry else entry["attempts"])),
            )
        except (KeyError, TypeError, ValueError):
            continue
        if found[str(pool)].failed_at > latest:
            del found[str(pool)]
    return found


def waiting(settings: Settings, jobset: JobSet | None, pool: str, now: float) -> Failure | None:
    """The failure ``pool`` still backs off from at ``now`` (None: it may be created or recycled)."""
    failure = failures(jobset, now).get(pool)
    return failure if failure is not None and now < retry_at(settings, failure) else None


def describe(seconds: float) -> str:
    """A short human duration: "45 s", "10 min", "1 h 30 min"."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def failed_message(settings: Settings, pool: str, reason: str, failure: Failure) -> str:
    """The ``TPUSliceFailed`` Event of one attempt: what failed, why, and what happens next and when.

    The same for every sighting of the attempt by any function (no "now", nothing only one caller
    knows), so repeats aggregate into one Event whose count says how often it was seen.
    """
    what = f"node pool {pool}"
    if failure.option:
        what += f" ({failure.option})"
    if failure.next:
        return (
            f"{what} could not be provisioned: {reason}; attempt {failure.attempts}, "
            f"falling back to {failure.next} now"
        )
    wait = delay(settings, failure.backoff_rounds)
    at = datetime.datetime.fromtimestamp(retry_at(settings, failure), tz=datetime.UTC)
    when = (
        f"retrying in {describe(wait)} (not before {at:%H:%M:%S}Z)" if wait else "retrying at the next sweep"
    )
    return f"{what} could not be provisioned: {reason}; attempt {failure.attempts}, {when}"


class Backoff:
    """Records failed attempts on the JobSet (conditionally, once each) and reports them as Events."""

    def __init__(self, settings: Settings, kube: KubeAPI, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.kube = kube
        self.clock = clock

    def observe(
        self,
        jobset: JobSet,
        pool: str,
        reason: str,
        *,
        pool_made: bool = True,
        tried: str = "",
        options: Sequence[str] = (),
    ) -> Failure:
        """Record that ``pool`` failed (ERROR status; ``pool_made`` False: the create itself was
        refused for quota) unless this failure is recorded already, and tell the JobSet.

        ``tried`` is the capacity option of the failed attempt and ``options`` the slice's options
        in policy order (``CapacityOption.key``); they decide whether the next attempt falls back at
        once or the slice backs off. A pool in ERROR is one attempt however often it is seen (unless
        it asked for other capacity than the recorded attempt); a refused create is always a new one.
        Raises TransientError when the JobSet kept changing under the write (redelivery retries).
        """

        counted = [False]  # whether the last decision (after any conflict) recorded a new attempt

        def change(known: Failure | None) -> Failure | None:
            counted[0] = False
            if pool_made and known is not None and not known.recycled and known.option == tried:
                return None  # this ERROR pool's failure is counted already
            counted[0] = True
            attempts = (known.attempts if known else 0) + 1
            following = capacity.after(options, tried) if tried else ""
            rounds = (known.rounds if known else 0) + (0 if following else 1)
            return Failure(attempts, float(int(self.clock())), not pool_made, tried, following, rounds)

        failure = self._update(jobset, {pool: change}, f"{pool} failed to provision: {reason}")[pool]
        if failure is None:  # unreachable: change() keeps only an existing entry
            failure = Failure(1, self.clock(), recycled=not pool_made)
        self.kube.record_event(
            jobset_ref(jobset),
            labels.REASON_FAILED,
            failed_message(self.settings, pool, reason, failure),
            warning=True,
        )
        # backoff.failed once per attempt (what the stockout metrics count); later sightings are quieter.
        why = f"pool {pool} failed (attempt {failure.attempts}): {reason}"
        wait = round(retry_at(self.settings, failure) - self.clock())
        if counted[0]:
            logs.decision(
                log,
                "backoff.failed",
                why,
                logging.WARNING,
                pool=pool,
                attempts=failure.attempts,
                retry_in=wait,
                option=failure.option,
                next=failure.next,
            )
        else:
            logs.decision(log, "backoff.seen", why, pool=pool, attempts=failure.attempts, retry_in=wait)
        return failure

    def recycled(self, jobset: JobSet, pools: Iterable[str]) -> None:
        """Note that these failed pools were deleted: the next failure of each is a new attempt."""

        def mark(known: Failure | None) -> Failure | None:
            return dataclasses.replace(known, recycled=True) if known and not known.recycled else None

        self._update(jobset, dict.fromkeys(pools, mark), "failed pools recycled")

    def landed(self, jobset: JobSet, pools: Iterable[str]) -> None:
        """Forget the failures of slices whose pool now runs: a later stockout starts from attempt 1."""
        self._update(jobset, dict.fromkeys(pools, _forget), "slices provisioned after failures")

    def _update(
        self,
        jobset: JobSet,
        changes: dict[str, Callable[[Failure | None], Failure | _Forget | None]],
        why: str,
    ) -> dict[str, Failure | None]:
        """Apply ``changes`` (per pool: new entry, None = keep, FORGET = remove) with a conditional
        write; after a conflict, read the JobSet again and decide again. Returns the entries after."""
        meta = jobset.meta
        namespace, name = meta.namespace, meta.name
        current = jobset
        for _ in range(_WRITE_ATTEMPTS):
            known = failures(current, self.clock())
            after: dict[str, Failure | None] = {}
            dirty = False
            for pool, change in changes.items():
                new = change(known.get(pool))
                if new is None:
                    after[pool] = known.get(pool)
                elif isinstance(new, _Forget):
                    dirty |= pool in known
                    known.pop(pool, None)
                    after[pool] = None
                else:
                    known[pool], after[pool], dirty = new, new, True
            if not dirty:
                return after
            value = json.dumps({p: f.to_json() for p, f in sorted(known.items())}, separators=(",", ":"))
            version = current.meta.resource_version
            try:
                self.kube.annotate_jobset(
                    namespace, name, {labels.SLICE_FAILURES: value if known else None}, version, why
                )
                return after
            except ConflictError:
                try:
                    current = self.kube.get_jobset(namespace, name)
                except NotFoundError:
                    return after  # the JobSet is gone, and its slices with it: nothing to back off
            except NotFoundError:
                return after
        raise TransientError(f"JobSet {namespace}/{name} kept changing while recording: {why}")


class _Forget:
    """Marker of a change that removes the entry."""


_FORGET = _Forget()


def _forget(known: Failure | None) -> _Forget | None:
    return _FORGET if known is not None else None


__all__ = [
    "Backoff",
    "Failure",
    "delay",
    "describe",
    "failed_message",
    "failures",
    "retry_at",
    "waiting",
]
