"""Tests of the TPU catalog (shared.tpu.catalog) and its CLI (tpuprov.commands.catalog).

Expected shapes are written out by hand from the GKE / Cloud TPU documentation tables, not
computed with the code under test, so a wrong table entry or rule shows up as a diff here.
"""

from __future__ import annotations

import argparse
import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.tpu import catalog
from shared.tpu.catalog import SliceShape, UnsupportedShape, resolve
from tpuprov.commands import catalog as cli_catalog

# Every TPU machine type the docs name for GKE, with chips per VM.
KNOWN_MACHINE_TYPES = {
    "ct4p-hightpu-4t": ("tpu-v4-podslice", 4),
    "ct5lp-hightpu-1t": ("tpu-v5-lite-podslice", 1),
    "ct5lp-hightpu-4t": ("tpu-v5-lite-podslice", 4),
    "ct5lp-hightpu-8t": ("tpu-v5-lite-podslice", 8),
    "ct5p-hightpu-4t": ("tpu-v5p-slice", 4),
    "ct6e-standard-1t": ("tpu-v6e-slice", 1),
    "ct6e-standard-4t": ("tpu-v6e-slice", 4),
    "ct6e-standard-8t": ("tpu-v6e-slice", 8),
    "tpu7x-standard-1t": ("tpu7x", 1),
    "tpu7x-standard-4t": ("tpu7x", 4),
}
ACCELERATORS = ("tpu-v4-podslice", "tpu-v5-lite-podslice", "tpu-v5p-slice", "tpu-v6e-slice", "tpu7x")


def _shape(
    accelerator: str,
    generation: str,
    topology: str,
    machine_type: str,
    chips_per_vm: int,
    num_vms: int,
    total_chips: int,
    placement: str,
) -> SliceShape:
    return SliceShape(
        accelerator=accelerator,
        generation=generation,
        topology=topology,
        machine_type=machine_type,
        chips_per_vm=chips_per_vm,
        num_vms=num_vms,
        total_chips=total_chips,
        multi_host=num_vms > 1,
        placement=placement,
    )


V4, V5E, V5P, V6E, TPU7X = ACCELERATORS

