"""The TPU generations GKE offers: per generation, its machine types, topologies, placement and boot disks.

The tables restate Google's documentation, cited per generation; ``shared.tpu.catalog`` answers
questions over them (``resolve`` a slice, list the accelerators).
"""

from __future__ import annotations

import dataclasses
import math

# How a node pool's VMs are placed. A single-host pool gets no TPU placement policy at all,
# because GKE rejects a TPU topology on a one-VM pool.
PLACEMENT_NONE = "none"
PLACEMENT_COMPACT = "compact"  # COMPACT placement policy carrying tpu_topology (v4, v5e, v5p, v6e)
PLACEMENT_WORKLOAD_POLICY = "workload-policy"  # a named workload policy (tpu7x multi-host)


@dataclasses.dataclass(frozen=True)
class MachineTypeInfo:
    """One TPU machine type: its name, chips per VM, and whether it only ever forms one-VM slices."""

    name: str
    chips: int
    single_host_only: bool = False


@dataclasses.dataclass(frozen=True)
class Generation:
    accelerator: str
    generation: str
    dimensions: int
    machine_types: tuple[MachineTypeInfo, ...]
    # Topologies listed one by one in the docs, smallest first.
    listed: tuple[str, ...]
    # 3D generations also take AxBxC with A <= B <= C, every dimension a multiple of 4, up to
    # this many chips. 0 means the listed topologies are the whole set.
    cube_max_chips: int
    multi_host_placement: str
    # Boot disk types the machine family supports, the default first (see _DISKS_* below).
    boot_disk_types: tuple[str, ...]

    @property
    def max_chips(self) -> int:
        listed_max = max(math.prod(dims(t)) for t in self.listed)
        return max(listed_max, self.cube_max_chips)

    def describe(self) -> str:
        return f"{self.generation} ({self.accelerator})"


def dims(topology: str) -> tuple[int, ...]:
    return tuple(int(part) for part in topology.split("x"))


# Boot disks. Cloud TPU "Attach durable block storage to a TPU VM", supported-disk-types table: v4,
# v5e and v5p VMs take Balanced Persistent Disk only; v6e VMs take Hyperdisk only (Balanced or ML,
# and GKE boots nodes from Hyperdisk Balanced, the one Hyperdisk type its boot-disk list names:
# GKE "Configuring a custom boot disk"). Compute refuses the other kind for the machine family.
# Ironwood (tpu7x) is not in that table; like the other newest Compute families it boots from
# Hyperdisk Balanced only (stated in this project's issue 12, not found verbatim in the docs).
DISKS_PD = ("pd-balanced",)
DISKS_HYPERDISK = ("hyperdisk-balanced",)

