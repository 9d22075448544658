"""The write paths of the sandbox Kubernetes API: create, replace, the PATCH flavours, delete.

Each write builds a new object from the stored one, keeps what clients may not change (identity,
timestamps, the status behind a status subresource) and commits only if something really changed.
"""

from __future__ import annotations

import contextlib
import random
import uuid
from typing import Any

from sandbox.emulators.kube import patch as kube_patch
from sandbox.emulators.kube.errors import (
    KubeApiError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
)
from sandbox.emulators.kube.object_store import (
    NAME_RE,
    SUFFIX_CHARS,
    StoreCore,
    content_of,
    key_namespace,
    now_rfc3339,
    spec_of,
)
from sandbox.emulators.kube.registry import ResourceType


class KubeStore(StoreCore):
    """The object store with the API's write semantics on top of the storage core."""

    def create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        field_manager: str | None = None,
        operation: str = "Update",
        dry_run: bool = False,
        keep_status: bool = False,
    ) -> dict[str, Any]:
        """POST: populate server metadata and store a new object (409 if the name is taken)."""
        obj = self._body(rtype, body)
        meta = obj["metadata"]
        with self._write():
            ns = self._namespace_of(rtype, namespace, meta)
            self._check_namespace(ns)
            bucket = self._objects[(rtype.group, rtype.plural)]
            name = meta.get("name")
            if not name and meta.get("generateName"):
                for _ in range(16):
                    name = str(meta["generateName"]) + "".join(random.choices(SUFFIX_CHARS, k=5))
                    if (ns, name) not in bucket:
                        break
            if not name:
                raise invalid(
                    rtype.kind, "", "metadata.name", "Required value: name or generateName is required"
                )
            if len(name) > 253 or "/" in name or "%" in name or name in (".", ".."):
                raise invalid(rtype.kind, name, "metadata.name", f"Invalid value: {name!r}", rtype.group)
            if rtype.plural == "namespaces" and not (NAME_RE.match(name) and len(name) <= 63):
                raise invalid(
                    rtype.kind,
                    name,
                    "metadata.name",
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
                )
            if (ns, name) in bucket:
                raise already_exists(rtype.plural, name, rtype.group)
            if rtype.has_status and rtype.crd and not keep_status:
                obj.pop("status", None)  # custom resources with a status subresource ignore it on create
            meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(), generation=1)
            for key in (
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
            ):
                meta.pop(key, None)
            if field_manager:
                meta["managedFields"] = [self._managed_entry(rtype, field_manager, operation, None)]
            for default in self.create_defaults:
                default(rtype, obj)
            if dry_run:
                return self.present(rtype, obj)
            stored = self._commit(rtype, "ADDED", obj, None)
            for hook in self.write_hooks:
                hook(rtype, "ADDED", stored, None)
            if self._owners_gone(ns, meta):
                # The garbage collector also removes a dependent created after its owner went (a
                # controller acting on a read from before the delete), not only those present then.
                self._remove(rtype, stored, None)
            return stored

    def _owners_gone(self, namespace: str, meta: dict[str, Any]) -> bool:
        """Whether every owner the object names is absent (an owner of an unserved kind counts as present)."""
        refs = meta.get("ownerReferences") or []
        for ref in refs:
            owner_type = self.registry.resolve(str(ref.get("apiVersion", "")), str(ref.get("kind", "")))
            if owner_type is None:
                return False
            bucket = self._objects.get((owner_type.group, owner_type.plural)) or {}
            owner = bucket.get((key_namespace(owner_type, namespace), str(ref.get("name", ""))))
            if owner is not None and owner["metadata"].get("uid") == ref.get("uid"):
                return False
        return bool(refs)

    def replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
        force: bool = False,
    ) -> dict[str, Any]:
        """PUT: replace the object (or only its status); a stale resourceVersion is a 409."""
        new = self._body(rtype, body)
        with self._write():
            old = self._find(rtype, namespace, name)
            if new["metadata"].get("name", name) != name:
                raise bad_request(
                    f"the name of the object ({new['metadata']['name']}) does not match the URL ({name})"
                )
            self._check_version(rtype, old, new)
            if subresource == "status":
                new = self._with_status(old, new.get("status"))
            else:
                new = self._carry_server_fields(rtype, old, new, keep_status=force)
            return self._update(rtype, old, new, subresource, field_manager, "Update", dry_run)

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: str,
        patch: Any,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """PATCH in any of the four flavours; returns the object and whether apply created it."""
        apply = patch_type == kube_patch.APPLY_PATCH
        if apply:
            body = self._body(rtype, patch)
            if not body.get("apiVersion") or not body.get("kind"):
                raise bad_request("apply patches must specify apiVersion and kind")
            if body["metadata"].get("name", name) != name:
                raise bad_request(
                    f"the name of the object ({body['metadata']['name']}) does not match the URL"
                )
        with self._write():
            bucket = self._objects[(rtype.group, rtype.plural)]
            old = bucket.get((key_namespace(rtype, namespace), name))
            if old is None:
                if not apply or subresource:
                    raise not_found(rtype.plural, name, rtype.group)
                body["metadata"]["name"] = name
                created = self.create(
                    rtype, namespace, body, field_manager=field_manager, operation="Apply", dry_run=dry_run
                )
                return created, True
            try:
                if apply:
                    patched = kube_patch.apply_merge(old, body)
                elif patch_type == kube_patch.JSON_PATCH:
                    patched = kube_patch.json_patch(old, patch)
                elif patch_type == kube_patch.MERGE_PATCH:
                    patched = kube_patch.json_merge_patch(old, patch)
                elif patch_type == kube_patch.STRATEGIC_MERGE_PATCH and rtype.crd is None:
                    patched = kube_patch.strategic_merge_patch(old, patch)
                else:
                    raise KubeApiError(
                        415, f"the body of the request was in an unknown format ({patch_type})"
                    )
            except kube_patch.PatchError as exc:
                raise KubeApiError(
                    422, f"the server rejected our request due to an error in our request: {exc}"
                ) from None
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata", {}), dict):
                raise KubeApiError(422, "the patched object is not a valid object")
            self._check_version(rtype, old, patched)
            if subresource == "status":
                new = self._with_status(old, patched.get("status"))
            else:
                new = self._carry_server_fields(rtype, old, patched, keep_status=False)
            operation = "Apply" if apply else "Update"
            return self._update(rtype, old, new, subresource, field_manager, operation, dry_run), False

    def delete(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None = None,
        preconditions: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """DELETE: finalizers turn it into a deletionTimestamp, otherwise the object goes away."""
        with self._write():
            old = self._find(rtype, namespace, name)
            meta = old["metadata"]
            for field in ("uid", "resourceVersion"):
                wanted = (preconditions or {}).get(field)
                if wanted and wanted != meta.get(field):
                    raise conflict(rtype.plural, name, rtype.group, f"Precondition failed: {field}: {wanted}")
            if self._held(rtype, old):
                if meta.get("deletionTimestamp") or dry_run:
                    return old
                marked = {**meta, "deletionTimestamp": now_rfc3339(), "deletionGracePeriodSeconds": 0}
                stored = self._commit(rtype, "MODIFIED", {**old, "metadata": marked}, old)
                for hook in self.terminating_hooks:
                    hook(rtype, stored)
                return stored
            if dry_run:
                return old
            return self._remove(rtype, old, propagation)

    def _remove(self, rtype: ResourceType, obj: dict[str, Any], propagation: str | None) -> dict[str, Any]:
        final = self._commit(rtype, "DELETED", obj, None)
        for hook in self.delete_hooks:
            hook(rtype, final)
        if propagation != "Orphan":
            self._collect_dependents(final["metadata"].get("uid"), propagation)
        return final

    def _collect_dependents(self, owner_uid: str | None, propagation: str | None) -> None:
        """Garbage-collect objects whose ownerReferences point at a deleted owner."""
        if not owner_uid:
            return
        for group_resource, bucket in list(self._objects.items()):
            versions = self.registry.versions_of(group_resource)
            for obj in list(bucket.values()):
                owners = obj["metadata"].get("ownerReferences") or []
                if versions and any(ref.get("uid") == owner_uid for ref in owners):
                    meta = obj["metadata"]
                    with contextlib.suppress(KubeApiError):  # already gone through another owner
                        self.delete(versions[0], meta.get("namespace"), meta["name"], propagation=propagation)

    def _update(
        self,
        rtype: ResourceType,
        old: dict[str, Any],
        new: dict[str, Any],
        subresource: str | None,
        field_manager: str | None,
        operation: str,
        dry_run: bool,
    ) -> dict[str, Any]:
        if content_of(new) == content_of(old):
            return old  # a no-op write keeps the resourceVersion, as the real storage layer does
        meta = dict(new["metadata"])
        if subresource is None and spec_of(new) != spec_of(old):
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if field_manager:
            entries = [
                e
                for e in meta.get("managedFields") or []
                if (e.get("manager"), e.get("operation"), e.get("subresource"))
                != (field_manager, operation, subresource)
            ]
            meta["managedFields"] = [
                *entries,
                self._managed_entry(rtype, field_manager, operation, subresource),
            ]
        new = {**new, "metadata": meta}
        if dry_run:
            return self.present(rtype, new)
        if meta.get("deletionTimestamp") and not self._held(rtype, new):
            return self._remove(rtype, new, None)  # the last finalizer is gone: finish the deletion
        stored = self._commit(rtype, "MODIFIED", new, old)
        for hook in self.write_hooks:
            hook(rtype, "MODIFIED", stored, subresource)
        return stored

    def drop_all(self, rtype: ResourceType, namespace: str | None = None) -> None:
        """Delete every object of a resource (optionally in one namespace) whatever its finalizers."""
        with self._write():
            for obj in list(self._objects[(rtype.group, rtype.plural)].values()):
                if namespace is None or obj["metadata"].get("namespace") == namespace:
                    self._remove(rtype, obj, None)
