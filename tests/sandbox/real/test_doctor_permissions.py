"""``tpuprov doctor``/``why`` and each function's permissions, on the real components: one stack.

The stack runs all five functions, each with exactly its infra/ role: IAM for the GKE and Compute
emulators, and the same role translated to a ClusterRole for the real API server
(``sandbox.kube.rbac``), whose 403 names the missing ``container.*`` permission as GKE's does
(``sandbox.kube.iam_reason``). JobSet and Kueue are installed the way a deployment installs them
(the setup message, handled by setup_cluster). Each broken case is a fault a real deployment can
have: a role missing one permission, a sink whose writer identity lost its publisher grant, Kueue
removed. Golden files in tests/cli/golden; ``UPDATE_GOLDEN=1`` rewrites them after an intended change.

Ported from tests/sandbox/test_doctor.py and tests/sandbox/test_permissions.py. There the kmock API
checked each caller's IAM role itself and ``kubectl``'s objects were kmock's; here the refusals are
the real API server's RBAC (the role re-applied with one permission fewer), the Event the dropped
sink would have exported is created in the real API server, and the Kueue Deployment doctor misses
is the one setup_cluster applied from the release. The release-lacks-node-update scenario itself is
in test_realstack.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sandbox.cli.doctor import StackDeployment
from sandbox.emulators.gke.emulator import GkeEmulator
from sandbox.emulators.gke.state import ClusterSeed
from sandbox.emulators.iam import Iam, load_roles
from sandbox.kube import rbac
from sandbox.realstack.core import RealStack
from sandbox.stack.config import REPO_ROOT
from sandbox.testing.stack import (
    REAL_FAST,
    exclusive_tpu_jobset,
    owned_pools,
    submit,
    wait_finished,
    wait_released,
)
from shared.app.deployment import TOPIC_PREFIX, wiring
from shared.cloud.gke import GkeNodePoolAPI
from shared.cloud.kube import connect
from shared.core.errors import PermissionDeniedError, RejectedError
from shared.core.settings import Settings
from shared.setup.manifests import JOBSET, KUEUE
from tests.cli.goldens import assert_golden
from tpuprov.commands import why
from tpuprov.doctor.run import diagnose, document, exit_code, render_table
from tpuprov.doctor.views import Expected
from tpuprov.main import build_parser
from tpuprov.output import dumps

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLUSTER = "projects/p/locations/us-east5-b/clusters/c"


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    with RealStack(REAL_FAST) as running:
        running.setup()
        yield running


def _doctor(stack: RealStack) -> tuple[str, int, dict[str, object]]:
    deployment = StackDeployment(stack, Expected(stack.config.project, TOPIC_PREFIX))
    checks = diagnose(deployment, deployment.expected, deployment.settings)
    return render_table(checks), exit_code(checks), document(checks)


def _apply_role(stack: RealStack, function: str, without: str = "") -> None:
    """Re-apply ``function``'s ClusterRole from its infra/ role, optionally one permission fewer."""
    permissions = [p for p in stack.kube_cluster.roles[function] if p != without]
    stack.kube_cluster.client().apply_all(rbac.objects_for(function, permissions))


def test_a_healthy_deployment_passes_every_check(stack: RealStack) -> None:
    text, code, doc = _doctor(stack)
    assert_golden("doctor-healthy.txt", text)
    assert code == 0 and doc["ok"] is True


def test_the_function_roles_are_the_ones_infra_deploys_in_iam_and_in_the_cluster(stack: RealStack) -> None:
    roles = json.loads((REPO_ROOT / "infra" / "roles.json").read_text())
    api = stack.kube_cluster.client()
    for function, permissions in roles.items():
        principal = stack.iam.principal_of(function)
        assert stack.iam.missing(principal, permissions) == ""
        # What the API server enforces is the same role, translated once (sandbox.kube.rbac).
        role = api.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{rbac.role_name(function)}")
        assert role is not None, function
        assert role["rules"] == [r.as_dict() for r in rbac.rules_for(permissions)], function
    # ...and not more: release may not create a pool through GKE.
    assert stack.iam.missing(stack.iam.principal_of("release"), ["container.nodePools.create"])


def test_the_real_api_server_refuses_like_gkes_authorizer(stack: RealStack) -> None:
    """There the kmock API refused by IAM; here RBAC refuses (apply_kueue's role has no
    container.nodes.list) and the API server's message carries IAM's reason, as on GKE."""

    def client(function: str) -> object:
        kubeconfig = str(stack.kube_cluster.kubeconfig_for(function))
        return connect(Settings(kubeconfig=kubeconfig), lambda: None)

    with pytest.raises(PermissionDeniedError) as denied:
        client("apply_kueue").list_nodes()  # type: ignore[attr-defined]
    assert denied.value.permission == "container.nodes.list"
    user = rbac.user_name("apply_kueue")
    assert (
        f'nodes is forbidden: User "{user}" cannot list resource "nodes" in API group "" at the cluster '
        'scope: requires one of ["container.nodes.list"] permission(s).'
    ) in denied.value.why
    assert client("release").list_nodes()  # type: ignore[attr-defined]


