"""MultiKueue's placement: one worker's copy of a manager's Workload Ready, the others Pending, and a
shortage in the chosen worker moving the job on (the fakes play the manager and two workers)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.compute import FakeReservations
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.settings import Settings
from shared.provisioning.admission.check import AdmissionChecker
from shared.provisioning.create.reservations import ReservationLook
from shared.provisioning.placement.multikueue import (
    PLACEMENT,
    REASON_CHOSEN,
    REASON_SHORT,
    SHORTAGES,
    choose,
    shortages,
)
from shared.provisioning.placement.outlook import (
    CAPACITY_SHORT,
    shortages_of,
    with_shortage,
    without_shortage,
)
from shared.provisioning.services import Services
from shared.tpu.jobsets import JobSet
from shared.tpu.nodepools import NodePoolInfo
from shared.tpu.reservations import ReservationView
from shared.tpu.workloads import MULTIKUEUE_ORIGIN_LABEL, PREBUILT_WORKLOAD
from tests.unit.provisioning.test_admission_check import workload

PROJECT = "p"
MANAGER = f"projects/{PROJECT}/locations/us-east5-b/clusters/manager"
WEST = f"projects/{PROJECT}/locations/us-west4-a/clusters/west"
CENTRAL = f"projects/{PROJECT}/locations/us-central1-a/clusters/central"
NOW = 1_800_000_000.0


class Peers:
    """The fleet: each cluster's fake Kubernetes, and its own services (settings, GKE, reservations)."""

    def __init__(self, kubes: dict[str, FakeKube], compute: FakeReservations | None = None) -> None:
        self.kubes = kubes
        self.compute = compute or FakeReservations()
        self.policies: dict[str, str] = {}  # path -> its CAPACITY_POLICY (per-cluster settings)

    def paths(self) -> list[str]:
        return list(self.kubes)

    def kube(self, path: str) -> FakeKube | None:
        return self.kubes.get(path)

    def capacity(self, path: str) -> Services | None:
        if path not in self.kubes:
            return None
        settings = settings_of(path).with_overrides(capacity_policy=self.policies.get(path, ""))
        look = ReservationLook(settings, self.compute)
        zone = settings.location
        return Services(settings, FakeGke(locations=(zone,)), self.kubes[path], reservations=look, peers=self)


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
    for worker in ("west", "central"):  # the manager's MultiKueueClusters, named as the workers
        kubes[MANAGER].multikueue_clusters[worker] = {"metadata": {"name": worker, "resourceVersion": "1"}}
    jobset = tpu_jobset("train", "default", replicas=2, accelerator="tpu-v5-lite-podslice", topology="2x4")
    original = workload(jobset)
    original["status"]["nominatedClusterNames"] = ["central", "west"]
    kubes[MANAGER].add_jobset(jobset, jobs=False)
    kubes[MANAGER].add_workload(original)
    for path in (WEST, CENTRAL):
        kubes[path].add_workload(worker_copy(original))
        kubes[path].flavors["vlp"] = {"metadata": {"name": "vlp"}, "spec": {"nodeLabels": {}}}
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


def checker(fleet: dict[str, FakeKube], path: str, peers: Peers | None = None) -> AdmissionChecker:
    services = Services(
        settings_of(path), FakeGke(), fleet[path], peers=peers or Peers(fleet), wall_clock=lambda: NOW
    )
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
    assert "not west: capacity for this job was short there" in state(fleet[CENTRAL], name)["message"]


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


SHAPE = "tpu-v5-lite-podslice 2x4"  # the fixture's JobSet: two slices of 2 VMs (ct5lp-hightpu-4t)


def manager_annotations(fleet: dict[str, FakeKube]) -> dict[str, str]:
    return dict(fleet[MANAGER].jobsets[("default", "train")]["metadata"].get("annotations") or {})


