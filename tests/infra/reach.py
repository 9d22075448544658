"""Which raw-API port calls each function's code can reach, found by reading the code.

A call graph over ``shared/`` resolved by name: from a function's entrypoint, every function or
method whose name the reached code calls (or passes on, e.g. to ``functools.partial``) is reached
too, whichever class defines it. That over-approximates (two methods of one name are both taken),
which is the safe direction for a role: a permission a path may need is never missed. Port calls
are recognised by method name (``shared.cloud.ports`` names are distinct) and, for the generic
names of ``WorkloadPolicyAPI`` and ``ObjectAPI``, by the attribute that holds the port.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from shared.cloud import ports
from shared.cloud.permissions import CALLS, CONNECT, OBJECT_VERBS, object_permissions
from shared.kueue.render import MANAGED_KINDS
from tests.paths import REPO

# Attributes that hold a port whose method names are too generic to recognise alone.
_HOLDERS = {"WorkloadPolicyAPI": {"api", "compute"}, "ReservationAPI": {"api"}, "ObjectAPI": {"objects"}}


def port_methods() -> dict[str, str]:
    """``method -> "Protocol.method"`` for every method of the raw-API ports."""
    found: dict[str, str] = {}
    for protocol in (
        ports.NodePoolAPI,
        ports.WorkloadPolicyAPI,
        ports.ReservationAPI,
        ports.KubeAPI,
        ports.ObjectAPI,
    ):
        for name, _ in inspect.getmembers(protocol, inspect.isfunction):
            if not name.startswith("_"):
                found.setdefault(name, "")
                found[f"{protocol.__name__}.{name}"] = f"{protocol.__name__}.{name}"
    return found


def _module_path(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def _imports(tree: ast.Module) -> set[Path]:
    """The shared/ modules a module imports (``from shared.x import y`` may name module y too)."""
    found: set[Path] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shared"):
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("shared")]
        found.update(path for path in map(_module_path, names) if path is not None)
    return found


@dataclasses.dataclass
class _Index:
    by_name: dict[tuple[Path, str], list[ast.AST]]  # (module, name) -> its definitions there
    scope: dict[Path, set[Path]]  # module -> itself and the shared/ modules it imports
    module_of: dict[int, Path]  # any node -> its module
    class_of: dict[int, dict[str, ast.AST]]  # any node inside a method -> its class's methods


@cache
def _index() -> _Index:
    """Definitions by (module, name), each module's import scope, and each node's module and class.

    A name used in a module resolves to the definitions of that name in the module itself and in
    the modules it imports: the code's own imports stand in for the types a checker would follow.
    """
    index = _Index({}, {}, {}, {})
    for path in [*sorted((REPO / "shared").rglob("*.py")), *sorted((REPO / "functions").rglob("main.py"))]:
        tree = ast.parse(path.read_text(), str(path))
        index.scope[path] = {path, *_imports(tree)}
        for node in ast.walk(tree):
            index.module_of[id(node)] = path
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                index.by_name.setdefault((path, node.name), []).append(node)
            if isinstance(node, ast.ClassDef):
                methods: dict[str, ast.AST] = {
                    item.name: item
                    for item in node.body
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                }
                for method in methods.values():
                    for inner in ast.walk(method):
                        index.class_of.setdefault(id(inner), methods)
    return index


def _holder(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _port_of(attribute: ast.Attribute) -> str:
    """``Protocol.method`` when ``attribute`` names a port method, else ""."""
    method = attribute.attr
    for protocol in ("NodePoolAPI", "KubeAPI"):
        if f"{protocol}.{method}" in CALLS:
            return f"{protocol}.{method}"
    for protocol, holders in _HOLDERS.items():
        key = f"{protocol}.{method}"
        if (key in CALLS or key in OBJECT_VERBS) and _holder(attribute.value) in holders:
            return key
    return ""


def _literal_kind(call: ast.Call) -> tuple[str, str] | None:
    args = call.args[:2]
    if len(args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
        return (str(args[0].value), str(args[1].value))  # type: ignore[attr-defined]
    return None


def _body_nodes(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(node, ast.ClassDef):  # a constructor call reaches __init__/__post_init__
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name in ("__init__", "__post_init__"):
                yield from ast.walk(item)
        return
    yield from ast.walk(node)


def reached_calls(entrypoint: Path) -> dict[str, set[tuple[str, str] | None]]:
    """Port calls reachable from ``entrypoint`` -> the literal kinds they name (None: not literal)."""
    index = _index()
    seen: set[int] = set()
    pending: list[ast.AST] = [
        node for (path, _), nodes in index.by_name.items() if path == entrypoint for node in nodes
    ]
    calls: dict[str, set[tuple[str, str] | None]] = {}
    while pending:
        root = pending.pop()
        if id(root) in seen:
            continue
        seen.add(id(root))
        literal: dict[int, tuple[str, str] | None] = {}
        for node in _body_nodes(root):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                literal[id(node.func)] = _literal_kind(node)
        for node in _body_nodes(root):
            name = ""
            if isinstance(node, ast.Attribute):
                port = _port_of(node)
                if port:
                    calls.setdefault(port, set()).add(literal.get(id(node)))
                    continue
                name = node.attr
                own = index.class_of.get(id(node), {})
                if _holder(node.value) in ("self", "cls") and name in own:
                    pending.append(own[name])  # self.method is this class's method, not any of its name
                    continue
            elif isinstance(node, ast.Name):
                name = node.id
            if name:
                for module in index.scope.get(index.module_of.get(id(node), entrypoint), ()):
                    pending.extend(index.by_name.get((module, name), ()))
    return calls


def reached_permissions(entrypoint: Path) -> dict[str, set[str]]:
    """Each permission the code from ``entrypoint`` can need -> the port calls that need it."""
    needed: dict[str, set[str]] = {}
    for call, kinds in reached_calls(entrypoint).items():
        if call in CALLS:
            permissions = set(CALLS[call])
        else:
            # A kind not written at the call is one of the Kueue kinds the applier manages.
            named = {kind for kind in kinds if kind is not None}
            permissions = object_permissions(call, named | (set(MANAGED_KINDS) if None in kinds else set()))
        if call.startswith(("KubeAPI.", "ObjectAPI.")):
            permissions |= set(CONNECT)
        for permission in permissions:
            needed.setdefault(permission, set()).add(call)
    return needed


__all__ = ["port_methods", "reached_calls", "reached_permissions"]
