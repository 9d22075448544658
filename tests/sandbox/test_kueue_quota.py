"""The simulated Kueue's admission pass as a pure function: one whole plan per row.

The rows are about preemption in progress: Kueue keeps an evicted Workload's quota until its job
has stopped, picks Workloads already being evicted before any other candidate, and does not evict
them a second time, so a preemptor waits for its victims rather than taking more of them.
"""

from __future__ import annotations

import dataclasses

import pytest

from sandbox.cluster.kueue_quota import FlavorQuota, Queue, Workload, plan

FLAVOR = "v5e-2x4"
CQ = Queue("cq", (FlavorQuota(FLAVOR, 16),), within="LowerPriority")


def _wl(name: str, priority: int, *, admitted: int = 0, evicting: bool = False, chips: int = 8) -> Workload:
    return Workload(
        key=f"default/{name}",
        uid=f"uid-{name}",
        job_uid=f"job-{name}",
        queue="cq",
        priority=priority,
        created=("2026-11-23T00:00:00Z", admitted or 100),
        chips=chips,
        pod_set="slice",
        flavor=FLAVOR if admitted else None,
        admitted_order=admitted,
        evicting=evicting,
    )


@dataclasses.dataclass(frozen=True)
class Row:
    workloads: tuple[Workload, ...]
    admitted: tuple[str, ...]  # workload names admitted by this pass
    preempted: tuple[str, ...]  # victims evicted by this pass
    pending: str  # what the preemptor's pending message ends with ("" when none)


ROWS = {
    "room-left-admits": Row(
        (_wl("a", 100, admitted=1), _wl("high", 1000)),
        admitted=("high",),
        preempted=(),
        pending="",
    ),
    "full-queue-preempts-the-lowest-priority": Row(
        (_wl("low", 100, admitted=1), _wl("lower", 50, admitted=2), _wl("high", 1000)),
        admitted=(),
        preempted=("lower",),
        pending="Pending the preemption of 1 workload(s)",
    ),
    "a-victim-still-stopping-holds-its-quota-and-is-not-evicted-again": Row(
        (_wl("low", 100, admitted=1), _wl("lower", 50, admitted=2, evicting=True), _wl("high", 1000)),
        admitted=(),
        preempted=(),
        pending="Pending the preemption of 1 workload(s)",
    ),
    "a-workload-already-being-evicted-is-taken-before-a-lower-priority-one": Row(
        (_wl("low", 100, admitted=1, evicting=True), _wl("lower", 50, admitted=2), _wl("high", 1000)),
        admitted=(),
        preempted=(),
        pending="Pending the preemption of 1 workload(s)",
    ),
    "a-second-preemptor-takes-a-further-victim": Row(
        (
            _wl("low", 100, admitted=1),
            _wl("lower", 50, admitted=2, evicting=True),
            _wl("high", 1000, chips=16),
        ),
        admitted=(),
        preempted=("low",),
        pending="Pending the preemption of 2 workload(s)",
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
def test_one_admission_pass(row: Row) -> None:
    workloads = [dataclasses.replace(w) for w in row.workloads]
    result = plan({"cq": CQ}, {FLAVOR: {}}, workloads)
    assert tuple(wl.key.split("/")[1] for wl, _ in result.admit) == row.admitted
    assert tuple(p.victim.key.split("/")[1] for p in result.preempt) == row.preempted
    assert all(p.preemptor.key == "default/high" for p in result.preempt)
    message = result.pending.get("default/high", "")
    assert message.endswith(row.pending) if row.pending else message == ""
