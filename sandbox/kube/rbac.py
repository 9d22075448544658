"""The functions' IAM roles in ``infra/`` as Kubernetes RBAC, the way GKE's IAM authorizer reads them.

On GKE a request to the Kubernetes API is allowed when IAM grants ``container.<resource>.<verb>``
(or RBAC allows it). The sandbox's API server has no IAM authorizer, so each function's
``container.*`` permissions become one ClusterRole bound to that function's user. The mapping, in
one place (GKE's "API permissions" reference, as ``shared/cloud/permissions.py`` summarises it):

* ``get`` -> get; ``list`` -> list and watch (IAM has no watch permission; a watch is a list);
  ``create`` -> create; ``update`` -> update and patch (PUT and PATCH); ``delete`` -> delete;
  ``getStatus``/``updateStatus`` -> the same verbs on the ``status`` subresource.
* the resource is the IAM name's Kubernetes resource in its API group (table below); every custom
  resource is ``thirdPartyObjects``, granted here on the custom API groups the cluster serves
  (JobSet's and Kueue's unless told otherwise).
* ``container.clusters.*``, ``container.nodePools.*``, ``container.operations.*`` are GKE API
  permissions and ``compute.*`` Compute Engine ones: no Kubernetes request needs them.

``setup_cluster`` holds ``roles/container.admin`` in infra, all of ``container.*``: cluster-admin.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# IAM resource -> (API groups, Kubernetes resource). Events are written through either events API.
RESOURCES: Mapping[str, tuple[tuple[str, ...], str]] = {
    "pods": (("",), "pods"),
    "nodes": (("",), "nodes"),
    "events": (("", "events.k8s.io"), "events"),
    "namespaces": (("",), "namespaces"),
    "configMaps": (("",), "configmaps"),
    "secrets": (("",), "secrets"),
    "services": (("",), "services"),
    "serviceAccounts": (("",), "serviceaccounts"),
    "jobs": (("batch",), "jobs"),
    "priorityClasses": (("scheduling.k8s.io",), "priorityclasses"),
    "leases": (("coordination.k8s.io",), "leases"),
}
THIRD_PARTY = "thirdPartyObjects"
CUSTOM_GROUPS = ("jobset.x-k8s.io", "kueue.x-k8s.io")
VERBS: Mapping[str, tuple[str, ...]] = {
    "get": ("get",),
    "list": ("list", "watch"),
    "create": ("create",),
    "update": ("update", "patch"),
    "delete": ("delete",),
}
STATUS_VERBS: Mapping[str, tuple[str, ...]] = {"getStatus": ("get",), "updateStatus": ("update", "patch")}
# Not Kubernetes API permissions: GKE's own API and Compute Engine.
NOT_KUBERNETES = ("compute.", "container.clusters.", "container.nodePools.", "container.operations.")
ADMIN_FUNCTIONS = ("setup_cluster",)
FUNCTIONS = ("provision", "release", "reconcile", "apply_kueue", "setup_cluster")


@dataclass(frozen=True)
class Rule:
    """One RBAC policy rule."""

    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def as_dict(self) -> dict[str, list[str]]:
        return {
            "apiGroups": list(self.api_groups),
            "resources": list(self.resources),
            "verbs": list(self.verbs),
        }


def rules_for(permissions: Iterable[str], custom_groups: Sequence[str] = CUSTOM_GROUPS) -> list[Rule]:
    """RBAC rules granting what ``permissions`` grant on GKE; ValueError on a ``container.*``
    permission this mapping does not know (so a new one fails here, not silently)."""
    verbs_by_target: dict[tuple[tuple[str, ...], str], set[str]] = {}
    for permission in sorted(set(permissions)):
        if permission.startswith(NOT_KUBERNETES):
            continue
        service, resource, verb = permission.split(".")
        if service != "container":
            raise ValueError(f"not a GKE permission: {permission}")
        if verb in STATUS_VERBS:
            groups, plural = RESOURCES[resource]
            verbs, plural = STATUS_VERBS[verb], f"{plural}/status"
        elif verb in VERBS and resource == THIRD_PARTY:
            groups, plural, verbs = tuple(custom_groups), "*", VERBS[verb]
        elif verb in VERBS and resource in RESOURCES:
            (groups, plural), verbs = RESOURCES[resource], VERBS[verb]
        else:
            raise ValueError(f"no Kubernetes mapping for {permission}")
        verbs_by_target.setdefault((groups, plural), set()).update(verbs)
    ordered = sorted(verbs_by_target.items(), key=lambda item: (item[0][1], item[0][0]))  # by resource
    return [Rule(groups, (plural,), tuple(sorted(verbs))) for (groups, plural), verbs in ordered]


def permission_for(verb: str, group: str, resource: str, subresource: str = "") -> str:
    """The IAM permission GKE checks for one Kubernetes request: the inverse of ``rules_for``
    ("" for a request no ``container.*`` permission covers, e.g. a pod's log)."""
    plain = "delete" if verb == "deletecollection" else next((i for i, v in VERBS.items() if verb in v), "")
    if group in CUSTOM_GROUPS:  # every custom resource and its subresources: thirdPartyObjects
        return f"container.{THIRD_PARTY}.{plain}" if plain else ""
    iam_verb = plain
    if subresource == "status":
        iam_verb = next((i for i, v in STATUS_VERBS.items() if verb in v), "")
    elif subresource:
        return ""
    name = next(
        (i for i, (groups, plural) in RESOURCES.items() if group in groups and plural == resource), ""
    )
    return f"container.{name}.{iam_verb}" if name and iam_verb else ""


def user_name(function: str) -> str:
    """The identity a function authenticates as: its runtime service account, as on GKE."""
    return f"tpuprov-{function.replace('_', '-')}@sandbox.iam.gserviceaccount.com"


def role_name(function: str) -> str:
    return f"tpuprov:{function}"


def objects_for(function: str, permissions: Iterable[str] | None) -> list[dict[str, Any]]:
    """The ClusterRole and ClusterRoleBinding of one function (``permissions`` None: cluster-admin)."""
    group = "rbac.authorization.k8s.io"
    binding: dict[str, Any] = {
        "apiVersion": f"{group}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": role_name(function)},
        "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": role_name(function)},
        "subjects": [{"apiGroup": group, "kind": "User", "name": user_name(function)}],
    }
    if permissions is None:
        binding["roleRef"]["name"] = "cluster-admin"
        return [binding]
    role = {
        "apiVersion": f"{group}/v1",
        "kind": "ClusterRole",
        "metadata": {"name": role_name(function)},
        "rules": [rule.as_dict() for rule in rules_for(permissions)],
    }
    return [role, binding]


def load_roles(infra: Path) -> dict[str, list[str]]:
    """Each function's custom-role permissions: ``infra/roles.json``, else iam.tf's locals."""
    roles_json = infra / "roles.json"
    if roles_json.exists():
        data = json.loads(roles_json.read_text())
    else:
        import hcl2  # only the Terraform fallback needs it

        with (infra / "iam.tf").open() as handle:
            parsed = hcl2.load(handle)
        data = next(
            block["custom_role_permissions"]
            for block in parsed["locals"]
            if "custom_role_permissions" in block
        )
    return {str(name): [str(p) for p in perms] for name, perms in data.items()}


def all_objects(roles: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
    """RBAC objects of every function: its role's rules, or cluster-admin for the admin ones."""
    objects: list[dict[str, Any]] = []
    for function in FUNCTIONS:
        if function in ADMIN_FUNCTIONS:
            objects += objects_for(function, None)
        elif function in roles:
            objects += objects_for(function, roles[function])
    return objects