VALID = [
    # v4: 2x2x1 is the one single-host shape; everything else is multi-host on 4-chip VMs.
    ("v4-2x2x1", (V4, "2x2x1", 4), _shape(V4, "v4", "2x2x1", "ct4p-hightpu-4t", 4, 1, 4, "none")),
    ("v4-2x2x2", (V4, "2x2x2", 4), _shape(V4, "v4", "2x2x2", "ct4p-hightpu-4t", 4, 2, 8, "compact")),
    ("v4-2x4x4", (V4, "2x4x4", 4), _shape(V4, "v4", "2x4x4", "ct4p-hightpu-4t", 4, 8, 32, "compact")),
    ("v4-4x4x4", (V4, "4x4x4", 4), _shape(V4, "v4", "4x4x4", "ct4p-hightpu-4t", 4, 16, 64, "compact")),
    (
        "v4-12x12x24",
        (V4, "12x12x24", 4),
        _shape(V4, "v4", "12x12x24", "ct4p-hightpu-4t", 4, 864, 3456, "compact"),
    ),
    # v5e: 1-, 4- and 8-chip VMs.
    ("v5e-1x1", (V5E, "1x1", 1), _shape(V5E, "v5e", "1x1", "ct5lp-hightpu-1t", 1, 1, 1, "none")),
    ("v5e-2x2", (V5E, "2x2", 4), _shape(V5E, "v5e", "2x2", "ct5lp-hightpu-4t", 4, 1, 4, "none")),
    ("v5e-2x4-one-vm", (V5E, "2x4", 8), _shape(V5E, "v5e", "2x4", "ct5lp-hightpu-8t", 8, 1, 8, "none")),
    ("v5e-2x4-two-vms", (V5E, "2x4", 4), _shape(V5E, "v5e", "2x4", "ct5lp-hightpu-4t", 4, 2, 8, "compact")),
    ("v5e-4x8", (V5E, "4x8", 4), _shape(V5E, "v5e", "4x8", "ct5lp-hightpu-4t", 4, 8, 32, "compact")),
    ("v5e-16x16", (V5E, "16x16", 4), _shape(V5E, "v5e", "16x16", "ct5lp-hightpu-4t", 4, 64, 256, "compact")),
    # v5p: same rules as v4, up to the full 8960-chip pod (16x20x28).
    ("v5p-2x2x1", (V5P, "2x2x1", 4), _shape(V5P, "v5p", "2x2x1", "ct5p-hightpu-4t", 4, 1, 4, "none")),
    ("v5p-2x2x4", (V5P, "2x2x4", 4), _shape(V5P, "v5p", "2x2x4", "ct5p-hightpu-4t", 4, 4, 16, "compact")),
    ("v5p-4x4x8", (V5P, "4x4x8", 4), _shape(V5P, "v5p", "4x4x8", "ct5p-hightpu-4t", 4, 32, 128, "compact")),
    (
        "v5p-16x16x24-largest",
        (V5P, "16x16x24", 4),
        _shape(V5P, "v5p", "16x16x24", "ct5p-hightpu-4t", 4, 1536, 6144, "compact"),
    ),
    (
        "v5p-12x24x24",
        (V5P, "12x24x24", 4),
        _shape(V5P, "v5p", "12x24x24", "ct5p-hightpu-4t", 4, 1728, 6912, "compact"),
    ),
    (
        "v5p-16x20x28-full-pod",
        (V5P, "16x20x28", 4),
        _shape(V5P, "v5p", "16x20x28", "ct5p-hightpu-4t", 4, 2240, 8960, "compact"),
    ),
    # v6e: the supported-configurations table row by row.
    ("v6e-1x1", (V6E, "1x1", 1), _shape(V6E, "v6e", "1x1", "ct6e-standard-1t", 1, 1, 1, "none")),
    ("v6e-2x2", (V6E, "2x2", 4), _shape(V6E, "v6e", "2x2", "ct6e-standard-4t", 4, 1, 4, "none")),
    ("v6e-2x4-one-vm", (V6E, "2x4", 8), _shape(V6E, "v6e", "2x4", "ct6e-standard-8t", 8, 1, 8, "none")),
    ("v6e-2x4-two-vms", (V6E, "2x4", 4), _shape(V6E, "v6e", "2x4", "ct6e-standard-4t", 4, 2, 8, "compact")),
    ("v6e-4x4", (V6E, "4x4", 4), _shape(V6E, "v6e", "4x4", "ct6e-standard-4t", 4, 4, 16, "compact")),
    ("v6e-8x16", (V6E, "8x16", 4), _shape(V6E, "v6e", "8x16", "ct6e-standard-4t", 4, 32, 128, "compact")),
    ("v6e-16x16", (V6E, "16x16", 4), _shape(V6E, "v6e", "16x16", "ct6e-standard-4t", 4, 64, 256, "compact")),
    # tpu7x: single-host shapes need no policy; multi-host ones use a workload policy.
    (
        "tpu7x-1x1x1",
        (TPU7X, "1x1x1", 1),
        _shape(TPU7X, "tpu7x", "1x1x1", "tpu7x-standard-1t", 1, 1, 1, "none"),
    ),
    (
        "tpu7x-2x2x1",
        (TPU7X, "2x2x1", 4),
        _shape(TPU7X, "tpu7x", "2x2x1", "tpu7x-standard-4t", 4, 1, 4, "none"),
    ),
    (
        "tpu7x-2x2x2",
        (TPU7X, "2x2x2", 4),
        _shape(TPU7X, "tpu7x", "2x2x2", "tpu7x-standard-4t", 4, 2, 8, "workload-policy"),
    ),
    (
        "tpu7x-4x4x4",
        (TPU7X, "4x4x4", 4),
        _shape(TPU7X, "tpu7x", "4x4x4", "tpu7x-standard-4t", 4, 16, 64, "workload-policy"),
    ),
    # Label values read from events may carry stray whitespace; the result is normalized.
    ("whitespace", (V6E, " 2x4\n", 8), _shape(V6E, "v6e", "2x4", "ct6e-standard-8t", 8, 1, 8, "none")),
    (
        "whitespace-3d",
        (V5P, "\t4x4x4 ", 4),
        _shape(V5P, "v5p", "4x4x4", "ct5p-hightpu-4t", 4, 16, 64, "compact"),
    ),
]


@pytest.mark.parametrize(("args", "expected"), [v[1:] for v in VALID], ids=[v[0] for v in VALID])
def test_resolve_returns_the_documented_slice(args: tuple[str, str, int], expected: SliceShape) -> None:
    assert resolve(*args) == expected


