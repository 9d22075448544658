"""The release service: delete a JobSet's TPU pools once the JobSet is really over.

An event only nominates pools; the Kubernetes API decides. A pool is deleted when its owning
JobSet is gone, terminal (Completed/Failed), or has been replaced by a new JobSet of the same name
(uid mismatch). A running JobSet never loses a pool, whatever event arrives.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Iterable
from typing import Any

from shared.cloud.ports import KubeAPI, NodePoolAPI
from shared.core import labels, logs
from shared.core.errors import NotFoundError, RejectedError, TransientError
from shared.core.settings import Settings
from shared.tpu.jobsets import condition
from shared.tpu.nodepools import STATUS_STOPPING, NodePoolInfo

log = logs.get("release")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether one pool may go, and why."""

    delete: bool
    why: str


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


class Releaser:
    """Deletes the pools of finished or vanished JobSets, after checking the Kubernetes API."""

    def __init__(self, settings: Settings, gke: NodePoolAPI, kube: KubeAPI) -> None:
        self.settings = settings
        self.gke = gke
        self.kube = kube

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
        jobsets: dict[str, dict[str, Any] | None] = {}
        for owner in sorted({p.labels.get(labels.OWNER_NAME, "") for p in pools}):
            try:
                jobsets[owner] = self.kube.get_jobset(namespace, owner)
            except NotFoundError:
                jobsets[owner] = None
        now = datetime.datetime.now(tz=datetime.UTC)
        deleted = self.delete_pools(
            ((p, judge(p, jobsets[p.labels.get(labels.OWNER_NAME, "")], self.settings, now)) for p in pools),
            trigger,
        )
        for owner, jobset in jobsets.items():
            mine = [p for p in deleted if p.labels.get(labels.OWNER_NAME) == owner]
            if jobset is not None and mine:
                names = ", ".join(p.name for p in mine)
                self.kube.record_event(
                    {
                        "apiVersion": f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}",
                        "kind": "JobSet",
                        **jobset,
                    },
                    labels.REASON_RELEASED,
                    f"released node pools {names}: {trigger}",
                )
        return [p.name for p in deleted]

    def delete_pools(
        self, verdicts: Iterable[tuple[NodePoolInfo, Verdict]], trigger: str
    ) -> list[NodePoolInfo]:
        """Delete each pool whose verdict allows it; 404 counts as deleted, transient errors raise last."""
        deleted: list[NodePoolInfo] = []
        retry: list[str] = []
        for pool, verdict in verdicts:
            fields = {"pool": pool.name, "jobset": _owner(pool)}
            if not verdict.delete:
                logs.decision(log, "release.kept", f"kept {pool.name}: {verdict.why}", **fields)
                continue
            if pool.status == STATUS_STOPPING:
                logs.decision(log, "release.stopping", f"{pool.name} is already being deleted", **fields)
                continue
            why = f"{verdict.why} ({trigger})"
            try:
                self.gke.delete_node_pool(self.settings.cluster_path, pool.name, why)
            except NotFoundError:
                logs.decision(log, "release.gone", f"{pool.name} was already deleted", **fields)
                continue
            except RejectedError as exc:
                logs.decision(
                    log,
                    "release.rejected",
                    f"GKE refused to delete {pool.name}: {exc.why}",
                    logging.ERROR,
                    **fields,
                )
                continue
            except TransientError as exc:
                retry.append(f"{pool.name}: {exc.why}")
                logs.decision(
                    log,
                    "release.retry",
                    f"delete {pool.name} must be retried: {exc.why}",
                    logging.WARNING,
                    **fields,
                )
                continue
            deleted.append(pool)
            logs.decision(log, "release.deleted", f"deleting {pool.name}: {why}", **fields)
        if retry:
            raise TransientError("; ".join(retry))
        return deleted


def _owner(pool: NodePoolInfo) -> str:
    return f"{pool.labels.get(labels.OWNER_NAMESPACE, '')}/{pool.labels.get(labels.OWNER_NAME, '')}"
