"""Each function's role in infra/roles.json is exactly what its code can call.

The permissions come from ``shared.cloud.permissions`` (what each port call needs) and the calls
from reading each function's code (``tests/infra/reach.py``), so a new call without its grant, or a
grant nothing calls any more, fails here and not in a deployment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.cloud.permissions import (
    CALLS,
    OBJECT_VERBS,
    denied_permission,
    denied_project,
    object_permissions,
)
from tests.infra.hcl import module
from tests.infra.reach import port_methods, reached_calls, reached_permissions
from tests.paths import REPO

ROLES = json.loads((REPO / "infra" / "roles.json").read_text())
FUNCTIONS = ("provision", "release", "reconcile", "apply_kueue")


def entrypoint(function: str) -> Path:
    return REPO / "functions" / function / "main.py"


@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_role_is_exactly_the_permissions_its_code_reaches(function: str) -> None:
    needed = reached_permissions(entrypoint(function))
    granted = set(ROLES[function])
    missing = {p: sorted(needed[p]) for p in sorted(set(needed) - granted)}
    unused = sorted(granted - set(needed))
    assert not missing, f"{function}'s role lacks permissions its code calls: {missing}"
    assert not unused, f"{function}'s role holds permissions no path of its code calls: {unused}"
    assert ROLES[function] == sorted(granted), "keep roles.json sorted, one entry per permission"


def test_roles_cover_every_function_but_setup_which_is_cluster_admin() -> None:
    assert sorted(ROLES) == sorted(FUNCTIONS)


def test_every_port_method_declares_its_permissions() -> None:
    declared = set(CALLS) | set(OBJECT_VERBS)
    methods = {key for key in port_methods() if "." in key}
    assert methods == declared
    for permissions in CALLS.values():
        assert permissions and all(p.count(".") == 2 for p in permissions)


def test_the_paths_a_release_takes_are_seen() -> None:
    # The call graph must see through the guard (cordon, occupancy) and the handover relabel; the
    # roles before this check lacked exactly these, so a real release was refused and leaked pools.
    calls = reached_calls(entrypoint("release"))
    for call in (
        "NodePoolAPI.delete_node_pool",
        "NodePoolAPI.set_node_pool_labels",
        "KubeAPI.list_nodes",
        "KubeAPI.set_unschedulable",
        "KubeAPI.record_event",
    ):
        assert call in calls, call
    assert "NodePoolAPI.create_node_pool" not in calls  # release never creates
    assert not any(call.startswith("WorkloadPolicyAPI") for call in calls)


def test_the_kueue_applier_touches_only_queue_objects() -> None:
    calls = reached_calls(entrypoint("apply_kueue"))
    assert {call.split(".")[0] for call in calls} == {"ObjectAPI", "NodePoolAPI", "KubeAPI"}
    # Reading GKE: the cluster's endpoint, and the fleet's listing when the message's cluster
    # attribute names a cluster of FLEET_PROJECTS.
    assert set(calls) - {"NodePoolAPI.get_cluster", "NodePoolAPI.list_clusters"} == {
        "ObjectAPI.apply",
        "ObjectAPI.get",
        "ObjectAPI.list_objects",
        "ObjectAPI.delete",
        # The product's AdmissionCheck is marked Active as soon as a queue uses it.
        "KubeAPI.set_admission_check_active",
    }


@pytest.mark.parametrize(
    ("method", "kinds", "expected"),
    [
        ("ObjectAPI.get", [("v1", "Namespace")], {"container.namespaces.get"}),
        (
            "ObjectAPI.apply",
            [("scheduling.k8s.io/v1", "PriorityClass"), ("kueue.x-k8s.io/v1beta2", "ClusterQueue")],
            {
                "container.priorityClasses.create",
                "container.priorityClasses.update",
                "container.thirdPartyObjects.create",
                "container.thirdPartyObjects.update",
            },
        ),
        (
            "ObjectAPI.delete",
            [("jobset.x-k8s.io/v1alpha2", "JobSet")],
            {"container.thirdPartyObjects.delete"},
        ),
    ],
)
def test_object_calls_need_the_resource_permission_of_their_kind(
    method: str, kinds: list[tuple[str, str]], expected: set[str]
) -> None:
    assert object_permissions(method, kinds) == expected


@pytest.mark.parametrize(
    ("message", "permission"),
    [
        (
            'Required "container.clusters.update" permission(s) for '
            '"projects/p/locations/us-east5-b/clusters/c".',
            "container.clusters.update",
        ),
        (
            'nodes "gke-a-1" is forbidden: User "p-release@p.iam.gserviceaccount.com" cannot patch resource '
            '"nodes" in API group "" at the cluster scope: requires one of ["container.nodes.update"] '
            "permission(s).",
            "container.nodes.update",
        ),
        (
            "Required 'compute.resourcePolicies.create' permission for "
            "'projects/p/regions/us-east5/resourcePolicies/x'",
            "compute.resourcePolicies.create",
        ),
        ("Insufficient regional quota to satisfy request: resource TPUS", ""),
        ('pods is forbidden: User "x" cannot list resource "pods" in API group ""', ""),
    ],
)
def test_a_403_names_the_permission_it_lacks(message: str, permission: str) -> None:
    assert denied_permission(message) == permission


@pytest.mark.parametrize(
    ("message", "project"),
    [
        ('Required "container.clusters.list" permission(s) for "projects/team-b-proj".', "team-b-proj"),
        (
            "Required 'compute.reservations.get' permission for "
            "'projects/owner-proj/zones/us-east5-b/reservations/theirs'",
            "owner-proj",
        ),
        ('requires one of ["container.nodes.update"] permission(s).', ""),
    ],
)
def test_a_403_names_the_project_it_was_refused_in(message: str, project: str) -> None:
    assert denied_project(message) == project


def test_a_boot_disk_key_is_usable_by_compute_engines_service_agent_only_when_set() -> None:
    grant = module().resource("google_kms_crypto_key_iam_member", "boot_disk_cmek")
    assert grant["count"] == '${lookup(var.extra_env, "BOOT_DISK_KMS_KEY", "") == "" ? 0 : 1}'
    assert grant["crypto_key_id"] == '${var.extra_env["BOOT_DISK_KMS_KEY"]}'
    assert grant["role"] == "roles/cloudkms.cryptoKeyEncrypterDecrypter"
    assert grant["member"].endswith("@compute-system.iam.gserviceaccount.com")
