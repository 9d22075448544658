"""The one place provision builds a slice's pool spec: once per (slice, capacity option), the pod's own
choice reused when an attempt's option is that same choice, each spec the one ``build_node_pool``
makes for that option."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sandbox.jobsets import tpu_jobset
from shared.core.errors import Refused
from shared.provisioning.create.groups import Specs
from shared.tpu import capacity
from shared.tpu.capacity import CapacityOption
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import ClusterInfo
from shared.tpu.slices import SliceRequest, build_node_pool, slice_request
from tests.unit.provisioning.stockouts import SETTINGS

B, A = "us-east5-b", "us-east5-a"
CLUSTER = ClusterInfo("c", B, "127.0.0.1", "", locations=(B, A), release_channel="REGULAR")


def request_of(index: int = 0, **jobset: Any) -> SliceRequest:
    return slice_request(expand_pods(tpu_jobset("a", "team-a", replicas=2, **jobset))[index])


def test_an_attempt_on_the_pods_own_choice_gets_the_own_spec_back() -> None:
    specs, request = Specs(SETTINGS, CLUSTER), request_of()
    own = specs.of(request)
    assert own == build_node_pool(SETTINGS, request, CLUSTER)
    assert capacity.key_of_spec(own[0]) == f"on-demand@{B}"
    assert specs.of(request, CapacityOption(capacity.ON_DEMAND, B)) is own


@pytest.mark.parametrize(
    "option",
    [
        CapacityOption(capacity.SPOT, A),
        CapacityOption(capacity.ON_DEMAND, A),
        CapacityOption(capacity.SPOT, B),
    ],
)
def test_another_option_is_built_for_it_once(option: CapacityOption) -> None:
    specs, request = Specs(SETTINGS, CLUSTER), request_of()
    own, _ = specs.of(request)
    other = specs.of(request, option)
    assert other == build_node_pool(SETTINGS, request, CLUSTER, option)
    assert other[0] != own and capacity.key_of_spec(other[0]) == option.key
    assert specs.of(request, option) is other
    assert specs.of(request) == (own, other[1])  # the own choice is still the own choice


def test_each_slice_of_the_group_has_its_own_spec() -> None:
    specs, request = Specs(SETTINGS, CLUSTER), request_of(0)
    sibling = dataclasses.replace(request, slice_id=dataclasses.replace(request.slice_id, job_index=1))
    option = CapacityOption(capacity.ON_DEMAND, B)
    own, sibling_spec = specs.of(request, option)[0], specs.of(sibling, option)[0]
    assert (own.name, sibling_spec.name) == (request.pool_name, sibling.pool_name)
    assert specs.of(sibling, option) == build_node_pool(SETTINGS, sibling, CLUSTER, option)


def test_a_shape_no_pool_can_be_is_refused_on_every_ask() -> None:
    specs, request = Specs(SETTINGS, CLUSTER), request_of(topology="3x3")
    for _ in range(2):
        with pytest.raises(Refused, match="3x3"):
            specs.of(request)
