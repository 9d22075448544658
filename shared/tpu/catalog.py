"""The TPU catalog: which GKE TPU slices exist and what node pool each one needs.

A pending pod names its slice with two node-selector labels (``cloud.google.com/gke-tpu-accelerator``
and ``cloud.google.com/gke-tpu-topology``) and asks for ``google.com/tpu`` chips; one pod runs per
VM. ``resolve`` turns those three values into a ``SliceShape``: the machine type, the node count
and the placement the node pool must be created with, or raises ``UnsupportedShape`` for
anything GKE would refuse.

The facts live in one table per generation (``GENERATIONS``) plus a few small rules. The node
count is always ``total chips / chips per VM`` and the machine type is looked up, never built
from a format string: a controller that assumes four chips per VM, or pastes the request into
``...-{n}t``, asks GKE for machine types that do not exist (``ct6e-standard-16t``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from collections.abc import Iterator

from shared.tpu.generations import (
    BY_ACCELERATOR,
    BY_MACHINE_TYPE,
    GENERATIONS,
    PLACEMENT_COMPACT,
    PLACEMENT_NONE,
    PLACEMENT_WORKLOAD_POLICY,
    Generation,
    MachineTypeInfo,
    dims,
)

__all__ = [
    "PLACEMENT_COMPACT",
    "PLACEMENT_NONE",
    "PLACEMENT_WORKLOAD_POLICY",
    "AcceleratorInfo",
    "MachineTypeInfo",
    "SliceShape",
    "UnsupportedShape",
    "accelerator_for_machine_type",
    "accelerators",
    "boot_disk_types",
    "chips_per_vm_options",
    "machine_type_chips",
    "resolve",
]


class UnsupportedShape(ValueError):
    """The accelerator / topology / chips-per-VM combination is not a slice GKE can create."""


@dataclasses.dataclass(frozen=True)
class SliceShape:
    """Everything needed to create the node pool of one TPU slice."""

    accelerator: str  # node label value, e.g. "tpu-v6e-slice"
    generation: str  # "v4" | "v5e" | "v5p" | "v6e" | "tpu7x"
    topology: str  # normalized, e.g. "2x4" / "2x2x4"
    machine_type: str  # e.g. "ct6e-standard-4t"
    chips_per_vm: int
    num_vms: int  # node count of the pool
    total_chips: int  # product of the topology's dimensions
    multi_host: bool  # num_vms > 1
    placement: str  # PLACEMENT_NONE | PLACEMENT_COMPACT | PLACEMENT_WORKLOAD_POLICY


@dataclasses.dataclass(frozen=True)
class AcceleratorInfo:
    """What the catalog offers for one accelerator label value (for humans and the CLI)."""

    accelerator: str
    generation: str
    dimensions: int  # 2 (AxB) or 3 (AxBxC)
    machine_types: tuple[MachineTypeInfo, ...]
    topologies: tuple[str, ...]  # every topology resolve() accepts, smallest first
    max_chips: int  # largest single slice
    topology_rule: str  # the same set, described in one line
    multi_host_placement: str  # placement of slices with more than one VM
    boot_disk_types: tuple[str, ...] = ()  # boot disk types the VMs support; the first is the default


_DIMENSION = re.compile(r"[1-9][0-9]*")


def _generation(accelerator: str) -> Generation:
    if not isinstance(accelerator, str):
        raise UnsupportedShape(f"TPU accelerator must be a string, got {type(accelerator).__name__}")
    gen = BY_ACCELERATOR.get(accelerator.strip())
    if gen is None:
        known = ", ".join(BY_ACCELERATOR)
        raise UnsupportedShape(
            f"unknown TPU accelerator {accelerator!r} (node label cloud.google.com/gke-tpu-accelerator); "
            f"known accelerators: {known}"
        )
    return gen


def _chips(n: int) -> str:
    return f"{n} chip" if n == 1 else f"{n} chips"


def _example(gen: Generation) -> str:
    return "2x4" if gen.dimensions == 2 else "2x2x4"


def _parse_topology(gen: Generation, topology: str) -> tuple[int, ...]:
    """Split a topology label value into positive dimensions, or say exactly what is wrong."""
    if not isinstance(topology, str):
        raise UnsupportedShape(f"TPU topology must be a string, got {type(topology).__name__}")
    text = topology.strip()
    shape_hint = f"{gen.describe()} topologies have {gen.dimensions} dimensions, like {_example(gen)}"
    if not text:
        raise UnsupportedShape(f"TPU topology is empty; {shape_hint}")
    parts = text.split("x")
    for part in parts:
        if part == "":
            raise UnsupportedShape(f"TPU topology {text!r} is malformed (empty dimension); {shape_hint}")
        if part.isascii() and part.isdigit() and int(part) == 0:
            raise UnsupportedShape(
                f"TPU topology {text!r} has a zero dimension; every dimension must be a positive integer"
            )
        if not _DIMENSION.fullmatch(part):
            raise UnsupportedShape(
                f"TPU topology {text!r} is malformed: dimension {part!r} is not a positive integer "
                f"written in plain digits; {shape_hint}"
            )
    if len(parts) != gen.dimensions:
        raise UnsupportedShape(f"TPU topology {text!r} has {len(parts)} dimensions but {shape_hint}")
    return tuple(int(part) for part in parts)


def _is_cube_shape(gen: Generation, dims: tuple[int, ...]) -> bool:
    """The custom-shape rule of the 3D generations (see the v4 comment in the table)."""
    return (
        gen.cube_max_chips > 0
        and all(d % 4 == 0 for d in dims)
        and list(dims) == sorted(dims)
        and math.prod(dims) <= gen.cube_max_chips
    )


def _offered(gen: Generation, dims: tuple[int, ...]) -> bool:
    return "x".join(map(str, dims)) in gen.listed or _is_cube_shape(gen, dims)


def _topology_rule(gen: Generation) -> str:
    listed = ", ".join(gen.listed)
    if not gen.cube_max_chips:
        return listed
    return f"{listed}, or AxBxC with A<=B<=C, all multiples of 4, at most {gen.cube_max_chips} chips"


def _check_offered(gen: Generation, dims: tuple[int, ...], normalized: str) -> None:
    if _offered(gen, dims):
        return
    total = math.prod(dims)
    valid = f"{gen.describe()} offers {_topology_rule(gen)}"
    if total > gen.max_chips:
        raise UnsupportedShape(
            f"TPU topology {normalized} has {total} chips, more than the largest {gen.generation} slice "
            f"({gen.max_chips} chips); {valid}"
        )
    # The same chips in another order is a common slip; point at the spelling GKE uses.
    spelled = next((p for p in sorted(set(itertools.permutations(dims))) if _offered(gen, p)), None)
    if spelled is not None:
        suggestion = "x".join(map(str, spelled))
        raise UnsupportedShape(
            f"TPU topology {normalized} is not offered for {gen.generation}: GKE names this shape "
            f"{suggestion} (the label value must match exactly)"
        )
    raise UnsupportedShape(f"TPU topology {normalized} is not offered for {gen.generation}; {valid}")


def _allowed(machine: MachineTypeInfo, total: int) -> bool:
    if total % machine.chips:
        return False
    return not (machine.single_host_only and total != machine.chips)


def _machine_type_for(gen: Generation, normalized: str, total: int, chips_per_vm: int) -> MachineTypeInfo:
    if isinstance(chips_per_vm, bool) or not isinstance(chips_per_vm, int):
        raise UnsupportedShape(
            f"google.com/tpu request (chips per VM) must be an integer, got {chips_per_vm!r}"
        )
    if chips_per_vm <= 0:
        raise UnsupportedShape(
            f"google.com/tpu request (chips per VM) must be a positive integer, got {chips_per_vm}"
        )
    options = [m for m in gen.machine_types if _allowed(m, total)]
    valid = ", ".join(f"{m.chips} ({m.name})" for m in options)
    machine = next((m for m in gen.machine_types if m.chips == chips_per_vm), None)
    if machine is None:
        family = ", ".join(f"{m.name} ({_chips(m.chips)})" for m in gen.machine_types)
        raise UnsupportedShape(
            f"no {gen.generation} machine type has {chips_per_vm} chips per VM (google.com/tpu request); "
            f"{gen.generation} machine types: {family}; valid requests for {normalized}: {valid}"
        )
    if total % machine.chips:
        raise UnsupportedShape(
            f"{_chips(chips_per_vm)} per VM ({machine.name}) cannot tile the {_chips(total)} of topology "
            f"{normalized}; valid requests for {normalized}: {valid}"
        )
    if machine.single_host_only and total != machine.chips:
        raise UnsupportedShape(
            f"{machine.name} only forms single-host slices of {_chips(machine.chips)}, but topology "
            f"{normalized} has {_chips(total)} and would need {total // machine.chips} VMs; "
            f"valid requests for {normalized}: {valid}"
        )
    return machine


def resolve(accelerator: str, topology: str, chips_per_vm: int) -> SliceShape:
    """Resolve a pod's TPU selectors and chip request into the slice GKE must create.

    ``accelerator`` and ``topology`` are the values of the pod's ``gke-tpu-accelerator`` and
    ``gke-tpu-topology`` node selectors (surrounding whitespace is ignored); ``chips_per_vm`` is
    its ``google.com/tpu`` request. Raises ``UnsupportedShape`` naming the problem and the valid
    choices when GKE would not create such a slice.
    """
    gen = _generation(accelerator)
    dims = _parse_topology(gen, topology)
    normalized = "x".join(map(str, dims))
    _check_offered(gen, dims, normalized)
    total = math.prod(dims)
    machine = _machine_type_for(gen, normalized, total, chips_per_vm)
    num_vms = total // machine.chips
    multi_host = num_vms > 1
    return SliceShape(
        accelerator=gen.accelerator,
        generation=gen.generation,
        topology=normalized,
        machine_type=machine.name,
        chips_per_vm=machine.chips,
        num_vms=num_vms,
        total_chips=total,
        multi_host=multi_host,
        placement=gen.multi_host_placement if multi_host else PLACEMENT_NONE,
    )


def chips_per_vm_options(accelerator: str, topology: str) -> tuple[int, ...]:
    """The ``google.com/tpu`` requests ``resolve`` accepts for this slice, smallest first.

    Raises ``UnsupportedShape`` when the accelerator or the topology itself is not valid.
    """
    gen = _generation(accelerator)
    dims = _parse_topology(gen, topology)
    _check_offered(gen, dims, "x".join(map(str, dims)))
    total = math.prod(dims)
    return tuple(m.chips for m in gen.machine_types if _allowed(m, total))


def machine_type_chips(machine_type: str) -> int | None:
    """Chips per VM of a TPU machine type in the catalog; None for anything else (GPU, CPU, unknown)."""
    entry = BY_MACHINE_TYPE.get(machine_type.strip()) if isinstance(machine_type, str) else None
    return entry[1].chips if entry else None


def accelerator_for_machine_type(machine_type: str) -> str | None:
    """The ``gke-tpu-accelerator`` label value of a TPU machine type; None if it is not one."""
    entry = BY_MACHINE_TYPE.get(machine_type.strip()) if isinstance(machine_type, str) else None
    return entry[0].accelerator if entry else None


def boot_disk_types(machine_type: str) -> tuple[str, ...]:
    """Boot disk types a TPU machine type supports, its default first; () for anything else."""
    entry = BY_MACHINE_TYPE.get(machine_type.strip()) if isinstance(machine_type, str) else None
    return entry[0].boot_disk_types if entry else ()


def _cube_topologies(max_chips: int) -> Iterator[tuple[int, int, int]]:
    # Count in units of 4 chips per side, so a <= b <= c and 64*a*b*c <= max_chips.
    limit = max_chips // 64
    a = 1
    while a * a * a <= limit:
        b = a
        while a * b * b <= limit:
            for c in range(b, limit // (a * b) + 1):
                yield (4 * a, 4 * b, 4 * c)
            b += 1
        a += 1


@functools.cache
def _all_topologies(gen: Generation) -> tuple[str, ...]:
    shapes = {dims(t) for t in gen.listed}
    if gen.cube_max_chips:
        shapes.update(_cube_topologies(gen.cube_max_chips))
    ordered = sorted(shapes, key=lambda d: (math.prod(d), d))
    return tuple("x".join(map(str, d)) for d in ordered)


def accelerators() -> list[AcceleratorInfo]:
    """Everything the catalog offers, one entry per accelerator label value."""
    return [
        AcceleratorInfo(
            accelerator=g.accelerator,
            generation=g.generation,
            dimensions=g.dimensions,
            machine_types=g.machine_types,
            topologies=_all_topologies(g),
            max_chips=g.max_chips,
            topology_rule=_topology_rule(g),
            multi_host_placement=g.multi_host_placement,
            boot_disk_types=g.boot_disk_types,
        )
        for g in GENERATIONS
    ]
