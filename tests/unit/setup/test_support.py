"""The supported JobSet and Kueue range and what setup_cluster does with a version it finds."""

from __future__ import annotations

import pytest

from shared.core.errors import InvalidInputError
from shared.core.settings import Settings
from shared.setup.installer import ComponentResult
from shared.setup.support import SUPPORTED, Support, plan, support


@pytest.mark.parametrize(
    ("found", "mode", "action"),
    [
        ("", "keep-newer", "installed"),
        ("v0.18.4", "keep-newer", "upgraded"),
        ("v0.18.4", "pinned", "upgraded"),
        ("v0.19.2", "keep-newer", "unchanged"),
        ("v0.19.3", "keep-newer", "skipped-newer"),
        ("v0.19.3", "pinned", "downgraded"),
        ("v0.20.0", "keep-newer", "skipped-newer"),
        ("main", "keep-newer", "skipped-unknown"),
        ("main", "pinned", "skipped-unknown"),  # never replace a build nobody can place
        ("unknown", "pinned", "skipped-unknown"),
    ],
)
def test_plan(found: str, mode: str, action: str) -> None:
    assert plan(found, "v0.19.2", mode) == action


@pytest.mark.parametrize(
    ("component", "version", "supported", "tested", "detail"),
    [
        ("kueue", "v0.19.2", True, True, "supported: tested, in the range v0.17-v0.19"),
        ("kueue", "v0.17.1", True, True, "supported: tested, in the range v0.17-v0.19"),
        ("kueue", "v0.17.0", True, False, "supported: the v0.17 line, tested at v0.17.1"),
        ("kueue", "v0.18.1", True, False, "supported: the v0.18 line, tested at v0.18.4"),
        ("kueue", "v0.16.3", False, False, "unsupported: older than the range v0.17-v0.19"),
        ("kueue", "v0.20.0", False, False, "unsupported: newer than the range v0.17-v0.19"),
        ("jobset", "v0.11.1", True, True, "supported: tested, in the range v0.10-v0.12"),
        ("jobset", "v0.9.0", False, False, "unsupported: older than the range v0.10-v0.12"),
        ("jobset", "main", False, False, "unsupported: not a release version (supported: v0.10-v0.12)"),
    ],
)
def test_support(component: str, version: str, supported: bool, tested: bool, detail: str) -> None:
    assert support(component, version) == Support(supported, tested, detail)


def test_the_range_holds_the_pinned_releases() -> None:
    pinned = Settings()
    assert pinned.jobset_version in SUPPORTED["jobset"].tested
    assert pinned.kueue_version in SUPPORTED["kueue"].tested
    assert SUPPORTED["jobset"].tested == ("v0.10.1", "v0.11.1", "v0.12.0")
    assert SUPPORTED["kueue"].tested == ("v0.17.1", "v0.18.4", "v0.19.2")


def test_addon_upgrade_defaults_to_keep_newer_and_is_validated() -> None:
    assert Settings().addon_upgrade == "keep-newer"
    assert Settings.from_env({"ADDON_UPGRADE": "pinned"}).addon_upgrade == "pinned"
    assert Settings.from_env({"ADDON_UPGRADE": " keep-newer "}).addon_upgrade == "keep-newer"
    with pytest.raises(InvalidInputError, match=r"ADDON_UPGRADE=\"latest\" is not one of keep-newer, pinned"):
        Settings.from_env({"ADDON_UPGRADE": "latest"})


def test_summaries_say_what_was_left_alone_and_why() -> None:
    kept = ComponentResult("jobset", "v0.10.1", "v0.11.1", "skipped-newer")
    assert kept.summary() == (
        "jobset v0.11.1: left alone (skipped-newer, pinned v0.10.1; "
        "supported: tested, in the range v0.10-v0.12)"
    )
    down = ComponentResult("jobset", "v0.10.1", "v0.11.1", "downgraded", configured=["Deployment x"])
    assert down.summary() == "jobset v0.10.1: downgraded from v0.11.1 (0 created, 1 configured, 0 unchanged)"
