"""Pool names: deterministic, unique per slice identity, always valid for GKE."""

import pytest

from shared.core.names import (
    POOL_NAME_MAX,
    SliceId,
    is_rfc1035,
    label_key_problem,
    label_value_problem,
    pool_name,
)

UID = "6f1c2b7e-9d3a-4a59-8a61-0c1f2d3e4f50"


@pytest.mark.parametrize(
    "slice_id",
    [
        SliceId("default", "train", UID, "slice", 0),
        SliceId("team-a", "a" * 63, UID, "b" * 63, 12345),
        SliceId("ns", "Weird.Name_with.dots", UID, "RJ", 7),
        SliceId("ns", "x", "", "y", 0),
        SliceId("ns", "9starts-with-digit", UID, "0", 1),
    ],
    ids=["simple", "longest-names", "dots-and-case", "no-uid", "digits"],
)
def test_pool_name_is_valid_rfc1035_within_gke_limit(slice_id):
    name = pool_name(slice_id)
    assert len(name) <= POOL_NAME_MAX
    assert is_rfc1035(name, POOL_NAME_MAX)
    assert name == pool_name(slice_id), "must be deterministic"


def test_pool_name_is_readable():
    assert pool_name(SliceId("default", "train", UID, "slice", 3)).startswith("tpu-train-slice-3-")


def test_every_identity_field_changes_the_name():
    base = SliceId("ns", "train", UID, "slice", 0)
    variants = [
        SliceId("ns2", "train", UID, "slice", 0),
        SliceId("ns", "train2", UID, "slice", 0),
        SliceId("ns", "train", UID.replace("6", "7"), "slice", 0),
        SliceId("ns", "train", UID, "slice2", 0),
        SliceId("ns", "train", UID, "slice", 1),
    ]
    names = {pool_name(v) for v in variants}
    assert pool_name(base) not in names
    assert len(names) == len(variants)


def test_long_names_sharing_a_prefix_do_not_collide():
    a = SliceId("ns", "x" * 60 + "a", UID, "slice", 0)
    b = SliceId("ns", "x" * 60 + "b", UID, "slice", 0)
    assert pool_name(a) != pool_name(b)


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("team", "research", True),
        ("example.com/tier", "gold_1.x", True),
        ("bad key", "v", False),
        ("team", "has space", False),
        ("team", "x" * 64, False),
        ("-team", "v", False),
        ("Example.com/tier", "v", False),
        ("team", "", True),
    ],
    ids=[
        "plain",
        "prefixed",
        "space-key",
        "space-value",
        "long-value",
        "leading-dash",
        "upper-prefix",
        "empty",
    ],
)
def test_label_validation(key, value, ok):
    assert (not label_key_problem(key) and not label_value_problem(value)) is ok


def test_a_pool_name_carries_64_bits_of_the_slice_identity() -> None:
    # 32 bits could be matched offline: a tenant could craft a slice named like another team's pool.
    name = pool_name(SliceId("team-a", "a-very-long-jobset-name-indeed", "uid", "workers", 12))
    digest = name.rsplit("-", 1)[1]
    assert len(digest) == 16 and int(digest, 16) >= 0 and len(name) <= 40