def short_on_record(fleet: dict[str, FakeKube], worker: str, options: list[str], at: str) -> None:
    annotations = fleet[MANAGER].multikueue_clusters[worker]["metadata"].setdefault("annotations", {})
    annotations[CAPACITY_SHORT] = json.dumps({SHAPE: {"at": at, "options": options}})


def test_the_shape_short_in_the_first_worker_on_the_fleets_record_sends_the_job_to_the_next(
    fleet: dict[str, FakeKube],
) -> None:
    # Another job of the shape ran out of west's on-demand capacity a minute ago.
    short_on_record(fleet, "west", ["on-demand@us-west4-a"], "2027-01-15T07:59:00Z")
    name = wl_name(fleet)
    assert checker(fleet, WEST).handle("default", name).state == "Pending"
    assert checker(fleet, CENTRAL).handle("default", name).state == "Ready"
    said = fleet[MANAGER].events[0]["message"]
    assert (
        said.startswith("runs in central (us-central1-a)")
        and f"not west: {SHAPE} was short there 60s" in said
    )
    # The choice is recorded on the manager's JobSet for this Workload.
    assert json.loads(manager_annotations(fleet)[PLACEMENT])["worker"] == "central"


def test_a_record_of_another_shape_or_of_fewer_options_does_not_move_the_job(
    fleet: dict[str, FakeKube],
) -> None:
    annotations = fleet[MANAGER].multikueue_clusters["west"]["metadata"].setdefault("annotations", {})
    annotations[CAPACITY_SHORT] = json.dumps(
        {"tpu-v6e-slice 4x4": {"at": "2027-01-15T07:59:00Z", "options": ["on-demand@us-west4-a"]}}
    )
    peers = Peers(fleet)
    name = wl_name(fleet)
    assert checker(fleet, WEST, peers).handle("default", name).state == "Ready"
    # West's policy also allows Spot VMs, which no job of the shape tried there.
    del fleet[MANAGER].jobsets[("default", "train")]["metadata"]["annotations"][PLACEMENT]
    short_on_record(fleet, "west", ["on-demand@us-west4-a"], "2027-01-15T07:59:00Z")
    peers.policies[WEST] = "on-demand,spot"
    state(fleet[WEST], name)["state"] = "Pending"  # a new copy's check, answered afresh
    assert checker(fleet, WEST, peers).handle("default", name).state == "Ready"


def test_a_reservation_with_room_for_every_slice_wins_over_the_fleets_order(
    fleet: dict[str, FakeKube],
) -> None:
    compute = FakeReservations()
    peers = Peers(fleet, compute)
    peers.policies[CENTRAL] = "reservation:res-c,on-demand"
    compute.add(ReservationView("res-c", PROJECT, "us-central1-a", "ct5lp-hightpu-4t", 4, 0))
    name = wl_name(fleet)
    assert checker(fleet, WEST, peers).handle("default", name).state == "Pending"
    assert checker(fleet, CENTRAL, peers).handle("default", name).state == "Ready"
    said = fleet[MANAGER].events[0]["message"]
    assert "reservation res-c: 4 free VMs, the slice takes 2; room for all 2 slices" in said, said


def test_a_reservation_with_room_for_one_slice_of_two_is_not_preferred(fleet: dict[str, FakeKube]) -> None:
    compute = FakeReservations()
    peers = Peers(fleet, compute)
    peers.policies[CENTRAL] = "reservation:res-c,on-demand"
    compute.add(ReservationView("res-c", PROJECT, "us-central1-a", "ct5lp-hightpu-4t", 4, 1))
    name = wl_name(fleet)
    assert checker(fleet, WEST, peers).handle("default", name).state == "Ready"


