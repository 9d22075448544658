"""Settings parsing of the occupancy/handover knobs: defaults, bounds and bad values."""

from __future__ import annotations

import pytest

from shared.core.errors import InvalidInputError
from shared.core.settings import Settings


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (1, 120)),
        ({"CORDON_SETTLE_SECONDS": "0", "IDLE_POOL_SECONDS": "0"}, (0, 0)),
        ({"CORDON_SETTLE_SECONDS": "30", "IDLE_POOL_SECONDS": "3600"}, (30, 3600)),
    ],
    ids=["defaults", "off", "maxima"],
)
def test_occupancy_settings_parse(env: dict[str, str], expected: tuple[int, int]) -> None:
    settings = Settings.from_env(env)
    assert (settings.cordon_settle_seconds, settings.idle_pool_seconds) == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CORDON_SETTLE_SECONDS": "31"}, "CORDON_SETTLE_SECONDS=31 must be <= 30"),
        ({"IDLE_POOL_SECONDS": "7200"}, "IDLE_POOL_SECONDS=7200 must be <= 3600"),
        ({"IDLE_POOL_SECONDS": "-1"}, "IDLE_POOL_SECONDS=-1 must be >= 0"),
        ({"CORDON_SETTLE_SECONDS": "soon"}, "is not an integer"),
    ],
    ids=["settle-too-long", "idle-too-long", "negative", "not-a-number"],
)
def test_occupancy_settings_refuse_bad_values(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        Settings.from_env(env)
