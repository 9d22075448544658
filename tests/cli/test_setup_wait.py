"""``tpuprov publish setup --wait``: what counts as done for each add-on controller.

Setup leaves a newer supported release alone under ADDON_UPGRADE=keep-newer (``shared.setup.support``),
so the wait must not hold out for the pinned version there; under ``pinned`` it must.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.core.errors import NotFoundError
from shared.setup.manifests import VERSION_ANNOTATION
from tpuprov.waits import _deployment_state


class Objects:
    """The one read the wait makes: the controller's Deployment, as the API returns it."""

    def __init__(self, deployment: dict[str, Any] | None) -> None:
        self.deployment = deployment

    def get(self, api_version: str, kind: str, name: str, namespace: str) -> dict[str, Any]:
        if self.deployment is None:
            raise NotFoundError(f"{kind} {namespace}/{name} not found")
        return self.deployment


def deployment(version: str, available: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {VERSION_ANNOTATION: version}},
        "spec": {"replicas": 1},
        "status": {
            "availableReplicas": int(available),
            "conditions": [{"type": "Available", "status": str(available)}],
        },
    }


@pytest.mark.parametrize(
    ("installed", "mode", "done", "says"),
    [
        pytest.param("v0.19.2", "keep-newer", True, "1/1 available", id="pinned-and-available"),
        pytest.param("v0.17.1", "keep-newer", False, "waiting for v0.19.2", id="older-is-upgraded"),
        pytest.param("v0.20.0", "keep-newer", True, "v0.20.0 kept (newer than", id="newer-is-kept"),
        pytest.param("v0.20.0", "pinned", False, "waiting for v0.19.2", id="newer-is-replaced-when-pinned"),
        pytest.param("main", "keep-newer", True, "not a release", id="unrecognised-is-kept"),
    ],
)
def test_setup_wait_waits_for_what_setup_leaves(installed: str, mode: str, done: bool, says: str) -> None:
    ok, state = _deployment_state(Objects(deployment(installed)), "kueue-system", "c", "v0.19.2", mode)
    assert ok is done
    assert says in state


def test_a_kept_release_that_is_not_available_is_not_done() -> None:
    ok, _ = _deployment_state(Objects(deployment("v0.20.0", available=False)), "n", "c", "v0.19.2")
    assert not ok


def test_an_absent_controller_is_not_done() -> None:
    assert _deployment_state(Objects(None), "n", "c", "v0.19.2") == (False, "not installed yet")
