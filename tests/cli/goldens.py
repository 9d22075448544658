"""What the plan golden tests share: their manifests written as a user's file, with the operator
settings plan reads cleared first, and each output held against its golden file."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

GOLDEN = Path(__file__).parent / "golden"
# Operator settings a test environment may carry and plan reads; each test starts without them.
PLAN_SETTINGS = (
    "CAPACITY_POLICY",
    "NODE_LOCATIONS",
    "LOCATION",
    "DISK_TYPE",
    "NODE_LABEL_KEYS",
    "TPU7X_WORKLOAD_POLICY",
)


def manifest_file(
    directory: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    documents: Sequence[Mapping[str, Any]],
    env: Mapping[str, str],
) -> Path:
    """``documents`` written to ``directory/name`` as one YAML stream, the environment set to ``env``."""
    for key in PLAN_SETTINGS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = directory / name
    path.write_text(yaml.safe_dump_all(documents))
    return path


def assert_golden(name: str, text: str) -> None:
    """``text`` equals golden file ``name``; ``UPDATE_GOLDEN=1`` rewrites it (review the diff)."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
