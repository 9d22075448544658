"""The tpu7x workload-policy service over a stateful fake of Compute, and its use by the Provisioner."""

from __future__ import annotations

import dataclasses
import datetime
import threading

import pytest

from sandbox.jobsets import tpu_jobset
from sandbox.testing.compute import FakeWorkloadPolicies
from sandbox.testing.fakes import FakeGke, FakeKube
from shared.core import labels
from shared.core.errors import RejectedError, TransientError
from shared.core.settings import Settings
from shared.provisioning.create.policies import WorkloadPolicies
from shared.provisioning.outcomes import CREATED, FAILED
from shared.provisioning.provisioner import Provisioner
from shared.provisioning.services import Services
from shared.tpu.jobsets import expand_pods
from shared.tpu.nodepools import NodePoolSpec, Placement, WorkloadPolicyInfo

SETTINGS = Settings(unlimited_spending=True, project_id="p", location="us-central2-b", cluster_name="c")
REGION = "us-central2"
NAME = "tpuprov-tpu7x-2-2-2"
PATH = f"projects/p/regions/{REGION}/resourcePolicies/{NAME}"
MANAGED = Placement(type="", policy_name=NAME, managed_topology="2x2x2")


def spec(placement: Placement | None = MANAGED, zone: str = "us-central2-b") -> NodePoolSpec:
    return NodePoolSpec("pool-a", "tpu7x-standard-4t", 2, (zone,), {}, {}, placement=placement)


@pytest.fixture
def compute() -> FakeWorkloadPolicies:
    return FakeWorkloadPolicies()


@pytest.fixture
def service(compute: FakeWorkloadPolicies) -> WorkloadPolicies:
    return WorkloadPolicies(SETTINGS, compute)


def test_missing_policy_is_created_once_in_the_zones_region(service, compute):
    assert service.ensure_for(spec(), "why") == NAME
    assert service.ensure_for(spec(), "why") == NAME
    assert compute.policies[("p", REGION, NAME)] == WorkloadPolicyInfo(
        NAME, REGION, "HIGH_THROUGHPUT", "2x2x2", "READY"
    )
    # The second call is answered from memory: one get, one insert.
    assert compute.calls == [("get", PATH), ("insert", PATH)]


def test_existing_policy_is_used_without_insert(service, compute):
    compute.add("p", REGION, WorkloadPolicyInfo(NAME, REGION, "HIGH_THROUGHPUT", "2x2x2", "READY"))
    assert service.ensure_for(spec(), "why") == NAME
    assert compute.count("insert") == 0


def test_409_on_insert_is_success(service, compute):
    compute.fail("insert", "conflict")
    assert service.ensure_for(spec(), "why") == NAME
    assert service.ensure_for(spec(), "why") == NAME
    assert compute.count("get") == 1


@pytest.mark.parametrize(
    "placement",
    [
        pytest.param(None, id="no-placement"),
        pytest.param(Placement(type="COMPACT", tpu_topology="2x2x2"), id="compact"),
        pytest.param(Placement(type="", policy_name="operators-policy"), id="operator-named"),
    ],
)
def test_placements_the_product_does_not_manage_cause_no_compute_call(service, compute, placement):
    service.ensure_for(spec(placement), "why")
    assert compute.calls == []


@pytest.mark.parametrize(
    ("existing", "error", "match"),
    [
        pytest.param(
            WorkloadPolicyInfo(NAME, REGION, "HIGH_THROUGHPUT", "4x4x4", "READY"),
            RejectedError,
            "not a HIGH_THROUGHPUT workload policy for accelerator topology 2x2x2",
            id="same-name-other-topology",
        ),
        pytest.param(
            WorkloadPolicyInfo(NAME, REGION, "HIGH_AVAILABILITY", "", "READY"),
            RejectedError,
            "type HIGH_AVAILABILITY",
            id="same-name-other-type",
        ),
        pytest.param(
            WorkloadPolicyInfo(NAME, REGION, "HIGH_THROUGHPUT", "2x2x2", "CREATING"),
            TransientError,
            "is CREATING",
            id="still-creating",
        ),
    ],
)
def test_a_policy_that_cannot_place_the_slice_is_never_used(service, compute, existing, error, match):
    compute.add("p", REGION, existing)
    with pytest.raises(error, match=match):
        service.ensure_for(spec(), "why")
    assert compute.count("insert") == 0


