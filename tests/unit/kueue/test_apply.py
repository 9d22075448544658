"""Applying a Kueue configuration over a stateful fake: idempotence, pruning, moves, webhook retries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shared.cloud.objects import Bounds, KindRegistry, WebhookNotReadyError, object_key
from shared.core.errors import InvalidInputError, NotFoundError, TransientError
from shared.kueue import config as kueue
from shared.kueue.apply import KueueService
from tests.paths import REPO
from tests.unit.kueue.examples import TUTORIAL

SEED_CONFIG = TUTORIAL


class FakeObjects:
    """A stateful in-memory ``ObjectAPI``: SSA replaces the applied object, versions bump on change."""

    def __init__(self) -> None:
        self.kinds = KindRegistry()
        self.store: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.calls: list[str] = []
        self.version = 0
        self.failures: list[tuple[str, Callable[[], Exception]]] = []
        for namespace in ("default", "research", "prod"):
            self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    def fail_next(self, verb: str, make: Callable[[], Exception], times: int = 1) -> None:
        self.failures.extend([(verb, make)] * times)

    def _enter(self, verb: str, what: str) -> None:
        self.calls.append(f"{verb} {what}")
        if self.failures and self.failures[0][0] == verb:
            raise self.failures.pop(0)[1]()

    def put(self, obj: dict[str, Any]) -> None:
        self.version += 1
        stored = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
        self.store[object_key(obj)] = stored

    def apply(self, obj: Any, force: bool = True) -> dict[str, Any]:
        key = object_key(obj)
        self._enter("apply", f"{key[1]} {key[3]}")
        current = self.store.get(key)
        strip = {**obj, "metadata": dict(obj["metadata"])}
        if current is not None:
            same = {
                **current,
                "metadata": {k: v for k, v in current["metadata"].items() if k != "resourceVersion"},
            }
            if same == strip:
                return current
        self.put(strip)
        return self.store[key]

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any]:
        try:
            return self.store[(api_version, kind, namespace, name)]
        except KeyError:
            raise NotFoundError(f"{kind} {name} not found") from None

    def list_objects(
        self, api_version: str, kind: str, namespace: str = "", label_selector: str = ""
    ) -> list[dict[str, Any]]:
        self._enter("list", kind)
        key, _, value = label_selector.partition("=")
        return [
            obj
            for (av, k, ns, _), obj in self.store.items()
            if (av, k) == (api_version, kind)
            and (not namespace or ns == namespace)
            and (not key or (obj["metadata"].get("labels") or {}).get(key) == value)
        ]

    def delete(self, api_version: str, kind: str, name: str, namespace: str = "") -> None:
        self._enter("delete", f"{kind} {name}")
        if self.store.pop((api_version, kind, namespace, name), None) is None:
            raise NotFoundError(f"{kind} {name} not found")

    def names(self, kind: str) -> list[str]:
        return sorted(f"{k[2] + '/' if k[2] else ''}{k[3]}" for k in self.store if k[1] == kind)


FAST = Bounds(total=5.0, webhook_retry=2.0, poll=0.001)


def test_apply_creates_then_reports_nothing_changed() -> None:
    objects = FakeObjects()
    service = KueueService(objects, FAST)
    first = service.apply(kueue.parse_config(SEED_CONFIG))
    assert first.created == [
        "PriorityClass low-priority",
        "ResourceFlavor vlp-24",
        "ClusterQueue cluster-queue",
        "LocalQueue default/multislice-queue",
    ]
    second = service.apply(kueue.parse_config(SEED_CONFIG))
    assert not second.changed
    assert len(second.unchanged) == 4


def test_prune_removes_only_managed_objects_no_longer_named() -> None:
    objects = FakeObjects()
    service = KueueService(objects, FAST)
    service.apply(kueue.load_config(REPO / "examples" / "kueue" / "multi-flavor.yaml"))
    # Someone else's queue without the label must survive the prune.
    objects.put(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "hand-made"},
            "spec": {},
        }
    )
    objects.calls.clear()
    report = service.apply(kueue.parse_config(SEED_CONFIG))
    assert sorted(report.pruned) == sorted(
        [
            "WorkloadPriorityClass batch-low",
            "WorkloadPriorityClass prod-high",
            "ResourceFlavor v6e-4x4",
            "ResourceFlavor v5e-2x4-spot",
            "ClusterQueue research",
            "ClusterQueue production",
            "LocalQueue research/research-queue",
            "LocalQueue prod/serving-queue",
        ]
    )
    assert objects.names("ClusterQueue") == ["cluster-queue", "hand-made"]
    assert objects.names("ResourceFlavor") == ["vlp-24"]
    deletes = [call for call in objects.calls if call.startswith("delete")]
    # Users before what they use: LocalQueues, then ClusterQueues, then flavors.
    kinds = [call.split()[1] for call in deletes]
    assert kinds.index("ResourceFlavor") > max(i for i, k in enumerate(kinds) if k == "ClusterQueue")
    assert kinds.index("ClusterQueue") > max(i for i, k in enumerate(kinds) if k == "LocalQueue")


def test_moving_a_local_queue_replaces_it() -> None:
    objects = FakeObjects()
    service = KueueService(objects, FAST)
    service.apply(kueue.parse_config(SEED_CONFIG))
    moved = SEED_CONFIG.replace(
        "quota: {vlp-24: 24}", "quota: {vlp-24: 24}\n  - {name: other, quota: {vlp-24: 8}}"
    ).replace("clusterQueue: cluster-queue}", "clusterQueue: other}")
    report = service.apply(kueue.parse_config(moved))
    assert "delete LocalQueue multislice-queue" in objects.calls
    assert "LocalQueue default/multislice-queue" in report.created
    stored = objects.get("kueue.x-k8s.io/v1beta2", "LocalQueue", "multislice-queue", "default")
    assert stored["spec"]["clusterQueue"] == "other"


def test_webhook_errors_are_retried_within_the_window() -> None:
    objects = FakeObjects()
    objects.fail_next(
        "apply", lambda: WebhookNotReadyError('failed calling webhook "vclusterqueue"'), times=3
    )
    report = KueueService(objects, FAST).apply(kueue.parse_config(SEED_CONFIG))
    assert len(report.created) == 4
    assert objects.calls.count("apply PriorityClass low-priority") == 4


def test_webhook_errors_beyond_the_window_ask_for_redelivery() -> None:
    objects = FakeObjects()
    objects.fail_next(
        "apply", lambda: WebhookNotReadyError("no endpoints available for service"), times=10_000
    )
    service = KueueService(objects, Bounds(total=5.0, webhook_retry=0.05, poll=0.01))
    with pytest.raises(TransientError, match="gave up after"):
        service.apply(kueue.parse_config(SEED_CONFIG))


def test_missing_kueue_crds_ask_for_redelivery() -> None:
    objects = FakeObjects()
    objects.fail_next("list", lambda: NotFoundError("404"), times=10_000)
    service = KueueService(objects, Bounds(total=1.0, webhook_retry=0.02, poll=0.01))
    with pytest.raises(TransientError, match="is Kueue installed"):
        service.apply(kueue.parse_config(SEED_CONFIG))


def test_local_queue_in_a_missing_namespace_applies_nothing() -> None:
    objects = FakeObjects()
    service = KueueService(objects, FAST)
    extra = "  - {name: q2, namespace: ghost, clusterQueue: cluster-queue}\npriorityClasses:"
    config = SEED_CONFIG.replace("priorityClasses:", extra)
    with pytest.raises(InvalidInputError, match=r"namespaces do not exist: ghost \(for q2\)"):
        service.apply(kueue.parse_config(config))
    assert not [call for call in objects.calls if call.startswith(("apply", "delete"))]
