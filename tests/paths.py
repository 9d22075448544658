"""Where things are, for tests at any depth of ``tests/``: the repository root and test data."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "events"
TEST_DATA = REPO / "tests" / "data"
