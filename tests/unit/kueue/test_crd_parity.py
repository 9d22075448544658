"""The queue-config validator's copies of Kueue's own rules agree with the real Kueue CRDs.

``shared.kueue.model`` restates a few facts of the ClusterQueue schema (the enums and the quantity
pattern) so that a bad value is refused with the user's own field path before anything is rendered.
These tests read the ClusterQueue CustomResourceDefinition of the pinned release in
``../shared/manifests`` and fail when Kueue's schema and the copies drift apart.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest
import yaml

from sandbox.stack.config import DEFAULT_MANIFESTS_DIR
from shared.kueue.model import BORROW_POLICIES, PREEMPTION_ENUMS, QUANTITY, QUEUEING_STRATEGIES
from shared.kueue.render import KUEUE_API

KUEUE_RELEASE = DEFAULT_MANIFESTS_DIR / "kueue-v0.19.2.yaml"

pytestmark = pytest.mark.skipif(not KUEUE_RELEASE.exists(), reason=f"{KUEUE_RELEASE} is not present")


@cache
def cluster_queue_spec() -> dict[str, Any]:
    """The ``spec`` schema of the ClusterQueue version the product renders."""
    version = KUEUE_API.rsplit("/", 1)[-1]
    with KUEUE_RELEASE.open(encoding="utf-8") as handle:
        for doc in yaml.load_all(handle, Loader=yaml.CSafeLoader):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            if doc["spec"]["names"]["kind"] != "ClusterQueue":
                continue
            for served in doc["spec"]["versions"]:
                if served["name"] == version:
                    spec: dict[str, Any] = served["schema"]["openAPIV3Schema"]["properties"]["spec"]
                    return spec
    raise AssertionError(f"no ClusterQueue {version} schema in {KUEUE_RELEASE}")


def test_queueing_strategies_are_kueues() -> None:
    enum = cluster_queue_spec()["properties"]["queueingStrategy"]["enum"]
    assert sorted(QUEUEING_STRATEGIES) == sorted(enum)


def test_preemption_values_are_kueues() -> None:
    preemption = cluster_queue_spec()["properties"]["preemption"]["properties"]
    for field, allowed in PREEMPTION_ENUMS.items():
        assert sorted(allowed) == sorted(preemption[field]["enum"]), field
    assert sorted(BORROW_POLICIES) == sorted(preemption["borrowWithinCohort"]["properties"]["policy"]["enum"])


@pytest.mark.parametrize(
    "text",
    ["8", "+8", "0", "1.5", ".5", "64Gi", "500m", "2k", "1e3", "1E+3", "-8", "8 Gi", "1.2.3", "Gi", ""],
)
def test_a_quota_quantity_is_accepted_as_kueue_accepts_it_but_never_negative(text: str) -> None:
    nominal = cluster_queue_spec()["properties"]["resourceGroups"]["items"]["properties"]["flavors"]["items"][
        "properties"
    ]["resources"]["items"]["properties"]["nominalQuota"]
    kueue_accepts = re.fullmatch(nominal["pattern"], text) is not None
    # Kueue's pattern admits a sign; its description says the quota must be non-negative.
    assert (QUANTITY.match(text) is not None) == (kueue_accepts and not text.startswith("-"))
