"""Reads both ``Deployment`` adapters share: Pub/Sub through the admin clients, add-ons through the
Kubernetes API. Production passes Google's clients, the sandbox the same clients on the emulator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.core.errors import NotFoundError, TransientError
from shared.core.settings import Settings
from shared.setup.manifests import Component, deployed_version
from tpuprov.cluster import ClusterView
from tpuprov.doctor.views import AddonView, AdmissionCheckView, SubscriptionView


def short(path: str, collection: str) -> str:
    """``projects/P/<collection>/NAME`` -> ``NAME`` (other strings unchanged)."""
    marker = f"/{collection}/"
    return path.split(marker, 1)[1] if marker in path else path


def subscription_view(sub: Any) -> SubscriptionView:
    """A ``pubsub_v1.types.Subscription`` as doctor reads it."""
    policy = sub.dead_letter_policy
    return SubscriptionView(
        name=short(sub.name, "subscriptions"),
        topic=short(sub.topic, "topics"),
        push_endpoint=sub.push_config.push_endpoint,
        dead_letter_topic=short(policy.dead_letter_topic, "topics") if policy.dead_letter_topic else "",
        max_delivery_attempts=int(policy.max_delivery_attempts or 0),
    )


def _pubsub_call(what: str, call: Any) -> Any:
    try:
        return call()
    except Exception as exc:  # google.api_core errors: permission, API disabled, unreachable
        raise TransientError(f"Pub/Sub {what}: {exc}") from None


def read_topics(publisher: Any, project: str) -> frozenset[str]:
    """Short names of the project's topics."""
    listed = _pubsub_call(
        "list topics", lambda: list(publisher.list_topics(request={"project": f"projects/{project}"}))
    )
    return frozenset(short(t.name, "topics") for t in listed)


def read_subscriptions(subscriber: Any, project: str) -> list[SubscriptionView]:
    """The project's subscriptions."""
    listed = _pubsub_call(
        "list subscriptions",
        lambda: list(subscriber.list_subscriptions(request={"project": f"projects/{project}"})),
    )
    return [subscription_view(s) for s in listed]


def publishers_in(policy: Any, role: str = "roles/pubsub.publisher") -> frozenset[str]:
    """Members bound to ``role`` in an IAM ``Policy`` (conditional bindings count too)."""
    return frozenset(m for b in policy.bindings if b.role == role for m in b.members)


def addon_view(objects: Any, component: Component) -> AddonView:
    """The add-on's controller Deployment read through an ``ObjectAPI``."""
    where = f"{component.namespace}/{component.deployment}"
    try:
        deployment = objects.get("apps/v1", "Deployment", component.deployment, component.namespace)
    except NotFoundError:
        return AddonView(component.name, where, installed=False, version="", available=False)
    return AddonView(
        component.name,
        where,
        installed=True,
        version=deployed_version(deployment, component),
        available=_available(deployment),
    )


def _available(deployment: Mapping[str, Any]) -> bool:
    meta, status = deployment.get("metadata") or {}, deployment.get("status") or {}
    generation, observed = meta.get("generation"), status.get("observedGeneration")
    # Right after an upgrade the old ReplicaSet still reports Available: not yet the pinned one.
    if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
        return False
    return any(
        c.get("type") == "Available" and str(c.get("status")) == "True"
        for c in status.get("conditions") or []
    )


def admission_check_view(objects: Any, name: str) -> AdmissionCheckView:
    """The AdmissionCheck ``name`` and the ClusterQueues naming it, read through an ``ObjectAPI``
    (a cluster without Kueue's CRDs answers 404 for both: nothing uses the check)."""
    api = "kueue.x-k8s.io/v1beta2"
    try:
        queues = objects.list_objects(api, "ClusterQueue")
    except NotFoundError:
        queues = []
    using = tuple(
        sorted(
            str((q.get("metadata") or {}).get("name", ""))
            for q in queues
            if any(
                c.get("name") == name
                for c in (
                    ((q.get("spec") or {}).get("admissionChecksStrategy") or {}).get("admissionChecks") or []
                )
            )
        )
    )
    try:
        check = objects.get(api, "AdmissionCheck", name)
    except NotFoundError:
        return AdmissionCheckView(name, exists=False, active=False, message="", queues=using)
    conditions = (check.get("status") or {}).get("conditions") or []
    active: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Active"), {})
    return AdmissionCheckView(
        name,
        exists=True,
        active=active.get("status") == "True",
        message=str(active.get("message") or "no Active condition"),
        queues=using,
    )


class ClusterObjectReads:
    """What every deployment reads the same way: the add-ons and the admission check, through the
    cluster's API with the operator's own credentials (``settings`` as the deployment resolved it)."""

    settings: Settings

    def addon(self, component: Component) -> AddonView:
        return addon_view(ClusterView(self.settings).objects, component)

    def admission_check(self, name: str) -> AdmissionCheckView:
        return admission_check_view(ClusterView(self.settings).objects, name)
