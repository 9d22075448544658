"""Install or upgrade the pinned JobSet and Kueue releases on a cluster, idempotently.

Order matters: Namespaces and CRDs first, then (once every CRD is Established) the rest of each
release in kustomize order, then a bounded wait for both controller Deployments to be Available.
Everything is server-side applied with one field manager and ``force``, so a re-run converges on
the manifests and a no-op re-run changes no ``resourceVersion``.

Version policy per component (``shared.setup.support.plan``): absent -> install; older -> upgrade
in place to the pinned release; same -> re-apply (reported "unchanged" when nothing moved); newer
-> left alone with ADDON_UPGRADE=keep-newer (the default), replaced by the pinned release with
ADDON_UPGRADE=pinned; unrecognisable -> left alone. An upgrade is a server-side apply of the new
release over the old one: the CRDs keep their objects (Workloads, queues and JobSets stay).

Every wait and retry draws on one :class:`~shared.cloud.retry.Budget` sized to fit in the Cloud
Run request timeout; running out raises ``TransientError`` so that Pub/Sub redelivers and the
next run continues where this one stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

from shared.cloud.objects import Bounds, describe
from shared.cloud.ports import ObjectAPI
from shared.cloud.retry import Budget, call_retrying
from shared.core import logs
from shared.core.errors import NotFoundError, TransientError
from shared.core.meta import Meta
from shared.core.settings import Settings
from shared.setup.manifests import (
    CRD_KIND,
    JOBSET,
    KUEUE,
    Component,
    Release,
    deployed_version,
)
from shared.setup.manifests import load_release as _load_release
from shared.setup.support import DOWNGRADE, plan, support

log = logs.get("installer")

INSTALLED = "installed"
UPGRADED = "upgraded"
UNCHANGED = "unchanged"
RECONCILED = "reconciled"  # same version, but drifted objects were put back
SKIPPED_NEWER = "skipped-newer"
SKIPPED_UNKNOWN = "skipped-unknown"
DOWNGRADED = DOWNGRADE  # ADDON_UPGRADE=pinned and a newer release was installed

_LOG_NAMES_MAX = 20


@dataclasses.dataclass
class ComponentResult:
    """What happened to one component; ``found`` is "" when it was not installed."""

    component: str
    pinned: str
    found: str
    action: str
    created: list[str] = dataclasses.field(default_factory=list)
    configured: list[str] = dataclasses.field(default_factory=list)
    unchanged: int = 0
    available: bool = False

    @property
    def changed(self) -> bool:
        """True when any object was created or modified."""
        return bool(self.created or self.configured)

    def summary(self) -> str:
        """One line, e.g. ``kueue v0.19.2: installed (79 created)``."""
        if self.action in (SKIPPED_NEWER, SKIPPED_UNKNOWN):
            said = support(self.component, self.found).detail
            found = self.found or "?"
            return f"{self.component} {found}: left alone ({self.action}, pinned {self.pinned}; {said})"
        counts = f"{len(self.created)} created, {len(self.configured)} configured, {self.unchanged} unchanged"
        was = f" from {self.found}" if self.action in (UPGRADED, DOWNGRADED) else ""
        return f"{self.component} {self.pinned}: {self.action}{was} ({counts})"


@dataclasses.dataclass
class InstallReport:
    """The outcome of one setup run."""

    cluster: str
    components: list[ComponentResult]

    @property
    def changed(self) -> bool:
        """True when the run modified the cluster."""
        return any(result.changed for result in self.components)

    def result(self, component: str) -> ComponentResult:
        """The result of ``component`` ("jobset" or "kueue")."""
        return next(result for result in self.components if result.component == component)

    def summary(self) -> str:
        """One line for logs and the CLI."""
        return "; ".join(result.summary() for result in self.components)


def _condition_true(obj: Mapping[str, Any], condition: str) -> bool:
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item.get("type") == condition:
            return str(item.get("status")) == "True"
    return False


def _deployment_available(deployment: Mapping[str, Any]) -> bool:
    generation = Meta.of(deployment).generation
    observed = (deployment.get("status") or {}).get("observedGeneration")
    # After an upgrade the old ReplicaSet may still be Available; wait until the controller saw
    # the new template.
    if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
        return False
    return _condition_true(deployment, "Available")


class Installer:
    """Applies the pinned releases through an ``ObjectAPI``."""

    def __init__(
        self,
        objects: ObjectAPI,
        settings: Settings,
        bounds: Bounds | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.objects = objects
        self.settings = settings
        self.bounds = bounds or Bounds.from_settings(settings)
        self.clock = clock
        self.sleep = sleep

    def load_releases(self) -> list[Release]:
        """The pinned JobSet and Kueue releases from ``settings.manifests_dir`` (JobSet first)."""
        directory = self.settings.manifests_dir
        return [
            _load_release(directory, JOBSET, self.settings.jobset_version, self.settings.jobset_sha256),
            _load_release(directory, KUEUE, self.settings.kueue_version, self.settings.kueue_sha256),
        ]

    def install(self, cluster: str = "") -> InstallReport:
        """Bring JobSet and Kueue to the pinned versions and wait until both controllers are Available."""
        budget = Budget(self.bounds.total, self.clock, self.sleep)
        releases = self.load_releases()
        results = [self._plan(release, budget) for release in releases]
        to_apply = [
            (release, result)
            for release, result in zip(releases, results, strict=True)
            if result.action not in (SKIPPED_NEWER, SKIPPED_UNKNOWN)
        ]
        for release, _ in to_apply:
            for crd in release.crds:
                self.objects.kinds.register_crd(crd)
        for release, result in to_apply:
            for doc in release.foundation:
                self._apply(doc, result, budget)
        self._wait_established([crd for release, _ in to_apply for crd in release.crds], budget)
        for release, result in to_apply:
            for doc in release.rest:
                self._apply(doc, result, budget)
        for release, result in zip(releases, results, strict=True):
            self._wait_available(release.component, budget)
            result.available = True
            if result.action == UNCHANGED and result.changed:
                result.action = RECONCILED
            logs.decision(
                log,
                "setup.component",
                f"{cluster or 'cluster'}: {result.summary()}",
                component=result.component,
                action=result.action,
                found=result.found,
                pinned=result.pinned,
                supported=support(result.component, result.found or result.pinned).supported,
                created=result.created[:_LOG_NAMES_MAX],
                configured=result.configured[:_LOG_NAMES_MAX],
            )
        return InstallReport(cluster, results)

    def _retrying(self, call: Callable[[], Any], what: str, budget: Budget) -> Any:
        return call_retrying(call, what, budget, self.bounds.webhook_retry, self.bounds.poll)

    def _plan(self, release: Release, budget: Budget) -> ComponentResult:
        component = release.component
        found = self._installed_version(component, budget)
        action = plan(found, release.version, self.settings.addon_upgrade)
        return ComponentResult(component.name, release.version, found, action)

    def _installed_version(self, component: Component, budget: Budget) -> str:
        def read() -> str:
            try:
                deployment = self.objects.get(
                    "apps/v1", "Deployment", component.deployment, component.namespace
                )
            except NotFoundError:
                return ""
            return deployed_version(deployment, component) or "unknown"

        return str(self._retrying(read, f"read {component.name} version", budget))

    def _resource_version(self, doc: Mapping[str, Any]) -> str:
        meta = Meta.of(doc, default_namespace="")  # a cluster-scoped object names no namespace
        try:
            current = self.objects.get(doc["apiVersion"], doc["kind"], meta.name, meta.namespace)
        except NotFoundError:
            return ""
        return Meta.of(current).resource_version or "?"

    def _apply(self, doc: Mapping[str, Any], result: ComponentResult, budget: Budget) -> None:
        what = describe(doc)
        before = self._retrying(functools.partial(self._resource_version, doc), f"read {what}", budget)
        after = self._retrying(functools.partial(self.objects.apply, doc), f"apply {what}", budget)
        after_version = Meta.of(after).resource_version
        if not before:
            result.created.append(what)
        elif before != after_version:
            result.configured.append(what)
        else:
            result.unchanged += 1

    def _wait_for(self, what: Callable[[], str], budget: Budget, ready: Callable[[], bool]) -> None:
        started = budget.clock()
        while True:
            try:
                if ready():
                    return
            except (TransientError, NotFoundError) as exc:
                # Not ready yet is the expected answer while things start; keep polling.
                log.debug("waiting for %s: %s", what(), exc.why)
            if budget.remaining() <= 0:
                waited = budget.clock() - started
                raise TransientError(f"timed out after {waited:.1f}s waiting for {what()}")
            budget.pause(self.bounds.poll)

    def _wait_established(self, crds: list[dict[str, Any]], budget: Budget) -> None:
        pending = [Meta.of(crd).name for crd in crds]

        def ready() -> bool:
            while pending:
                crd = self.objects.get("apiextensions.k8s.io/v1", CRD_KIND, pending[0])
                if not _condition_true(crd, "Established"):
                    return False
                pending.pop(0)
            return True

        self._wait_for(
            lambda: f"CRD {pending[0]} (and {len(pending) - 1} more) to be Established", budget, ready
        )

    def _wait_available(self, component: Component, budget: Budget) -> None:
        def ready() -> bool:
            deployment = self.objects.get("apps/v1", "Deployment", component.deployment, component.namespace)
            return _deployment_available(deployment)

        name = f"Deployment {component.namespace}/{component.deployment}"
        self._wait_for(lambda: f"{name} to be Available", budget, ready)