# --- The tables. Each fact is restated from Google's documentation, cited per generation.
GENERATIONS: tuple[Generation, ...] = (
    # v4. GKE "Plan TPUs in GKE", v4/v5p table: one machine type with 4 chips per VM; 2x2x1 is the
    # only single-host shape, 2x2x2, 2x2x4 and 2x4x4 are the small multi-host ones, and larger
    # slices are custom AxBxC shapes. Cloud TPU "TPU types and topologies": v4 shapes are AxBxC
    # with A <= B <= C, all dimensions either <= 4 or multiples of 4; below 64 chips only the
    # shapes GKE's table names are accepted. Cloud TPU "TPU v4": a v4 Pod holds 4096 chips,
    # which bounds a slice.
    Generation(
        accelerator="tpu-v4-podslice",
        generation="v4",
        dimensions=3,
        machine_types=(MachineTypeInfo("ct4p-hightpu-4t", 4),),
        listed=("2x2x1", "2x2x2", "2x2x4", "2x4x4"),
        cube_max_chips=4096,
        multi_host_placement=PLACEMENT_COMPACT,
        boot_disk_types=DISKS_PD,
    ),
    # v5e. GKE "Plan TPUs in GKE", v5e table, and Cloud TPU "TPU v5e" supported 2D shapes:
    # 1x1 to 16x16 (256 chips at most); VMs carry 1, 4 or 8 chips. The 1-chip type only forms a
    # 1x1 and the 8-chip type only a one-VM 2x4; every multi-VM slice (2x4 on two VMs up to
    # 16x16) uses ct5lp-hightpu-4t.
    Generation(
        accelerator="tpu-v5-lite-podslice",
        generation="v5e",
        dimensions=2,
        machine_types=(
            MachineTypeInfo("ct5lp-hightpu-1t", 1, single_host_only=True),
            MachineTypeInfo("ct5lp-hightpu-4t", 4),
            MachineTypeInfo("ct5lp-hightpu-8t", 8, single_host_only=True),
        ),
        listed=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        cube_max_chips=0,
        multi_host_placement=PLACEMENT_COMPACT,
        boot_disk_types=DISKS_PD,
    ),
    # v5p. GKE "Plan TPUs in GKE", v4/v5p table (same shape rules as v4, machine type
    # ct5p-hightpu-4t). Cloud TPU "TPU v5p": a v5p Pod holds 8960 chips; its configurations table
    # lists common shapes up to 16x16x24 (6144 chips, the largest "scheduled job" it names) and
    # says the list is not exhaustive. Full-pod slices such as 16x20x28 (8960 chips) and 12x24x24
    # (6912) are in use, so the bound is the pod, not the table's largest row.
    Generation(
        accelerator="tpu-v5p-slice",
        generation="v5p",
        dimensions=3,
        machine_types=(MachineTypeInfo("ct5p-hightpu-4t", 4),),
        listed=("2x2x1", "2x2x2", "2x2x4", "2x4x4"),
        cube_max_chips=8960,
        multi_host_placement=PLACEMENT_COMPACT,
        boot_disk_types=DISKS_PD,
    ),
    # v6e. Cloud TPU "TPU v6e", supported-configurations table (topology, chips, VMs, GKE machine
    # type): 1x1 on ct6e-standard-1t; 2x2 on one ct6e-standard-4t; 2x4 on one ct6e-standard-8t
    # or on two ct6e-standard-4t (the latter only through GKE); 4x4 to 16x16 on 4-chip VMs.
    Generation(
        accelerator="tpu-v6e-slice",
        generation="v6e",
        dimensions=2,
        machine_types=(
            MachineTypeInfo("ct6e-standard-1t", 1, single_host_only=True),
            MachineTypeInfo("ct6e-standard-4t", 4),
            MachineTypeInfo("ct6e-standard-8t", 8, single_host_only=True),
        ),
        listed=("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
        cube_max_chips=0,
        multi_host_placement=PLACEMENT_COMPACT,
        boot_disk_types=DISKS_HYPERDISK,
    ),
    # Ironwood. GKE "About TPUs in GKE": tpu7x topologies are 3-tuples like v4/v5p. GKE "Ironwood
    # (TPU7x) in GKE": each VM has four chips, and a multi-host pool is placed by a workload
    # policy passed as the placement policy instead of a TPU topology. Cloud TPU "TPU7x": a Pod
    # holds 9216 chips. The 1-chip tpu7x-standard-1t serves only the 1x1x1 shape (Google's XPK
    # system-characteristics table).
    Generation(
        accelerator="tpu7x",
        generation="tpu7x",
        dimensions=3,
        machine_types=(
            MachineTypeInfo("tpu7x-standard-1t", 1, single_host_only=True),
            MachineTypeInfo("tpu7x-standard-4t", 4),
        ),
        listed=("1x1x1", "2x2x1", "2x2x2", "2x2x4", "2x4x4"),
        cube_max_chips=9216,
        multi_host_placement=PLACEMENT_WORKLOAD_POLICY,
        boot_disk_types=DISKS_HYPERDISK,
    ),
)

BY_ACCELERATOR = {g.accelerator: g for g in GENERATIONS}
BY_MACHINE_TYPE = {m.name: (g, m) for g in GENERATIONS for m in g.machine_types}
