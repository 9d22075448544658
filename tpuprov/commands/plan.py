"""``tpuprov plan -f jobset.yaml``: the node pools a JobSet would get, without any cluster.

Exit status: 0 when every TPU slice would get its pool, 1 when provision would refuse one (the
reason is the row's ``refused`` field and its note), 2 when the file cannot be read or is not a
valid JobSet manifest.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from shared.core.errors import InvalidInputError
from shared.core.settings import Settings
from tpuprov import output
from tpuprov.manifest import load_jobsets
from tpuprov.plan import plan

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_BAD_INPUT = 2
# The zone planned for when none is given: where TPU v4, the first GKE TPU generation, is offered.
DEFAULT_LOCATION = "us-central2-b"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` subcommand."""
    parser = subparsers.add_parser(
        "plan", help="print the node pools a JobSet manifest would get", description=__doc__
    )
    parser.add_argument(
        "-f", "--file", required=True, help="JobSet YAML (may hold several documents; - for stdin)"
    )
    output.add_output_argument(parser)
    parser.add_argument(
        "--location", default="", help=f"cluster zone (default: LOCATION env or {DEFAULT_LOCATION})"
    )
    parser.set_defaults(func=run)


def _read(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read {path}: {exc}") from None


def rows_for(jobsets: list[dict[str, Any]], settings: Settings) -> list[dict[str, Any]]:
    """One dict per slice of each JobSet: the ``-o json|yaml`` rows."""
    rows: list[dict[str, Any]] = []
    for jobset in jobsets:
        meta = dict(jobset.get("metadata") or {})
        meta.setdefault("namespace", "default")
        # A manifest has no uid yet; the real pool names hash the uid the API server assigns.
        meta.setdefault("uid", "<uid>")
        jobset = {**jobset, "metadata": meta}
        for planned in plan(jobset, settings):
            rows.append({"jobset": f"{meta['namespace']}/{meta.get('name')}", **dataclasses.asdict(planned)})
    return rows


def _selectors_cell(fates: dict[str, str]) -> str:
    """Who sets each selected key on the pool's nodes, grouped, keys only: ``GKE sets
    cloud.google.com/gke-spot; product sets team; refused: x`` (a ``key=word`` spelling would read
    as the value the pod selects; -o json has each whole sentence, with the pool field GKE derives
    it from)."""
    groups: dict[str, list[str]] = {"GKE sets": [], "product sets": [], "refused:": []}
    for key, fate in fates.items():
        if "set by GKE" in fate:
            groups["GKE sets"].append(key)
        elif "set by the product" in fate:
            groups["product sets"].append(key)
        else:
            groups["refused:"].append(key)
    return "; ".join(f"{who} {', '.join(keys)}" for who, keys in groups.items() if keys) or "-"


def table(rows: list[dict[str, Any]]) -> str:
    """The rows for people, one line per slice."""
    header = [
        "JOBSET",
        "SLICE",
        "POOL",
        "MACHINE-TYPE",
        "NODES",
        "TOPOLOGY",
        "CHIPS",
        "PLACEMENT",
        "CAPACITY",
        "SELECTORS",
        "NOTE",
    ]
    return output.table(
        header,
        (
            (
                r["jobset"],
                r["slice"],
                r["pool"] or "-",
                r["machine_type"] or "-",
                str(r["node_count"]),
                r["topology"] or "-",
                str(r["total_chips"]),
                r["placement"] or "-",
                r["capacity"] or "-",
                _selectors_cell(r.get("selectors") or {}),
                ("refused: " if r["refused"] else "") + (r["note"] or ""),
            )
            for r in rows
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Print one row per slice: pool, machine type, node count, topology, chips, placement, and the
    capacity options in the order they are tried (the capacity policy)."""
    source = "stdin" if args.file == "-" else args.file
    try:
        jobsets = load_jobsets(_read(args.file), source)
    except InvalidInputError as exc:
        print(f"tpuprov plan: {exc.why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    settings = Settings.from_env()
    location = args.location or settings.location
    settings = settings.with_overrides(location=location or DEFAULT_LOCATION)
    rows = rows_for(jobsets, settings)
    output.emit(args.output, rows, lambda: table(rows))
    sys.stdout.flush()  # the rows first, then what is said about them, when both go to one terminal
    for warning in dict.fromkeys(r["warning"] for r in rows if r["warning"]):
        print(f"tpuprov plan: warning: {warning}", file=sys.stderr)
    if not location:
        print(
            f"tpuprov plan: planned for {DEFAULT_LOCATION} (no --location and no LOCATION); pools go "
            "in your cluster's zone",
            file=sys.stderr,
        )
    refused = [r for r in rows if r["refused"]]
    if refused:
        print(f"tpuprov plan: {len(refused)} slice(s) would be refused", file=sys.stderr)
        return EXIT_REFUSED
    return EXIT_OK
