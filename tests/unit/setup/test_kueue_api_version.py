"""The product speaks only Kueue's v1beta2 API: every Kueue release of the supported range serves it
(``shared.setup.support``), Kueue v0.20 stops serving v1beta1, and a v1beta1 call would be the first
thing to break on it. Fails on any use of ``kueue.x-k8s.io/v1beta1`` in shared/, functions/ and
tpuprov/: the literal anywhere in a source or data file, or a Python string that builds it
(``f"{KUEUE_GROUP}/v1beta1"``, ``"v1beta1"`` next to a Kueue name)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from shared.cloud.kube import KUEUE_PATH
from shared.kueue.config import load_config
from shared.kueue.render import KUEUE_API, render
from shared.tpu.workloads import KUEUE_API as WORKLOADS_KUEUE_API
from tests.paths import REPO

ROOTS = ("shared", "functions", "tpuprov")
SUFFIXES = (".py", ".yaml", ".yml", ".json", ".txt", ".tf", ".sh")
LITERAL = re.compile(r"kueue\.x-k8s\.io/v1beta1\b")
# Google's own v1beta1 APIs are not Kueue's (the GKE audit log's CreateCluster method name).
NOT_KUEUE = re.compile(r"google\.[a-z.]*v1beta1")


def _where(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def _files() -> list[Path]:
    return sorted(
        path
        for root in ROOTS
        for path in (REPO / root).rglob("*")
        if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
    )


def _literal_uses(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    return [
        f"{_where(path)}:{number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        if LITERAL.search(line)
    ]


def _built_uses(path: Path) -> list[str]:
    """Python string literals holding v1beta1 (not Google's) on a line that names Kueue."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", -1)):
            continue
        if "v1beta1" not in token.string or NOT_KUEUE.search(token.string):
            continue
        line = lines[token.start[0] - 1]
        if "kueue" in line.lower() and not token.string.lstrip("rbfu").startswith(('"""', "'''")):
            found.append(f"{_where(path)}:{token.start[0]}: {line.strip()}")
    return found


def test_the_scan_sees_the_product() -> None:
    files = _files()
    assert any(p.name == "kube.py" and p.parent.name == "cloud" for p in files)
    assert len(files) > 50


def test_no_kueue_v1beta1_literal_anywhere_in_the_product() -> None:
    uses = [use for path in _files() for use in _literal_uses(path)]
    assert uses == [], "kueue.x-k8s.io/v1beta1 is used (v1beta2 only):\n" + "\n".join(uses)


def test_no_python_string_builds_a_kueue_v1beta1_name() -> None:
    uses = [use for path in _files() if path.suffix == ".py" for use in _built_uses(path)]
    assert uses == [], "a Kueue v1beta1 name is built (v1beta2 only):\n" + "\n".join(uses)


@pytest.mark.parametrize(
    "text",
    [
        'PATH = "/apis/kueue.x-k8s.io/v1beta1"\n',
        'api = f"{KUEUE_GROUP}/v1beta1"  # kueue\n',
        'KUEUE_VERSION = "v1beta1"\n',
    ],
)
def test_the_scan_catches_a_use(tmp_path: Path, text: str) -> None:
    path = tmp_path / "probe.py"
    path.write_text(text)
    assert _literal_uses(path) or _built_uses(path)


def test_the_api_constants_and_rendered_objects_are_v1beta2() -> None:
    assert KUEUE_API == WORKLOADS_KUEUE_API == "kueue.x-k8s.io/v1beta2"
    assert KUEUE_PATH == "/apis/kueue.x-k8s.io/v1beta2"
    versions = {doc["apiVersion"] for doc in render(load_config()) if "kueue" in doc["apiVersion"]}
    assert versions == {"kueue.x-k8s.io/v1beta2"}
