"""Each function calls the emulators as its own service account, with exactly its infra/ role.

Every other sandbox scenario already runs this way (``StackConfig.enforce_iam``); here a role loses
one permission and the function must fail the way a real deployment would: GKE's or the Kubernetes
API's 403 naming the permission, a ``permission.denied`` line naming it and the role to fix, no
pool deleted under a workload, and nothing lost once the grant is back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sandbox.emulators.gke.emulator import GkeEmulator
from sandbox.emulators.gke.state import ClusterSeed
from sandbox.emulators.iam import Iam, load_roles
from sandbox.kube import rbac
from sandbox.stack.config import REPO_ROOT
from sandbox.stack.core import Stack
from sandbox.testing.fixtures.kube import KubeHandle
from sandbox.testing.stack import (
    FAST,
    exclusive_tpu_jobset,
    owned_pools,
    submit,
    wait_finished,
    wait_released,
)
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.kube import connect
from shared.core.errors import PermissionDeniedError, RejectedError
from shared.core.settings import Settings

pytestmark = [pytest.mark.integration]

CLUSTER = "projects/p/locations/us-east5-b/clusters/c"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack(FAST) as running:
        yield running


def test_a_release_whose_role_lacks_node_update_is_refused_then_delivered_once_granted(stack: Stack) -> None:
    stack.iam.revoke("release", "container.nodes.update")  # the cordon of PoolGuard
    try:
        submit(stack, exclusive_tpu_jobset("denied", replicas=1, topology="2x2"))
        assert wait_finished(stack, "denied") == "Completed"
        stack.wait_for(
            lambda: stack.decisions("permission.denied", function="release"),
            30,
            "release to say which permission it lacks",
        )
        denial = stack.decisions("permission.denied", function="release")[0]
        assert denial["permission"] == "container.nodes.update"
        assert denial["role"] == "release"
        # The real Kubernetes-on-GKE text reached the function, naming the caller and the permission.
        assert 'cannot patch resource "nodes" in API group "" at the cluster scope' in denial["message"]
        assert 'requires one of ["container.nodes.update"] permission(s)' in denial["message"]
        assert "release-" not in json.dumps(denial)  # no stray identity: it names the role, not a pod
        # Nothing was deleted while the role could not cordon: the pool is still there.
        assert len(owned_pools(stack, "denied")) == 1
    finally:
        stack.iam.grant(stack.iam.principal_of("release"), ["container.nodes.update"])
    # Pub/Sub redelivers the same message; with the grant back, the pool goes.
    wait_released(stack, "denied", timeout=60)
    assert owned_pools(stack, "denied") == []


def test_the_function_roles_are_the_ones_infra_deploys(stack: Stack) -> None:
    roles = json.loads((REPO_ROOT / "infra" / "roles.json").read_text())
    for function, permissions in roles.items():
        principal = stack.iam.principal_of(function)
        assert stack.iam.missing(principal, permissions) == ""
    # ...and not more: provision may not delete a pool directly through GKE when its role lacks it.
    assert stack.iam.missing(stack.iam.principal_of("release"), ["container.nodePools.create"])


@pytest.fixture
def gke_with_iam() -> Iterator[tuple[GkeEmulator, Iam]]:
    iam = Iam.for_functions(load_roles(REPO_ROOT), "p")
    with GkeEmulator([ClusterSeed.from_path(CLUSTER, "127.0.0.1", "")], op_delay=0) as gke:
        gke.set_iam(iam)
        yield gke, iam


def test_gke_refuses_a_caller_without_the_permission_with_its_real_text(
    gke_with_iam: tuple[GkeEmulator, Iam],
) -> None:
    gke, iam = gke_with_iam
    release = GkeNodePoolAPI(endpoint=gke.url, access_token=iam.token_for("release"))
    assert release.list_node_pools(CLUSTER) == []
    iam.revoke("release", "container.nodePools.list")
    with pytest.raises(PermissionDeniedError) as denied:
        release.list_node_pools(CLUSTER)
    assert denied.value.permission == "container.nodePools.list"
    assert f'Required "container.nodePools.list" permission(s) for "{CLUSTER}".' in denied.value.why
    # Anonymous callers are not let in at all.
    with pytest.raises(RejectedError, match="credentials"):
        GkeNodePoolAPI(endpoint=gke.url).list_node_pools(CLUSTER)
    assert gke.answered("list", 403) == 1 and gke.answered("list", 401) == 1


def test_the_kubernetes_api_refuses_like_gkes_authorizer(kube_server: KubeHandle) -> None:
    # The real kube-apiserver with RBAC: apply_kueue's role (infra/roles.json) has no nodes.list.
    client = connect(Settings(kubeconfig=str(kube_server.kubeconfig_for("apply_kueue"))), lambda: None)
    with pytest.raises(PermissionDeniedError) as denied:
        client.list_nodes()
    assert denied.value.permission == "container.nodes.list"
    user = rbac.user_name("apply_kueue")
    assert (
        f'nodes is forbidden: User "{user}" cannot list resource "nodes" in API group "" at the cluster scope'
    ) in denied.value.why
    release = connect(Settings(kubeconfig=str(kube_server.kubeconfig_for("release"))), lambda: None)
    assert release.list_nodes() == []
