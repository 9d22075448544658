"""``tpuprov plan`` on public TPU manifests nobody here wrote (``tests/data/public_manifests``, #30).

Each manifest is planned as its source publishes it, in a zone that offers its TPU generation, and
must come out as an experienced GKE user expects: the machine type and node count of each slice,
its capacity, and for what the product cannot build (a bare Job, GKE's dynamic slicing, one-pod
Jobs on a multi-host slice) a refusal that says what to do instead. The tables are held against a
golden file (``UPDATE_GOLDEN=1`` rewrites it; review the diff); the expectations below are the
reading of each source that the golden must agree with.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.cli.goldens import PLAN_SETTINGS, assert_golden
from tests.paths import REPO
from tpuprov.main import main

CORPUS = REPO / "tests" / "data" / "public_manifests"


@dataclasses.dataclass(frozen=True)
class Expected:
    """What plan must say of one manifest."""

    location: str  # a zone Cloud TPU lists for the manifest's generation
    exit_code: int = 0
    slices: tuple[tuple[str, int, str], ...] = ()  # (machine type, nodes, capacity) per slice
    refused: str = ""  # in every slice's reason when the manifest is refused
    note: str = ""  # in every slice's note
    error: str = ""  # on stderr when plan finds nothing to plan


V5E_2X4 = ("ct5lp-hightpu-4t", 2, "on-demand@us-east5-b")
V6E_4X4 = ("ct6e-standard-4t", 4, "on-demand@us-east5-b")
EXPECTED = {
    "gke-tutorial-multislice.yaml": Expected("us-east5-b", slices=(V5E_2X4, V5E_2X4)),
    "jobset-repo-tpu.yaml": Expected("us-east5-b", slices=(V6E_4X4, V6E_4X4)),
    "xpk-workload.yaml": Expected("us-east5-b", slices=(V6E_4X4, V6E_4X4)),
    # v5p 2x2x2 on Spot with the custom label abc (a key the operator allows).
    "ai-on-gke-tpu-provisioner.yaml": Expected(
        "us-east5-b", slices=(("ct5p-hightpu-4t", 2, "spot@us-east5-b"),)
    ),
    "spot-custom-label.yaml": Expected("us-east5-b", slices=(("ct6e-standard-4t", 1, "spot@us-east5-b"),)),
    "flex-start-v6e.yaml": Expected("us-east5-b", slices=(("ct6e-standard-4t", 4, "flex-start@us-east5-b"),)),
    "tpu7x.yaml": Expected("us-central1-c", slices=(("tpu7x-standard-4t", 1, "on-demand@us-central1-c"),)),
    # Required node affinity on the user's own pool: GKE's queued provisioning fills it, not us.
    "queued-provisioning-v6e.yaml": Expected(
        "us-east5-b", slices=(("", 0, ""),), note="pinned to your node pool 'gke-tpu-v6e-pool'"
    ),
    "tpu7x-dynamic-slicing.yaml": Expected(
        "us-central1-c",
        exit_code=1,
        slices=(("", 0, ""),) * 2,
        refused="Use cloud.google.com/gke-nodepool as the exclusive topology (one pool per slice)",
    ),
    "tf-workers-one-pod-per-job.yaml": Expected(
        "us-east5-b",
        exit_code=1,
        slices=(("", 0, ""),) * 8,
        refused="declare replicas: 1 with parallelism and completions 8 (8 pods on 1 slice(s))",
    ),
    "gke-single-host-job.yaml": Expected(
        "us-east5-b", exit_code=2, error="the product creates pools only for the pods of a JobSet"
    ),
}


@pytest.fixture(autouse=True)
def operator_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in PLAN_SETTINGS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NODE_LABEL_KEYS", "abc")  # the custom label of the ai-on-gke examples


def test_the_corpus_is_what_this_test_expects() -> None:
    assert sorted(p.name for p in CORPUS.glob("*.yaml")) == sorted(EXPECTED)
    for path in CORPUS.glob("*.yaml"):
        header = [line.split(":", 1)[0] for line in path.read_text().splitlines()[:4]]
        assert header == ["# source", "# what", "# edits", "# expect"], path.name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_public_manifest_is_planned_as_a_gke_user_expects(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = EXPECTED[name]
    code = main(["plan", "-f", str(CORPUS / name), "--location", expected.location, "-o", "json"])
    captured = capsys.readouterr()
    assert code == expected.exit_code, captured.err
    if expected.error:
        assert expected.error in captured.err
        return
    rows = json.loads(captured.out)
    assert [(r["machine_type"], r["node_count"], r["capacity"]) for r in rows] == list(expected.slices)
    assert all(expected.refused in r["refused"] for r in rows), [r["refused"] for r in rows]
    assert all(expected.note in r["note"] for r in rows), [r["note"] for r in rows]
    assert [r["warning"] for r in rows] == [""] * len(rows)  # each planned in a zone with its TPUs


def test_the_corpus_plan_tables(capsys: pytest.CaptureFixture[str]) -> None:
    out = []
    for name in sorted(EXPECTED):
        main(
            [
                "plan",
                "-f",
                str(Path("tests/data/public_manifests") / name),
                "--location",
                EXPECTED[name].location,
            ]
        )
        captured = capsys.readouterr()
        out.append(f"=== {name}\n{captured.out}--- stderr\n{captured.err}")
    assert_golden("plan-public-manifests.txt", "".join(out))
