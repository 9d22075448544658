"""MultiKueue's placement: one worker's copy of a manager's Workload Ready, the others Pending, and a
shortage in the chosen worker moving the job on (the fakes play the manager and two workers)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core.settings import Settings
from shared.provisioning.admission.check import AdmissionChecker
from shared.provisioning.placement.multikueue import (
    REASON_CHOSEN,
    REASON_SHORT,
    SHORTAGES,
    choose,
    shortages,
)
from shared.provisioning.services import Services
from shared.tpu.jobsets import JobSet
from shared.tpu.workloads import MULTIKUEUE_ORIGIN_LABEL, PREBUILT_WORKLOAD
from tests.unit.provisioning.test_admission_check import workload

PROJECT = "p"
MANAGER = f"projects/{PROJECT}/locations/us-east5-b/clusters/manager"
WEST = f"projects/{PROJECT}/locations/us-west4-a/clusters/west"
CENTRAL = f"projects/{PROJECT}/locations/us-central1-a/clusters/central"
NOW = 1_800_000_000.0


class Peers:
    def __init__(self, kubes: dict[str, FakeKube]) -> None:
        self.kubes = kubes

    def paths(self) -> list[str]:
        return list(self.kubes)

    def kube(self, path: str) -> FakeKube | None:
        return self.kubes.get(path)


def settings_of(path: str) -> Settings:
    _, project, _, location, _, name = path.split("/")
    return Settings(
        unlimited_spending=True,
        project_id=project,
        location=location,
        cluster_name=name,
        multikueue_manager=MANAGER,
    )


@pytest.fixture
def fleet() -> dict[str, FakeKube]:
    kubes = {path: FakeKube() for path in (MANAGER, WEST, CENTRAL)}
    jobset = tpu_jobset("train", "default", replicas=2, accelerator="tpu-v5-lite-podslice", topology="2x4")
    original = workload(jobset)
    original["status"]["nominatedClusterNames"] = ["central", "west"]
    kubes[MANAGER].add_jobset(jobset, jobs=False)
    kubes[MANAGER].add_workload(original)
    for path in (WEST, CENTRAL):
        kubes[path].add_workload(worker_copy(original))
    return kubes


def worker_copy(original: dict[str, Any]) -> dict[str, Any]:
    """What cloneForCreate makes of the manager's Workload: no owner, the origin label, no status
    but the worker's own quota reservation and checks."""
    clone = copy.deepcopy(original)
    meta = clone["metadata"]
    meta.pop("ownerReferences")
    meta["labels"] = {MULTIKUEUE_ORIGIN_LABEL: "multikueue"}
    meta["uid"] = "copy-uid"
    clone["status"].pop("nominatedClusterNames", None)
    return clone


def checker(fleet: dict[str, FakeKube], path: str) -> AdmissionChecker:
    services = Services(settings_of(path), FakeGke(), fleet[path], peers=Peers(fleet), wall_clock=lambda: NOW)
    return AdmissionChecker(services)


def state(kube: FakeKube, name: str) -> dict[str, Any]:
    checks = kube.workloads[("default", name)]["status"]["admissionChecks"]
    return next(c for c in checks if c["name"] == "tpu-slices")


def wl_name(fleet: dict[str, FakeKube]) -> str:
    return next(iter(fleet[MANAGER].workloads))[1]


def test_the_first_worker_of_the_fleet_is_ready_the_other_waits_and_nothing_is_bought(
    fleet: dict[str, FakeKube],
) -> None:
    name = wl_name(fleet)
    central = checker(fleet, CENTRAL).handle("default", name)
    west = checker(fleet, WEST).handle("default", name)
    assert (west.state, central.state) == ("Ready", "Pending")
    assert "runs in west" in state(fleet[CENTRAL], name)["message"]
    assert "nothing is bought here" in state(fleet[CENTRAL], name)["message"]
    assert west.created == () and central.created == ()
    # The choice is told on the manager's Workload and JobSet, where their owner looks.
    told = [(e["kind"], e["reason"]) for e in fleet[MANAGER].events]
    assert told == [("Workload", REASON_CHOSEN), ("JobSet", REASON_CHOSEN)]
    assert "runs in west (us-west4-a)" in fleet[MANAGER].events[0]["message"]


