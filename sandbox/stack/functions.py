"""Start the product's event functions under ``functions-framework``, as Cloud Run runs them."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sandbox.emulators.sockets import free_ports, listener_is_ours
from sandbox.stack.processes import LineSink, ManagedProcess, ProcessRegistry, wait_http

Waiter = Callable[[float], str]
_PORT_ATTEMPTS = 3


def functions_framework_binary() -> str:
    """The ``functions-framework`` script of this interpreter's environment (else the one on PATH)."""
    beside = Path(sys.executable).parent / "functions-framework"
    if beside.exists():
        return str(beside)
    found = shutil.which("functions-framework")
    if found is None:
        raise RuntimeError("functions-framework is not installed (pip install functions-framework)")
    return found


def function_argv(target: str, source: Path, port: int) -> list[str]:
    """The command line Cloud Run's buildpack would run for ``target`` in ``source`` (loopback only)."""
    return [
        functions_framework_binary(),
        "--target",
        target,
        "--source",
        str(source),
        "--signature-type",
        "cloudevent",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def start_functions(
    registry: ProcessRegistry,
    functions: Sequence[str],
    settings_env: Mapping[str, str],
    workdir: Path,
    repo_root: Path,
    on_line: LineSink | None = None,
    identities: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Waiter]:
    """Start every function at once; returns ``{function: wait_until_ready(timeout) -> url}``.

    The child environment is built from scratch (a few basics plus ``settings_env``) so that
    nothing from the caller's shell, such as cloud credentials, leaks into the functions.
    ``identities`` adds each function's own variables (its service account's token).
    """
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(repo_root),
        "PYTHONUNBUFFERED": "1",
    }
    env = {**base, **settings_env}

    def launch(function: str, port: int) -> ManagedProcess:
        argv = function_argv(function, repo_root / "functions" / function / "main.py", port)
        own = {**env, **(identities or {}).get(function, {})}
        return registry.start(function, argv, own, repo_root, workdir / f"{function}.log", on_line)

    ports = free_ports(len(functions))
    started = {
        function: (port, launch(function, port)) for function, port in zip(functions, ports, strict=True)
    }

    def waiter(function: str) -> Waiter:
        def wait(timeout: float) -> str:
            port, proc = started[function]
            for _ in range(_PORT_ATTEMPTS):
                wait_http(f"http://127.0.0.1:{port}/", timeout, proc)
                if listener_is_ours(port, proc.pid):
                    return f"http://127.0.0.1:{port}"
                # Someone else took the port between choosing and binding it: start again elsewhere.
                proc.stop()
                port = free_ports(1)[0]
                proc = launch(function, port)
                started[function] = (port, proc)
            raise RuntimeError(f"{function}: no free port could be bound after {_PORT_ATTEMPTS} attempts")

        return wait

    return {function: waiter(function) for function in functions}