@pytest.mark.parametrize("permission", ["compute.resourcePolicies.get", "compute.resourcePolicies.create"])
def test_permission_denied_is_a_refusal_naming_the_fix(service, compute, permission):
    compute.deny(permission)
    with pytest.raises(RejectedError, match=f"Required '{permission}' permission") as caught:
        service.ensure_for(spec(), "why")
    assert caught.value.code == 403
    assert "TPU7X_WORKLOAD_POLICY" in caught.value.why
    assert ("p", REGION, NAME) not in compute.policies


def test_transient_failure_is_not_remembered(service, compute):
    compute.fail("get", "transient")
    with pytest.raises(TransientError):
        service.ensure_for(spec(), "why")
    assert service.ensure_for(spec(), "why") == NAME
    assert compute.count("insert") == 1


def test_concurrent_ensures_of_one_policy_insert_once(compute):
    service = WorkloadPolicies(SETTINGS, compute)
    barrier = threading.Barrier(8)

    def one():
        barrier.wait()
        service.ensure_for(spec(), "why")

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (compute.count("get"), compute.count("insert")) == (1, 1)


# --- the Provisioner sends no create before its policy exists ---------------------------------------


def provision(settings, compute, gke, kube, jobset):
    kube.add_jobset(jobset)
    pods = expand_pods(jobset)
    for pod in pods:
        kube.add_pod(pod)
    service = Provisioner(Services(settings, gke, kube, policies=WorkloadPolicies(settings, compute)))
    now = datetime.datetime.now(tz=datetime.UTC)
    return service.handle_pending_pod(pods[0]["metadata"]["namespace"], pods[0]["metadata"]["name"], now)


def tpu7x(name, replicas=2):
    return tpu_jobset(
        name, "team-a", replicas=replicas, accelerator="tpu7x", topology="2x2x2", chips_per_vm=4
    )


def test_two_slices_of_one_topology_share_one_policy_and_name_it(compute):
    gke, kube = FakeGke(), FakeKube()
    outcome = provision(SETTINGS, compute, gke, kube, tpu7x("train"))
    assert outcome.result == CREATED and len(outcome.requested) == 2
    assert (compute.count("get"), compute.count("insert")) == (1, 1)
    # FakeGke keeps the specs it was sent: both pools name the product's policy.
    assert {s.placement.policy_name for s in gke.specs.values() if s.placement} == {NAME}


def test_operator_policy_means_no_compute_call(compute):
    gke, kube = FakeGke(), FakeKube()
    settings = dataclasses.replace(SETTINGS, tpu7x_workload_policy="ops-{topology}")
    outcome = provision(settings, compute, gke, kube, tpu7x("train"))
    assert outcome.result == CREATED
    assert compute.calls == []
    assert {s.placement.policy_name for s in gke.specs.values() if s.placement} == {"ops-2-2-2"}


def test_denied_policy_means_no_pool_and_a_warning_on_the_pod(compute):
    gke, kube = FakeGke(), FakeKube()
    compute.deny("compute.resourcePolicies.create")
    outcome = provision(SETTINGS, compute, gke, kube, tpu7x("train", replicas=1))
    assert outcome.result == FAILED
    assert gke.count("create") == 0
    [event] = [e for e in kube.events if e["reason"] == labels.REASON_FAILED]
    assert "compute.resourcePolicies.create" in event["message"] and event["type"] == "Warning"


def test_transient_compute_failure_redelivers_without_a_pool(compute):
    gke, kube = FakeGke(), FakeKube()
    compute.fail("get", "transient")
    with pytest.raises(TransientError):
        provision(SETTINGS, compute, gke, kube, tpu7x("train", replicas=1))
    assert gke.count("create") == 0
