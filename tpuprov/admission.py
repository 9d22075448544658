"""``tpuprov status``'s admission-check section: the product's Kueue AdmissionCheck and its Workloads.

Pure functions over what the Kubernetes API returns (Workload JSON) and what doctor's reader says
of the AdmissionCheck (passed in as plain values: the CLI's features do not import each other).
The section appears only where the check matters: when it exists, when a ClusterQueue names it, or
when a Workload carries its state. A check that is not Active is said first, because Kueue then
keeps every ClusterQueue using it inactive (what a cluster the product was removed from looks like).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tpuprov import output


@dataclasses.dataclass(frozen=True)
class CheckHealth:
    """The AdmissionCheck as Kueue sees it (doctor's ``AdmissionCheckView`` fields)."""

    name: str
    exists: bool
    active: bool
    message: str
    queues: tuple[str, ...]

    def line(self) -> str:
        """One sentence: Active for which queues, or why Kueue admits nothing through them."""
        queues = ", ".join(self.queues) or "none"
        if not self.exists:
            return (
                f"AdmissionCheck {self.name} does not exist; ClusterQueue(s) {queues} name it, so Kueue "
                "admits nothing there (tpuprov doctor)"
            )
        if not self.active:
            return (
                f"AdmissionCheck {self.name} is NOT Active ({self.message}): Kueue keeps ClusterQueue(s) "
                f"{queues} inactive; nothing keeps the check Active (tpuprov doctor)"
            )
        return f"AdmissionCheck {self.name} Active for ClusterQueue(s) {queues}"


@dataclasses.dataclass(frozen=True)
class WorkloadCheck:
    """One Workload that carries the product's check state."""

    workload: str  # namespace/name
    jobset: str  # namespace/name of the JobSet owning it, "-" when none
    queue: str  # the ClusterQueue that reserved its quota, "-" while none has
    state: str  # Pending | Ready | Retry | Rejected (Kueue's check states)
    message: str
    requeue_after: int | None  # Retry's requeueAfterSeconds
    admitted: bool


def _true(workload: Mapping[str, Any], kind: str) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and str(c.get("status")) == "True" for c in conditions)


def workload_checks(workloads: Iterable[Mapping[str, Any]], check: str) -> list[WorkloadCheck]:
    """The Workloads whose ``status.admissionChecks`` name ``check``, sorted by namespace/name."""
    rows = []
    for wl in workloads:
        status = wl.get("status") or {}
        mine = next((c for c in status.get("admissionChecks") or [] if c.get("name") == check), None)
        if mine is None:
            continue
        meta = wl.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "JobSet"), None)
        requeue = mine.get("requeueAfterSeconds")
        rows.append(
            WorkloadCheck(
                workload=f"{namespace}/{meta.get('name', '')}",
                jobset=f"{namespace}/{owner['name']}" if owner else "-",
                queue=str((status.get("admission") or {}).get("clusterQueue") or "-"),
                state=str(mine.get("state") or "Pending"),
                message=str(mine.get("message") or ""),
                requeue_after=int(requeue) if isinstance(requeue, int) else None,
                admitted=_true(wl, "Admitted"),
            )
        )
    return sorted(rows, key=lambda r: r.workload)


def relevant(health: CheckHealth, rows: Sequence[WorkloadCheck]) -> bool:
    """Whether the section says anything: a cluster that never used the check gets none."""
    return health.exists or bool(health.queues) or bool(rows)


def render(health: CheckHealth, rows: Sequence[WorkloadCheck]) -> str:
    """The section as text: the check's line, then one row per Workload (blank when irrelevant)."""
    if not relevant(health, rows):
        return ""
    text = "\n" + health.line() + "\n"
    if rows:
        body = [
            (
                r.workload,
                r.jobset,
                r.queue,
                r.state + (f" ({r.requeue_after}s)" if r.requeue_after is not None else ""),
                "yes" if r.admitted else "no",
                r.message or "-",
            )
            for r in rows
        ]
        text += output.table(("WORKLOAD", "JOBSET", "CLUSTERQUEUE", "CHECK", "ADMITTED", "MESSAGE"), body)
    return text


def document(health: CheckHealth, rows: Sequence[WorkloadCheck]) -> dict[str, Any] | None:
    """``-o json|yaml``: the check and its Workloads (None when irrelevant)."""
    if not relevant(health, rows):
        return None
    return {
        **dataclasses.asdict(health),
        "queues": list(health.queues),
        "workloads": [dataclasses.asdict(r) for r in rows],
    }
