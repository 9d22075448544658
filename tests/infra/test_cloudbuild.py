"""Offline checks of cloudbuild.yaml and infra/cloudbuild-destroy.yaml.

The files must parse, every substitution they use must be declared and documented in
infra/README.md, and their shell steps are run (after Cloud Build's substitution rules are applied)
against stub ``curl`` and ``terraform`` commands to check what they download and deploy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import REPO

ROOT = REPO
INFRA = ROOT / "infra"
CLOUD_BUILD_BUILTINS = {"PROJECT_ID", "PROJECT_NUMBER", "BUILD_ID", "LOCATION", "SERVICE_ACCOUNT_EMAIL"}

_SUBSTITUTION = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def cloudbuild(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def substitute(text: str, values: dict[str, str]) -> str:
    """Cloud Build's substitution: ``$$`` is a literal ``$``; unknown ``$NAME`` is an error."""
    parts = text.split("$$")

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise KeyError(f"undeclared substitution ${name}")
        return values[name]

    return "$".join(_SUBSTITUTION.sub(one, part) for part in parts)


def used_substitutions(doc: dict[str, Any]) -> set[str]:
    text = json.dumps(doc["steps"]).replace("$$", "")
    return {m.group(1) or m.group(2) for m in _SUBSTITUTION.finditer(text)}


CLOUDBUILD_FILES = [ROOT / "cloudbuild.yaml", INFRA / "cloudbuild-destroy.yaml"]


@pytest.mark.parametrize("path", CLOUDBUILD_FILES, ids=["deploy", "destroy"])
def test_cloudbuild_substitutions_are_declared_and_documented(path: Path) -> None:
    doc = cloudbuild(path)
    declared = set(doc["substitutions"])
    used = used_substitutions(doc)
    assert used - CLOUD_BUILD_BUILTINS <= declared, used - CLOUD_BUILD_BUILTINS - declared
    assert all(name.startswith("_") for name in declared)
    assert declared <= used, f"declared but unused: {declared - used}"
    readme = (INFRA / "README.md").read_text()
    for name in declared:
        assert f"`{name}`" in readme, f"{name} is not documented in infra/README.md"
    for step in doc["steps"]:
        assert step.get("id") and step.get("name")


def test_cloudbuild_pipeline_order() -> None:
    steps = {s["id"]: s for s in cloudbuild(ROOT / "cloudbuild.yaml")["steps"]}
    assert list(steps) == ["check-substitutions", "test", "manifests", "build", "push", "deploy", "report"]
    assert "make test" in steps["test"]["args"][-1] and steps["test"]["name"].startswith("python:3.11")
    assert set(steps["build"]["waitFor"]) == {"test", "manifests"}
    assert "--file=infra/image/Dockerfile" in steps["build"]["args"]


def _step_script(path: Path, step_id: str, values: dict[str, str], workspace: Path) -> str:
    doc = cloudbuild(path)
    step = next(s for s in doc["steps"] if s["id"] == step_id)
    merged = {**{k: str(v) for k, v in doc["substitutions"].items()}, **values}
    return substitute(step["args"][-1], merged).replace("/workspace/", f"{workspace}/")


def _stub(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


BUILTINS = {"PROJECT_ID": "my-proj", "BUILD_ID": "b-123"}
CURL_STUB = """
out=""; url=""
while [ $# -gt 0 ]; do
  case "$1" in -o) out="$2"; shift 2;; -*) shift;; *) url="$1"; shift;; esac
done
echo "$url" >> "$STUB_LOG"
printf 'manifest from %s\\n' "$url" > "$out"
"""


def _run_manifests(tmp_path: Path, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    _stub(tmp_path / "bin", "curl", CURL_STUB)
    script = _step_script(ROOT / "cloudbuild.yaml", "manifests", {**BUILTINS, **values}, tmp_path)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "STUB_LOG": str(tmp_path / "urls"),
    }
    return subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )


def _sha(url: str) -> str:
    return hashlib.sha256(f"manifest from {url}\n".encode()).hexdigest()


JOBSET_URL = "https://github.com/kubernetes-sigs/jobset/releases/download/v0.10.1/manifests.yaml"
KUEUE_URL = "https://github.com/kubernetes-sigs/kueue/releases/download/v0.19.2/manifests.yaml"


def test_manifests_step_downloads_pinned_releases(tmp_path: Path) -> None:
    result = _run_manifests(tmp_path, {"_JOBSET_SHA256": _sha(JOBSET_URL), "_KUEUE_SHA256": ""})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "urls").read_text().split() == [JOBSET_URL, KUEUE_URL]
    manifests = tmp_path / "build" / "manifests"
    assert sorted(p.name for p in manifests.iterdir()) == ["jobset-v0.10.1.yaml", "kueue-v0.19.2.yaml"]
    assert f"sha256={_sha(KUEUE_URL)}" in result.stdout


def test_manifests_step_fails_on_checksum_mismatch(tmp_path: Path) -> None:
    result = _run_manifests(tmp_path, {"_KUEUE_VERSION": "v0.20.0", "_KUEUE_SHA256": "0" * 64})
    assert result.returncode == 1
    assert "kueue-v0.20.0.yaml: sha256" in result.stderr and "does not match" in result.stderr


TERRAFORM_STUB = 'printf "%s\\n" "$*" >> "$STUB_LOG"\n'