INVALID = [
    # (id, accelerator, topology, chips_per_vm, fragments the message must contain)
    (
        "unknown-accelerator",
        "tpu-v9-slice",
        "2x4",
        4,
        ["unknown TPU accelerator 'tpu-v9-slice'", "tpu-v6e-slice"],
    ),
    ("gpu-accelerator", "nvidia-l4", "2x4", 4, ["unknown TPU accelerator"]),
    ("trailing-x", V6E, "2x", 4, ["'2x' is malformed", "2 dimensions"]),
    ("leading-x", V6E, "x4", 4, ["'x4' is malformed"]),
    ("zero-dimension", V6E, "0x4", 4, ["'0x4' has a zero dimension"]),
    ("negative-dimension", V6E, "-2x4", 4, ["dimension '-2' is not a positive integer"]),
    ("decimal-dimension", V6E, "2x4.0", 4, ["dimension '4.0' is not a positive integer"]),
    ("leading-zero", V6E, "02x4", 4, ["dimension '02'"]),
    ("inner-space", V6E, "2 x 4", 4, ["malformed"]),
    ("upper-case-x", V6E, "2X4", 4, ["'2X4' is malformed"]),
    ("empty", V6E, "  ", 4, ["topology is empty"]),
    ("2d-for-3d-generation", V5P, "2x2", 4, ["'2x2' has 2 dimensions", "3 dimensions"]),
    ("3d-for-2d-generation", V6E, "2x2x2", 4, ["'2x2x2' has 3 dimensions", "2 dimensions"]),
    ("4d", V4, "2x2x2x2", 4, ["has 4 dimensions"]),
    ("swapped-2d", V6E, "4x2", 4, ["4x2 is not offered", "GKE names this shape 2x4"]),
    ("swapped-3d", V4, "8x4x4", 4, ["8x4x4 is not offered", "4x4x8"]),
    ("reordered-single-host", V5P, "1x2x2", 4, ["GKE names this shape 2x2x1"]),
    ("2d-not-offered", V5E, "3x3", 4, ["3x3 is not offered for v5e", "1x1, 2x2, 2x4"]),
    ("2d-too-large", V6E, "32x32", 4, ["1024 chips, more than the largest v6e slice (256 chips)"]),
    ("3d-not-multiple-of-4", V5P, "2x4x8", 4, ["2x4x8 is not offered for v5p", "multiples of 4"]),
    ("3d-odd", V4, "4x4x6", 4, ["4x4x6 is not offered for v4"]),
    ("v5p-too-large", V5P, "16x20x32", 4, ["10240 chips, more than the largest v5p slice (8960 chips)"]),
    ("v5p-full-pod-misordered", V5P, "28x20x16", 4, ["GKE names this shape 16x20x28"]),
    ("v5p-not-multiple-of-4", V5P, "12x20x26", 4, ["12x20x26 is not offered for v5p"]),
    ("v4-too-large", V4, "16x16x32", 4, ["more than the largest v4 slice (4096 chips)"]),
    ("1x1x1-only-on-tpu7x", V4, "1x1x1", 4, ["1x1x1 is not offered for v4"]),
    # The anchor bug: a request of 16 turned into ct6e-standard-16t. No such machine exists.
    ("v6e-16-chip-vm", V6E, "4x4", 16, ["no v6e machine type has 16 chips", "valid requests for 4x4: 4"]),
    ("v5p-8-chip-vm", V5P, "2x2x2", 8, ["no v5p machine type has 8 chips", "ct5p-hightpu-4t (4 chips)"]),
    ("v4-1-chip-vm", V4, "2x2x1", 1, ["no v4 machine type has 1 chip"]),
    ("tpu7x-8-chip-vm", TPU7X, "2x2x2", 8, ["no tpu7x machine type has 8 chips"]),
    (
        "request-larger-than-slice",
        V6E,
        "1x1",
        4,
        ["4 chips per VM", "cannot tile the 1 chip", "valid requests for 1x1: 1"],
    ),
    ("v5e-2x2-on-8-chip-vm", V5E, "2x2", 8, ["cannot tile the 4 chips"]),
    ("tpu7x-1x1x1-on-4-chip-vm", TPU7X, "1x1x1", 4, ["cannot tile the 1 chip"]),
    ("8-chip-vm-multi-host-v6e", V6E, "4x4", 8, ["ct6e-standard-8t only forms single-host", "need 2 VMs"]),
    ("8-chip-vm-multi-host-v5e", V5E, "16x16", 8, ["ct5lp-hightpu-8t only forms single-host", "need 32 VMs"]),
    ("1-chip-vm-multi-host-v5e", V5E, "2x2", 1, ["ct5lp-hightpu-1t only forms single-host", "need 4 VMs"]),
    ("1-chip-vm-multi-host-tpu7x", TPU7X, "2x2x1", 1, ["tpu7x-standard-1t only forms single-host"]),
    ("zero-chips", V6E, "2x4", 0, ["must be a positive integer, got 0"]),
    ("negative-chips", V6E, "2x4", -4, ["must be a positive integer, got -4"]),
]


