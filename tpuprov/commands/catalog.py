"""``tpuprov catalog``: print the TPU slices the provisioner knows how to create.

Operators use it to check which ``gke-tpu-accelerator`` / ``gke-tpu-topology`` values and
``google.com/tpu`` requests a workload may use before submitting it. ``-o json`` (or ``yaml``)
prints every topology one by one for scripts. The table lists small shapes by name and gives the rule
for the large 3D ones, which would otherwise run to hundreds of lines.
"""

from __future__ import annotations

import argparse
import io
from typing import Any, TextIO

from shared.tpu.catalog import AcceleratorInfo, MachineTypeInfo, accelerators
from tpuprov import output


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``catalog`` subcommand; its parsed args carry ``func=run``."""
    parser = subparsers.add_parser(
        "catalog",
        help="list TPU accelerators, machine types and topologies the provisioner supports",
        description=__doc__,
    )
    output.add_output_argument(parser)
    parser.set_defaults(func=run)


def _machine_type_text(machine: MachineTypeInfo) -> str:
    unit = "chip" if machine.chips == 1 else "chips"
    note = ", single-host only" if machine.single_host_only else ""
    return f"{machine.name} ({machine.chips} {unit}{note})"


def _to_json(info: AcceleratorInfo) -> dict[str, Any]:
    return {
        "accelerator": info.accelerator,
        "generation": info.generation,
        "dimensions": info.dimensions,
        "machine_types": [
            {"name": m.name, "chips": m.chips, "single_host_only": m.single_host_only}
            for m in info.machine_types
        ],
        "max_chips": info.max_chips,
        "multi_host_placement": info.multi_host_placement,
        "topology_rule": info.topology_rule,
        "topologies": list(info.topologies),
        "boot_disk_types": list(info.boot_disk_types),
    }


def _write_table(infos: list[AcceleratorInfo], out: TextIO) -> None:
    for index, info in enumerate(infos):
        if index:
            out.write("\n")
        out.write(
            f"{info.accelerator}  (generation {info.generation}, {info.dimensions}D, "
            f"up to {info.max_chips} chips per slice, multi-host placement: {info.multi_host_placement})\n"
        )
        out.write("  machine types: " + ", ".join(_machine_type_text(m) for m in info.machine_types) + "\n")
        out.write(f"  topologies:    {info.topology_rule}\n")
        disks = ", ".join(info.boot_disk_types)
        out.write(f"  boot disks:    {disks} (the first is the default)\n")


def run(args: argparse.Namespace) -> int:
    """Print the catalog in the format ``args.output`` names; returns the process exit code."""
    infos = accelerators()

    def table() -> str:
        text = io.StringIO()
        _write_table(infos, text)
        return text.getvalue()

    output.emit(args.output, [_to_json(info) for info in infos], table)
    return 0
