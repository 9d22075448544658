"""Every setting docs/settings.md documents can be deployed, and reaches every service.

The settings table of docs/settings.md (the one place settings are documented, linked from the README) is
read at run time, so a setting added there (with its field in ``shared/core/settings.py``) is covered
without touching this file: it is set either by a variable
of its own (``local.function_env`` in infra/main.tf) or through the one ``extra_env`` map. Where
terraform is installed, the variable validations and the function module's preconditions are run by
terraform itself (``terraform plan`` over the verbatim blocks; no provider needed).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from shared.core.settings import CONTROL_PLANE_ENDPOINTS, Settings
from tests.infra.hcl import INFRA, TF_ENV, WIRING, first, hcl_block, module
from tests.paths import REPO

SETTINGS_PAGE = REPO / "docs" / "settings.md"
# Every page a setting could be documented on besides SETTINGS_PAGE: none of them may hold a settings table.
OTHER_PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "infra" / "README.md")
FIELDS = {field.name.upper() for field in dataclasses.fields(Settings)}
TERRAFORM = shutil.which("terraform")
needs_terraform = pytest.mark.skipif(TERRAFORM is None, reason="terraform is not installed")


def table_settings(text: str) -> list[str]:
    """Env names in the first column of every table row of ``text``, in order."""
    names: list[str] = []
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            names += re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[1])
    return names


@cache
def documented_settings() -> tuple[str, ...]:
    """Env names in the first column of docs/settings.md's "Settings" table, in table order."""
    text = SETTINGS_PAGE.read_text()
    start = re.search(r"^# Settings\b.*$", text, re.M)
    assert start is not None, "docs/settings.md has no '# Settings' title"
    section = text[start.end() :]
    end = re.search(r"^#{1,2} ", section, re.M)
    section = section[: end.start()] if end else section
    names = table_settings(section)
    assert len(names) > 20, f"the Settings table was not parsed: {names}"
    return tuple(names)


def dedicated() -> set[str]:
    """Settings set by a Terraform variable of their own."""
    return set(module().locals["function_env"])


# --- the settings page and the settings agree --------------------------------------------------


def test_the_settings_page_documents_only_real_settings() -> None:
    unknown = sorted(set(documented_settings()) - FIELDS)
    assert not unknown, f"docs/settings.md names settings shared/core/settings.py does not have: {unknown}"


def test_every_setting_is_documented_on_the_settings_page() -> None:
    undocumented = sorted(FIELDS - set(documented_settings()))
    assert not undocumented, f"settings missing from docs/settings.md's Settings table: {undocumented}"


def test_every_setting_is_documented_exactly_once() -> None:
    names = documented_settings()
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert not repeated, f"docs/settings.md documents these settings more than once: {repeated}"
    # The table is the whole page's only table and ends it, so rows are appended at its end.
    tables = re.findall(r"^\| env \| default \| meaning \|$", SETTINGS_PAGE.read_text(), re.M)
    assert len(tables) == 1, "docs/settings.md must hold exactly one settings table"
    # No other page has a row that documents a setting (a first cell opening with its env name).
    for page in OTHER_PAGES:
        if page != SETTINGS_PAGE:
            rows = re.findall(r"^\|\s*`([A-Z][A-Z0-9_]*)`", page.read_text(), re.M)
            elsewhere = sorted(set(rows) & FIELDS)
            where = page.relative_to(REPO)
            assert not elsewhere, f"{where} documents settings {elsewhere}: link docs/settings.md instead"


# --- every documented setting can be set -------------------------------------------------------


def _extra_env_accepts(name: str) -> bool:
    """The extra_env validations, read from infra/variables.tf and applied in Python."""
    conditions = [v["condition"] for v in module().variables["extra_env"]["validation"]]
    pattern = next(re.search(r'regex\("([^"]+)"', c) for c in conditions if "regex(" in c)
    assert pattern is not None
    reserved = next(re.findall(r'"([A-Z_]+)"', c) for c in conditions if "setintersection" in c)
    return bool(re.fullmatch(pattern.group(1).replace("\\\\", "\\"), name)) and name not in reserved


