"""Fixtures of the end-to-end sandbox tests: one running stack per module, its timeline on failure."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.stack import Stack
from sandbox.testing.stack import FAST


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """One sandbox (FAST settings) shared by the tests of a module, stopped after the module."""
    with Stack(FAST) as running:
        yield running


@pytest.fixture
def timeline_on_failure(stack: Stack) -> Iterator[None]:
    """Print the stack's timeline of this test; pytest shows it when the test failed."""
    start = len(stack.timeline.entries())
    yield
    print(stack.timeline.render_from(start))
