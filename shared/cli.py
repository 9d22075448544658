"""``tpuprov``: the product's command line (catalog, plan, decode, publish, kueue, sandbox, bench).

Each subcommand lives in its own ``shared/cli_*.py`` module exposing ``register(subparsers)``;
subcommand modules are imported only when the CLI starts, never by the functions.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Order is the order of `tpuprov --help`.
SUBCOMMAND_MODULES = (
    "shared.cli_plan",
    "shared.cli_catalog",
    "shared.cli_decode",
    "shared.cli_publish",
    "shared.cli_kueue",
    "shared.cli_sandbox",
    "shared.cli_bench",
)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="tpuprov",
        description="Serverless GKE TPU node-pool provisioner: plan, inspect and try it locally.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tpuprov`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
