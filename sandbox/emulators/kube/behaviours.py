"""The few controller behaviours the sandbox API server needs to look like a live cluster.

* Namespaces get their ``kubernetes.io/metadata.name`` label and phase, pods start ``Pending``.
* CustomResourceDefinitions are served as soon as they are written and report ``Established``
  and ``NamesAccepted`` after a configurable delay; deleting one drops its objects.
* Deleting a namespace marks it Terminating (its ``spec.finalizers`` hold it, as on a real
  cluster); after a configurable delay its contents are deleted and then the namespace itself.
* Deployments report themselves available after a configurable delay, so install code that
  waits for ``Available=True`` works without a kubelet.
"""

from __future__ import annotations

import contextlib
from typing import Any

from sandbox.emulators.kube.errors import KubeApiError
from sandbox.emulators.kube.object_store import now_rfc3339
from sandbox.emulators.kube.registry import Registry, ResourceType, crd_resource_types
from sandbox.emulators.kube.write_paths import KubeStore

CRD_GROUP_RESOURCE = ("apiextensions.k8s.io", "customresourcedefinitions")
DEPLOYMENT_GROUP_RESOURCE = ("apps", "deployments")
NAMESPACE_GROUP_RESOURCE = ("", "namespaces")


def _conditions(previous: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Condition list with ``lastTransitionTime`` kept when a condition's status did not change."""
    before = {c.get("type"): c for c in previous or []}
    result = []
    for condition in wanted:
        old = before.get(condition["type"])
        same = old is not None and old.get("status") == condition["status"] and old.get("lastTransitionTime")
        result.append(
            {**condition, "lastTransitionTime": old["lastTransitionTime"] if same and old else now_rfc3339()}
        )
    return result


class Behaviours:
    """Hooks the store calls around writes; install once per store."""

    def __init__(
        self,
        store: KubeStore,
        registry: Registry,
        *,
        crd_establish_delay: float = 0.0,
        deployment_ready_delay: float = 0.0,
        namespace_delete_delay: float = 0.0,
    ) -> None:
        self.store = store
        self.registry = registry
        self.crd_establish_delay = crd_establish_delay
        self.deployment_ready_delay = deployment_ready_delay
        self.namespace_delete_delay = namespace_delete_delay

    def install(self) -> None:
        """Register the hooks with the store."""
        self.store.create_defaults.append(self.defaults)
        self.store.write_hooks.append(self.after_write)
        self.store.delete_hooks.append(self.after_delete)
        self.store.terminating_hooks.append(self.terminating)
        self.store.holders.append(self.holds)

    def defaults(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        """Fill what the real API server defaults on create."""
        group_resource = (rtype.group, rtype.plural)
        if group_resource == NAMESPACE_GROUP_RESOURCE:
            meta = obj["metadata"]
            meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/metadata.name": meta["name"]}
            obj["status"] = {"phase": "Active", **(obj.get("status") or {})}
            obj["spec"] = {"finalizers": ["kubernetes"], **(obj.get("spec") or {})}
        elif group_resource == ("", "pods"):
            obj["status"] = {"phase": "Pending", **(obj.get("status") or {})}

    def after_write(
        self, rtype: ResourceType, etype: str, obj: dict[str, Any], subresource: str | None
    ) -> None:
        """React to a committed create or update of the main resource."""
        if subresource is not None:
            return
        group_resource = (rtype.group, rtype.plural)
        meta = obj["metadata"]
        if group_resource == CRD_GROUP_RESOURCE:
            self.registry.set_crd(meta["name"], crd_resource_types(obj))
            name = meta["name"]
            self.store.schedule(self.crd_establish_delay, lambda: self._establish(name))
        elif group_resource == DEPLOYMENT_GROUP_RESOURCE:
            namespace, name = meta.get("namespace"), meta["name"]
            self.store.schedule(self.deployment_ready_delay, lambda: self._deployment_ready(namespace, name))

    def after_delete(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        """React to an object that is gone for good."""
        group_resource = (rtype.group, rtype.plural)
        meta = obj["metadata"]
        if group_resource == CRD_GROUP_RESOURCE:
            served = crd_resource_types(obj)
            if served:
                self.store.drop_all(served[0])
            self.registry.set_crd(meta["name"], [])
        elif group_resource == NAMESPACE_GROUP_RESOURCE:
            self._delete_contents(meta["name"])  # in case it went without the finalizer's cleanup

    @staticmethod
    def holds(rtype: ResourceType, obj: dict[str, Any]) -> bool:
        """Namespaces wait for the namespace controller's ``kubernetes`` finalizer."""
        in_spec = (obj.get("spec") or {}).get("finalizers") or []
        return (rtype.group, rtype.plural) == NAMESPACE_GROUP_RESOURCE and "kubernetes" in in_spec

    def terminating(self, rtype: ResourceType, obj: dict[str, Any]) -> None:
        """A namespace marked for deletion turns Terminating and is cleaned up after the delay."""
        if (rtype.group, rtype.plural) != NAMESPACE_GROUP_RESOURCE:
            return
        name = obj["metadata"]["name"]
        self._set_status(
            NAMESPACE_GROUP_RESOURCE, None, name, {**(obj.get("status") or {}), "phase": "Terminating"}
        )
        self.store.schedule(self.namespace_delete_delay, lambda: self._finalize_namespace(name))

    def _finalize_namespace(self, name: str) -> None:
        self._delete_contents(name)
        rtype = self.registry.versions_of(NAMESPACE_GROUP_RESOURCE)[0]
        with contextlib.suppress(KubeApiError):  # already gone
            namespace = self.store.get(rtype, None, name)
            spec = {**(namespace.get("spec") or {}), "finalizers": []}
            self.store.replace(rtype, None, name, {**namespace, "spec": spec}, force=True)

    def _delete_contents(self, name: str) -> None:
        for content in self.store.group_resources():
            versions = self.registry.versions_of(content)
            if versions and versions[0].namespaced:
                items, _ = self.store.list_objects(versions[0], name)
                for item in items:
                    with contextlib.suppress(KubeApiError):  # already collected as a dependent
                        self.store.delete(versions[0], name, item["metadata"]["name"])

    def _set_status(
        self, group_resource: tuple[str, str], namespace: str | None, name: str, status: dict
    ) -> None:
        versions = self.registry.versions_of(group_resource)
        if not versions:
            return
        body = {"metadata": {}, "status": status}
        with contextlib.suppress(KubeApiError):  # deleted before the delayed behaviour ran
            self.store.replace(versions[0], namespace, name, body, subresource="status")

    def _establish(self, name: str) -> None:
        versions = self.registry.versions_of(CRD_GROUP_RESOURCE)
        try:
            crd = self.store.get(versions[0], None, name)
        except KubeApiError:
            return
        spec = crd.get("spec") or {}
        names = dict(spec.get("names") or {})
        names.setdefault("singular", str(names.get("kind", "")).lower())
        names.setdefault("listKind", f"{names.get('kind', '')}List")
        wanted = [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ]
        status = {
            "acceptedNames": names,
            "conditions": _conditions((crd.get("status") or {}).get("conditions") or [], wanted),
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
        }
        self._set_status(CRD_GROUP_RESOURCE, None, name, status)

    def _deployment_ready(self, namespace: str | None, name: str) -> None:
        versions = self.registry.versions_of(DEPLOYMENT_GROUP_RESOURCE)
        try:
            deployment = self.store.get(versions[0], namespace, name)
        except KubeApiError:
            return
        replicas = (deployment.get("spec") or {}).get("replicas", 1)
        wanted = [
            {
                "type": "Available",
                "status": "True",
                "reason": "MinimumReplicasAvailable",
                "message": "Deployment has minimum availability.",
            },
            {
                "type": "Progressing",
                "status": "True",
                "reason": "NewReplicaSetAvailable",
                "message": f'ReplicaSet "{name}" has successfully progressed.',
            },
        ]
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": replicas,
            "updatedReplicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "conditions": _conditions((deployment.get("status") or {}).get("conditions") or [], wanted),
        }
        self._set_status(DEPLOYMENT_GROUP_RESOURCE, namespace, name, status)
