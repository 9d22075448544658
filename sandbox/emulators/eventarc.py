"""An Eventarc-shaped relay between the Pub/Sub emulator's push subscriptions and the functions.

In production a push subscription (infra: ``push_endpoint = <service>/projects/P/topics/T``)
delivers each message to Cloud Run as a binary-mode CloudEvent. The emulator's push is a plain JSON
POST, so the sandbox points the subscriptions at this relay instead: it rebuilds the CloudEvent with
``shared.events.entries`` (the one definition of the shape), posts it to the function
that owns the topic, and answers the emulator with the function's status. A 2xx acknowledges the
message; anything else (including an unreachable function) makes the emulator redeliver with the
subscription's backoff, exactly the contract the functions rely on.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sandbox.emulators.serving import BackgroundServer
from shared.events.entries import binary_cloudevent_headers, eventarc_body

_PUSH_PATH = re.compile(r"^/projects/([^/]+)/topics/([^/?]+)$")
UNREACHABLE = 599  # recorded (and answered as 502) when the function cannot be reached at all


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One push the relay forwarded: which message, to which function, and how it went."""

    t: float  # monotonic time when the push arrived
    topic: str
    subscription: str
    message_id: str
    function: str
    status: int
    latency: float  # seconds the function took to answer
    attempt: int  # 1 for the first delivery of this message id, 2 for the first redelivery...

    @property
    def acked(self) -> bool:
        """Whether the emulator takes this answer as an acknowledgement."""
        return 200 <= self.status < 300


DeliveryListener = Callable[[Delivery], None]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    relay: EventarcRelay


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = 30  # a client that connects and never sends must not pin a thread forever

    def log_message(self, format: str, *args: Any) -> None:
        """Deliveries are recorded on the relay instead of printed."""

    def do_POST(self) -> None:
        """Forward one push."""
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        code = self.server.relay._forward(self.path, body)
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()


class EventarcRelay:
    """HTTP server on 127.0.0.1 turning emulator pushes into Eventarc CloudEvent requests."""

    def __init__(
        self,
        project: str,
        routes: Mapping[str, tuple[str, str]] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout: float = 60.0,
    ) -> None:
        """``routes`` maps a topic name to ``(function name, function URL)``."""
        self.project = project
        self._routes: dict[str, tuple[str, str]] = dict(routes or {})
        self._host, self._port = host, port
        self._timeout = timeout
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self._attempts: Counter[str] = Counter()
        self._listeners: list[DeliveryListener] = []
        self._serving: BackgroundServer | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` once started."""
        if self._serving is None:
            raise RuntimeError("relay is not started")
        return self._serving.url

    def start(self) -> EventarcRelay:
        """Bind and serve on a background thread."""
        if self._serving is None:
            server = _Server((self._host, self._port), _Handler)
            server.relay = self
            self._serving = BackgroundServer(server, "relay")
        return self

    def stop(self) -> None:
        """Stop serving and join the server thread."""
        serving, self._serving = self._serving, None
        if serving is not None:
            serving.stop()

    def __enter__(self) -> EventarcRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration and inspection -----------------------------------------------------------

    def push_endpoint(self, topic: str) -> str:
        """The URL a push subscription of ``topic`` targets (the path infra uses on Cloud Run)."""
        return f"{self.url}/projects/{self.project}/topics/{topic}"

    def route(self, topic: str, function: str, function_url: str) -> None:
        """Send pushes of ``topic`` to ``function`` at ``function_url``."""
        with self._lock:
            self._routes[topic] = (function, function_url)

    def listen(self, listener: DeliveryListener) -> None:
        """Call ``listener`` after every forwarded push."""
        with self._lock:
            self._listeners.append(listener)

    @property
    def deliveries(self) -> list[Delivery]:
        """Every push so far, in arrival order of the answers."""
        with self._lock:
            return list(self._deliveries)

    def count(self, function: str | None = None, status: int | None = None, acked: bool | None = None) -> int:
        """How many pushes matched: by function, exact status, or acknowledged or not."""
        return sum(
            1
            for d in self.deliveries
            if (function is None or d.function == function)
            and (status is None or d.status == status)
            and (acked is None or d.acked == acked)
        )

    # -- forwarding -----------------------------------------------------------------------------

    def _forward(self, path: str, body: bytes) -> int:
        arrived = time.monotonic()
        match = _PUSH_PATH.match(path.split("?", 1)[0])
        try:
            push = json.loads(body or b"{}")
        except ValueError:
            push = None
        if match is None or not isinstance(push, dict) or not isinstance(push.get("message"), dict):
            # Not a push we understand: 400 would make the emulator retry forever; it is a bug here.
            return 400
        topic = match.group(2)
        with self._lock:
            route = self._routes.get(topic)
        if route is None:
            return 404
        function, function_url = route
        message: dict[str, Any] = push["message"]
        message.setdefault("messageId", message.get("message_id", ""))
        message.setdefault("publishTime", message.get("publish_time", ""))
        subscription = str(push.get("subscription", ""))
        topic_path = f"projects/{match.group(1)}/topics/{topic}"
        headers = binary_cloudevent_headers(message, topic_path)
        data = json.dumps(eventarc_body(message, subscription)).encode()
        request = urllib.request.Request(function_url, data=data, headers=headers, method="POST")
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                response.read()
                status = int(response.status)
        except urllib.error.HTTPError as err:
            status = int(err.code)
        except (OSError, urllib.error.URLError):
            status = UNREACHABLE
        latency = time.monotonic() - started
        message_id = str(message.get("messageId", ""))
        with self._lock:
            self._attempts[message_id] += 1
            delivery = Delivery(
                t=arrived,
                topic=topic,
                subscription=subscription,
                message_id=message_id,
                function=function,
                status=status,
                latency=latency,
                attempt=self._attempts[message_id],
            )
            self._deliveries.append(delivery)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(delivery)
            except Exception:
                continue  # a broken listener must not turn a delivery into a redelivery
        return 502 if status == UNREACHABLE else status
