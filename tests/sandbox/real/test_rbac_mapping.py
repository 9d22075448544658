"""The translation of a function's GKE IAM permissions into the RBAC rules the sandbox binds."""

from __future__ import annotations

import pytest

from sandbox.kube import iam_reason, rbac
from tests.paths import REPO


def test_each_iam_verb_becomes_the_kubernetes_verbs_gke_checks_it_for() -> None:
    rules = rbac.rules_for(
        [
            "container.pods.get",
            "container.pods.list",
            "container.nodes.update",
            "container.events.create",
            "container.thirdPartyObjects.delete",
            "container.pods.updateStatus",
        ]
    )
    assert [r.as_dict() for r in rules] == [
        {"apiGroups": ["jobset.x-k8s.io", "kueue.x-k8s.io"], "resources": ["*"], "verbs": ["delete"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch", "update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch", "update"]},
    ]


def test_gke_and_compute_api_permissions_grant_nothing_in_the_cluster() -> None:
    assert (
        rbac.rules_for(
            ["container.clusters.update", "container.nodePools.create", "compute.resourcePolicies.get"]
        )
        == []
    )


@pytest.mark.parametrize(
    "permission", ["container.widgets.get", "container.pods.impersonate", "storage.objects.get"]
)
def test_a_permission_without_a_mapping_is_refused(permission: str) -> None:
    with pytest.raises(ValueError, match=permission):
        rbac.rules_for([permission])


def test_every_function_role_in_infra_translates_and_setup_cluster_is_cluster_admin() -> None:
    roles = rbac.load_roles(REPO / "infra")
    objects = rbac.all_objects(roles)
    bindings = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRoleBinding"}
    assert set(bindings) == {rbac.role_name(f) for f in rbac.FUNCTIONS}
    assert bindings[rbac.role_name("setup_cluster")]["roleRef"]["name"] == "cluster-admin"
    roles_by_name = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    provision = roles_by_name[rbac.role_name("provision")]["rules"]
    assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]} in provision


def test_every_request_a_role_grants_maps_back_to_that_permission() -> None:
    """The IAM reason of a refusal (``sandbox.kube.iam_reason``) names the permission whose RBAC rule
    would have allowed the request: ``permission_for`` inverts ``rules_for`` for every permission
    any function's role holds."""
    roles = rbac.load_roles(REPO / "infra")
    permissions = {p for granted in roles.values() for p in granted if not p.startswith(rbac.NOT_KUBERNETES)}
    assert permissions
    for permission in sorted(permissions):
        (rule,) = rbac.rules_for([permission], custom_groups=("jobset.x-k8s.io",))
        for group in rule.api_groups:
            for resource in rule.resources:
                plural, _, subresource = resource.partition("/")
                for verb in rule.verbs:
                    name = "jobsets" if plural == "*" else plural
                    assert rbac.permission_for(verb, group, name, subresource) == permission, (verb, resource)


def test_a_request_no_permission_covers_gets_no_iam_reason() -> None:
    review = {"spec": {"resourceAttributes": {"verb": "get", "resource": "pods", "subresource": "log"}}}
    assert iam_reason.reason(review) == ""
    assert iam_reason.reason({"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}}) == ""
    patch = {"spec": {"resourceAttributes": {"verb": "patch", "group": "", "resource": "nodes"}}}
    assert iam_reason.reason(patch) == 'requires one of ["container.nodes.update"] permission(s).'
