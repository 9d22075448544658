"""A small REST client of the sandbox's real API server, for the harness and its tests.

It speaks plain HTTPS with a bearer token and the cluster CA, and surfaces the API server's own
answer: a non-2xx response raises ``ApiError`` with the HTTP status and the ``Status`` object's
reason and message, exactly what a product call would have met (a 403 is RBAC's verdict).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

# kind -> (API path prefix, plural, namespaced) for the kinds the harness writes itself.
_KINDS: Mapping[str, tuple[str, str, bool]] = {
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Namespace": ("/api/v1", "namespaces", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
}
FIELD_MANAGER = "tpuprov-sandbox"


class ApiError(Exception):
    """A non-2xx answer of the API server."""

    def __init__(self, status: int, reason: str, message: str, method: str, path: str) -> None:
        super().__init__(f"{method} {path}: {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def object_path(obj: Mapping[str, Any]) -> str:
    """The URL path of an object of a kind in ``_KINDS``."""
    prefix, plural, namespaced = _KINDS[str(obj["kind"])]
    meta = obj["metadata"]
    namespace = f"/namespaces/{meta.get('namespace', 'default')}" if namespaced else ""
    return f"{prefix}{namespace}/{plural}/{meta['name']}"


class KubeClient:
    """HTTPS requests to one API server as one token's identity."""

    def __init__(self, server: str, token: str, ca_pem: bytes) -> None:
        self.server = server
        self._token = token
        self._context = ssl.create_default_context(cadata=ca_pem.decode())

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer, or ApiError."""
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self._context) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                status = json.loads(raw)
            except ValueError:
                status = {"message": raw.decode(errors="replace")}
            raise ApiError(
                exc.code, str(status.get("reason", "")), str(status.get("message", "")), method, path
            ) from None
        return json.loads(raw) if raw else {}

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at ``path``, or None when the API server answers 404."""
        try:
            return self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, path: str, label_selector: str = "", field_selector: str = "") -> list[dict[str, Any]]:
        """The items of a collection."""
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        return list(self.request("GET", path, query=query).get("items") or [])

    def create(self, collection: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", collection, obj)

    def patch(self, path: str, patch: Mapping[str, Any], kind: str = "merge") -> dict[str, Any]:
        """A JSON merge (``merge``) or strategic merge (``strategic``) patch."""
        content = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }
        return self.request("PATCH", path, patch, content_type=content[kind])

    def delete(self, path: str, grace_seconds: int | None = None) -> bool:
        """Delete; False when it was already gone."""
        body = None if grace_seconds is None else {"gracePeriodSeconds": grace_seconds}
        try:
            self.request("DELETE", path, body)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def apply(self, obj: Mapping[str, Any], path: str | None = None) -> dict[str, Any]:
        """Server-side apply of ``obj`` (force: the harness owns these fields)."""
        return self.request(
            "PATCH",
            path or object_path(obj),
            obj,
            content_type="application/apply-patch+yaml",
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )

    def watch(
        self, collection: str, resource_version: str, timeout: float, field_selector: str = ""
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The watch events (type, object) of a collection after ``resource_version``, until the
        server closes the stream after ``timeout`` seconds or the caller stops iterating."""
        query = {"watch": "1", "resourceVersion": resource_version, "timeoutSeconds": str(int(timeout))}
        if field_selector:
            query["fieldSelector"] = field_selector
        url = f"{self.server}{collection}?{urllib.parse.urlencode(query)}"
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self._token}"})
        with urllib.request.urlopen(req, timeout=timeout + 10, context=self._context) as response:
            for line in response:
                if line.strip():
                    event = json.loads(line)
                    yield str(event["type"]), dict(event["object"])

    def apply_all(self, objects: Iterable[Mapping[str, Any]]) -> None:
        for obj in objects:
            self.apply(obj)