def test_a_worker_whose_only_reservation_is_full_is_passed_over(fleet: dict[str, FakeKube]) -> None:
    compute = FakeReservations()
    peers = Peers(fleet, compute)
    peers.policies[WEST] = "reservation:res-w"
    compute.add(ReservationView("res-w", PROJECT, "us-west4-a", "ct5lp-hightpu-4t", 4, 4))
    name = wl_name(fleet)
    assert checker(fleet, WEST, peers).handle("default", name).state == "Pending"
    assert checker(fleet, CENTRAL, peers).handle("default", name).state == "Ready"
    assert "not west: reservation res-w: 0 free VMs of 4" in fleet[MANAGER].events[0]["message"]


def test_a_policy_that_cannot_place_the_slice_in_a_worker_puts_it_last(fleet: dict[str, FakeKube]) -> None:
    peers = Peers(fleet)
    peers.policies[WEST] = "on-demand@us-west4-b"  # not a zone of west's cluster
    name = wl_name(fleet)
    assert checker(fleet, WEST, peers).handle("default", name).state == "Pending"
    assert checker(fleet, CENTRAL, peers).handle("default", name).state == "Ready"
    assert "its capacity policy cannot place slice" in fleet[MANAGER].events[0]["message"]


def test_the_recorded_choice_holds_when_what_the_other_worker_reads_changes(
    fleet: dict[str, FakeKube],
) -> None:
    name = wl_name(fleet)
    assert checker(fleet, WEST).handle("default", name).state == "Ready"
    # West's shortage reaches the record between the two workers' answers: central keeps to the
    # recorded choice, so exactly one copy is Ready.
    short_on_record(fleet, "west", ["on-demand@us-west4-a"], "2027-01-15T07:59:59Z")
    assert checker(fleet, CENTRAL).handle("default", name).state == "Pending"
    assert [e["reason"] for e in fleet[MANAGER].events] == [REASON_CHOSEN, REASON_CHOSEN]


def test_a_concurrent_choice_is_read_back_not_overwritten(fleet: dict[str, FakeKube]) -> None:
    name = wl_name(fleet)
    manager = fleet[MANAGER]
    theirs = json.dumps({"workload": "wl-uid", "worker": "central", "why": "theirs", "at": "x"})

    def central_writes_first(namespace: str, jobset: str) -> None:
        manager.before_annotate = None
        manager.annotate_jobset(namespace, jobset, {PLACEMENT: theirs}, "", "central's check")

    manager.before_annotate = central_writes_first
    assert checker(fleet, WEST).handle("default", name).state == "Pending"
    assert manager_annotations(fleet)[PLACEMENT] == theirs


def test_a_recorded_worker_no_longer_nominated_is_chosen_again(fleet: dict[str, FakeKube]) -> None:
    name = wl_name(fleet)
    assert checker(fleet, WEST).handle("default", name).state == "Ready"
    # MultiKueue lost west: the manager nominates central alone now.
    fleet[MANAGER].workloads[("default", name)]["status"]["nominatedClusterNames"] = ["central"]
    assert checker(fleet, CENTRAL).handle("default", name).state == "Ready"
    assert json.loads(manager_annotations(fleet)[PLACEMENT])["worker"] == "central"


def test_a_shortage_goes_on_the_fleets_record_and_clears_the_choice(fleet: dict[str, FakeKube]) -> None:
    name = wl_name(fleet)
    assert checker(fleet, WEST).handle("default", name).state == "Ready"
    original = fleet[MANAGER].workloads[("default", name)]
    original["status"]["clusterName"] = "west"
    remote = tpu_jobset("train", "default", replicas=2, accelerator="tpu-v5-lite-podslice", topology="2x4")
    remote["metadata"]["labels"] = {MULTIKUEUE_ORIGIN_LABEL: "multikueue"}
    remote["metadata"]["annotations"] = {PREBUILT_WORKLOAD: name}
    services = Services(settings_of(WEST), FakeGke(), fleet[WEST], peers=Peers(fleet), wall_clock=lambda: NOW)
    assert services.multikueue.short(JobSet.parse(remote), "GCE_STOCKOUT", "slice", ["on-demand@us-west4-a"])
    assert PLACEMENT not in manager_annotations(fleet)
    record = fleet[MANAGER].multikueue_clusters["west"]["metadata"]["annotations"]
    assert {k: v.options for k, v in shortages_of(record, NOW, 60).items()} == {
        SHAPE: ("on-demand@us-west4-a",)
    }


