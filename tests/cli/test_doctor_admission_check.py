"""``tpuprov doctor``'s admission-check line: the product's Kueue AdmissionCheck as Kueue sees it."""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.errors import NotFoundError
from tpuprov.doctor.checks import Check, check_admission_check
from tpuprov.doctor.readers import admission_check_view
from tpuprov.doctor.views import AdmissionCheckView

NAME = "admission check"


@pytest.mark.parametrize(
    ("view", "want"),
    [
        (
            AdmissionCheckView("tpu-slices", exists=False, active=False, message="", queues=()),
            Check(NAME, True, "tpu-slices not used: queued JobSets get their slices by the pending-pod path"),
        ),
        (
            AdmissionCheckView("tpu-slices", exists=True, active=True, message="ok", queues=("cq",)),
            Check(NAME, True, "tpu-slices Active for ClusterQueue(s) cq"),
        ),
        (
            AdmissionCheckView("tpu-slices", exists=False, active=False, message="", queues=("cq",)),
            Check(
                NAME,
                False,
                "ClusterQueue(s) cq name AdmissionCheck tpu-slices, which does not exist, so Kueue admits "
                "nothing there: apply a queue configuration with tpuSlicesCheck (tpuprov publish kueue)",
            ),
        ),
        # The product was removed from the cluster: nobody keeps the check Active any more.
        (
            AdmissionCheckView("tpu-slices", exists=True, active=False, message="stale", queues=("a", "b")),
            Check(
                NAME,
                False,
                "tpu-slices is not Active (stale), so Kueue keeps ClusterQueue(s) a, b inactive: the "
                "reconcile function keeps it Active; check that it runs (Cloud Scheduler) and can reach "
                "the cluster, or remove tpuSlicesCheck from the queue configuration",
            ),
        ),
    ],
)
def test_admission_check(view: AdmissionCheckView, want: Check) -> None:
    assert check_admission_check(view) == want


class Objects:
    """An ``ObjectAPI`` over a dict; 404 for what it does not hold (Kueue not installed: everything)."""

    def __init__(self, objects: dict[tuple[str, str], Any]) -> None:
        self.objects = objects

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        if (kind, name) not in self.objects:
            raise NotFoundError(f"404 {kind} {name}")
        return dict(self.objects[(kind, name)])

    def list_objects(self, api_version: str, kind: str, namespace: str = "", label_selector: str = "") -> Any:
        found = [o for (k, _), o in self.objects.items() if k == kind]
        if not self.objects:
            raise NotFoundError(f"404 the server could not find the requested resource ({kind})")
        return found


def test_the_view_reads_the_check_and_the_queues_that_name_it() -> None:
    strategy = {"admissionChecksStrategy": {"admissionChecks": [{"name": "tpu-slices", "onFlavors": ["f"]}]}}
    objects = Objects(
        {
            ("ClusterQueue", "checked"): {"metadata": {"name": "checked"}, "spec": strategy},
            ("ClusterQueue", "plain"): {"metadata": {"name": "plain"}, "spec": {}},
            ("AdmissionCheck", "tpu-slices"): {
                "status": {"conditions": [{"type": "Active", "status": "False", "message": "gone"}]}
            },
        }
    )
    assert admission_check_view(objects, "tpu-slices") == AdmissionCheckView(
        "tpu-slices", exists=True, active=False, message="gone", queues=("checked",)
    )
    # Kueue not installed: no CRDs, nothing uses the check.
    assert admission_check_view(Objects({}), "tpu-slices") == AdmissionCheckView(
        "tpu-slices", exists=False, active=False, message="", queues=()
    )
