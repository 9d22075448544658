"""Every permission each port call declares is one the sandbox enforces, with the real 403 text.

For each call in ``shared.cloud.permissions.CALLS`` and each permission it declares, the caller holds
every other permission there is and not that one: the real client against the GKE or Compute
emulator (IAM), or the real kube-apiserver (RBAC, the caller's ClusterRole being that permission set
as ``sandbox.kube.rbac`` maps it), must be refused with ``PermissionDeniedError`` naming exactly it.
Together with
``tests/infra/test_roles.py`` (each role is the union of what its function's code reaches), taking
any one permission out of any role therefore fails a test with the real 403 text.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandbox.emulators.compute.emulator import ComputeEmulator
from sandbox.emulators.gke.emulator import GkeEmulator
from sandbox.emulators.gke.seeds import ClusterSeed
from sandbox.emulators.iam import Iam
from sandbox.emulators.reservations import Block, ReservationBook, SubBlock
from sandbox.kube import rbac
from sandbox.testing.fixtures.kube import KubeHandle
from shared.cloud.compute import ComputeWorkloadPolicyAPI
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.kube import KubeClient, connect
from shared.cloud.permissions import CALLS
from shared.cloud.reservations import ComputeReservationAPI
from shared.core import labels
from shared.core.errors import PermissionDeniedError
from shared.core.settings import Settings
from shared.tpu.nodepools import NodePoolSpec

pytestmark = [pytest.mark.integration]

PROJECT, ZONE, REGION = "p", "us-east5-b", "us-east5"
CLUSTER = f"projects/{PROJECT}/locations/{ZONE}/clusters/c"
EVERYTHING = sorted({p for permissions in CALLS.values() for p in permissions})
CALLER = "caller"
CALLER_FUNCTION = "provision"  # whose token and ClusterRole the Kubernetes cases use
FRESH = itertools.count()  # names of policies no earlier case created


def spec(name: str) -> NodePoolSpec:
    return NodePoolSpec(
        name=name,
        machine_type="ct6e-standard-4t",
        node_count=1,
        node_locations=(ZONE,),
        labels={"a": "b"},
        resource_labels={},
        disk_type="hyperdisk-balanced",  # what v6e boots from
        auto_upgrade=True,  # the emulated cluster is on a release channel, which requires it
    )


@pytest.fixture(scope="module")
def iam() -> Iam:
    iam = Iam(PROJECT)
    iam.grant(iam.principal_of("admin"), ["container.*", "compute.*"])
    return iam


def _dense() -> ReservationBook:
    # A reservation with a block that has a sub-block: its read makes all three of its calls.
    book = ReservationBook()
    book.add("dense", ZONE, 0, "ct5lp-hightpu-4t", blocks=[Block("b1", 4, sub_blocks=[SubBlock("s1", 4)])])
    return book


@pytest.fixture(scope="module")
def cloud(iam: Iam) -> Iterator[dict[str, Any]]:
    with (
        GkeEmulator([ClusterSeed.from_path(CLUSTER, "127.0.0.1", "")], op_delay=0) as gke,
        ComputeEmulator(op_delay=0.5, reservations=_dense()) as compute,  # a running insert is polled
    ):
        gke.set_iam(iam)
        compute.iam = iam
        admin = iam.token_for("admin")
        GkeNodePoolAPI(endpoint=gke.url, access_token=admin).create_node_pool(CLUSTER, spec("existing"), "t")
        yield {"gke": gke, "compute": compute}


@pytest.fixture
def emulators(cloud: dict[str, Any], kube_server: KubeHandle) -> dict[str, Any]:
    """The GKE and Compute emulators, and the (reset) real API server with what the calls name."""
    kube_server.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-0"}, "spec": {}})
    kube_server.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "pod-0", "namespace": "team-a"},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
    )
    replicated = {
        "name": "w",
        "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}},
    }
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {"replicatedJobs": [replicated]},
    }
    kube_server.put(jobset)
    return {**cloud, "kube": kube_server}


def _grant_kube(kube: KubeHandle, permissions: list[str], removed: str = "") -> None:
    """Make the caller's ClusterRole exactly ``permissions`` (as GKE's authorizer reads them) and
    wait until the API server's authorizer has it: each granted rule allowed, ``removed`` denied."""
    role = rbac.objects_for(CALLER_FUNCTION, permissions)[0]
    kube.admin.apply(role)
    user = rbac.user_name(CALLER_FUNCTION)
    checks = [(rule, True) for rule in rbac.rules_for(permissions)]
    if removed and not removed.startswith(rbac.NOT_KUBERNETES):
        checks += [(rule, False) for rule in rbac.rules_for([removed])]
    for rule, allowed in checks:
        plural, _, subresource = rule.resources[0].partition("/")
        attributes = {
            "verb": rule.verbs[0],
            "group": rule.api_groups[0],
            "resource": "jobsets" if plural == "*" else plural,
            "subresource": subresource,
        }
        review = {"spec": {"user": user, "resourceAttributes": attributes}}
        for _ in range(500):
            answer = kube.admin.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
            if bool((answer.get("status") or {}).get("allowed")) == allowed:
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"RBAC never {'allowed' if allowed else 'denied'} {attributes}")