def _run_terraform_step(
    tmp_path: Path, path: Path, step_id: str, values: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    _stub(tmp_path / "bin", "terraform", TERRAFORM_STUB)
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "image-ref.txt").write_text("r/p/i@sha256:" + "f" * 64 + "\n")
    script = _step_script(path, step_id, {**BUILTINS, **values}, tmp_path / "workspace")
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "STUB_LOG": str(tmp_path / "calls"),
    }
    result = subprocess.run(
        ["sh", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    calls = (tmp_path / "calls").read_text().splitlines() if (tmp_path / "calls").exists() else []
    return result, calls


REQUIRED = {"_CLUSTER": "tpu-cluster", "_CLUSTER_LOCATION": "us-central2-b", "_STATE_BUCKET": "bucket"}


def test_deploy_step_applies_the_pushed_digest(tmp_path: Path) -> None:
    values = {**REQUIRED, "_NODE_ZONES": "us-central2-b,us-central2-c", "_TF_VAR_FILE": "prod.tfvars"}
    result, calls = _run_terraform_step(tmp_path, ROOT / "cloudbuild.yaml", "deploy", values)
    assert result.returncode == 0, result.stderr
    init, fmt, validate, apply = calls
    assert init == "init -input=false -backend-config=bucket=bucket -backend-config=prefix=tpu-provisioner"
    assert (fmt, validate) == ("fmt -check -recursive", "validate")
    args = apply.split(" ")
    assert args[:4] == ["apply", "-input=false", "-auto-approve", "-var-file=prod.tfvars"]
    assert '-var=node_locations=["us-central2-b","us-central2-c"]' in args
    assert "-var=image=r/p/i@sha256:" + "f" * 64 in args
    assert {
        "-var=project_id=my-proj",
        "-var=cluster_name=tpu-cluster",
        "-var=cluster_location=us-central2-b",
    } <= set(args)
    # The var file comes first so that the substitutions (given later) win over it.
    assert args.index("-var-file=prod.tfvars") < args.index("-var=project_id=my-proj")


def test_deploy_step_leaves_optional_inputs_out(tmp_path: Path) -> None:
    result, calls = _run_terraform_step(tmp_path, ROOT / "cloudbuild.yaml", "deploy", REQUIRED)
    assert result.returncode == 0, result.stderr
    apply = calls[-1]
    assert "-var-file" not in apply and "node_locations" not in apply


def test_destroy_step(tmp_path: Path) -> None:
    result, calls = _run_terraform_step(tmp_path, INFRA / "cloudbuild-destroy.yaml", "destroy", REQUIRED)
    assert result.returncode == 0, result.stderr
    init, destroy = calls
    assert init.startswith("init -input=false -backend-config=bucket=bucket")
    assert destroy.startswith("destroy -input=false -auto-approve")
    image = re.search(r"-var=image=(\S+)", destroy)
    assert image is not None and re.search(r"@sha256:[0-9a-f]{64}$", image.group(1))


@pytest.mark.parametrize(
    ("path", "step_id"),
    [(INFRA / "cloudbuild-destroy.yaml", "destroy"), (ROOT / "cloudbuild.yaml", "check-substitutions")],
    ids=["destroy", "deploy"],
)
def test_missing_required_substitutions_stop_the_build(tmp_path: Path, path: Path, step_id: str) -> None:
    runner = "bash" if step_id == "check-substitutions" else "sh"
    _stub(tmp_path / "bin", "terraform", TERRAFORM_STUB)
    script = _step_script(path, step_id, {**BUILTINS, "_CLUSTER": "c"}, tmp_path)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "STUB_LOG": str(tmp_path / "calls"),
    }
    result = subprocess.run(
        [runner, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 2
    assert "_STATE_BUCKET" in result.stderr
    assert not (tmp_path / "calls").exists()


def test_readme_gives_the_submit_command() -> None:
    readme = (INFRA / "README.md").read_text()
    assert "gcloud builds submit --config cloudbuild.yaml" in readme
    assert "gcloud builds submit --config infra/cloudbuild-destroy.yaml" in readme


TEST_TOOLS = INFRA / "ci" / "test-tools.sh"


def test_the_test_step_runs_what_ci_runs_with_every_tool_the_suite_needs() -> None:
    steps = {s["id"]: s for s in cloudbuild(ROOT / "cloudbuild.yaml")["steps"]}
    ci = re.search(r"^exec (make \w+)$", (ROOT / ".ci" / "run").read_text(), re.M)
    assert ci is not None, ".ci/run no longer execs a make target"
    tools, command = steps["test"]["args"][-1].split(" && ")
    assert tools == "infra/ci/test-tools.sh"
    assert command.split()[:2] == ci.group(1).split(), "the same target CI runs (only the venv path differs)"
    # The apt packages the script installs are Debian bookworm's (openjdk-17); so is the image.
    assert steps["test"]["name"] == "python:3.11-bookworm"
    script = TEST_TOOLS.read_text()
    for needed in (
        "openjdk-17-jre-headless",
        "google-cloud-cli-pubsub-emulator",
        "SHA256SUMS",
        "sha256sum -c",
    ):
        assert needed in script, needed
    # `make test` builds the sandbox's Kubernetes binaries with the Go their module names.
    assert "sandbox/kube/go/go.mod" in script and "go.dev/dl/" in script
    assert os.access(TEST_TOOLS, os.X_OK)
    syntax = subprocess.run(["bash", "-n", str(TEST_TOOLS)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_terraform_is_one_pinned_release_everywhere() -> None:
    version = re.search(r'^TERRAFORM_VERSION="(\d+\.\d+\.\d+)"$', TEST_TOOLS.read_text(), re.M)
    assert version is not None, "test-tools.sh pins Terraform to a release"
    images = [
        step["name"]
        for path in CLOUDBUILD_FILES
        for step in cloudbuild(path)["steps"]
        if step["name"].startswith("hashicorp/terraform")
    ]
    assert images and set(images) == {f"hashicorp/terraform:{version.group(1)}"}, images