@pytest.mark.parametrize(
    ("accelerator", "topology", "chips_per_vm", "fragments"),
    [v[1:] for v in INVALID],
    ids=[v[0] for v in INVALID],
)
def test_resolve_rejects_what_gke_would_reject(
    accelerator: str, topology: str, chips_per_vm: int, fragments: list[str]
) -> None:
    with pytest.raises(UnsupportedShape) as info:
        resolve(accelerator, topology, chips_per_vm)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("chips", [True, 4.0, "4", None], ids=["bool", "float", "str", "none"])
def test_resolve_rejects_a_chip_request_that_is_not_an_integer(chips: object) -> None:
    with pytest.raises(UnsupportedShape, match="must be an integer"):
        resolve(V6E, "2x4", chips)  # type: ignore[arg-type]


def _every_resolvable_shape() -> list[SliceShape]:
    shapes = []
    requests = [*range(1, 17), 32, 64]
    for info in catalog.accelerators():
        for topology in info.topologies:
            accepted = []
            for chips in requests:
                try:
                    accepted.append(resolve(info.accelerator, topology, chips))
                except UnsupportedShape:
                    continue
            # Every topology the catalog lists must be creatable with some request.
            assert accepted, f"{info.accelerator} {topology} accepts no chip request"
            shapes.extend(accepted)
    return shapes


def test_no_resolved_shape_leaves_the_documented_machine_families() -> None:
    shapes = _every_resolvable_shape()
    assert len(shapes) > 1000  # the 3D rule really was enumerated
    for shape in shapes:
        assert shape.machine_type in KNOWN_MACHINE_TYPES, shape
        accelerator, chips = KNOWN_MACHINE_TYPES[shape.machine_type]
        assert shape.accelerator == accelerator, shape
        assert shape.chips_per_vm == chips, shape
        assert shape.num_vms * shape.chips_per_vm == shape.total_chips, shape
        assert shape.multi_host == (shape.num_vms > 1), shape
        if not shape.multi_host:
            assert shape.placement == "none", shape
        elif shape.generation == "tpu7x":
            assert shape.placement == "workload-policy", shape
        else:
            assert shape.placement == "compact", shape
        # The 1- and 8-chip machine types only ever form one-VM slices.
        if chips in (1, 8):
            assert shape.num_vms == 1, shape
        # Resolving the normalized result again is a fixed point.
        assert resolve(shape.accelerator, shape.topology, shape.chips_per_vm) == shape


def test_2d_generations_offer_exactly_the_documented_topologies() -> None:
    documented = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")
    by_accelerator = {info.accelerator: info for info in catalog.accelerators()}
    assert by_accelerator[V5E].topologies == documented
    assert by_accelerator[V6E].topologies == documented


@pytest.mark.parametrize(
    ("accelerator", "present", "absent", "max_chips"),
    [
        (
            V4,
            ["2x2x1", "2x4x4", "4x4x4", "4x8x8", "12x12x24", "16x16x16"],
            ["1x1x1", "4x4x2", "16x16x20"],
            4096,
        ),
        (
            V5P,
            ["2x2x1", "2x2x4", "8x16x16", "16x16x24", "12x24x24", "16x20x28"],
            ["1x1x1", "2x4x8", "16x20x32", "20x20x24"],
            8960,
        ),
        (TPU7X, ["1x1x1", "2x2x1", "4x4x4", "16x24x24"], ["4x4x2", "24x24x24"], 9216),
    ],
    ids=["v4", "v5p", "tpu7x"],
)
def test_3d_generations_enumerate_their_rule(
    accelerator: str, present: list[str], absent: list[str], max_chips: int
) -> None:
    info = next(i for i in catalog.accelerators() if i.accelerator == accelerator)
    assert info.max_chips == max_chips
    for topology in present:
        assert topology in info.topologies
    for topology in absent:
        assert topology not in info.topologies
    assert len(set(info.topologies)) == len(info.topologies)


