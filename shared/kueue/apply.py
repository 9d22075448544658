"""Apply a Kueue queue configuration to a cluster and prune what it no longer names.

The service renders the configuration, server-side applies every object in dependency order
(priority classes, flavors, ClusterQueues, LocalQueues), then deletes the objects that carry the
product's managed-by label but are not in the configuration, in reverse order so that nothing is
deleted while something still points at it. Objects without the label are never touched.

Kueue's own webhooks validate these objects and refuse connections for a while after Kueue
starts, so every call is retried within the run's bounds before the delivery is handed back to
Pub/Sub as a TransientError.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

from shared.cloud.objects import Bounds, describe, object_key
from shared.cloud.ports import ObjectAPI
from shared.cloud.retry import Budget, call_retrying
from shared.core import logs
from shared.core.errors import InvalidInputError, NotFoundError, TransientError
from shared.core.meta import Meta
from shared.kueue.model import KueueConfig
from shared.kueue.render import MANAGED_KINDS, MANAGED_SELECTOR, render

log = logs.get("kueue")

Key = tuple[str, str, str, str]


@dataclasses.dataclass
class KueueReport:
    """What one apply did, as ``Kind namespace/name`` strings."""

    created: list[str] = dataclasses.field(default_factory=list)
    configured: list[str] = dataclasses.field(default_factory=list)
    unchanged: list[str] = dataclasses.field(default_factory=list)
    pruned: list[str] = dataclasses.field(default_factory=list)

    @property
    def changed(self) -> bool:
        """True when the cluster was modified."""
        return bool(self.created or self.configured or self.pruned)

    def summary(self) -> str:
        """One line for logs."""
        return (
            f"{len(self.created)} created, {len(self.configured)} configured, "
            f"{len(self.unchanged)} unchanged, {len(self.pruned)} pruned"
        )


def _version(obj: Mapping[str, Any]) -> str:
    return Meta.of(obj).resource_version


class KueueService:
    """Applies queue configurations through an ``ObjectAPI``."""

    def __init__(
        self,
        objects: ObjectAPI,
        bounds: Bounds,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.objects = objects
        self.bounds = bounds
        self.clock = clock
        self.sleep = sleep

    def _retrying(self, call: Callable[[], Any], what: str, budget: Budget) -> Any:
        return call_retrying(call, what, budget, self.bounds.webhook_retry, self.bounds.poll)

    def managed(self, budget: Budget | None = None) -> dict[Key, dict[str, Any]]:
        """Every object of the rendered kinds that carries the managed-by label, by identity."""
        budget = budget or Budget(self.bounds.total, self.clock, self.sleep)
        found: dict[Key, dict[str, Any]] = {}
        for api_version, kind in MANAGED_KINDS:

            def list_kind(api_version: str = api_version, kind: str = kind) -> list[dict[str, Any]]:
                try:
                    return self.objects.list_objects(api_version, kind, label_selector=MANAGED_SELECTOR)
                except NotFoundError:
                    # The kind is not served: Kueue's CRDs are missing, setup has not run (yet).
                    raise TransientError(
                        f"{kind} ({api_version}) is not served; is Kueue installed?"
                    ) from None

            for obj in self._retrying(list_kind, f"list {kind}", budget):
                found[object_key(obj)] = obj
        return found

    def apply(self, config: KueueConfig) -> KueueReport:
        """Make the cluster's managed Kueue objects match ``config`` exactly."""
        budget = Budget(self.bounds.total, self.clock, self.sleep)
        desired = render(config)
        self._check_namespaces(desired, budget)
        existing = self.managed(budget)
        report = KueueReport()
        for obj in desired:
            key, what = object_key(obj), describe(obj)
            before = existing.get(key)
            if before is not None and obj["kind"] == "LocalQueue":
                old_target = (before.get("spec") or {}).get("clusterQueue")
                if old_target != obj["spec"]["clusterQueue"]:
                    # spec.clusterQueue is immutable; moving a queue means replacing it.
                    self._delete(key, budget)
                    before = None
            after = self._retrying(functools.partial(self.objects.apply, obj), f"apply {what}", budget)
            if before is None:
                report.created.append(what)
            elif _version(before) != _version(after):
                report.configured.append(what)
            else:
                report.unchanged.append(what)
        wanted = {object_key(obj) for obj in desired}
        order = {kind: index for index, (_, kind) in enumerate(MANAGED_KINDS)}
        stale = sorted((key for key in existing if key not in wanted), key=lambda k: -order[k[1]])
        for key in stale:
            self._delete(key, budget)
            report.pruned.append(describe(existing[key]))
        logs.decision(
            log,
            "kueue.applied",
            f"Kueue configuration applied: {report.summary()}",
            created=report.created,
            configured=report.configured,
            pruned=report.pruned,
        )
        return report

    def _check_namespaces(self, desired: list[dict[str, Any]], budget: Budget) -> None:
        # All or nothing: a LocalQueue in a missing namespace would fail halfway through the apply.
        wanted: dict[str, list[str]] = {}
        for obj in desired:
            _, kind, namespace, name = object_key(obj)
            if kind == "LocalQueue":
                wanted.setdefault(namespace, []).append(name)
        missing = []
        for namespace, queues in sorted(wanted.items()):

            def exists(namespace: str = namespace) -> bool:
                try:
                    self.objects.get("v1", "Namespace", namespace)
                except NotFoundError:
                    return False
                return True

            if not self._retrying(exists, f"read Namespace {namespace}", budget):
                missing.append(f"{namespace} (for {', '.join(queues)})")
        if missing:
            raise InvalidInputError(
                f"LocalQueue namespaces do not exist: {'; '.join(missing)}; create them, then apply again"
            )

    def _delete(self, key: Key, budget: Budget) -> None:
        api_version, kind, namespace, name = key

        def delete() -> None:
            with contextlib.suppress(NotFoundError):  # already gone: the goal is reached
                self.objects.delete(api_version, kind, name, namespace)

        self._retrying(delete, f"delete {kind} {name}", budget)
