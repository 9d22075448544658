"""The function image: what it copies, what it installs, and that the layering contracts hold.

``docker build`` cannot run here, so the Dockerfile is checked as text and the runtime dependency
list against what ``shared/`` and ``functions/`` really import.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.paths import REPO

DOCKERFILE = REPO / "infra" / "image" / "Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


# google.* is one namespace over many distributions: name the one behind each subpackage used.
GOOGLE = {
    "google.cloud.compute_v1": "google-cloud-compute",
    "google.cloud.container_v1": "google-cloud-container",
    "google.auth": "google-auth",
    "google.api_core": "google-api-core",
}


def _imported_distributions(*roots: Path) -> set[str]:
    """Distributions of every non-stdlib, non-project module imported under ``roots``."""
    modules: set[str] = set()
    for root in roots:
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    by_module = importlib.metadata.packages_distributions()
    out: set[str] = set()
    for module in modules:
        top = module.split(".")[0]
        if top in sys.stdlib_module_names or top in {"shared", "main", "__future__"}:
            continue
        if top == "google":
            owner = next((d for prefix, d in GOOGLE.items() if module.startswith(prefix)), None)
            assert owner, f"{module}: add its distribution to GOOGLE"
            out.add(owner)
        else:
            out.update(_requirement_name(d) for d in by_module[top])
    return out


def _closure(names: set[str]) -> set[str]:
    """``names`` and everything they require (extras and unmet markers left out)."""
    seen = set(names)
    frontier = list(names)
    while frontier:
        try:
            dist = importlib.metadata.distribution(frontier.pop())
        except importlib.metadata.PackageNotFoundError:
            continue  # a requirement whose environment marker excludes this Python
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            name = _requirement_name(requirement)
            if name not in seen:
                seen.add(name)
                frontier.append(name)
    return seen


def test_the_image_copies_only_the_functions_the_library_and_the_manifests() -> None:
    text = DOCKERFILE.read_text()
    copied = re.findall(r"^COPY\s+(\S+)\s+\S+$", text, re.M)
    assert sorted(copied) == sorted(["pyproject.toml", "shared/", "functions/", "build/manifests/"])
    assert "pip install ." not in text and "pip install -e" not in text, "the project itself (CLI) stays out"
    assert "['project']['dependencies']" in text, "only the runtime dependencies are installed"


def test_runtime_dependencies_are_exactly_what_the_functions_import() -> None:
    declared = {_requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    imported = _imported_distributions(REPO / "shared", REPO / "functions")
    missing = imported - _closure(declared)
    assert not missing, f"imported by the deployed code but not installed in the image: {sorted(missing)}"
    unused = declared - imported
    assert not unused, f"installed in the image but imported by no function: {sorted(unused)}"
    for cli_only in ("google-cloud-pubsub", "google-cloud-logging", "cloudevents"):
        assert cli_only not in declared, f"{cli_only} belongs to the cli extra"


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")
def test_import_contracts_fail_when_the_library_imports_the_sandbox(tmp_path: Path) -> None:
    for package in ("shared", "sandbox", "tpuprov"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")

    def lint() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(LINT_IMPORTS), "--no-cache"],
            cwd=tmp_path,
            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )

    clean = lint()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    errors = tmp_path / "shared" / "core" / "errors.py"
    errors.write_text(errors.read_text() + "\nfrom sandbox.stack import timeline  # noqa\n")
    broken = lint()
    assert broken.returncode != 0
    assert "BROKEN" in broken.stdout and "sandbox" in broken.stdout
