"""``tpuprov``: the command line (plan, catalog, decode, publish, kueue, status, why, doctor, sandbox, bench).

Each subcommand lives in its own ``tpuprov/commands/*.py`` module exposing ``register(subparsers)``.
Those modules are light at import time: the Google, Kubernetes and Pub/Sub clients are imported
inside the command that needs them, so ``tpuprov --help`` stays fast. ``demo``, ``sandbox`` and
``bench`` are the sandbox's (``sandbox.cli``), found through the ``tpuprov.commands`` entry points:
no ``tpuprov`` module imports ``sandbox``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from tpuprov.commands import catalog, decode, doctor, kueue, plan, publish, status, why

# What a shell reports for a process SIGPIPE ended (`yes | head`): 128 + signal 13.
EXIT_BROKEN_PIPE = 141

# Order is the order of `tpuprov --help`; the installed plugins' commands follow.
SUBCOMMANDS: tuple[ModuleType, ...] = (plan, catalog, decode, publish, kueue, status, why, doctor)
# Subcommands other packages add (the sandbox's demo, sandbox and bench: sandbox.cli): each entry
# point names a ``register(subparsers)``. The CLI itself never imports the sandbox.
PLUGIN_GROUP = "tpuprov.commands"


def plugins() -> list[Any]:
    """The ``register`` functions of the installed plugin subcommands, in entry-point name order."""
    return [ep.load() for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name)]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="tpuprov",
        description="Serverless GKE TPU node-pool provisioner: plan, inspect and try it locally.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.register(subparsers)
    for register in plugins():
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tpuprov`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code = int(func(args) or 0)
        sys.stdout.flush()  # inside the try: a closed pipe surfaces here, not at interpreter exit
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    return code


def _silence_stdout() -> None:
    """The reader (``head``, ``grep -q``) has gone: stop quietly. Pointing stdout at /dev/null keeps
    Python's last flush at exit from reporting the same broken pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout has no file descriptor (captured in tests): nothing left to flush


if __name__ == "__main__":
    sys.exit(main())