def test_the_fleets_record_merges_options_and_forgets_old_and_bad_entries() -> None:
    old = json.dumps(
        {
            SHAPE: {"at": "2027-01-15T07:59:00Z", "options": ["spot@z"]},
            "tpu-v6e-slice 4x4": {"at": "2020-01-01T00:00:00Z", "options": ["on-demand@z"]},
            "bad": {"at": "soon", "options": []},
            "worse": [1],
        }
    )
    merged = json.loads(with_shortage({CAPACITY_SHORT: old}, SHAPE, ["on-demand@z"], NOW, 1800))
    assert merged == {SHAPE: {"at": "2027-01-15T08:00:00Z", "options": ["on-demand@z", "spot@z"]}}
    assert shortages_of({CAPACITY_SHORT: "not json"}, NOW, 1800) == {}
    # A stamp in the future is an edit, not a record.
    future = json.dumps({SHAPE: {"at": "2027-01-16T08:00:00Z", "options": ["spot@z"]}})
    assert shortages_of({CAPACITY_SHORT: future}, NOW, 1800) == {}


def up_pool(status: str = "RUNNING", topology: str = "2x4") -> NodePoolInfo:
    """A pool of the fixture's shape as GKE lists it once its create ended."""
    managed = {labels.MANAGED_BY: labels.MANAGED_BY_VALUE}
    return NodePoolInfo("train-slice-0", status, "ct5lp-hightpu-4t", 2, managed, tpu_topology=topology)


def test_a_pool_of_the_shape_up_in_the_worker_removes_only_that_shapes_shortage_there(
    fleet: dict[str, FakeKube],
) -> None:
    other = "tpu-v6e-slice 4x4"
    annotations = fleet[MANAGER].multikueue_clusters["west"]["metadata"].setdefault("annotations", {})
    annotations[CAPACITY_SHORT] = json.dumps(
        {
            SHAPE: {"at": "2027-01-15T07:59:00Z", "options": ["on-demand@us-west4-a"]},
            other: {"at": "2027-01-15T07:58:00Z", "options": ["on-demand@us-west4-a"]},
        }
    )
    gke = FakeGke()
    gke.pools[WEST] = {"train-slice-0": up_pool()}
    west = Services(settings_of(WEST), gke, fleet[WEST], peers=Peers(fleet), wall_clock=lambda: NOW)
    # A pool in ERROR (a stockout at the end of the create) delivered nothing: the record stays.
    assert not west.multikueue.capacity_back(up_pool("ERROR"))
    assert set(shortages_of(annotations, NOW, 1800)) == {SHAPE, other}
    assert west.multikueue.pool_up("train-slice-0")
    left = fleet[MANAGER].multikueue_clusters["west"]["metadata"]["annotations"]
    assert set(shortages_of(left, NOW, 1800)) == {other}
    # The next job of the shape is placed in west again, first in the fleet's order.
    name = wl_name(fleet)
    assert checker(fleet, WEST).handle("default", name).state == "Ready"
    # Nothing left to remove: no write.
    version = fleet[MANAGER].multikueue_clusters["west"]["metadata"]["resourceVersion"]
    assert not west.multikueue.pool_up("train-slice-0")
    assert fleet[MANAGER].multikueue_clusters["west"]["metadata"]["resourceVersion"] == version


def test_the_last_shortage_removed_removes_the_annotation() -> None:
    record = with_shortage({}, SHAPE, ["on-demand@z"], NOW, 1800)
    assert without_shortage({CAPACITY_SHORT: record}, SHAPE, NOW, 1800) is None
