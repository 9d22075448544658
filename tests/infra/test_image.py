"""The function image: what it copies, what it installs, and that the layering contracts hold.

``docker build`` cannot run here, so the Dockerfile is checked as text and the runtime dependency
list against what ``shared/`` and ``functions/`` really import.
"""

from __future__ import annotations

import ast
import dataclasses
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
DOCKERIGNORE = REPO / "infra" / "image" / "Dockerfile.dockerignore"
LOCK_IN_REPO = "infra/image/requirements.lock"
LOCK = REPO / LOCK_IN_REPO
LOCK_IN_IMAGE = "/tmp/requirements.lock"
PROJECT_ROOT = "tpu-provisioner (pyproject.toml)"  # how pip-compile names the project in `# via`
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


# google.* is one namespace over many distributions: name the one behind each subpackage used.
GOOGLE = {
    "google.cloud.compute_v1": "google-cloud-compute",
    "google.cloud.container_v1": "google-cloud-container",
    "google.auth": "google-auth",
    "google.oauth2": "google-auth",
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


def test_the_image_copies_only_the_lock_the_functions_the_library_and_the_manifests() -> None:
    text = DOCKERFILE.read_text()
    copied = re.findall(r"^COPY\s+(\S+)\s+\S+$", text, re.M)
    assert sorted(copied) == sorted([LOCK_IN_REPO, "shared/", "functions/", "build/manifests/"])
    assert "pip install ." not in text and "pip install -e" not in text, "the project itself (CLI) stays out"
    # BuildKit sends only what .dockerignore lets through: the same four paths.
    allowed = [line[1:] for line in DOCKERIGNORE.read_text().splitlines() if line.startswith("!")]
    assert sorted(allowed) == sorted(copied)


def test_the_image_installs_exactly_the_locked_files() -> None:
    installs = [line for line in _run_commands() if "pip install" in line]
    assert installs == [f"pip install --require-hashes --no-deps -r {LOCK_IN_IMAGE}"], installs


def _run_commands() -> list[str]:
    """The shell commands of the Dockerfile's RUN instructions, continuation lines joined."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    runs = re.findall(r"^RUN\s+(.+)$", text, re.M)
    return [re.sub(r"\s+", " ", part).strip() for run in runs for part in run.split("&&")]


# --- the lock file the image installs from ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Locked:
    name: str
    version: str
    hashes: tuple[str, ...]
    via: tuple[str, ...]  # what requires it, as pip-compile wrote it


def _locked() -> dict[str, Locked]:
    """The entries of the pip-compile output: ``name==version \\`` + hash lines + ``# via`` comments."""
    entries: dict[str, Locked] = {}
    text = LOCK.read_text()
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        head = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", block)
        if head is None:
            continue
        via_lines = re.findall(r"^\s+#\s+(?:via\s+)?(.+)$", block, re.M)
        name = _requirement_name(head.group(1))
        entries[name] = Locked(
            name,
            head.group(2),
            tuple(re.findall(r"--hash=sha256:([0-9a-f]{64})", block)),
            tuple(v.strip() for v in via_lines if v.strip() != "via"),
        )
    return entries


def test_the_lock_pins_every_file_by_hash() -> None:
    locked = _locked()
    assert len(locked) > 20, "the lock looks empty or unparsed"
    text = LOCK.read_text()
    requirement_lines = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert len(requirement_lines) == len(locked), "only name==version entries (no options, indexes or links)"
    for entry in locked.values():
        assert entry.hashes, f"{entry.name} has no --hash"
        assert re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", entry.version), (entry.name, entry.version)
    command = re.search(r"^#\s+(pip-compile .+)$", text, re.M)
    assert command is not None, "the lock records the command that made it"
    assert "--generate-hashes" in command.group(1) and command.group(1).endswith(" pyproject.toml")


def test_the_lock_is_in_step_with_the_runtime_dependencies() -> None:
    from packaging.requirements import Requirement

    locked = _locked()
    declared = {_requirement_name(r): Requirement(r) for r in PYPROJECT["project"]["dependencies"]}
    roots = {name for name, entry in locked.items() if PROJECT_ROOT in entry.via}
    missing = sorted(set(declared) - set(locked))
    assert not missing, f"runtime dependencies not in the lock: {missing}; run `make lock`"
    stale = sorted(roots ^ set(declared))
    assert not stale, f"the lock was compiled from other dependencies than pyproject.toml's: {stale}"
    for name, requirement in declared.items():
        assert requirement.specifier.contains(locked[name].version, prereleases=True), (
            f"{name}=={locked[name].version} in the lock does not satisfy {requirement}; run `make lock`"
        )
    # Everything else is there because something locked needs it, never a leftover.
    reachable = set(roots)
    frontier = list(roots)
    while frontier:
        parent = frontier.pop()
        for name, entry in locked.items():
            if name not in reachable and parent in {_requirement_name(v.split(" (")[0]) for v in entry.via}:
                reachable.add(name)
                frontier.append(name)
    assert reachable == set(locked), f"locked but required by nothing: {sorted(set(locked) - reachable)}"


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
