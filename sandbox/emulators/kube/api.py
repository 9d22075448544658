"""A local Kubernetes API server for tests and the sandbox, built on kmock.

It runs kmock's Kubernetes handler (extended in ``kube_http``) on an aiohttp server in a
background thread and serves the official ``kubernetes`` client and ``kubectl`` over plain HTTP
on 127.0.0.1. Tests and simulated controllers can also read and write its state directly.

Run as a process: ``python -m sandbox.emulators.kube.api --port 0 [--crd-file F ...] [--kubeconfig PATH]``;
it prints its URL on the first stdout line and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp.web
import aiohttp.web_request
import aiohttp.web_server
import kubernetes.client
import yaml

from sandbox.emulators.iam import Iam
from sandbox.emulators.kube import patch as kube_patch
from sandbox.emulators.kube.behaviours import Behaviours
from sandbox.emulators.kube.errors import KubeApiError
from sandbox.emulators.kube.http import FaultInjector, KubeHandler
from sandbox.emulators.kube.object_store import clone
from sandbox.emulators.kube.registry import Registry, ResourceType
from sandbox.emulators.kube.write_paths import KubeStore

__all__ = ["KubeApiError", "KubeApiServer", "main"]

_PRECREATED_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_MAX_BODY = 64 * 1024 * 1024  # CRD manifests run to megabytes; aiohttp's 1 MiB default is too small
ChangeCallback = Callable[[str, dict[str, Any]], None]
# Aliases for annotations inside KubeApiServer, whose list() method shadows the builtin there.
RequestLog = list[tuple[str, str]]


class _LargeBodyServer(aiohttp.web_server.Server):
    """aiohttp's low-level server, accepting request bodies as large as CRD manifests."""

    def _make_request(self, message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> Any:
        return aiohttp.web_request.BaseRequest(
            message, payload, protocol, writer, task, self._loop, client_max_size=_MAX_BODY
        )


_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is ~7x faster
_CRD_CACHE: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
_CRD_CACHE_LOCK = threading.Lock()


def _crd_documents(path: Path) -> list[dict[str, Any]]:
    """The CRDs in a manifest file, parsed once per file version (tests start many servers)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    with _CRD_CACHE_LOCK:
        if key not in _CRD_CACHE:
            docs = yaml.load_all(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)
            _CRD_CACHE[key] = [
                doc for doc in docs if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition"
            ]
        return _CRD_CACHE[key]


def _version_info(kube_version: str) -> dict[str, str]:
    major, _, rest = kube_version.lstrip("v").partition(".")
    minor = rest.split(".")[0]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": kube_version if kube_version.startswith("v") else f"v{kube_version}",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


class KubeApiServer:
    """An in-memory Kubernetes API server on a local port (also a context manager)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        crd_files: Sequence[str | Path] = (),
        strict_namespaces: bool = True,
        crd_establish_delay: float = 0.0,
        deployment_ready_delay: float = 0.0,
        namespace_delete_delay: float = 1.0,
        kube_version: str = "v1.32.4",
    ) -> None:
        self._host = host
        self._port = port
        self._crd_files = [Path(path) for path in crd_files]
        self._registry = Registry.with_builtins()
        self._store = KubeStore(self._registry, strict_namespaces=strict_namespaces)
        Behaviours(
            self._store,
            self._registry,
            crd_establish_delay=crd_establish_delay,
            deployment_ready_delay=deployment_ready_delay,
            namespace_delete_delay=namespace_delete_delay,
        ).install()
        self._faults = FaultInjector()
        self._handler = KubeHandler(
            store=self._store,
            registry=self._registry,
            faults=self._faults,
            version_info=_version_info(kube_version),
        )
        self._callbacks: list[ChangeCallback] = []
        self._changes: queue.Queue[list[tuple[str, dict[str, Any]]] | None] = queue.Queue()
        self._store.add_listener(self._changes.put)
        self._dispatcher: threading.Thread | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self.url = ""
        for name in _PRECREATED_NAMESPACES:
            self.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> KubeApiServer:
        """Preload CRDs, start serving in a background thread and return once connections are accepted."""
        if self._thread is not None:
            raise RuntimeError("the Kubernetes API server is already started")
        for path in self._crd_files:
            for doc in _crd_documents(path):
                self.put(doc)
        self._dispatcher = threading.Thread(target=self._dispatch, name="kube-api-callbacks", daemon=True)
        self._dispatcher.start()
        ready = threading.Event()
        errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, errors), name="kube-api", daemon=True)
        self._thread.start()
        if not ready.wait(30) or errors:
            self.stop()
            raise RuntimeError(
                f"the Kubernetes API server did not start: {errors[0] if errors else 'timeout'}"
            )
        return self

    def _run(self, ready: threading.Event, errors: list[BaseException]) -> None:
        try:
            asyncio.run(self._serve(ready))
        except BaseException as exc:  # reported to start() instead of dying silently in the thread
            errors.append(exc)
        finally:
            ready.set()

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        async with self._handler:
            server = _LargeBodyServer(self._handler, handler_cancellation=True)
            runner = aiohttp.web.ServerRunner(server, shutdown_timeout=2.0)
            await runner.setup()
            try:
                site = aiohttp.web.TCPSite(runner, self._host, self._port)
                await site.start()
                port = runner.addresses[0][1]
                self.url = f"http://{self._host}:{port}"
                self._handler.address = f"{self._host}:{port}"
                ready.set()
                await self._stop_event.wait()
            finally:
                self._store.close()  # ends the watches so that the shutdown does not wait on them
                await runner.cleanup()

    def stop(self) -> None:
        """Stop serving, end watches and delayed behaviours, and join the background threads."""
        loop, event, thread = self._loop, self._stop_event, self._thread
        if loop is not None and event is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(event.set)
        if thread is not None:
            thread.join(15)
        self._store.close()
        if self._dispatcher is not None:
            self._changes.put(None)
            self._dispatcher.join(15)
            self._dispatcher = None

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- clients -------------------------------------------------------------------------------

    def api_client(self, token: str = "") -> kubernetes.client.ApiClient:
        """An official-client ApiClient for this server (as ``token``'s principal when the server
        authorizes callers, else no auth); close it when done."""
        config = kubernetes.client.Configuration()
        config.host = self.url
        if token:
            config.api_key = {"authorization": token}
            config.api_key_prefix = {"authorization": "Bearer"}
        return kubernetes.client.ApiClient(configuration=config)

    def write_kubeconfig(self, path: Path, token: str = "") -> Path:
        """Write a kubeconfig that points ``kubectl --kubeconfig`` at this server (as ``token``'s
        principal when the server authorizes callers)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": {"server": self.url}}],
            "users": [{"name": "sandbox", "user": {"token": token} if token else {}}],
            "contexts": [{"name": "sandbox", "context": {"cluster": "sandbox", "user": "sandbox"}}],
            "current-context": "sandbox",
            "preferences": {},
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return path

    # -- direct state access -------------------------------------------------------------------

    def _type(self, api_version: str, plural_or_kind: str) -> ResourceType:
        rtype = self._registry.resolve(api_version, plural_or_kind)
        if rtype is None:
            raise KubeApiError(
                404, f'the server doesn\'t have a resource type "{plural_or_kind}" in {api_version}'
            )
        return rtype

    def get(
        self, api_version: str, kind_plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """A copy of one object, or None; ``kind_plural`` may be the plural or the kind."""
        try:
            return clone(self._store.get(self._type(api_version, kind_plural), namespace, name))
        except KubeApiError as exc:
            if exc.code == 404:
                return None
            raise

    def list(
        self, api_version: str, plural: str, namespace: str | None = None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        """Copies of the matching objects (all namespaces when ``namespace`` is None)."""
        items, _ = self._store.list_objects(self._type(api_version, plural), namespace, label_selector)
        return [clone(item) for item in items]

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as given, status included; returns the stored copy."""
        rtype = self._type(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or ("default" if rtype.namespaced else None)
        existing = self.get(rtype.api_version, rtype.plural, namespace, str(meta.get("name", "")))
        if existing is None:
            stored = self._store.create(rtype, namespace, obj, keep_status=True)
        else:
            body = {**obj, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
            stored = self._store.replace(rtype, namespace, meta["name"], body, force=True)
        return clone(self._store.present(rtype, stored))

    def preload(self, objects: Sequence[dict[str, Any]]) -> int:
        """Store many objects at once, bypassing admission and watches (benchmark setup)."""
        by_type: dict[ResourceType, list[dict[str, Any]]] = {}
        for obj in objects:
            rtype = self._type(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
            by_type.setdefault(rtype, []).append(obj)
        return sum(self._store.preload(rtype, group) for rtype, group in by_type.items())

    def patch_status(
        self, api_version: str, plural: str, namespace: str | None, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch (RFC 7386) an object's status, as a controller would; returns a copy."""
        rtype = self._type(api_version, plural)
        patched, _ = self._store.patch(
            rtype, namespace, name, kube_patch.MERGE_PATCH, {"status": status}, subresource="status"
        )
        return clone(self._store.present(rtype, patched))

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> bool:
        """Delete like the API does (finalizers only mark it); False when it did not exist."""
        try:
            self._store.delete(self._type(api_version, plural), namespace, name)
        except KubeApiError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    @property
    def resource_version(self) -> int:
        """The resourceVersion of the latest write."""
        return self._store.resource_version

    # -- fault injection and accounting --------------------------------------------------------

    def set_iam(self, iam: Iam | None, anonymous: str = "") -> None:
        """Authorize HTTP requests as GKE's IAM authorizer would (401 for an unknown token, 403
        naming the missing ``container.*`` permission); None switches it off. A request with no
        Authorization header acts as ``anonymous`` (401 when ""): kubectl sends no token to this
        plain-HTTP server (seen with kubectl v1.32 -v=9), so the sandbox maps it to its operator.
        In-process callers (the simulated cluster's controllers) act on the store and are not checked."""
        self._handler.iam = iam
        self._handler.anonymous = anonymous

    def set_list_latency(self, seconds: float) -> None:
        """Delay every list response (each page of a paged list) by ``seconds`` (0: off)."""
        if seconds < 0:
            raise ValueError("list latency must be >= 0")
        self._handler.list_latency = seconds

    def set_down(self, down: bool) -> None:
        """While down, every request is answered 503 (a simulated API outage)."""
        self._faults.set_down(down)

    def fail_next(
        self,
        times: int,
        status: int = 500,
        match: Callable[[str, str], bool] | None = None,
        message: str = "Internal error occurred: injected failure",
    ) -> None:
        """Fail the next ``times`` requests for which ``match(METHOD, path)`` holds (all if None)."""
        self._faults.fail_next(times, status, match, message)

    @property
    def requests(self) -> RequestLog:
        """A snapshot of every request seen, as ``(METHOD, path?query)`` in arrival order."""
        return self._faults.snapshot()

    def clear_requests(self) -> None:
        """Forget the requests seen so far (counting starts again)."""
        self._faults.clear()

    def count(self, method: str | None = None, path_contains: str = "") -> int:
        """How many requests had this method (any if None) and a path?query containing the text."""
        wanted = method.upper() if method else None
        log: RequestLog = self._faults.snapshot()
        return sum(1 for m, p in log if (wanted is None or m == wanted) and path_contains in p)

    # -- admission -----------------------------------------------------------------------------

    def on_create(self, mutate: Callable[[str, str, dict[str, Any]], None]) -> None:
        """Call ``mutate(api_version, kind, obj)`` on every object about to be created.

        A stand-in for a mutating admission webhook (Kueue suspends queued JobSets this way): it
        runs inside the create, over HTTP or direct, and may change ``obj`` in place.
        """
        self._store.create_defaults.append(lambda rtype, obj: mutate(rtype.api_version, rtype.kind, obj))

    # -- change notifications ------------------------------------------------------------------

    def on_change(self, callback: ChangeCallback) -> None:
        """Call ``callback(event_type, obj)`` after every write, in order, on a dispatcher thread.

        Callbacks may use the direct methods or HTTP; ``wait_for_callbacks`` waits for them.
        """
        self._callbacks.append(callback)

    def wait_for_callbacks(self, timeout: float = 10.0) -> None:
        """Block until every change so far has been delivered to the callbacks."""
        done = threading.Event()
        self._changes.put([("__flush__", {"event": done})])
        if self._dispatcher is None or not done.wait(timeout):
            raise TimeoutError("the change callbacks did not catch up in time")

    def _dispatch(self) -> None:
        while (batch := self._changes.get()) is not None:
            for etype, obj in batch:
                if etype == "__flush__":
                    obj["event"].set()
                    continue
                for callback in list(self._callbacks):
                    try:
                        callback(etype, clone(obj))
                    except Exception as exc:  # a broken simulated controller must not stop the others
                        print(f"kube-api: change callback {callback!r} failed: {exc!r}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT, printing its URL on the first stdout line."""
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.emulators.kube.api", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--crd-file", action="append", default=[], help="manifest whose CRDs to preload")
    parser.add_argument("--kubeconfig", type=Path, help="write a kubeconfig for kubectl here")
    parser.add_argument(
        "--no-strict-namespaces", action="store_true", help="allow objects in missing namespaces"
    )
    parser.add_argument("--crd-establish-delay", type=float, default=0.0)
    parser.add_argument("--deployment-ready-delay", type=float, default=0.0)
    parser.add_argument("--namespace-delete-delay", type=float, default=1.0)
    parser.add_argument("--kube-version", default="v1.32.4")
    args = parser.parse_args(argv)
    server = KubeApiServer(
        host=args.host,
        port=args.port,
        crd_files=args.crd_file,
        strict_namespaces=not args.no_strict_namespaces,
        crd_establish_delay=args.crd_establish_delay,
        deployment_ready_delay=args.deployment_ready_delay,
        namespace_delete_delay=args.namespace_delete_delay,
        kube_version=args.kube_version,
    ).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        if args.kubeconfig:
            server.write_kubeconfig(args.kubeconfig)
        print(server.url, flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
