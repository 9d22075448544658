"""Who may call the emulators: bearer tokens, the service accounts they stand for, and their roles.

Google's front ends turn a request's OAuth token into a principal and check IAM before the API
runs; the emulators do the same with this table. The grants are read from ``infra/`` (the roles
Terraform gives each function) and never from the product's own declarations, so a call the
product makes without its role holding the permission gets the real 403 here.

The Kubernetes side is the real API server's RBAC (``sandbox.kube.rbac`` translates the same roles).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from shared.app.deployment import service_account

# setup_cluster holds roles/container.admin (infra/iam.tf): every container.* permission.
BROAD_ROLES = {"setup_cluster": ("container.*",)}


def load_roles(repo_root: Path) -> dict[str, tuple[str, ...]]:
    """Each function's granted permissions, as ``infra/`` deploys them."""
    roles = json.loads((repo_root / "infra" / "roles.json").read_text())
    granted = {function: tuple(permissions) for function, permissions in roles.items()}
    granted.update(BROAD_ROLES)
    return granted


class Iam:
    """Tokens -> principals -> granted permissions per project; thread-safe, changeable while serving.

    A grant holds in one project, as a project IAM binding does: custom roles are project resources
    and a binding in one project says nothing about another's (IAM "Understanding roles", custom
    roles; Resource Manager's policy hierarchy), so infra/iam.tf copies each function's role into
    every fleet project and binds it there."""

    def __init__(self, project: str, prefix: str = "tpuprov") -> None:
        self.project = project
        self.prefix = prefix
        self._grants: dict[tuple[str, str], set[str]] = {}  # (principal, project) -> permissions
        self._tokens: dict[str, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_functions(
        cls,
        roles: Mapping[str, Iterable[str]],
        project: str,
        prefix: str = "tpuprov",
        fleet_projects: Iterable[str] = (),
    ) -> Iam:
        """An IAM with one service account and token per function, granted ``roles`` in ``project``
        and in each of ``fleet_projects`` (infra/iam.tf ``fleet_function``)."""
        iam = cls(project, prefix)
        for function, permissions in roles.items():
            for where in dict.fromkeys((project, *fleet_projects)):
                iam.grant(iam.principal_of(function), permissions, where)
        return iam

    def principal_of(self, function: str) -> str:
        """The service account email infra/ creates for ``function``."""
        return service_account(function, self.project, self.prefix)

    def grant(self, principal: str, permissions: Iterable[str], project: str = "") -> None:
        """Add permissions to ``principal`` (creating it) in ``project`` (default: the home project)."""
        with self._lock:
            self._grants.setdefault((principal, project or self.project), set()).update(permissions)

    def revoke(self, function: str, permission: str, project: str = "") -> None:
        """Take one permission away from ``function``'s service account (tests)."""
        with self._lock:
            key = (self.principal_of(function), project or self.project)
            self._grants.get(key, set()).discard(permission)

    def granted(self, principal: str, project: str = "") -> frozenset[str]:
        """What ``principal`` holds in ``project`` now (``tpuprov doctor`` reads it as the deployed role)."""
        with self._lock:
            return frozenset(self._grants.get((principal, project or self.project), ()))

    def token_for(self, function: str) -> str:
        """A bearer token that authenticates as ``function``'s service account."""
        principal = self.principal_of(function)
        with self._lock:
            for token, owner in self._tokens.items():
                if owner == principal:
                    return token
            token = f"ya29.sandbox-{secrets.token_urlsafe(16)}"
            self._tokens[token] = principal
            return token

    def principal(self, authorization: str | None) -> str:
        """The principal an ``Authorization`` header authenticates ("" when it authenticates none)."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return ""
        with self._lock:
            return self._tokens.get(token.strip(), "")

    def missing(self, principal: str, permissions: Iterable[str], project: str = "") -> str:
        """The first of ``permissions`` that ``principal`` lacks in ``project`` ("" when it holds
        them all; default: the home project)."""
        with self._lock:
            granted = self._grants.get((principal, project or self.project), set())
            for permission in permissions:
                service = permission.split(".", 1)[0]
                if permission not in granted and f"{service}.*" not in granted:
                    return permission
            return ""


UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or "
    "other valid authentication credential."
)


def gke_denial(permission: str, resource: str) -> str:
    """GKE's text for a missing permission on ``resource`` (a cluster or operation path)."""
    return f'Required "{permission}" permission(s) for "{resource}".'


__all__ = [
    "BROAD_ROLES",
    "UNAUTHENTICATED",
    "Iam",
    "gke_denial",
    "load_roles",
]
