"""The HTTP face of the sandbox Kubernetes API, built on kmock's Kubernetes request handler.

kmock parses and records each request and renders unexpected failures as ``v1/Status``; this
handler routes the Kubernetes URL space (discovery, CRUD, subresources, watch) onto the store
and injects the faults tests ask for. URLs it does not know fall through to kmock (404 Status).
"""

from __future__ import annotations

import asyncio
import json
from contextlib import suppress
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml

from sandbox.emulators.iam import Iam, k8s_permission, kube_denial
from sandbox.emulators.kube import openapi as kube_openapi
from sandbox.emulators.kube import patch as kube_patch
from sandbox.emulators.kube.errors import KubeApiError, bad_request, method_not_allowed, resource_not_found
from sandbox.emulators.kube.faults import FaultInjector
from sandbox.emulators.kube.registry import Registry, ResourceType
from sandbox.emulators.kube.views import (
    WatchFilter,
    bookmark_line,
    list_page,
    render_table,
    wants_table,
    watch_line,
)
from sandbox.emulators.kube.write_paths import KubeStore

_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TRUE = ("1", "t", "T", "true", "TRUE", "True")
_KMOCK_LOG_LIMIT = 500  # kmock keeps whole request objects (bodies too): keep only recent ones


def _json(body: Any, status: int = 200) -> aiohttp.web.Response:
    return aiohttp.web.Response(
        body=json.dumps(body, separators=(",", ":")).encode(), status=status, content_type="application/json"
    )


