"""``tpuprov plan -f jobset.yaml``: the node pools a JobSet would get, without any cluster."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from shared.core.settings import Settings
from shared.tpu.plan import plan


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` subcommand."""
    parser = subparsers.add_parser("plan", help="print the node pools a JobSet manifest would get")
    parser.add_argument(
        "-f", "--file", required=True, help="JobSet YAML (may hold several documents; - for stdin)"
    )
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument(
        "--location", default="", help="cluster zone (default: LOCATION env or us-central2-b)"
    )
    parser.set_defaults(func=run)


def _documents(path: str) -> list[dict[str, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    return [d for d in yaml.safe_load_all(text) if isinstance(d, dict) and d.get("kind") == "JobSet"]


def run(args: argparse.Namespace) -> int:
    """Print one row per slice: pool, machine type, node count, topology, chips, placement, and the
    capacity options in the order they are tried (the capacity policy)."""
    try:
        jobsets = _documents(args.file)
    except (OSError, yaml.YAMLError) as exc:
        print(f"tpuprov plan: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    if not jobsets:
        print(f"tpuprov plan: no JobSet in {args.file}", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    location = args.location or settings.location or "us-central2-b"
    settings = settings.with_overrides(location=location)
    rows: list[dict[str, Any]] = []
    for jobset in jobsets:
        meta = jobset.get("metadata") or {}
        meta.setdefault("namespace", "default")
        # A manifest has no uid yet; the real pool names hash the uid the API server assigns.
        meta.setdefault("uid", "<uid>")
        jobset["metadata"] = meta
        for planned in plan(jobset, settings):
            rows.append({"jobset": f"{meta['namespace']}/{meta.get('name')}", **dataclasses.asdict(planned)})
    if args.output == "json":
        print(json.dumps(rows, indent=2))
        return 0
    header = (
        "JOBSET",
        "SLICE",
        "POOL",
        "MACHINE TYPE",
        "NODES",
        "TOPOLOGY",
        "CHIPS",
        "PLACEMENT",
        "CAPACITY",
        "NOTE",
    )
    table = [header] + [
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
            r["note"] or "",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return 0
