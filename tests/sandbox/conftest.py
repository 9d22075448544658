"""Fixtures of the end-to-end sandbox tests: one running stack per module, its timeline on failure."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.realstack.core import RealStack
from sandbox.testing.stack import REAL_FAST


@pytest.fixture(scope="module")
def stack() -> Iterator[RealStack]:
    """The product on the real components (``REAL_FAST``), shared by the tests of a module and set
    up once: the product's ``setup_cluster`` has installed JobSet and Kueue and both serve."""
    with RealStack(REAL_FAST) as running:
        running.setup()
        yield running


@pytest.fixture
def timeline_on_failure(stack: RealStack) -> Iterator[None]:
    """Print the stack's timeline of this test; pytest shows it when the test failed."""
    start = len(stack.timeline.entries())
    yield
    print(stack.timeline.render_from(start))
