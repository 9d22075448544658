"""The Terraform of infra/ as tests read it: each module directory's blocks parsed by python-hcl2.

Shared by the infra tests, the doctor's parity test (tests/cli) and the sandbox wiring's
(tests/sandbox/test_wiring.py), so that one loader decides how HCL's quoting is undone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import hcl2

from tests.paths import REPO

ROOT = REPO
INFRA = ROOT / "infra"
TF_ENV = {**os.environ, "TF_CLI_CONFIG_FILE": os.devnull, "CHECKPOINT_DISABLE": "1"}

# The product wiring every engineer codes against (function -> source, topic suffix).
WIRING = {
    "provision": ("functions/provision/main.py", "pending-pods"),
    "release": ("functions/release/main.py", "jobset-lifecycle"),
    "reconcile": ("functions/reconcile/main.py", "reconcile"),
    "setup_cluster": ("functions/setup_cluster/main.py", "setup"),
    "apply_kueue": ("functions/apply_kueue/main.py", "kueue"),
}


def _clean(value: Any) -> Any:
    """python-hcl2 keeps quotes on literals and adds bookkeeping keys; strip both."""
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items() if k not in ("__is_block__", "__comments__")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def loads(text: str) -> Any:
    """HCL text as plain Python: python-hcl2's parse with its quotes and bookkeeping keys removed."""
    return _clean(hcl2.loads(text))


@dataclasses.dataclass
class Module:
    """The blocks of one Terraform module directory, keyed by name."""

    path: Path
    resources: dict[tuple[str, str], dict[str, Any]]
    modules: dict[str, dict[str, Any]]
    variables: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]
    locals: dict[str, Any]
    text: str

    def resource(self, type_: str, name: str) -> dict[str, Any]:
        """The body of ``resource "<type_>" "<name>"``; KeyError when absent."""
        return self.resources[(type_, name)]

    def of_type(self, type_: str) -> dict[str, dict[str, Any]]:
        """Every resource of one type by name."""
        return {name: body for (t, name), body in self.resources.items() if t == type_}


@cache
def module(relative: str = "") -> Module:
    """Every block of the ``*.tf`` files in ``infra/<relative>``, quotes removed."""
    path = INFRA / relative
    mod = Module(path, {}, {}, {}, {}, {}, "")
    for tf in sorted(path.glob("*.tf")):
        text = tf.read_text()
        mod.text += text
        doc = loads(text)
        for block in doc.get("resource", []):
            for type_, named in block.items():
                for name, body in named.items():
                    mod.resources[(type_, name)] = body
        for kind, target in (("module", mod.modules), ("variable", mod.variables), ("output", mod.outputs)):
            for block in doc.get(kind, []):
                target.update(block)
        for block in doc.get("locals", []):
            mod.locals.update(block)
    return mod


def first(blocks: Any) -> dict[str, Any]:
    """A nested block (python-hcl2 gives a list of one dict)."""
    assert isinstance(blocks, list) and len(blocks) == 1, blocks
    result: dict[str, Any] = blocks[0]
    return result


def hcl_block(path: Path, header: str) -> str:
    """The text of the block that starts with ``header`` (e.g. 'variable "extra_env"'), braces
    matched outside strings and comments."""
    text = path.read_text()
    start = text.index(header + " {")
    depth, i, in_string = 0, text.index("{", start), False
    while True:
        ch = text[i]
        if in_string:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "#":
            i = text.index("\n", i)
            continue
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1


def terraform_json(expression: str, workdir: Path) -> Any:
    """What ``terraform console`` (no configuration, no provider) makes of ``jsonencode(expression)``."""
    import json
    import subprocess

    result = subprocess.run(
        ["terraform", "console"],
        input=f"jsonencode({expression})",
        capture_output=True,
        text=True,
        cwd=workdir,
        env=TF_ENV,
        timeout=120,
        check=True,
    )
    return json.loads(json.loads(result.stdout))


def conditioned_on(grant: dict[str, Any]) -> str:
    """The condition module a grant is limited by, unless the deployment discovers clusters of its
    own project by label (then a cluster labelled later could not be named in it)."""
    [dynamic] = [d["condition"] for d in grant["dynamic"] if "condition" in d]
    assert first(dynamic["content"])["expression"] == "${condition.value}"
    prefix, suffix = "${local.discovers_here ? [] : [", "]}"
    assert dynamic["for_each"].startswith(prefix) and dynamic["for_each"].endswith(suffix)
    return str(dynamic["for_each"]).removeprefix(prefix).removesuffix(suffix)


# --- running terraform offline (provider-free configurations: variables, locals, outputs) -------


def terraform(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``terraform ARGS`` in ``directory``, initialised first (no backend) when it is not yet."""
    if not (directory / ".terraform").exists() and args[0] != "init":
        init = terraform(directory, "init", "-input=false", "-backend=false", "-no-color")
        assert init.returncode == 0, init.stdout + init.stderr
    return subprocess.run(
        ["terraform", *args], cwd=directory, env=TF_ENV, capture_output=True, text=True, timeout=120
    )


def terraform_apply(directory: Path, variables: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``terraform apply`` of a provider-free configuration (outputs only) with ``variables``."""
    (directory / "terraform.tfvars.json").write_text(json.dumps(variables))
    return terraform(directory, "apply", "-auto-approve", "-input=false", "-no-color", "-lock=false")


def terraform_outputs(directory: Path) -> dict[str, Any]:
    """The applied configuration's outputs, by name."""
    result = terraform(directory, "output", "-json", "-no-color")
    assert result.returncode == 0, result.stderr
    return {name: value["value"] for name, value in json.loads(result.stdout).items()}
