"""A minimal OpenAPI v3 description of the served resources, enough for kubectl.

kubectl reads ``/openapi/v3`` only to learn whether PATCH accepts ``fieldValidation``; if it
cannot tell, it falls back to client-side schema validation and fails without a full OpenAPI v2
document. So each group/version document lists just the PATCH operation of each kind, tagged with
``x-kubernetes-group-version-kind`` and the ``fieldValidation`` query parameter; no schemas.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sandbox.emulators.kube.registry import Registry, ResourceType


def _gv_path(group: str, version: str) -> str:
    return f"api/{version}" if not group else f"apis/{group}/{version}"


def _object_path(rtype: ResourceType) -> str:
    prefix = "/" + _gv_path(rtype.group, rtype.version)
    scope = "/namespaces/{namespace}" if rtype.namespaced else ""
    return f"{prefix}{scope}/{rtype.plural}/{{name}}"


def group_version_document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of one group/version, or None when it is not served."""
    types = [
        r for r in registry.all_types() if (r.group, r.version) == (group, version) and "patch" in r.verbs
    ]
    if not types:
        return None
    paths = {}
    for rtype in types:
        parameters = [
            {"name": name, "in": "query", "schema": {"type": "string"}}
            for name in ("dryRun", "fieldManager", "fieldValidation", "force")
        ]
        paths[_object_path(rtype)] = {
            "patch": {
                "operationId": f"patch{rtype.kind}",
                "parameters": parameters,
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": rtype.kind},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (sandbox)", "version": "unversioned"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def root_document(registry: Registry) -> dict[str, Any]:
    """``GET /openapi/v3``: where each group/version document lives, with a content hash."""
    paths = {}
    for group, versions in registry.groups().items():
        for version in versions:
            doc = group_version_document(registry, group, version)
            if doc is None:
                continue
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
            gv_path = _gv_path(group, version)
            paths[gv_path] = {"serverRelativeURL": f"/openapi/v3/{gv_path}?hash={digest}"}
    return {"paths": paths}
