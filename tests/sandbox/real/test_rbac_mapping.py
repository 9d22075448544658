"""The translation of a function's GKE IAM permissions into the RBAC rules the sandbox binds."""

from __future__ import annotations

import pytest

from sandbox.kube import rbac
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
