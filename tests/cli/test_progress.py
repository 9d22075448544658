"""Progress lines for waiting commands, and ``tpuprov publish setup --wait`` following an install."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest

from sandbox.testing.clock import FakeClock
from shared.setup.manifests import JOBSET, KUEUE, VERSION_ANNOTATION
from tests.cli.publishing import RecordingPublisher, parse
from tpuprov.commands import publish as cli_publish
from tpuprov.progress import Progress


def test_a_pipe_gets_one_line_when_a_step_starts_and_one_when_it_ends() -> None:
    out = io.StringIO()
    states = iter([(False, "0/1 available"), (False, "0/1 available"), (True, "1/1 available")])
    clock = FakeClock(0.0)
    assert Progress(out, tty=False).wait_until(
        "Waiting for kueue", lambda: next(states), 60, 1, clock, clock.sleep
    )
    assert out.getvalue() == "Waiting for kueue...\nWaiting for kueue...done.\n"


def test_a_terminal_line_is_redrawn_with_a_spinner_and_the_detail() -> None:
    out = io.StringIO()
    states = iter([(False, "0/1 available"), (True, "1/1 available")])
    clock = FakeClock(0.0)
    Progress(out, tty=True).wait_until("Waiting for jobset", lambda: next(states), 60, 1, clock, clock.sleep)
    text = out.getvalue()
    assert "\rWaiting for jobset" not in text.split("\x1b[2K")[0]
    assert "0/1 available" in text and text.endswith("\r\x1b[2KWaiting for jobset...done.\n")


def test_a_wait_that_times_out_says_so_and_how_far_it_got() -> None:
    out = io.StringIO()
    clock = FakeClock(0.0)
    ok = Progress(out, tty=False).wait_until(
        "Waiting for kueue", lambda: (False, "v0.18.0 installed"), 10, 2, clock, clock.sleep
    )
    assert not ok
    assert out.getvalue().endswith("Waiting for kueue...failed: gave up after 10s (v0.18.0 installed)\n")


def _deployment(component: Any, version: str, available: bool) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": component.deployment,
            "namespace": component.namespace,
            "annotations": {VERSION_ANNOTATION: version},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": component.deployment}},
            "template": {
                "metadata": {"labels": {"app": component.deployment}},
                "spec": {"containers": [{"name": "manager", "image": f"example.com/manager:{version}"}]},
            },
        },
        "status": {  # as the controller manager reports one pod, ready or not
            "observedGeneration": 1,
            "replicas": 1,
            "updatedReplicas": 1,
            "readyReplicas": 1 if available else 0,
            "availableReplicas": 1 if available else 0,
            "conditions": [{"type": "Available", "status": "True" if available else "False"}],
        },
    }


@pytest.mark.integration
def test_publish_setup_wait_follows_the_install_until_both_controllers_are_available(
    kube_server: Any, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kube_server.kubeconfig))
    monkeypatch.setenv("GKE_API_ENDPOINT", "http://127.0.0.1:9")  # never called: the endpoint is given
    for namespace in ("jobset-system", "kueue-system"):
        kube_server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kube_server.put(_deployment(JOBSET, "v0.10.1", True))
    kube_server.put(_deployment(KUEUE, "v0.19.2", False))
    # The setup function finishes the Kueue rollout a moment after the message is published.
    timer = threading.Timer(0.3, lambda: kube_server.put(_deployment(KUEUE, "v0.19.2", True)))
    timer.start()
    try:
        args = parse(["setup", "--cluster", "projects/p/locations/us-central2-b/clusters/c", "--wait", "20"])
        assert cli_publish.run(args, publisher=RecordingPublisher()) == 0
    finally:
        timer.cancel()
    err = capsys.readouterr().err
    assert "Waiting for jobset v0.10.1 (jobset-system/jobset-controller-manager)...done." in err
    assert "Waiting for kueue v0.19.2 (kueue-system/kueue-controller-manager)...done." in err
