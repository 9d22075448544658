"""``tpuprov``: the command line (plan, catalog, decode, publish, kueue, status, why, doctor, sandbox, bench).

Each subcommand lives in its own ``tpuprov/commands/*.py`` module exposing ``register(subparsers)``.
Those modules are light at import time: the sandbox stack, the benchmark and the Google, Kubernetes
and Pub/Sub clients are imported inside the command that needs them, so ``tpuprov --help`` stays
fast. The one sandbox module loaded at startup is ``sandbox.emulators.logging.entries`` (stdlib and
``shared`` only), with which ``tpuprov.publish`` writes its LogEntries as GKE would.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tpuprov.commands import bench, catalog, decode, doctor, kueue, plan, publish, sandbox, status, why

# What a shell reports for a process SIGPIPE ended (`yes | head`): 128 + signal 13.
EXIT_BROKEN_PIPE = 141

# Order is the order of `tpuprov --help`.
SUBCOMMANDS = (plan, catalog, decode, publish, kueue, status, why, doctor, sandbox, bench)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="tpuprov",
        description="Serverless GKE TPU node-pool provisioner: plan, inspect and try it locally.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.register(subparsers)
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
