"""The owner's side of a release: may a pool go now, and since when has nobody needed it.

Pure functions of a pool and its owning JobSet as the API shows it (``None`` = gone), and of a
suspended JobSet's Kueue Workload (``workload_hold``); the occupancy side (who runs there) is
``shared.provisioning.release.occupancy``. The release paths judge through ``Releaser.judge``, which reads the
Workload a suspended owner needs; ``tpuprov status`` calls the same functions on what it lists.
"""

from __future__ import annotations

import datetime

from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.release.occupancy import Verdict
from shared.tpu.jobsets import Condition, JobSet, condition, is_suspended, terminal_condition
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.workloads import PENDING, READY, WorkloadView


def _since(timestamp: str, now: datetime.datetime) -> float:
    try:
        then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except (ValueError, AttributeError):
        return float("inf")  # unknown transition time: treat as long ago rather than keep forever
    return (now - then).total_seconds()


# How a pool's owner JobSet stands: the question behind every release decision (``owner_state``).
GONE, DELETING, RECREATED, FAILED, COMPLETED, SUSPENDED, RUNNING = (
    "gone",
    "deleting",
    "recreated",
    "failed",
    "completed",
    "suspended",
    "running",
)


def owner_state(pool: NodePoolInfo, jobset: JobSet | None) -> str:
    """How ``pool``'s owner stands, given its JobSet as the API shows it now (None = gone): one of
    gone, deleting, recreated (a new JobSet of the name: another uid), failed, completed, suspended,
    running. ``judge`` decides on it, and ``tpuprov status`` shows it."""
    if jobset is None:
        return GONE
    meta = jobset.meta
    if meta.deleting:
        return DELETING
    if pool.owner.uid and meta.uid and pool.owner.uid != meta.uid:
        return RECREATED
    ended = terminal_condition(jobset)
    if ended:
        return FAILED if ended.type == "Failed" else COMPLETED
    return SUSPENDED if is_suspended(jobset) else RUNNING


def judge(
    pool: NodePoolInfo,
    jobset: JobSet | None,
    settings: Settings,
    now: datetime.datetime,
    hold: str = "",
) -> Verdict:
    """Decide whether ``pool`` may be deleted given its JobSet as the API shows it now (None = gone).

    ``hold``: for a suspended JobSet, why its Kueue Workload still needs its pools (``workload_hold``,
    from what Kueue writes), "" when it does not or the caller did not look."""
    owner = pool.owner.describe()
    state = owner_state(pool, jobset)
    if state == GONE:
        return Verdict(True, f"JobSet {owner} no longer exists")
    assert jobset is not None
    if state == DELETING:
        return Verdict(True, f"JobSet {owner} is being deleted")
    if state == RECREATED:
        uid = jobset.meta.uid
        return Verdict(True, f"JobSet {owner} was recreated (uid {uid}, pool made for {pool.owner.uid})")
    ended = terminal_condition(jobset) or Condition("")
    if state == FAILED:
        return Verdict(True, f"JobSet {owner} failed ({ended.reason})")
    if state == COMPLETED:
        waited = _since(ended.last_transition, now)
        if waited < settings.release_grace_seconds:
            return Verdict(
                False,
                f"JobSet {owner} completed {waited:.0f}s ago; grace is {settings.release_grace_seconds}s",
            )
        return Verdict(True, f"JobSet {owner} completed")
    if state == SUSPENDED:
        if hold:
            return Verdict(False, f"JobSet {owner} is suspended: {hold}")
        suspended = condition(jobset, "Suspended")
        waited = _since(suspended.last_transition, now) if suspended else 0.0
        if suspended and waited >= settings.suspend_grace_seconds:
            return Verdict(
                True, f"JobSet {owner} suspended for {waited:.0f}s (grace {settings.suspend_grace_seconds}s)"
            )
        return Verdict(
            False, f"JobSet {owner} is suspended, within the {settings.suspend_grace_seconds}s grace"
        )
    return Verdict(False, f"JobSet {owner} is still running")


def workload_hold(
    workload: WorkloadView | None, check: str, settings: Settings, now: datetime.datetime
) -> str:
    """Why a suspended JobSet's pools are needed by its Kueue Workload ("" when they are not).

    Read only from what Kueue and the check write in the Workload's status (tenants can read
    Workloads but not write their status), never from anything on the JobSet: a tenant-written
    record could keep a suspended JobSet's pools forever after Kueue gave its quota to others.

    * the check (``check``, this product's) is Pending or Ready while Kueue holds quota for the
      Workload: its slices are being provisioned, for as long as that takes (GKE creates in waves);
    * Kueue evicted it after a Retry and will bring it back at ``requeueState.requeueAt``: the
      slices that landed wait for it until then plus ``IDLE_POOL_SECONDS`` (an idle slice is kept
      that long for a queued JobSet), unless that is further off than STOCKOUT_BACKOFF_MAX_SECONDS
      (no retry of this product's waits longer).
    """
    if workload is None or not workload.active or workload.has("Finished"):
        return ""
    state = workload.check(check)
    if state is None:
        return ""
    reserved = workload.has("QuotaReserved") and not workload.has("Evicted")
    if state.state in (PENDING, READY) and reserved:
        return (
            f"its Workload's admission check is {state.state} with quota reserved: "
            "its slices are being provisioned"
        )
    if workload.requeue_at is not None:
        ahead = workload.requeue_at - now.timestamp()
        left = ahead + settings.idle_pool_seconds
        if left > 0 and ahead <= settings.stockout_backoff_max_seconds:
            requeue = f"Kueue requeues it in {max(0.0, ahead):.0f}s"
            return f"kept {left:.0f}s more for its Workload's retry ({requeue})"
    return ""


def idle_seconds(
    pool: NodePoolInfo, jobset: JobSet | None, settings: Settings, now: datetime.datetime
) -> float | None:
    """How long ``pool`` has been without an owner that needs it; None when nothing says (then the
    releaser stamps ``tpuprov.dev/idle-since`` on the pool so the next look knows)."""
    stamp = pool.labels.get(labels.IDLE_SINCE, "")
    if stamp.isdigit():
        return max(0.0, now.timestamp() - int(stamp))
    if jobset is not None and jobset.meta.uid == pool.owner.uid:
        ended = terminal_condition(jobset)
        if ended:
            return max(0.0, _since(ended.last_transition, now))
        suspended = condition(jobset, "Suspended")
        if suspended:
            waited = _since(suspended.last_transition, now)
            return max(0.0, waited - settings.suspend_grace_seconds)
    return None