def _kube(emulators: dict[str, Any], token: str) -> KubeClient:
    # The caller's Kubernetes identity is a function's token; its ClusterRole is what _grant_kube set.
    del token
    kubeconfig = str(emulators["kube"].kubeconfig_for(CALLER_FUNCTION))
    return connect(Settings(kubeconfig=kubeconfig), lambda: None)


def _record_twice(kube: KubeClient, involved: dict[str, Any]) -> None:
    # The second identical Event meets 409, is read back and its count patched (get and update).
    kube.record_event(involved, labels.REASON_REQUESTED, "same message")
    kube.record_event(involved, labels.REASON_REQUESTED, "same message")


def _calls(emulators: dict[str, Any], token: str) -> dict[str, Callable[[], Any]]:
    gke = GkeNodePoolAPI(endpoint=emulators["gke"].url, access_token=token)
    compute = ComputeWorkloadPolicyAPI(endpoint=emulators["compute"].url, access_token=token, wait_seconds=2)
    reservations = ComputeReservationAPI(endpoint=emulators["compute"].url, access_token=token)
    kube = _kube(emulators, token)
    involved = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod-0", "namespace": "team-a", "uid": "u-1"},
    }
    operation = f"projects/{PROJECT}/locations/{ZONE}/operations/x"
    return {
        "NodePoolAPI.get_cluster": lambda: gke.get_cluster(CLUSTER),
        "NodePoolAPI.list_clusters": lambda: gke.list_clusters(PROJECT),
        "NodePoolAPI.list_node_pools": lambda: gke.list_node_pools(CLUSTER),
        "NodePoolAPI.get_node_pool": lambda: gke.get_node_pool(CLUSTER, "existing"),
        "NodePoolAPI.create_node_pool": lambda: gke.create_node_pool(CLUSTER, spec("new"), "t"),
        "NodePoolAPI.delete_node_pool": lambda: gke.delete_node_pool(CLUSTER, "existing", "t"),
        "NodePoolAPI.set_node_pool_labels": lambda: gke.set_node_pool_labels(
            CLUSTER, "existing", {"x": "y"}, "t"
        ),
        "NodePoolAPI.get_operation": lambda: gke.get_operation(operation),
        "WorkloadPolicyAPI.get": lambda: compute.get(PROJECT, REGION, "policy"),
        "WorkloadPolicyAPI.insert": lambda: compute.insert(PROJECT, REGION, f"p-{next(FRESH)}", "2x2x2", "t"),
        "ReservationAPI.get_reservation": lambda: reservations.get_reservation(PROJECT, ZONE, "dense"),
        "KubeAPI.get_pod": lambda: kube.get_pod("team-a", "pod-0"),
        "KubeAPI.list_pods": lambda: kube.list_pods("team-a"),
        "KubeAPI.list_nodes": lambda: kube.list_nodes(),
        "KubeAPI.set_unschedulable": lambda: kube.set_unschedulable("n-0", True, "t"),
        "KubeAPI.get_jobset": lambda: kube.get_jobset("team-a", "train"),
        # Authorization comes before the lookup: the Job need not exist.
        "KubeAPI.get_job": lambda: kube.get_job("team-a", "train-slice-0"),
        "KubeAPI.get_namespace_labels": lambda: kube.get_namespace_labels("team-a"),
        "KubeAPI.list_jobsets": lambda: kube.list_jobsets("team-a"),
        "KubeAPI.annotate_jobset": lambda: kube.annotate_jobset(
            "team-a", "train", {"a": "b"}, _version(emulators), "t"
        ),
        "KubeAPI.record_event": lambda: _record_twice(kube, involved),
        # Kueue's objects: authorization comes before the lookup, so none of them needs to exist.
        "KubeAPI.get_workload": lambda: kube.get_workload("team-a", "w"),
        "KubeAPI.list_workloads": lambda: kube.list_workloads("team-a"),
        "KubeAPI.get_cluster_queue": lambda: kube.get_cluster_queue("cq"),
        "KubeAPI.get_multikueue_cluster": lambda: kube.get_multikueue_cluster("west"),
        "KubeAPI.annotate_multikueue_cluster": lambda: kube.annotate_multikueue_cluster(
            "west", {"a": "b"}, "", "test"
        ),
        "KubeAPI.get_resource_flavor": lambda: kube.get_resource_flavor("rf"),
        "KubeAPI.set_admission_check_state": lambda: kube.set_admission_check_state(
            "team-a", "w", {"name": "tpu-slices", "state": "Pending", "message": "pools ready 0/1"}
        ),
        "KubeAPI.set_admission_check_active": lambda: kube.set_admission_check_active("tpu-slices", "ok"),
    }


