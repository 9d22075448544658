"""``tpuprov doctor`` against a sandbox deployment: healthy, then one thing broken at a time.

The sandbox runs all five functions, each with exactly its infra/ role, and JobSet and Kueue are
installed the way a deployment installs them (the setup message, handled by setup_cluster). Each
broken case is a fault a real deployment can have: a role missing one permission, a sink whose
writer identity lost its publisher grant (the router then exports nothing from it), Kueue removed.
Golden files in tests/cli/golden; ``UPDATE_GOLDEN=1`` rewrites them after an intended change.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.stack.config import ALL_FUNCTIONS
from sandbox.stack.core import Stack
from sandbox.stack.wiring import TOPIC_PREFIX, wiring
from sandbox.testing.stack import FAST, exclusive_tpu_jobset, submit, wait_finished, wait_released
from shared.setup.manifests import JOBSET, KUEUE
from tpuprov.commands import why
from tpuprov.doctor.run import diagnose, document, exit_code, render_table
from tpuprov.doctor.sandbox import StackDeployment, install_addons
from tpuprov.doctor.views import Expected
from tpuprov.main import build_parser
from tpuprov.output import dumps

pytestmark = [pytest.mark.integration]

GOLDEN = Path(__file__).parents[1] / "cli" / "golden"


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack(dataclasses.replace(FAST, functions=ALL_FUNCTIONS)) as running:
        install_addons(running)
        yield running


def _doctor(stack: Stack) -> tuple[str, int, dict[str, object]]:
    deployment = StackDeployment(stack, Expected(stack.config.project, TOPIC_PREFIX))
    checks = diagnose(deployment, deployment.expected, deployment.settings)
    return render_table(checks), exit_code(checks), document(checks)


def test_a_healthy_deployment_passes_every_check(stack: Stack) -> None:
    text, code, doc = _doctor(stack)
    _golden("doctor-healthy.txt", text)
    assert code == 0 and doc["ok"] is True


def test_a_role_missing_a_permission_is_named_with_the_fix(stack: Stack) -> None:
    stack.iam.revoke("release", "container.nodes.update")
    try:
        text, code, doc = _doctor(stack)
    finally:
        stack.iam.grant(stack.iam.principal_of("release"), ["container.nodes.update"])
    _golden("doctor-missing-permission.txt", text)
    _golden("doctor-missing-permission.json", dumps(doc, "json"))
    assert code == 1


def test_a_sink_that_cannot_publish_is_named_and_exports_nothing(stack: Stack) -> None:
    assert stack.router is not None
    topic, writer = wiring("release").topic(TOPIC_PREFIX), stack.router.writer_identity
    stack.router.revoke_publisher(topic, writer)
    try:
        text, code, _ = _doctor(stack)
        # What the missing grant does: the JobSet-lifecycle sink's entries no longer reach the topic.
        stack.kube.put(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "js.1", "namespace": "default"},
                "involvedObject": {"kind": "JobSet", "name": "js", "namespace": "default"},
                "reason": "AllJobsCompleted",
                "message": "jobset completed",
                "type": "Normal",
            }
        )
        stack.wait_for(lambda: stack.router.export_failures, 10, "the failed export")  # type: ignore[union-attr]
    finally:
        stack.router.grant_publisher(topic, writer)
    _golden("doctor-missing-sink-grant.txt", text)
    assert code == 1
    assert ("jobset-lifecycle", topic) in stack.router.export_failures


def test_why_names_the_permission_a_role_lacks(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stack.iam.revoke("release", "container.nodes.update")  # release cannot cordon, so cannot delete
    try:
        submit(stack, exclusive_tpu_jobset("denied", replicas=1, topology="2x2"))
        assert wait_finished(stack, "denied") == "Completed"
        stack.wait_for(lambda: stack.decisions("permission.denied", function="release"), 30, "the denial")
        for name, value in stack.env().items():
            monkeypatch.setenv(name, value)
        args = build_parser().parse_args(["why", "--jobset", "default/denied"])
        # As from a shell with `tpuprov sandbox up`'s exports: the denial is read from the function logs.
        assert why.run(args) == 0
    finally:
        stack.iam.grant(stack.iam.principal_of("release"), ["container.nodes.update"])
    out = capsys.readouterr().out
    assert out.startswith("Pod default/denied-")
    assert (
        "Deployment error: The release function's role lacks container.nodes.update: add it to "
        "infra/roles.json and apply infra/."
    ) in out
    wait_released(stack, "denied", timeout=60)  # redelivered once the grant is back


def test_an_uninstalled_kueue_is_named_with_the_fix(stack: Stack) -> None:
    assert stack.kube.delete("apps/v1", "deployments", KUEUE.namespace, KUEUE.deployment)
    text, code, _ = _doctor(stack)
    _golden("doctor-kueue-uninstalled.txt", text)
    assert code == 1
    assert stack.kube.get("apps/v1", "deployments", JOBSET.namespace, JOBSET.deployment) is not None
