"""``tpuprov status``'s admission-check section: the check as Kueue sees it, and its Workloads' states.

Golden files in ``tests/cli/golden`` (``UPDATE_GOLDEN=1`` rewrites them after an intended change).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tpuprov import admission

GOLDEN = Path(__file__).parent / "golden"
CHECK = "tpu-slices"


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


def _workload(name: str, check: dict[str, Any] | None, admitted: bool = False) -> dict[str, Any]:
    conditions = [{"type": "QuotaReserved", "status": "True"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True"})
    status: dict[str, Any] = {"conditions": conditions, "admission": {"clusterQueue": "checked"}}
    if check is not None:
        status["admissionChecks"] = [{"name": "other-check", "state": "Ready"}, {"name": CHECK, **check}]
    return {
        "metadata": {
            "name": f"jobset-{name}-0",
            "namespace": "team-a",
            "ownerReferences": [{"kind": "JobSet", "name": name, "uid": "u"}],
        },
        "status": status,
    }


WORKLOADS = [
    _workload("train", {"state": "Pending", "message": "pools ready 1/3"}),
    _workload(
        "big",
        {"state": "Retry", "message": "pools ready 3/4; could not provision ...", "requeueAfterSeconds": 300},
    ),
    _workload("done", {"state": "Ready", "message": "pools ready 2/2"}, admitted=True),
    _workload("plain", None),  # a queue without the check: not this section's business
]
ACTIVE = admission.CheckHealth(CHECK, exists=True, active=True, message="ok", queues=("checked",))


def test_the_section_lists_every_workload_carrying_the_check_with_its_state() -> None:
    rows = admission.workload_checks(WORKLOADS, CHECK)
    assert [(r.jobset, r.state, r.requeue_after, r.admitted) for r in rows] == [
        ("team-a/big", "Retry", 300, False),
        ("team-a/done", "Ready", None, True),
        ("team-a/train", "Pending", None, False),
    ]
    _golden("status-admission.txt", admission.render(ACTIVE, rows))
    doc = admission.document(ACTIVE, rows)
    _golden("status-admission.json", json.dumps(doc, indent=2, sort_keys=True) + "\n")


def test_a_check_nobody_keeps_active_any_more_is_said_with_the_queues_kueue_holds() -> None:
    # The product was removed: its reconcile no longer keeps the check Active.
    gone = admission.CheckHealth(CHECK, exists=True, active=False, message="stale", queues=("a", "b"))
    text = admission.render(gone, [])
    assert text == (
        "\nAdmissionCheck tpu-slices is NOT Active (stale): Kueue keeps ClusterQueue(s) a, b inactive; "
        "nothing keeps the check Active (tpuprov doctor)\n"
    )
    missing = admission.CheckHealth(CHECK, exists=False, active=False, message="", queues=("a",))
    assert "does not exist" in admission.render(missing, [])


def test_a_cluster_that_never_used_the_check_gets_no_section() -> None:
    unused = admission.CheckHealth(CHECK, exists=False, active=False, message="", queues=())
    rows = admission.workload_checks([_workload("plain", None)], CHECK)
    assert rows == [] and admission.render(unused, rows) == "" and admission.document(unused, rows) is None
