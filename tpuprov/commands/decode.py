"""``tpuprov decode``: show how the functions would classify an input, without acting on it.

Accepts any of the four forms the product meets -- a LogEntry, a Pub/Sub message, a push or
Eventarc body (``{"message": ..., "subscription": ...}``) or a structured CloudEvent -- and also a
JSON array of them, which is what ``gcloud logging read --format=json`` prints. "ignored" is a
diagnosis, not an error: the exit status is non-zero only when the file cannot be read or parsed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from shared.events.envelope import decode_any, to_dict
from tpuprov import output

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``decode`` sub-command to an ``argparse`` sub-parsers object; sets ``func=run``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "decode",
        help="classify a LogEntry, Pub/Sub message, push body or CloudEvent",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("file", metavar="FILE", help="JSON file to decode, or - for stdin")
    output.add_output_argument(parser, default="json")
    parser.set_defaults(func=run)
    return parser


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    return Path(name).read_text(encoding="utf-8")


def _text_lines(summary: dict[str, Any], prefix: str = "") -> list[str]:
    lines = []
    for key, value in summary.items():
        if isinstance(value, dict):
            lines.extend(_text_lines(value, f"{prefix}{key}."))
        else:
            lines.append(f"{prefix}{key}: {value}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Decode ``args.file`` and print the classification; 0 unless the input is unreadable."""
    name = str(args.file)
    try:
        text = _read(name)
    except (OSError, UnicodeDecodeError) as err:
        print(f"tpuprov decode: cannot read {name}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        print(f"tpuprov decode: {name} is not valid JSON: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RecursionError:
        print(f"tpuprov decode: {name} is nested too deeply to parse", file=sys.stderr)
        return EXIT_BAD_INPUT
    items = doc if isinstance(doc, list) else [doc]
    summaries = [to_dict(decode_any(item)) for item in items]
    output.emit(
        args.output,
        summaries if isinstance(doc, list) else summaries[0],
        lambda: "\n\n".join("\n".join(_text_lines(summary)) for summary in summaries) + "\n",
    )
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Run ``decode`` on its own (``python -m tpuprov.commands.decode FILE``)."""
    parser = argparse.ArgumentParser(prog="tpuprov")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["decode", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
