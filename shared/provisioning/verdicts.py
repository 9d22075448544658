"""The owner's side of a release: may a pool go now, and since when has nobody needed it.

Pure functions of a pool and its owning JobSet as the API shows it (``None`` = gone); the occupancy
side (who runs there) is ``shared.provisioning.occupancy``. ``shared.provisioning.releaser``
re-exports both, as every release path (release, reconcile, ``tpuprov status``) reads them there.
"""

from __future__ import annotations

import datetime
from typing import Any

from shared.core import labels
from shared.core.meta import Meta
from shared.core.settings import Settings
from shared.provisioning.occupancy import Verdict
from shared.tpu.jobsets import condition, is_suspended, terminal_condition
from shared.tpu.nodepools import NodePoolInfo


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
    meta = Meta.of(jobset)
    if meta.deleting:
        return Verdict(True, f"JobSet {owner} is being deleted")
    pool_uid = pool.labels.get(labels.OWNER_UID, "")
    if pool_uid and meta.uid and pool_uid != meta.uid:
        return Verdict(True, f"JobSet {owner} was recreated (uid {meta.uid}, pool made for {pool_uid})")
    ended = terminal_condition(jobset)
    if ended and ended.get("type") == "Failed":
        return Verdict(True, f"JobSet {owner} failed ({ended.get('reason', '')})")
    if ended:
        waited = _since(str(ended.get("lastTransitionTime", "")), now)
        if waited < settings.release_grace_seconds:
            return Verdict(
                False,
                f"JobSet {owner} completed {waited:.0f}s ago; grace is {settings.release_grace_seconds}s",
            )
        return Verdict(True, f"JobSet {owner} completed")
    if is_suspended(jobset):
        checking = admission_check(jobset, settings, now)
        if checking:
            return Verdict(False, f"JobSet {owner} is suspended: {checking}")
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


def admission_check(jobset: dict[str, Any], settings: Settings, now: datetime.datetime) -> str:
    """Why a suspended JobSet's pools are needed for its Kueue admission check ("" if they are not):
    the check provisions them before Kueue admits it, for longer than SUSPEND_GRACE_SECONDS when GKE
    creates them in waves. Only a fresh record counts (the check refreshes it at every look), so a
    Workload the check no longer looks at (deactivated, deleted) gets the usual grace from then."""
    annotations = Meta.of(jobset).annotations
    state, _, stamp = str(annotations.get(labels.ADMISSION_CHECK, "")).partition("@")
    if not stamp.isdigit():
        return ""
    if state == "Retry":
        # The slices that landed wait for the requeued Workload: until Kueue may bring it back (the
        # stamp), plus the IDLE_POOL_SECONDS an idle slice may be kept for a queued JobSet.
        left = int(stamp) + settings.idle_pool_seconds - now.timestamp()
        return f"kept {left:.0f}s more for its Workload's retry after a stockout" if left > 0 else ""
    age = now.timestamp() - int(stamp)
    if state not in ("Pending", "Ready") or age >= settings.suspend_grace_seconds:
        return ""
    return f"its Workload's admission check is {state} ({age:.0f}s ago): its slices are being provisioned"


def idle_seconds(
    pool: NodePoolInfo, jobset: dict[str, Any] | None, settings: Settings, now: datetime.datetime
) -> float | None:
    """How long ``pool`` has been without an owner that needs it; None when nothing says (then the
    releaser stamps ``tpuprov.dev/idle-since`` on the pool so the next look knows)."""
    stamp = pool.labels.get(labels.IDLE_SINCE, "")
    if stamp.isdigit():
        return max(0.0, now.timestamp() - int(stamp))
    if jobset is not None and Meta.of(jobset).uid == pool.labels.get(labels.OWNER_UID, ""):
        ended = terminal_condition(jobset)
        if ended:
            return max(0.0, _since(str(ended.get("lastTransitionTime", "")), now))
        suspended = condition(jobset, "Suspended")
        if suspended:
            waited = _since(str(suspended.get("lastTransitionTime", "")), now)
            return max(0.0, waited - settings.suspend_grace_seconds)
    return None
