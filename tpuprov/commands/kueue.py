"""``tpuprov kueue render``: print the Kueue objects a queue configuration produces.

No cluster is needed: the configuration is validated exactly as the ``apply_kueue`` function
validates it (every problem listed) and the objects are printed as multi-document YAML, ready
for review or for ``kubectl apply --server-side -f -``; ``-o json`` prints them as one JSON list and
``-o table`` one line per object.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from shared.cloud.objects import object_key
from shared.core.errors import InvalidInputError
from shared.kueue.config import DEFAULT_CONFIG, load_config, parse_config
from shared.kueue.render import render, to_yaml
from tpuprov import output


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``kueue`` subcommand (with ``render``); its parsed args carry ``func=run``."""
    parser = subparsers.add_parser("kueue", help="work with Kueue queue configurations", description=__doc__)
    actions = parser.add_subparsers(dest="kueue_command", metavar="ACTION", required=True)
    render_parser = actions.add_parser(
        "render", help="print the Kueue manifests of a queue configuration (no cluster needed)"
    )
    render_parser.add_argument(
        "-f",
        "--file",
        default="",
        help=f"configuration file (YAML or JSON; '-' for stdin); default: {DEFAULT_CONFIG.name}",
    )
    output.add_output_argument(render_parser, default="yaml")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Execute ``kueue render``; 0 on success, 2 for an invalid configuration."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        config = parse_config(sys.stdin.read()) if args.file == "-" else load_config(args.file)
    except InvalidInputError as exc:
        err.write(f"tpuprov kueue render: {exc.why}\n")
        return 2
    objects = render(config)
    if args.output == "yaml":
        out.write(to_yaml(objects))  # one document per object, as kubectl apply -f reads them
        return 0
    rows = [(kind, namespace or "-", name) for _, kind, namespace, name in map(object_key, objects)]
    output.emit(args.output, objects, lambda: output.table(("KIND", "NAMESPACE", "NAME"), rows), out)
    return 0
