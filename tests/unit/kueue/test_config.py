"""Kueue queue configuration validation: every problem is found, named and listed at once."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from shared.core.errors import InvalidInputError
from shared.kueue import config as kueue
from shared.kueue.config import DEFAULT_CONFIG

# The packaged default is the GKE tutorial's setup; each case breaks one part of it.
SEED_CONFIG = DEFAULT_CONFIG.read_text()


def _with(**sections: Any) -> dict[str, Any]:
    base = yaml.safe_load(SEED_CONFIG)
    base.update(sections)
    return base


INVALID = [
    (
        _with(flavors=[{"name": "f", "accelerator": "tpu-v9-podslice", "topology": "2x4"}]),
        ["flavors[0] (f)", "unknown TPU accelerator 'tpu-v9-podslice'"],
    ),
    (
        _with(flavors=[{"name": "vlp-24", "accelerator": "tpu-v5-lite-podslice", "topology": "3x3"}]),
        ["flavors[0] (vlp-24)", "3x3"],
    ),
    (
        _with(flavors=[{"name": "vlp-24", "accelerator": "tpu-v5-lite-podslice", "topology": "2x2x2"}]),
        ["dimensions"],
    ),
    (
        _with(clusterQueues=[{"name": "cluster-queue", "quota": {"vlp-24": -8}}]),
        ["clusterQueues[0] (cluster-queue) quota[vlp-24]", "must not be negative (-8)"],
    ),
    (
        _with(clusterQueues=[{"name": "cluster-queue", "quota": {"vlp-24": {"chips": 8, "memory": "-1Gi"}}}]),
        ["memory quota '-1Gi'"],
    ),
    (
        _with(localQueues=[{"name": "q", "namespace": "default", "clusterQueue": "nope"}]),
        ["localQueues[0] (q)", "clusterQueue 'nope' is not defined"],
    ),
    (
        _with(
            flavors=[
                {"name": "vlp-24", "accelerator": "tpu-v5-lite-podslice", "topology": "2x4"},
                {"name": "vlp-24", "accelerator": "tpu-v5-lite-podslice", "topology": "4x4"},
            ]
        ),
        ["flavors[1] (vlp-24)", "duplicate flavor 'vlp-24'"],
    ),
    (
        _with(
            localQueues=[
                {"name": "q", "namespace": "team-a", "clusterQueue": "cluster-queue"},
                {"name": "q", "namespace": "team-a", "clusterQueue": "cluster-queue"},
            ]
        ),
        ["duplicate LocalQueue 'team-a/q'"],
    ),
    (
        _with(localQueues=[{"name": "q", "namespace": "Team_A", "clusterQueue": "cluster-queue"}]),
        ["namespace 'Team_A' is not a valid DNS-1123 label"],
    ),
    (
        _with(clusterQueues=[{"name": "Cluster Queue", "quota": {"vlp-24": 8}}]),
        ["name 'Cluster Queue' is not a valid DNS-1123 subdomain"],
    ),
    (
        _with(clusterQueues=[{"name": "cq", "quota": {"vlp-24": 8}, "queueingStrategy": "LIFO"}]),
        ["queueingStrategy 'LIFO'"],
    ),
    (
        _with(
            clusterQueues=[
                {"name": "cq", "quota": {"vlp-24": 8}, "preemption": {"withinClusterQueue": "Always"}}
            ]
        ),
        ["preemption.withinClusterQueue 'Always'"],
    ),
    (
        _with(clusterQueues=[{"name": "cq", "quota": {"other": 8}}]),
        ["quota[other]", "unknown flavor 'other'"],
    ),
    (
        _with(clusterQueues=[{"name": "cq", "quota": {}}]),
        ["quota must map at least one flavor"],
    ),
    (
        _with(priorityClasses=[{"name": "p", "value": "high"}]),
        ["priorityClasses[0] (p)", "value must be an integer"],
    ),
    (
        _with(
            priorityClasses=[
                {"name": "p", "value": 1, "kind": "WorkloadPriorityClass", "globalDefault": True}
            ]
        ),
        ["globalDefault only applies to kind PriorityClass"],
    ),
    (
        _with(
            flavors=[
                {"name": "vlp-24", "accelerator": "tpu-v5-lite-podslice", "topology": "2x4", "zone": "a"}
            ]
        ),
        ["unknown field 'zone'"],
    ),
    ({"flavor": []}, ["configuration: unknown field 'flavor'"]),
    ("- just\n- a list\n", ["must be a mapping"]),
    ("flavors: [unclosed\n", ["neither YAML nor JSON"]),
]


@pytest.mark.parametrize(
    ("config", "fragments"),
    INVALID,
    ids=[
        "unknown-accelerator",
        "impossible-topology",
        "wrong-dimensions",
        "negative-chip-quota",
        "negative-memory-quota",
        "localqueue-unknown-clusterqueue",
        "duplicate-flavor",
        "duplicate-localqueue",
        "bad-namespace",
        "bad-clusterqueue-name",
        "bad-queueing-strategy",
        "bad-preemption-value",
        "quota-for-undeclared-flavor",
        "empty-quota",
        "non-integer-priority",
        "global-default-on-workload-priority",
        "unknown-flavor-field",
        "unknown-top-level-key",
        "not-a-mapping",
        "not-yaml",
    ],
)
def test_invalid_configuration_is_rejected_with_a_precise_reason(config: Any, fragments: list[str]) -> None:
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    with pytest.raises(InvalidInputError) as caught:
        kueue.parse_config(text)
    for fragment in fragments:
        assert fragment in caught.value.why


def test_every_problem_is_listed_at_once() -> None:
    text = """
