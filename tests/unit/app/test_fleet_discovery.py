"""Clusters joining the fleet by a GKE resource label (FLEET_PROJECTS, FLEET_LABEL): one listing per
project per FLEET_DISCOVERY_SECONDS, a failed listing never drops a served cluster, zones GKE
could not answer for keep their members, and a project without a listing redelivers.

GKE is the in-memory fake of the product's port (its ``listings`` are what ``list_clusters``
answers); the wire-level test with the GKE emulator and IAM is tests/functions/test_fleet.py.
"""

from __future__ import annotations

import json
import logging

import pytest

from sandbox.testing.fakes import FakeGke
from shared.app.discovery import FleetDirectory
from shared.app.entry import Runtime
from shared.core.errors import TransientError
from shared.core.settings import Settings
from shared.tpu.nodepools import ClusterListing, ListedCluster

LABELLED = "projects/team-b-proj/locations/us-east5/clusters/train"
PLAIN = "projects/team-b-proj/locations/us-east5-b/clusters/notebooks"
ELSEWHERE = "projects/team-c-proj/locations/us-east5/clusters/train"
ON = (("tpuprov", "enabled"),)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def listing(
    *clusters: tuple[str, tuple[tuple[str, str], ...]], missing: tuple[str, ...] = ()
) -> ClusterListing:
    return ClusterListing(tuple(ListedCluster(path, labels) for path, labels in clusters), missing)


def directory(gke: FakeGke, clock: Clock, **settings: object) -> FleetDirectory:
    values: dict[str, object] = {"fleet_projects": ("team-b-proj",), "fleet_discovery_seconds": 60}
    values.update(settings)
    return FleetDirectory(Settings(**values), lambda: gke, clock)  # type: ignore[arg-type]


def test_a_labelled_cluster_is_a_member_and_one_listing_answers_for_a_ttl() -> None:
    gke, clock = FakeGke(), Clock()
    gke.listings["team-b-proj"] = listing((LABELLED, ON), (PLAIN, (("tpuprov", "disabled"),)))
    fleet = directory(gke, clock)
    assert fleet.labelled(LABELLED) and not fleet.labelled(PLAIN)
    clock.now += 59
    assert fleet.labelled(LABELLED) and not fleet.labelled(PLAIN)
    assert gke.count("list_clusters") == 1  # every answer inside the TTL from one listing


def test_a_cluster_labelled_later_joins_within_the_ttl_and_leaves_when_unlabelled() -> None:
    gke, clock = FakeGke(), Clock()
    gke.listings["team-b-proj"] = listing((LABELLED, ON), (PLAIN, ()))
    fleet = directory(gke, clock)
    assert not fleet.labelled(PLAIN)
    gke.listings["team-b-proj"] = listing((LABELLED, ()), (PLAIN, ON))
    assert not fleet.labelled(PLAIN)  # still the old listing
    clock.now += 60
    assert fleet.labelled(PLAIN) and not fleet.labelled(LABELLED)
    assert fleet.members() == [PLAIN]


def test_a_fresh_question_lists_now() -> None:
    gke, clock = FakeGke(), Clock()
    gke.listings["team-b-proj"] = listing((LABELLED, ON))
    fleet = directory(gke, clock)
    assert not fleet.labelled(PLAIN)
    gke.listings["team-b-proj"] = listing((LABELLED, ON), (PLAIN, ON))  # created labelled
    assert fleet.labelled(PLAIN, fresh=True)
    assert gke.count("list_clusters") == 2


def test_a_cluster_of_another_project_is_decided_without_a_call() -> None:
    gke, clock = FakeGke(), Clock()
    fleet = directory(gke, clock)
    assert not fleet.labelled(ELSEWHERE) and not fleet.labelled(ELSEWHERE, fresh=True)
    assert gke.calls == []


def test_gke_failing_keeps_the_last_listing_answering(caplog: pytest.LogCaptureFixture) -> None:
    gke, clock = FakeGke(), Clock()
    gke.listings["team-b-proj"] = listing((LABELLED, ON))
    fleet = directory(gke, clock)
    assert fleet.labelled(LABELLED)
    clock.now += 61
    gke.fail("list_clusters", "unavailable")
    with caplog.at_level(logging.WARNING):
        assert fleet.labelled(LABELLED)  # a blip does not drop a served cluster
    assert "goes on answering" in caplog.text
    assert fleet.labelled(LABELLED) and gke.count("list_clusters") == 3  # asked again next time


def test_no_listing_yet_redelivers_and_a_sweep_goes_on_without_the_project() -> None:
    gke, clock = FakeGke(), Clock()
    fleet = directory(gke, clock, fleet_projects=("team-b-proj", "team-c-proj"))
    gke.listings["team-c-proj"] = listing((ELSEWHERE, ON))
    gke.fail("list_clusters", "unavailable")
    with pytest.raises(TransientError, match="cannot list the clusters of fleet project team-b-proj"):
        fleet.labelled(LABELLED)
    gke.fail("list_clusters", "unavailable")
    assert fleet.members() == [ELSEWHERE]  # team-b-proj unlisted this time, team-c-proj swept


def test_zones_gke_could_not_answer_for_keep_their_members() -> None:
    gke, clock = FakeGke(), Clock()
    gke.listings["team-b-proj"] = listing((LABELLED, ON), (PLAIN, ON))
    fleet = directory(gke, clock)
    assert fleet.members() == sorted([LABELLED, PLAIN])
    clock.now += 61
    # us-east5-b did not answer: the regional us-east5 cluster (whose zones include it) and the
    # zonal one there may be missing from the list without having left.
    gke.listings["team-b-proj"] = listing(missing=("us-east5-b",))
    assert fleet.members() == sorted([LABELLED, PLAIN])
    clock.now += 61
    gke.listings["team-b-proj"] = listing()
    assert fleet.members() == []  # a full answer: both gone


def test_the_runtime_serves_a_labelled_cluster_with_its_own_settings_and_lists_the_fleet() -> None:
    gke = FakeGke()
    gke.listings["team-b-proj"] = listing((LABELLED, ON), (PLAIN, ()))
    settings = Settings(
        project_id="home-proj",
        location="us-east5",
        cluster_name="home",
        fleet_projects=("team-b-proj",),
        fleet_overrides=json.dumps({LABELLED: {"DRAIN": True}}),
    )
    runtime = Runtime(settings)
    runtime._cache["gke"] = gke  # the instance's GKE adapter, as Runtime.gke() caches it
    member = runtime.member(LABELLED)
    assert member is not None and member.settings.cluster_path == LABELLED and member.settings.drain
    assert runtime.member(PLAIN) is None
    assert runtime.member(ELSEWHERE) is None
    assert [m.settings.cluster_path for m in runtime.members()] == [settings.cluster_path, LABELLED]
    assert gke.count("list_clusters") == 1