@pytest.mark.parametrize(
    ("machine_type", "chips", "accelerator"),
    [(name, chips, acc) for name, (acc, chips) in KNOWN_MACHINE_TYPES.items()]
    + [
        ("ct6e-standard-16t", None, None),  # what the anchor bug asks for
        ("ct5lp-hightpu-2t", None, None),
        ("n2-standard-8", None, None),
        ("a3-highgpu-8g", None, None),
        ("", None, None),
    ],
    ids=lambda value: str(value),
)
def test_machine_type_lookups(machine_type: str, chips: int | None, accelerator: str | None) -> None:
    assert catalog.machine_type_chips(machine_type) == chips
    assert catalog.accelerator_for_machine_type(machine_type) == accelerator


@pytest.mark.parametrize(
    ("accelerator", "topology", "options"),
    [
        (V5E, "2x4", (4, 8)),
        (V6E, "2x4", (4, 8)),
        (V6E, "1x1", (1,)),
        (V6E, "4x4", (4,)),
        (TPU7X, "1x1x1", (1,)),
        (TPU7X, "2x2x2", (4,)),
        (V5P, "2x2x1", (4,)),
    ],
    ids=["v5e-2x4", "v6e-2x4", "v6e-1x1", "v6e-4x4", "tpu7x-1x1x1", "tpu7x-2x2x2", "v5p-2x2x1"],
)
def test_chips_per_vm_options(accelerator: str, topology: str, options: tuple[int, ...]) -> None:
    assert catalog.chips_per_vm_options(accelerator, topology) == options


def test_chips_per_vm_options_rejects_a_bad_topology() -> None:
    with pytest.raises(UnsupportedShape, match="not offered"):
        catalog.chips_per_vm_options(V6E, "3x3")


@settings(max_examples=300, deadline=None)
@given(
    accelerator=st.sampled_from([*ACCELERATORS, "tpu-v3", ""]),
    topology=st.text(alphabet="0123456789x -X.", max_size=12),
    chips=st.integers(min_value=-8, max_value=80),
)
def test_resolve_never_fails_any_other_way(accelerator: str, topology: str, chips: int) -> None:
    try:
        shape = resolve(accelerator, topology, chips)
    except UnsupportedShape as error:
        assert str(error)
        return
    assert shape.machine_type in KNOWN_MACHINE_TYPES
    assert shape.num_vms * shape.chips_per_vm == shape.total_chips


# --- CLI -----------------------------------------------------------------------------------


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tpuprov")
    cli_catalog.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_cli_json_lists_every_accelerator(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["catalog", "--output", "json"])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert [entry["accelerator"] for entry in data] == list(ACCELERATORS)
    machine_types = {m["name"]: m["chips"] for entry in data for m in entry["machine_types"]}
    assert machine_types == {name: chips for name, (_, chips) in KNOWN_MACHINE_TYPES.items()}
    v6e = next(entry for entry in data if entry["accelerator"] == V6E)
    assert v6e["generation"] == "v6e"
    assert v6e["topologies"] == ["1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"]
    tpu7x = next(entry for entry in data if entry["accelerator"] == TPU7X)
    assert tpu7x["multi_host_placement"] == "workload-policy"
    assert "16x24x24" in tpu7x["topologies"]
    disks = {entry["accelerator"]: entry["boot_disk_types"] for entry in data}
    assert disks == {
        V4: ["pd-balanced"],
        V5E: ["pd-balanced"],
        V5P: ["pd-balanced"],
        V6E: ["hyperdisk-balanced"],
        TPU7X: ["hyperdisk-balanced"],
    }


def test_cli_table_is_the_default_and_names_everything(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse(["catalog"])
    assert cli_catalog.run(args) == 0
    out = capsys.readouterr().out
    for accelerator in ACCELERATORS:
        assert accelerator in out
    for name in KNOWN_MACHINE_TYPES:
        assert name in out
    assert "ct6e-standard-8t (8 chips, single-host only)" in out
    assert "1x1, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16" in out
    assert "at most 8960 chips" in out
    assert "boot disks:    hyperdisk-balanced (the first is the default)" in out


def test_cli_yaml_is_the_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    for fmt in ("json", "yaml"):
        args = _parse(["catalog", "-o", fmt])
        assert args.func(args) == 0
    as_json, as_yaml = capsys.readouterr().out.split("\n]\n", 1)
    assert yaml.safe_load(as_yaml) == json.loads(as_json + "\n]")


def test_cli_rejects_an_unknown_output_format(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _parse(["catalog", "--output", "xml"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
