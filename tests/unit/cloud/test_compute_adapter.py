"""The Compute adapter against the Compute emulator: the real client over HTTP, errors translated."""

from __future__ import annotations

import pytest

from sandbox.emulators.compute.emulator import ComputeEmulator
from shared.cloud.compute import ComputeWorkloadPolicyAPI
from shared.core.errors import (
    AlreadyExistsError,
    NotFoundError,
    PermissionDeniedError,
    RejectedError,
    TransientError,
)
from shared.tpu.nodepools import WorkloadPolicyInfo

REGION = "us-central2"
NAME = "tpuprov-tpu7x-2-2-2"


@pytest.fixture
def api(compute_emulator: ComputeEmulator) -> ComputeWorkloadPolicyAPI:
    return ComputeWorkloadPolicyAPI(endpoint=compute_emulator.url, timeout=5.0, poll_interval=0.05)


def test_insert_then_get_round_trips_a_high_throughput_policy(api, compute_emulator):
    with pytest.raises(
        NotFoundError, match=f"The resource 'projects/p/regions/{REGION}/resourcePolicies/{NAME}' was"
    ):
        api.get("p", REGION, NAME)
    api.insert("p", REGION, NAME, "2x2x2", "test")
    assert api.get("p", REGION, NAME) == WorkloadPolicyInfo(NAME, REGION, "HIGH_THROUGHPUT", "2x2x2", "READY")
    [stored] = compute_emulator.policies()
    assert stored["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "2x2x2"}


def test_second_insert_is_409_already_exists(api):
    api.insert("p", REGION, NAME, "2x2x2", "test")
    with pytest.raises(AlreadyExistsError, match="already exists"):
        api.insert("p", REGION, NAME, "2x2x2", "test")


def test_insert_waits_for_a_running_operation(api, compute_emulator):
    compute_emulator.state.set_op_delay(0.3)
    api.insert("p", REGION, NAME, "2x2x2", "test")
    # Returned only once Compute finished: the policy exists for the GKE create that follows.
    assert compute_emulator.exists("p", REGION, NAME)
    assert compute_emulator.count("get_operation") >= 1


def test_insert_gives_up_after_its_wait_as_transient(compute_emulator):
    compute_emulator.state.set_op_delay(30)
    api = ComputeWorkloadPolicyAPI(
        endpoint=compute_emulator.url, timeout=5.0, wait_seconds=0.2, poll_interval=0.05
    )
    with pytest.raises(TransientError, match="still creating"):
        api.insert("p", REGION, NAME, "2x2x2", "test")


@pytest.mark.parametrize(
    ("arrange", "call", "error", "code", "match"),
    [
        pytest.param(
            lambda c: c.deny("compute.resourcePolicies.create"),
            "insert",
            PermissionDeniedError,
            None,
            "Required 'compute.resourcePolicies.create' permission for 'projects/p/regions/us-central2/",
            id="403-permission",
        ),
        pytest.param(
            lambda c: c.fail_next("get", 503, "Internal error. Please try again."),
            "get",
            TransientError,
            None,
            "Internal error",
            id="503",
        ),
        pytest.param(
            lambda c: c.fail_next("insert", 429, "Rate Limit Exceeded", reason="rateLimitExceeded"),
            "insert",
            TransientError,
            None,
            "Rate Limit Exceeded",
            id="429",
        ),
    ],
)
def test_errors_are_translated(api, compute_emulator, arrange, call, error, code, match):
    arrange(compute_emulator)
    with pytest.raises(error, match=match) as caught:
        if call == "get":
            api.get("p", REGION, NAME)
        else:
            api.insert("p", REGION, NAME, "2x2x2", "test")
    if code is not None:
        assert caught.value.code == code


def test_bad_name_is_refused_with_computes_rule(api):
    with pytest.raises(RejectedError, match=r"Invalid value for field 'resource.name': 'Tpu_7x'") as caught:
        api.insert("p", REGION, "Tpu_7x", "2x2x2", "test")
    assert caught.value.code == 400


def test_unreachable_endpoint_is_transient():
    api = ComputeWorkloadPolicyAPI(endpoint="http://127.0.0.1:9", timeout=1.0)
    with pytest.raises(TransientError):
        api.get("p", REGION, NAME)