def _decode_body(request: kmock.Request) -> Any:
    if not request.body:
        return None
    try:
        return json.loads(request.body)
    except ValueError:
        pass
    try:
        return yaml.load(request.body, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise bad_request(f"the request body is neither JSON nor YAML: {exc}") from None


@attrs.define(kw_only=True)
class KubeHandler(kmock.KubernetesScaffold):
    """kmock's Kubernetes scaffold extended with the full resource semantics of the store."""

    store: KubeStore
    registry: Registry
    faults: FaultInjector
    version_info: dict[str, str]
    address: str = ""
    list_latency: float = 0.0  # seconds added to every list response (one page of a paged list)
    iam: Iam | None = None  # GKE's IAM authorizer; None lets every caller do everything
    anonymous: str = ""  # the principal of a request with no Authorization header ("": refused, 401)

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Serve one HTTP request (the aiohttp low-level handler entry point).

        kmock's own entry point is not used because its URL parser raises on some valid
        Kubernetes paths (``/api/v1/namespaces`` itself); such requests get a plain kmock
        Request without the Kubernetes fields, which this handler's router does not need.
        """
        body = await raw_request.read()
        try:
            request = await kmock.Request._parse(raw_request, id=len(self._requests))
        except ValueError:
            request = kmock.Request(
                id=len(self._requests),
                raw_request=raw_request,
                method=raw_request.method,
                url=raw_request.url,
                params=dict(raw_request.query),
                headers=dict(raw_request.headers),
                body=body,
                text=body.decode("utf-8", errors="replace"),
            )
        self._requests.append(request)
        if len(self._requests) > _KMOCK_LOG_LIMIT:
            del self._requests[: len(self._requests) - _KMOCK_LOG_LIMIT]
        try:
            return await self._handle(request)
        except Exception as exc:  # rendered as a 500 Status, as kmock does, instead of a dropped connection
            return await self._render_error(exc)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        method = str(request.method.value).upper()
        # The official client asks for "/version/", "/api/" and "/apis/"; the real server takes both.
        path = (raw.path if raw is not None else request.url.path).rstrip("/") or "/"
        self.faults.record(method, raw.path_qs if raw is not None else str(request.url))
        try:
            injected = self.faults.take(method, path)
            if injected is not None:
                raise injected
            response = await self._route(request, method, path)
        except KubeApiError as exc:
            return _json(exc.status(), exc.code)
        return response if response is not None else await super()._handle(request)

    async def _route(
        self, request: kmock.Request, method: str, path: str
    ) -> aiohttp.web.StreamResponse | None:
        parts = [part for part in path.split("/") if part]
        if method == "GET":
            if path in ("/healthz", "/livez", "/readyz"):
                return aiohttp.web.Response(text="ok")
            if path == "/version":
                return _json(self.version_info)
            if path == "/api":
                cidr = [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.address}]
                return _json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidr})
            if path == "/apis":
                return _json(self.registry.api_group_list())
            if len(parts) == 2 and parts[0] == "apis":
                doc = self.registry.api_group(parts[1])
                if doc is None:
                    raise resource_not_found(path)
                return _json(doc)
            if path == "/openapi/v3":
                return _json(kube_openapi.root_document(self.registry))
            if parts[:2] == ["openapi", "v3"]:
                doc = None
                if len(parts) == 4 and parts[2] == "api":
                    doc = kube_openapi.group_version_document(self.registry, "", parts[3])
                elif len(parts) == 5 and parts[2] == "apis":
                    doc = kube_openapi.group_version_document(self.registry, parts[3], parts[4])
                if doc is None:
                    raise resource_not_found(path)
                return _json(doc)
            if (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
                group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
                doc = self.registry.resource_list(group, version)
                if doc is None:
                    raise resource_not_found(path)
                return _json(doc)
        if len(parts) >= 3 and (parts[0] == "api" or (parts[0] == "apis" and len(parts) >= 4)):
            return await self._resource(request, method, path, parts)
        return None

    async def _resource(
        self, request: kmock.Request, method: str, path: str, parts: list[str]
    ) -> aiohttp.web.StreamResponse:
        group, version, rest = (
            ("", parts[1], parts[2:]) if parts[0] == "api" else (parts[1], parts[2], parts[3:])
        )
        params = dict(request.params)
        watch = params.get("watch") in _TRUE
        if rest and rest[0] == "watch":  # the legacy /watch/ URL prefix
            watch, rest = True, rest[1:]
        namespace = None
        namespace_sub = group == "" and len(rest) == 3 and rest[2] in ("status", "finalize")
        if len(rest) >= 3 and rest[0] == "namespaces" and not namespace_sub:
            namespace, rest = rest[1], rest[2:]
        if not rest:
            raise resource_not_found(path)
        plural, name = rest[0], (rest[1] if len(rest) > 1 else None)
        subresource = "/".join(rest[2:]) or None
        rtype = self.registry.lookup(group, version, plural)
        if rtype is None or (namespace and not rtype.namespaced):
            raise resource_not_found(path)
        if subresource is not None and subresource not in rtype.subresources:
            raise resource_not_found(path)
        if rtype.namespaced and namespace is None and (name is not None or method in ("POST", "DELETE")):
            raise resource_not_found(path)

        verb = self._verb(method, name, watch)
        self._authorize(request, verb, group, plural, name, namespace)
        allowed = ("get", "patch", "update") if subresource else rtype.verbs
        if verb not in allowed:
            raise method_not_allowed(verb, rtype.kind)
        if verb == "watch":
            return await self._watch(request, rtype, namespace, name, params)
        if verb == "list":
            if self.list_latency > 0:  # each list response is one page: a paged list pays it per page
                await asyncio.sleep(self.list_latency)
            return self._list(request, rtype, namespace, params)
        if verb == "get":
            assert name is not None
            obj = self.store.get(rtype, namespace, name)
            return _json(
                render_table(rtype, [obj], obj["metadata"]["resourceVersion"])
                if wants_table(request)
                else obj
            )
        return self._write(request, verb, rtype, namespace, name, subresource, params)

    def _authorize(
        self,
        request: kmock.Request,
        verb: str,
        group: str,
        plural: str,
        name: str | None,
        namespace: str | None,
    ) -> None:
        if self.iam is None:
            return
        header = request.headers.get("Authorization")
        principal = self.iam.principal(header) if header else self.anonymous
        if not principal:
            raise KubeApiError(401, "Unauthorized")
        permission = k8s_permission(verb, group, plural)
        if self.iam.missing(principal, (permission,)):
            message = kube_denial(principal, verb, group, plural, name or "", namespace or "", permission)
            raise KubeApiError(403, message, name=name, group=group or None, kind=plural)

    @staticmethod
    def _verb(method: str, name: str | None, watch: bool) -> str:
        if method == "GET":
            return "watch" if watch else ("get" if name else "list")
        if method == "DELETE":
            return "delete" if name else "deletecollection"
        if method == "POST" and name is None:
            return "create"
        if method in ("PUT", "PATCH") and name is not None:
            return "update" if method == "PUT" else "patch"
        raise KubeApiError(405, f"the server does not allow this method ({method}) on the requested resource")

    def _list(
        self, request: kmock.Request, rtype: ResourceType, namespace: str | None, params: dict[str, str]
    ) -> aiohttp.web.Response:
        items, rv = self.store.list_objects(
            rtype, namespace, params.get("labelSelector", ""), params.get("fieldSelector", "")
        )
        if wants_table(request):
            return _json(render_table(rtype, items, str(rv)))
        selected = bool(params.get("labelSelector") or params.get("fieldSelector"))
        page = list_page(rtype, items, rv, params.get("limit"), params.get("continue"))
        if selected:
            # The real API cannot count what is left of a filtered list and leaves the field unset.
            page["metadata"].pop("remainingItemCount", None)
        return _json(page)

    def _write(
        self,
        request: kmock.Request,
        verb: str,
        rtype: ResourceType,
        namespace: str | None,
        name: str | None,
        subresource: str | None,
        params: dict[str, str],
    ) -> aiohttp.web.Response:
        body = _decode_body(request)
        options = body if isinstance(body, dict) else {}
        dry_run = params.get("dryRun") == "All" or (
            verb == "delete" and "All" in (options.get("dryRun") or [])
        )
        manager = params.get("fieldManager") or None
        if verb == "create":
            created = self.store.create(rtype, namespace, body, field_manager=manager, dry_run=dry_run)
            return _json(self.store.present(rtype, created), 201)
        if verb == "update":
            assert name is not None
            replaced = self.store.replace(
                rtype, namespace, name, body, subresource=subresource, field_manager=manager, dry_run=dry_run
            )
            return _json(self.store.present(rtype, replaced))
        if verb == "patch":
            assert name is not None
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
            if content_type not in kube_patch.PATCH_TYPES:
                raise KubeApiError(415, f"the body of the request was in an unknown format ({content_type})")
            if content_type == kube_patch.APPLY_PATCH and not manager:
                raise KubeApiError(
                    422, "fieldManager: Required value: is required for apply patch", "Invalid"
                )
            patched, was_created = self.store.patch(
                rtype,
                namespace,
                name,
                content_type,
                body,
                subresource=subresource,
                field_manager=manager,
                dry_run=dry_run,
            )
            return _json(self.store.present(rtype, patched), 201 if was_created else 200)
        propagation = params.get("propagationPolicy") or options.get("propagationPolicy")
        if verb == "delete":
            assert name is not None
            deleted = self.store.delete(
                rtype,
                namespace,
                name,
                propagation=propagation,
                preconditions=options.get("preconditions"),
                dry_run=dry_run,
            )
            return _json(self.store.present(rtype, deleted))
        items, _ = self.store.list_objects(
            rtype, namespace, params.get("labelSelector", ""), params.get("fieldSelector", "")
        )
        gone = []
        for item in items:
            with suppress(KubeApiError):  # collected as a dependent of an earlier item
                meta = item["metadata"]
                gone.append(
                    self.store.delete(rtype, meta.get("namespace"), meta["name"], propagation=propagation)
                )
        return _json(
            list_page(rtype, [self.store.present(rtype, g) for g in gone], self.store.resource_version)
        )

    async def _watch(
        self,
        request: kmock.Request,
        rtype: ResourceType,
        namespace: str | None,
        name: str | None,
        params: dict[str, str],
    ) -> aiohttp.web.StreamResponse:
        field_selector = params.get("fieldSelector", "")
        if name:
            field_selector = ",".join(filter(None, [field_selector, f"metadata.name={name}"]))
        selector = WatchFilter.parse(rtype, namespace, params.get("labelSelector", ""), field_selector)
        try:
            timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        except ValueError:
            raise bad_request(f"invalid timeoutSeconds {params['timeoutSeconds']!r}") from None
        loop = asyncio.get_running_loop()
        raw = request._raw_request
        assert raw is not None  # always set for requests that came over HTTP
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        initial_events = params.get("sendInitialEvents") in _TRUE
        try:
            initial, sub = self.store.subscribe(rtype, params.get("resourceVersion"), loop, initial_events)
        except KubeApiError as exc:
            await response.prepare(raw)
            await response.write((json.dumps({"type": "ERROR", "object": exc.status()}) + "\n").encode())
            await response.write_eof()
            return response
        deadline = loop.time() + timeout if timeout else None
        try:
            await response.prepare(raw)
            for event in initial:
                if line := watch_line(self.store, rtype, event, selector):
                    await response.write(line)
            if initial_events:
                await response.write(bookmark_line(rtype, self.store.resource_version))
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    live = await asyncio.wait_for(sub.queue.get(), remaining)
                except TimeoutError:
                    break
                if live is None:
                    break
                if line := watch_line(self.store, rtype, live, selector):
                    await response.write(line)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return response  # the watcher went away
        finally:
            self.store.unsubscribe(sub)
        with suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await response.write_eof()
        return response