def test_every_documented_setting_has_a_variable_or_fits_extra_env() -> None:
    refused = [n for n in documented_settings() if n not in dedicated() and not _extra_env_accepts(n)]
    assert not refused, f"docs/settings.md documents settings infra/ cannot set: {refused}"
    assert not _extra_env_accepts("PORT") and not _extra_env_accepts("node_locations")


def test_extra_env_reaches_every_service_beside_the_dedicated_settings() -> None:
    root = module()
    extra = root.variables["extra_env"]
    assert (extra["type"], extra["default"]) == ("${map(string)}", {})
    call = root.modules["function"]
    assert call["for_each"] == "${local.functions}" and set(root.locals["functions"]) == set(WIRING)
    assert (call["env"], call["extra_env"]) == ("${local.function_env}", "${var.extra_env}")
    service = module("modules/function").resource("google_cloud_run_v2_service", "this")
    container = first(first(service["template"])["containers"])
    [env] = [block["env"] for block in container["dynamic"] if "env" in block]
    assert env["for_each"] == "${merge(var.env, var.extra_env)}"
    assert first(env["content"]) == {"name": "${env.key}", "value": "${env.value}"}


# --- reaching the cluster ----------------------------------------------------------------------


def test_control_plane_endpoint_is_a_variable_with_the_settings_choices() -> None:
    root = module()
    assert root.locals["function_env"]["CONTROL_PLANE_ENDPOINT"] == "${var.control_plane_endpoint}"
    variable = root.variables["control_plane_endpoint"]
    assert variable["default"] == Settings().control_plane_endpoint
    choices = re.findall(r'"([a-z-]+)"', first(variable["validation"])["condition"])
    assert tuple(choices) == CONTROL_PLANE_ENDPOINTS


def test_vpc_egress_is_direct_vpc_egress_for_private_ranges_only() -> None:
    root = module()
    assert root.variables["vpc_egress"]["default"] is None
    assert root.modules["function"]["vpc_egress"] == "${var.vpc_egress}"
    service = module("modules/function").resource("google_cloud_run_v2_service", "this")
    [vpc] = [block["vpc_access"] for block in first(service["template"])["dynamic"] if "vpc_access" in block]
    assert vpc["for_each"] == "${var.vpc_egress == null ? [] : [var.vpc_egress]}"
    content = first(vpc["content"])
    assert content["egress"] == "PRIVATE_RANGES_ONLY"  # Google APIs keep their usual path
    assert first(content["network_interfaces"]) == {
        "network": "${vpc_access.value.network}",
        "subnetwork": "${vpc_access.value.subnetwork}",
    }
    assert "connector" not in content, "Direct VPC egress, not a Serverless VPC Access connector"


# --- terraform runs the same checks ------------------------------------------------------------


