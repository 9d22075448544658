"""The capacity policy: parsing it, and which options a slice gets given what its pods select."""

from __future__ import annotations

import pytest

from shared.core import labels
from shared.core.errors import Refused
from shared.core.settings import Settings
from shared.tpu import capacity
from shared.tpu.capacity import CapacityOption, Demand
from shared.tpu.nodepools import NodePoolInfo, Reservation
from shared.tpu.slices import build_node_pool, policy_of, slice_options, slice_request
from tests.unit.tpu.pods import pod_of

A, B = "us-east5-a", "us-east5-b"
SETTINGS = Settings(
    unlimited_spending=True, project_id="p", location="us-east5", cluster_name="c", node_locations=(B, A)
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", (), id="empty-no-policy"),
        pytest.param(
            " spot , on-demand ", (CapacityOption("spot"), CapacityOption("on-demand")), id="spaces"
        ),
        pytest.param(
            "reservation:res-1@us-east5-b, flex-start@us-east5-a",
            (
                CapacityOption("reservation", B, Reservation("res-1")),
                CapacityOption("flex-start", A),
            ),
            id="reservation-and-zones",
        ),
        pytest.param(
            "reservation:projects/other-proj/reservations/big",
            (CapacityOption("reservation", "", Reservation("big", "other-proj")),),
            id="shared-reservation",
        ),
    ],
)
def test_policy_text_parses_into_ordered_options(text: str, expected: tuple[CapacityOption, ...]) -> None:
    assert capacity.parse_policy(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("spott", "kind must be one of", id="unknown-kind"),
        pytest.param("spot@east", "is not a zone", id="bad-zone"),
        pytest.param("reservation:Bad_Name", "is not a reservation name", id="bad-reservation"),
        pytest.param("spot, spot", "twice", id="duplicate"),
    ],
)
def test_a_malformed_policy_says_which_entry_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        capacity.parse_policy(text)


POLICY = capacity.parse_policy(f"reservation:res-1, spot@{B}, spot@{A}, flex-start, on-demand")


@pytest.mark.parametrize(
    ("demand", "expected"),
    [
        pytest.param(
            Demand(),
            [f"reservation:res-1@{B}", f"spot@{B}", f"spot@{A}", f"flex-start@{B}", f"on-demand@{B}"],
            id="pod-selects-nothing-gets-the-whole-policy",
        ),
        pytest.param(Demand("spot"), [f"spot@{B}", f"spot@{A}"], id="spot-pod-only-spot-zones"),
        pytest.param(Demand("spot", zone=A), [f"spot@{A}"], id="spot-pod-pinned-to-zone-a"),
        pytest.param(
            Demand(zone=A),
            [f"reservation:res-1@{A}", f"spot@{A}", f"flex-start@{A}", f"on-demand@{A}"],
            id="zone-pinned-pod-keeps-kinds-in-its-zone",
        ),
        pytest.param(
            Demand("reservation", Reservation("other")),
            [f"reservation:other@{B}"],
            id="other-reservation-own",
        ),
        pytest.param(Demand("flex-start"), [f"flex-start@{B}"], id="flex-start-pod"),
    ],
)
def test_options_follow_the_policy_only_where_the_pods_selectors_allow(
    demand: Demand, expected: list[str]
) -> None:
    assert [o.key for o in capacity.options(POLICY, demand, demand.zone or B)] == expected


def test_without_a_policy_the_only_option_is_the_pods_own_choice() -> None:
    assert [o.key for o in capacity.options((), Demand(), B)] == [f"on-demand@{B}"]
    assert [o.key for o in capacity.options((), Demand("spot"), A)] == [f"spot@{A}"]


@pytest.mark.parametrize(
    ("tried", "expected"),
    [
        pytest.param("spot@a", "on-demand@a", id="next-in-round"),
        pytest.param("on-demand@a", "", id="last-ends-round"),
        pytest.param("flex-start@a", "", id="unlisted-ends-round-never-loops"),
    ],
)
def test_the_option_after_a_failed_one(tried: str, expected: str) -> None:
    assert capacity.after(["spot@a", "on-demand@a"], tried) == expected


def test_a_pool_and_a_spec_name_the_same_option() -> None:
    spec, _ = build_node_pool(SETTINGS, slice_request(pod_of()), option=CapacityOption("spot", A))
    info = NodePoolInfo(name=spec.name, status="ERROR", spot=True, node_locations=(A,))
    assert capacity.key_of_spec(spec) == capacity.key_of_pool(info) == f"spot@{A}"


def test_a_flex_start_option_builds_an_empty_autoscaled_pool_without_auto_repair() -> None:
    spec, _ = build_node_pool(SETTINGS, slice_request(pod_of()), option=CapacityOption("flex-start", A))
    assert (spec.flex_start, spec.spot, spec.reservation, spec.auto_repair) == (True, False, None, False)
    assert spec.node_locations == (A,)


def test_the_jobset_annotation_overrides_the_setting_and_a_bad_one_is_refused() -> None:
    settings = SETTINGS.with_overrides(capacity_policy="spot, on-demand")
    jobset = {"metadata": {"annotations": {labels.CAPACITY_POLICY: "on-demand"}}}
    assert [o.kind for o in policy_of(settings, jobset)] == ["on-demand"]
    assert [o.kind for o in policy_of(settings, {"metadata": {}})] == ["spot", "on-demand"]
    with pytest.raises(Refused, match=f"{labels.CAPACITY_POLICY}: .*kind must be one of"):
        policy_of(settings, {"metadata": {"annotations": {labels.CAPACITY_POLICY: "cheap"}}})


def test_a_policy_zone_outside_the_cluster_is_refused() -> None:
    with pytest.raises(Refused, match="not a zone of this cluster"):
        slice_options(SETTINGS, Demand(), capacity.parse_policy("spot@us-west4-a"))


def test_flex_start_is_refused_where_gke_does_not_offer_it() -> None:
    pod = pod_of(accelerator="tpu-v4-podslice", topology="2x2x1")
    with pytest.raises(Refused, match="flex-start capacity is not offered for v4"):
        build_node_pool(SETTINGS, slice_request(pod), option=CapacityOption("flex-start", B))


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        pytest.param({labels.SPOT: "true"}, "flex-start VMs are neither Spot", id="spot"),
        pytest.param({labels.RESERVATION_NAME: "r"}, "flex-start VMs are neither Spot", id="reservation"),
    ],
)
def test_a_pod_selecting_flex_start_with_spot_or_a_reservation_is_refused(
    selector: dict[str, str], message: str
) -> None:
    pod = pod_of(selectors={labels.FLEX_START: "true", **selector})
    with pytest.raises(Refused, match=message):
        slice_request(pod)


def test_a_malformed_capacity_policy_stops_the_service_at_startup() -> None:
    from shared.app.entry import Runtime
    from shared.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"setting CAPACITY_POLICY: .*'nowhere' is not a zone"):
        Runtime(SETTINGS.with_overrides(capacity_policy="spot@nowhere"))
    assert Runtime(SETTINGS.with_overrides(capacity_policy="spot, on-demand")).settings.capacity_policy