flavors:
  - {name: ok, accelerator: tpu-v5-lite-podslice, topology: 2x4}
  - {name: bad-acc, accelerator: tpu-v0, topology: 2x4}
  - {name: bad-topo, accelerator: tpu-v6e-slice, topology: 5x5}
clusterQueues:
  - {name: cq, quota: {ok: -1}}
  - {name: cq, quota: {ok: 8}}
localQueues:
  - {name: lq, namespace: default, clusterQueue: missing}
  - {name: UPPER, namespace: default, clusterQueue: cq}
"""
    with pytest.raises(InvalidInputError) as caught:
        kueue.parse_config(text)
    why = caught.value.why
    assert why.startswith("Kueue configuration has 6 problems:")
    for fragment in (
        "flavors[1] (bad-acc): unknown TPU accelerator 'tpu-v0'",
        "flavors[2] (bad-topo):",
        "clusterQueues[0] (cq) quota[ok]: chip quota must not be negative (-1)",
        "clusterQueues[1] (cq): duplicate ClusterQueue 'cq'",
        "localQueues[0] (lq): clusterQueue 'missing' is not defined",
        "localQueues[1] (UPPER): name 'UPPER' is not a valid DNS-1123 subdomain",
    ):
        assert fragment in why


def test_allowed_accelerators_guardrail_applies_to_flavors() -> None:
    with pytest.raises(InvalidInputError, match="not in ALLOWED_ACCELERATORS"):
        kueue.parse_config(SEED_CONFIG, allowed_accelerators=("tpu-v6e-slice",))
    assert kueue.parse_config(SEED_CONFIG, allowed_accelerators=("tpu-v5-lite-podslice",)).flavors


def test_topology_is_checked_by_slice_shape_not_by_machine_type() -> None:
    # 1x1 only forms on the 1-chip machine type and 2x4 on two; both are valid flavors.
    for topology, chips in (("1x1", 1), ("2x4", 8), ("16x16", 256)):
        text = f"flavors: [{{name: f, accelerator: tpu-v5-lite-podslice, topology: '{topology}'}}]"
        assert kueue.parse_config(text).flavors[0].chips_per_slice == chips


# --- hostile inputs: the configuration arrives in a Pub/Sub message -----------------------------

# The "billion laughs" in YAML: nine levels of nine aliases expand to 9**9 strings. Parsed with an
# expanding loader, validation's error message alone repeated tens of MB of it.
BILLION_LAUGHS = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{name}: &{name} [{', '.join(['*' + prev] * 9)}]\n"
        for prev, name in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "flavors: *i\n"
)
HOSTILE = [
    (BILLION_LAUGHS, "YAML anchor &a is not accepted at line 1, column 4"),
    ("base: &base {accelerator: tpu-v6e-slice}\nflavors: []\n", "YAML anchor &base is not accepted"),
    # An alias to an anchor that was never defined is refused the same way, before composing it.
    ("flavors: *nowhere\n", "YAML alias *nowhere is not accepted"),
    ("flavors:\n  - <<: *f\n    name: x\n", "YAML alias *f is not accepted"),
    ("[" * 60000, "nests too deeply"),
    ('{"flavors": ' * 4000 + "1" + "}" * 4000, "nests too deeply"),
    ("#" * (kueue.MAX_CONFIG_BYTES + 1), f"at most {kueue.MAX_CONFIG_BYTES} are accepted"),
]


@pytest.mark.parametrize(
    ("text", "reason"),
    HOSTILE,
    ids=[
        "billion-laughs",
        "anchor",
        "dangling-alias",
        "merge-key-alias",
        "deep-yaml",
        "deep-json",
        "oversized",
    ],
)
def test_hostile_configurations_are_refused_cheaply_and_briefly(text: str, reason: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        kueue.parse_config(text)
    assert reason in caught.value.why
    assert len(str(caught.value)) <= 300


def test_the_billion_laughs_is_small_and_never_expanded() -> None:
    assert len(BILLION_LAUGHS.encode()) < 500
    with pytest.raises(InvalidInputError, match="anchor"):
        kueue.parse_text(BILLION_LAUGHS.encode())


def test_error_messages_are_bounded_however_large_the_values() -> None:
    huge_name = "z" * 20000
    text = f"flavors: [{{name: '{huge_name}', accelerator: tpu-v9-podslice, topology: 2x4}}]\n"
    with pytest.raises(InvalidInputError) as caught:
        kueue.parse_config(text)
    why = caught.value.why
    assert "unknown TPU accelerator" in why or "chars)" in why
    assert huge_name not in why
    assert all(len(line) <= kueue.MAX_PROBLEM_CHARS + 4 for line in why.splitlines())


def test_many_problems_are_counted_but_only_the_first_are_listed() -> None:
    flavors = ", ".join(f"{{name: f{i}, accelerator: tpu-v9, topology: 2x4}}" for i in range(300))
    with pytest.raises(InvalidInputError) as caught:
        kueue.parse_config(f"flavors: [{flavors}]\n")
    why = caught.value.why
    assert why.startswith("Kueue configuration has 300 problems:")
    assert why.count("\n  - flavors[") == kueue.MAX_PROBLEMS_LISTED
    assert why.endswith(f"... and {300 - kueue.MAX_PROBLEMS_LISTED} more")
    assert len(why) <= kueue.MAX_ERROR_CHARS


def test_yaml_without_anchors_still_parses_as_before() -> None:
    assert kueue.parse_text("a: [1, 2]\nb: {c: 'd'}\n") == {"a": [1, 2], "b": {"c": "d"}}
    assert kueue.parse_config(SEED_CONFIG).flavors