def _plan(directory: Path, variables: dict[str, object]) -> subprocess.CompletedProcess[str]:
    (directory / "terraform.tfvars.json").write_text(json.dumps(variables))
    if not (directory / ".terraform").exists():
        init = subprocess.run(
            ["terraform", "init", "-input=false", "-backend=false", "-no-color"],
            cwd=directory,
            env=TF_ENV,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert init.returncode == 0, init.stdout + init.stderr
    return subprocess.run(
        ["terraform", "plan", "-input=false", "-no-color", "-lock=false", "-refresh=false"],
        cwd=directory,
        env=TF_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_terraform
def test_terraform_accepts_every_documented_setting_in_extra_env(tmp_path: Path) -> None:
    (tmp_path / "main.tf").write_text(hcl_block(INFRA / "variables.tf", 'variable "extra_env"'))
    others = {name: "x" for name in documented_settings() if name not in dedicated()}
    accepted = _plan(tmp_path, {"extra_env": others})
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    for bad in ("PORT", "K_SERVICE", "FUNCTION_TARGET", "idle_pool_seconds"):
        refused = _plan(tmp_path, {"extra_env": {bad: "1"}})
        assert refused.returncode != 0 and "Invalid value for variable" in refused.stderr, bad


@pytest.fixture
def service_checks(tmp_path: Path) -> Path:
    """The function module's variables and its Cloud Run service's preconditions, provider-free."""
    variables = INFRA / "modules" / "function" / "variables.tf"
    service = hcl_block(
        INFRA / "modules" / "function" / "main.tf", 'resource "google_cloud_run_v2_service" "this"'
    )
    lifecycle = service[service.index("  lifecycle {") :].rsplit("}", 1)[0]
    (tmp_path / "main.tf").write_text(
        "\n\n".join(hcl_block(variables, f'variable "{name}"') for name in ("env", "extra_env", "vpc_egress"))
        + f'\n\nresource "terraform_data" "service" {{\n{lifecycle}}}\n'
    )
    return tmp_path


VPC = {"network": "tpu-net", "subnetwork": "tpu-run"}


@needs_terraform
@pytest.mark.parametrize(
    ("variables", "refusal"),
    [
        ({"env": {"DRAIN": "false"}, "extra_env": {"IDLE_POOL_SECONDS": "300"}}, ""),
        ({"env": {"DRAIN": "false"}, "extra_env": {"DRAIN": "true"}}, "has a variable of its own"),
        ({"env": {"CONTROL_PLANE_ENDPOINT": "private-ip"}, "vpc_egress": None}, "needs vpc_egress"),
        ({"env": {"CONTROL_PLANE_ENDPOINT": "private-ip"}, "vpc_egress": VPC}, ""),
        ({"env": {}, "extra_env": {"CONTROL_PLANE_ENDPOINT": "private-ip"}}, "needs vpc_egress"),
        ({"env": {"CONTROL_PLANE_ENDPOINT": "dns"}}, ""),
    ],
    ids=["extra", "repeat", "private-no-vpc", "private-vpc", "private-via-extra", "dns"],
)
def test_the_service_preconditions(service_checks: Path, variables: dict[str, object], refusal: str) -> None:
    result = _plan(service_checks, variables)
    if refusal:
        assert result.returncode != 0, result.stdout
        assert "Resource precondition failed" in result.stderr and refusal in result.stderr, result.stderr
    else:
        assert result.returncode == 0, result.stdout + result.stderr


# --- reproducible deploys ----------------------------------------------------------------------


def _admits(constraint: str, version: str) -> bool:
    """Whether a Terraform version constraint of '=', '>=', '<' parts admits ``version``."""

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    for part in (p.strip() for p in constraint.split(",")):
        op, bound = re.fullmatch(r"(>=|<=|<|>|=)?\s*([\d.]+)", part).groups()  # type: ignore[union-attr]
        ok = {
            None: key(version) == key(bound),
            "=": key(version) == key(bound),
            ">=": key(version) >= key(bound),
            ">": key(version) > key(bound),
            "<=": key(version) <= key(bound),
            "<": key(version) < key(bound),
        }[op]
        if not ok:
            return False
    return True


def _google_constraint(directory: str) -> str:
    path = INFRA / directory / ("versions.tf" if not directory else "main.tf")
    block = hcl_block(path, "  required_providers")
    match = re.search(r'google\s*=\s*\{[^}]*version\s*=\s*"([^"]+)"', block)
    assert match is not None, path
    return match.group(1)


def test_the_google_provider_is_pinned_to_one_release() -> None:
    pinned = _google_constraint("")
    assert re.fullmatch(r"\d+\.\d+\.\d+", pinned), f"infra/versions.tf pins a range ({pinned}), not a release"
    for directory in ("modules/function", "modules/pubsub", "modules/sink"):
        assert _admits(_google_constraint(directory), pinned), (directory, pinned)
    assert not _admits(">= 6.0, < 7.0", "7.0.0") and _admits("6.50.0", "6.50.0")
