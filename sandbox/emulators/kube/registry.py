"""Which resources the sandbox API serves, and the discovery documents that describe them.

Built-in resources come from the discovery snapshot bundled with kmock (taken from a real cluster);
custom resources are added and removed as CustomResourceDefinitions are written and deleted.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import warnings
from collections.abc import Iterable
from typing import Any

import kmock

# Groups in kmock's snapshot that a GKE cluster does not serve by default.
_SKIPPED_GROUPS = frozenset({"gateway.networking.k8s.io", "metrics.k8s.io"})
# Only these subresources have behaviour here; the others (exec, log, scale...) are not served.
_SERVED_SUBRESOURCES = frozenset({"status"})
_STANDARD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Sort key ranking API versions as Kubernetes does: GA > beta > alpha, then newer first."""
    match = _VERSION_RE.match(version)
    if not match:
        return (-1, 0, 0, version)
    stability = {"alpha": 0, "beta": 1, None: 2}[match.group(2)]
    return (stability, int(match.group(1)), int(match.group(3) or 0), version)


@dataclasses.dataclass(frozen=True)
class ResourceType:
    """One served resource at one group/version, with its discovery facts."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    verbs: tuple[str, ...] = _STANDARD_VERBS
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    crd: str | None = None  # name of the defining CustomResourceDefinition, None for built-ins
    selectable_fields: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        """The ``apiVersion`` string objects of this resource carry."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def has_status(self) -> bool:
        """Whether ``.status`` is a separate subresource (main writes then keep the old status)."""
        return "status" in self.subresources

    def discovery_entries(self) -> list[dict[str, Any]]:
        """The ``APIResourceList.resources`` entries for the resource and its subresources."""
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular or self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        entries = [entry]
        for sub in sorted(self.subresources):
            entries.append(
                {
                    "name": f"{self.plural}/{sub}",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


@functools.cache
def builtin_resource_types() -> tuple[ResourceType, ...]:
    """The built-in resources of a current cluster, from kmock's bundled discovery snapshot."""
    snapshot = kmock.ResourcesArray()
    with warnings.catch_warnings():  # kmock reads its data with a deprecated importlib call
        warnings.simplefilter("ignore", DeprecationWarning)
        snapshot.load_bundled()
    types: list[ResourceType] = []
    for res in snapshot:
        info = snapshot[res]
        if res.group is None or res.version is None or res.plural is None or res.group in _SKIPPED_GROUPS:
            continue
        types.append(
            ResourceType(
                group=res.group,
                version=res.version,
                plural=res.plural,
                kind=info.kind or res.plural.capitalize(),
                namespaced=bool(info.namespaced),
                singular=info.singular or "",
                verbs=tuple(sorted(info.verbs)) or _STANDARD_VERBS,
                short_names=tuple(sorted(info.shortnames)),
                categories=tuple(sorted(info.categories)),
                subresources=frozenset(info.subresources) & _SERVED_SUBRESOURCES,
            )
        )
    return tuple(types)


def crd_resource_types(crd: dict[str, Any]) -> list[ResourceType]:
    """The resources a CustomResourceDefinition serves: one per served version."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not (group and plural and kind):
        return []
    types = []
    for version in spec.get("versions") or []:
        if not version.get("served", True) or not version.get("name"):
            continue
        subresources = version.get("subresources") or spec.get("subresources") or {}
        selectable = tuple(
            str(field.get("jsonPath", "")).lstrip(".") for field in version.get("selectableFields") or []
        )
        types.append(
            ResourceType(
                group=group,
                version=version["name"],
                plural=plural,
                kind=kind,
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular") or kind.lower(),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=frozenset(subresources) & _SERVED_SUBRESOURCES,
                crd=(crd.get("metadata") or {}).get("name"),
                selectable_fields=selectable,
            )
        )
    return types


class Registry:
    """A thread-safe table of served resources, keyed by group/version/plural."""

    def __init__(self, types: Iterable[ResourceType] = ()) -> None:
        self._lock = threading.Lock()
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        for rtype in types:
            self._types[(rtype.group, rtype.version, rtype.plural)] = rtype

    @classmethod
    def with_builtins(cls) -> Registry:
        """A registry preloaded with the built-in resources."""
        return cls(builtin_resource_types())

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        """The resource served at this group/version/plural, if any."""
        with self._lock:
            return self._types.get((group, version, plural))

    def resolve(self, api_version: str, plural_or_kind: str) -> ResourceType | None:
        """Find a resource by ``apiVersion`` and either its plural or its kind."""
        group, _, version = api_version.rpartition("/")
        with self._lock:
            found = self._types.get((group, version, plural_or_kind))
            if found is not None:
                return found
            for rtype in self._types.values():
                if (rtype.group, rtype.version) == (group, version) and plural_or_kind in (
                    rtype.kind,
                    rtype.singular,
                    *rtype.short_names,
                ):
                    return rtype
        return None

    def all_types(self) -> list[ResourceType]:
        """Every served resource, in a stable order."""
        with self._lock:
            return sorted(self._types.values(), key=lambda r: (r.group, r.version, r.plural))

    def versions_of(self, group_resource: tuple[str, str]) -> list[ResourceType]:
        """Every served version of one group/plural."""
        with self._lock:
            return [r for r in self._types.values() if (r.group, r.plural) == group_resource]

    def set_crd(self, name: str, types: Iterable[ResourceType]) -> None:
        """Replace what one CRD serves (built-ins with the same names are never shadowed)."""
        with self._lock:
            for key in [key for key, rtype in self._types.items() if rtype.crd == name]:
                del self._types[key]
            for rtype in types:
                key = (rtype.group, rtype.version, rtype.plural)
                existing = self._types.get(key)
                if existing is None or existing.crd is not None:
                    self._types[key] = rtype

    def groups(self) -> dict[str, list[str]]:
        """Each served group with its versions, the preferred version first."""
        with self._lock:
            found: dict[str, set[str]] = {}
            for rtype in self._types.values():
                found.setdefault(rtype.group, set()).add(rtype.version)
        return {group: sorted(vs, key=version_priority, reverse=True) for group, vs in sorted(found.items())}

    # -- discovery documents -------------------------------------------------------------------

    def api_group_list(self) -> dict[str, Any]:
        """``GET /apis``: every named group (the core group lives at ``/api``)."""
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                self._group_doc(group, versions) for group, versions in self.groups().items() if group
            ],
        }

    def api_group(self, group: str) -> dict[str, Any] | None:
        """``GET /apis/<group>``, or None when the group is not served."""
        versions = self.groups().get(group)
        if not group or not versions:
            return None
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group_doc(group, versions)}

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        """``GET /api/v1`` or ``GET /apis/<group>/<version>``, or None when not served."""
        types = [r for r in self.all_types() if (r.group, r.version) == (group, version)]
        if not types:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for rtype in types for entry in rtype.discovery_entries()],
        }

    @staticmethod
    def _group_doc(group: str, versions: list[str]) -> dict[str, Any]:
        listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": listed, "preferredVersion": listed[0]}