def _version(emulators: dict[str, Any]) -> str:
    stored = emulators["kube"].get("jobset.x-k8s.io/v1alpha2", "jobsets", "team-a", "train")
    return str(stored["metadata"]["resourceVersion"])


def test_every_declared_call_is_in_the_matrix(iam: Iam, emulators: dict[str, Any]) -> None:
    assert set(_calls(emulators, iam.token_for("admin"))) == set(CALLS)


CASES = [(call, permission) for call, permissions in sorted(CALLS.items()) for permission in permissions]
# Calls whose emulator answers are not for this matrix: Kubernetes Events are best effort (a refusal
# is logged, never raised), so record_event's permissions are checked through the log line below.
RAISING = [case for case in CASES if case[0] != "KubeAPI.record_event"]


@pytest.mark.parametrize(("call", "permission"), RAISING, ids=[f"{c}-{p}" for c, p in RAISING])
def test_a_call_without_one_of_its_permissions_is_refused_naming_it(
    iam: Iam, emulators: dict[str, Any], call: str, permission: str
) -> None:
    principal = iam.principal_of(CALLER)
    iam.grant(principal, EVERYTHING)
    iam.revoke(CALLER, permission)
    _grant_kube(emulators["kube"], [p for p in EVERYTHING if p != permission], permission)
    try:
        with pytest.raises(PermissionDeniedError) as denied:
            _calls(emulators, iam.token_for(CALLER))[call]()
        assert denied.value.permission == permission
        assert f'"{permission}"' in denied.value.why or f"'{permission}'" in denied.value.why
    finally:
        iam.grant(principal, [permission])


@pytest.mark.parametrize("permission", CALLS["KubeAPI.record_event"])
def test_an_event_the_role_may_not_write_is_logged_as_a_denial(
    iam: Iam, emulators: dict[str, Any], permission: str, caplog: pytest.LogCaptureFixture
) -> None:
    principal = iam.principal_of(CALLER)
    iam.grant(principal, EVERYTHING)
    iam.revoke(CALLER, permission)
    _grant_kube(emulators["kube"], [p for p in EVERYTHING if p != permission], permission)
    try:
        _calls(emulators, iam.token_for(CALLER))["KubeAPI.record_event"]()
        denials = [r for r in caplog.records if getattr(r, "fields", {}).get("event") == "permission.denied"]
        assert denials and {r.fields["permission"] for r in denials} == {permission}  # type: ignore[attr-defined]
    finally:
        iam.grant(principal, [permission])