def test_a_role_missing_a_permission_is_named_with_the_fix(stack: RealStack) -> None:
    stack.iam.revoke("release", "container.nodes.update")
    try:
        text, code, doc = _doctor(stack)
    finally:
        stack.iam.grant(stack.iam.principal_of("release"), ["container.nodes.update"])
    assert_golden("doctor-missing-permission.txt", text)
    assert_golden("doctor-missing-permission.json", dumps(doc, "json"))
    assert code == 1


def test_why_names_the_permission_a_role_lacks(
    stack: RealStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _apply_role(stack, "release", without="container.nodes.update")  # release cannot cordon
    try:
        submit(stack, exclusive_tpu_jobset("denied", replicas=1, topology="2x2", run_seconds=2))
        assert wait_finished(stack, "denied", timeout=180) == "Completed"
        stack.wait_for(lambda: stack.decisions("permission.denied", function="release"), 60, "the denial")
        denial = stack.decisions("permission.denied", function="release")[0]
        assert denial["permission"] == "container.nodes.update" and denial["role"] == "release"
        assert len(owned_pools(stack, "denied")) == 1  # nothing deleted while it could not cordon
        for name, value in stack.env().items():
            monkeypatch.setenv(name, value)
        args = build_parser().parse_args(["why", "--jobset", "default/denied"])
        # As from a shell with `tpuprov sandbox up`'s exports: the denial is read from the function logs.
        assert why.run(args) == 0
    finally:
        _apply_role(stack, "release")
    out = capsys.readouterr().out
    assert out.startswith("Pod default/denied-"), out
    assert (
        "Deployment error: The release function's role lacks container.nodes.update: add it to "
        "infra/roles.json and apply infra/."
    ) in out
    wait_released(stack, "denied", timeout=120)  # redelivered once the role is whole again


def test_a_sink_that_cannot_publish_is_named_and_exports_nothing(stack: RealStack) -> None:
    router = stack.router
    assert router is not None
    topic, writer = wiring("release").topic(TOPIC_PREFIX), router.writer_identity
    router.revoke_publisher(topic, writer)
    try:
        text, code, _ = _doctor(stack)
        # What the missing grant does: the JobSet-lifecycle sink's entries no longer reach the topic.
        stack.kube_cluster.client().create(
            "/api/v1/namespaces/default/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "js.1", "namespace": "default"},
                "involvedObject": {
                    "apiVersion": "jobset.x-k8s.io/v1alpha2",
                    "kind": "JobSet",
                    "name": "js",
                    "namespace": "default",
                },
                "reason": "AllJobsCompleted",
                "message": "jobset completed",
                "type": "Normal",
                "source": {"component": "jobset-controller"},
            },
        )
        stack.wait_for(lambda: ("jobset-lifecycle", topic) in router.export_failures, 30, "the failed export")
    finally:
        router.grant_publisher(topic, writer)
    assert_golden("doctor-missing-sink-grant.txt", text)
    assert code == 1


@pytest.fixture
def gke_with_iam() -> Iterator[tuple[GkeEmulator, Iam]]:
    iam = Iam.for_functions(load_roles(REPO_ROOT), "p")
    with GkeEmulator([ClusterSeed.from_path(CLUSTER, "127.0.0.1", "")], op_delay=0) as gke:
        gke.set_iam(iam)
        yield gke, iam


def test_gke_refuses_a_caller_without_the_permission_with_its_real_text(
    gke_with_iam: tuple[GkeEmulator, Iam],
) -> None:
    """Moved from tests/sandbox/test_permissions.py unchanged: GKE is emulated here as there."""
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


def test_an_uninstalled_kueue_is_named_with_the_fix(stack: RealStack) -> None:
    """Last: the Kueue Deployment setup_cluster applied is deleted (its local controller runs on)."""
    api = stack.kube_cluster.client()
    assert api.delete(f"/apis/apps/v1/namespaces/{KUEUE.namespace}/deployments/{KUEUE.deployment}")
    text, code, _ = _doctor(stack)
    assert_golden("doctor-kueue-uninstalled.txt", text)
    assert code == 1
    assert api.get(f"/apis/apps/v1/namespaces/{JOBSET.namespace}/deployments/{JOBSET.deployment}") is not None
