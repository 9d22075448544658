"""What the sandbox's HTTP emulators share: a threaded server on a loopback port, served on a
background thread and stopped by its owner, and the routing of a request to one API method."""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Route = tuple[str, "re.Pattern[str]", str]  # (HTTP verb, path pattern, method kind)


class BackgroundServer:
    """One bound ``ThreadingHTTPServer`` served on a daemon thread until ``stop``."""

    def __init__(self, server: ThreadingHTTPServer, name: str) -> None:
        self.server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` the server is bound to."""
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        """Stop serving, release the port and join the thread."""
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def request_body(request: BaseHTTPRequestHandler) -> bytes:
    """The request's body (empty without a Content-Length)."""
    length = int(request.headers.get("Content-Length") or 0)
    return request.rfile.read(length) if length else b""


def request_path(request: BaseHTTPRequestHandler) -> str:
    """The request's path, percent-decoded, without its query."""
    return urllib.parse.unquote(urllib.parse.urlsplit(request.path).path)


def route(routes: Sequence[Route], verb: str, path: str) -> tuple[str, tuple[str, ...]] | None:
    """The method kind and path parameters of the first route matching ``verb path``."""
    for method, pattern, kind in routes:
        if method == verb and (match := pattern.match(path)):
            return kind, match.groups()
    return None


__all__ = ["BackgroundServer", "Route", "request_body", "request_path", "route"]
