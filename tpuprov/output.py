"""The one way every ``tpuprov`` command prints results: ``-o table|json|yaml``.

A command builds one JSON-safe document and, for people, a table (or other text) from the same data;
``emit`` picks by the ``-o`` value. Keys are sorted in JSON and YAML so scripts and diffs see a stable
order. Tables are kubectl-style: left-aligned columns three spaces apart, no trailing blanks.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

import yaml

FORMATS = ("table", "json", "yaml")


def add_output_argument(
    parser: argparse.ArgumentParser, default: str = "table", formats: Sequence[str] = FORMATS
) -> None:
    """``-o/--output`` with the same spelling and choices on every command."""
    parser.add_argument(
        "-o",
        "--output",
        choices=tuple(formats),
        default=default,
        help=f"output format: {', '.join(formats)} (default: {default})",
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell; one line per row, header first."""
    lines = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "".join(
        "   ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() + "\n" for line in lines
    )


def dumps(doc: Any, fmt: str) -> str:
    """``doc`` as JSON or YAML text (ending in a newline)."""
    if fmt == "yaml":
        return yaml.safe_dump(doc, sort_keys=True, default_flow_style=False, allow_unicode=True)
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def emit(fmt: str, doc: Any, text: Callable[[], str], out: TextIO | None = None) -> None:
    """Write ``doc`` as JSON/YAML, or ``text()`` for ``table``."""
    (out or sys.stdout).write(text() if fmt == "table" else dumps(doc, fmt))