def test_a_recent_shortage_moves_the_choice_to_the_next_worker(fleet: dict[str, FakeKube]) -> None:
    jobset = fleet[MANAGER].jobsets[("default", "train")]
    jobset["metadata"].setdefault("annotations", {})[SHORTAGES] = json.dumps({"west": "2027-01-15T08:00:00Z"})
    name = wl_name(fleet)
    assert checker(fleet, WEST).handle("default", name).state == "Pending"
    assert checker(fleet, CENTRAL).handle("default", name).state == "Ready"
    assert "west short" in state(fleet[CENTRAL], name)["message"]


def test_the_worker_multikueue_placed_it_in_is_kept(fleet: dict[str, FakeKube]) -> None:
    name = wl_name(fleet)
    original = fleet[MANAGER].workloads[("default", name)]
    original["status"].pop("nominatedClusterNames")
    original["status"]["clusterName"] = "central"
    assert checker(fleet, CENTRAL).handle("default", name).state == "Ready"
    assert checker(fleet, WEST).handle("default", name).state == "Pending"


def test_a_copy_whose_manager_workload_is_gone_waits_and_buys_nothing(fleet: dict[str, FakeKube]) -> None:
    name = wl_name(fleet)
    del fleet[MANAGER].workloads[("default", name)]
    result = checker(fleet, WEST).handle("default", name)
    assert result.state == "Pending" and "gone" in result.why


def test_without_a_manager_setting_a_copy_is_answered_as_any_workload(fleet: dict[str, FakeKube]) -> None:
    name = wl_name(fleet)
    services = Services(
        Settings(unlimited_spending=True, project_id=PROJECT, location="us-west4-a", cluster_name="west"),
        FakeGke(),
        fleet[WEST],
        peers=Peers(fleet),
    )
    result = AdmissionChecker(services).handle("default", name)
    assert result.state == "Ready" and "no TPU slices" in result.why


def test_a_shortage_in_the_chosen_worker_records_it_and_retries_the_copy(fleet: dict[str, FakeKube]) -> None:
    name = wl_name(fleet)
    original = fleet[MANAGER].workloads[("default", name)]
    original["status"].pop("nominatedClusterNames")
    original["status"]["clusterName"] = "west"
    # The JobSet MultiKueue created in west (SyncJob): the origin label, the Workload's name.
    remote = tpu_jobset("train", "default", replicas=2, accelerator="tpu-v5-lite-podslice", topology="2x4")
    remote["metadata"]["labels"] = {MULTIKUEUE_ORIGIN_LABEL: "multikueue"}
    remote["metadata"]["annotations"] = {PREBUILT_WORKLOAD: name}
    services = Services(settings_of(WEST), FakeGke(), fleet[WEST], peers=Peers(fleet), wall_clock=lambda: NOW)
    assert services.multikueue.short(JobSet.parse(remote), "GCE_STOCKOUT")
    assert state(fleet[WEST], name)["state"] == "Retry"
    manager_jobset = JobSet.parse(fleet[MANAGER].jobsets[("default", "train")])
    assert set(shortages(manager_jobset, NOW, 60)) == {"west"}
    assert [e["reason"] for e in fleet[MANAGER].events] == [REASON_SHORT, REASON_SHORT]
    # A JobSet of this cluster that MultiKueue did not create is not moved anywhere.
    del remote["metadata"]["labels"][MULTIKUEUE_ORIGIN_LABEL]
    assert not services.multikueue.short(JobSet.parse(remote), "GCE_STOCKOUT")


def test_choose_takes_the_fleet_order_and_skips_recent_shortages() -> None:
    assert choose(["a", "b"], {}).worker == "a"
    assert choose(["a", "b"], {"a": NOW}).worker == "b"
    # Short everywhere: the one short longest ago.
    assert choose(["a", "b"], {"a": NOW, "b": NOW - 60}).worker == "b"
    with pytest.raises(ValueError):
        choose([], {})


def test_shortages_forget_old_and_malformed_records() -> None:
    def jobset(value: str) -> JobSet:
        return JobSet.parse({"metadata": {"name": "j", "annotations": {SHORTAGES: value}}})

    record = json.dumps({"a": "2027-01-15T08:00:00Z", "b": "2020-01-01T00:00:00Z", "c": "soon"})
    assert set(shortages(jobset(record), NOW, 1800)) == {"a"}
    assert shortages(jobset("not json"), NOW, 1800) == {}
    assert shortages(jobset("[1]"), NOW, 1800) == {}
