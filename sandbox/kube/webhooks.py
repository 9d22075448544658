"""A validating admission webhook on loopback that fails on purpose: a controller's webhook being down.

Kueue's and JobSet's webhooks are ``failurePolicy: Fail``: while their server is down or answers an
error, the API server refuses the write with its own 500 "failed calling webhook" text, and the
product must retry, then hand the message back for redelivery. ``FailingWebhook`` registers a
ValidatingWebhookConfiguration for one resource and serves it with a certificate from the cluster's
CA; the first ``failures`` reviews of real (not dry-run) writes get HTTP 500, every later one is
allowed. Dry-run writes are allowed and not counted: ``start`` uses one to wait until the API server
calls the webhook at all.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sandbox.kube.api import ApiError
from sandbox.kube.cluster import RealCluster

CONFIGS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


class FailingWebhook:
    """A webhook named ``name`` on writes of the cluster-scoped ``group/version`` ``resource`` of
    ``kind`` (see the module docstring)."""

    def __init__(
        self, cluster: RealCluster, name: str, group: str, version: str, resource: str, kind: str
    ) -> None:
        self.cluster = cluster
        self.name, self.group, self.version, self.resource, self.kind = name, group, version, resource, kind
        self.failures = 0
        self.failed = 0  # reviews answered 500 so far
        self.dry_runs = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def _answer(self, review: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = review.get("request") or {}
        with self._lock:
            if request.get("dryRun"):
                self.dry_runs += 1
            elif self.failed < self.failures:
                self.failed += 1
                return 500, {"message": "webhook down"}
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": request.get("uid", ""), "allowed": True},
        }
        return 200, body

    def start(self) -> FailingWebhook:
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, body = webhook._answer(json.loads(self.rfile.read(length) or b"{}"))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        pair = self.cluster.issue_serving_cert(f"webhook-{self.name}")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(pair.cert, pair.key)
        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, name=f"webhook-{self.name}", daemon=True).start()
        self.cluster.client().apply(self._configuration(server.server_address[1]), f"{CONFIGS}/{self.name}")
        self._wait(lambda: self.dry_runs > 0, "the API server to call the webhook")
        return self

    def _configuration(self, port: int) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                {
                    "name": self.name,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/validate",
                        "caBundle": base64.b64encode(self.cluster.ca_pem).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [self.group],
                            "apiVersions": [self.version],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": [self.resource],
                        }
                    ],
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        }

    def _probe(self) -> bool:
        """A dry-run create of a (cluster-scoped) object; True when the API server let it through."""
        collection = f"/apis/{self.group}/{self.version}/{self.resource}"
        probe = {
            "apiVersion": f"{self.group}/{self.version}",
            "kind": self.kind,
            "metadata": {"name": "webhook-probe"},
            "spec": {},
        }
        try:
            self.cluster.client().request("POST", collection, probe, query={"dryRun": "All"})
        except ApiError:
            return False
        return True

    def _wait(self, done: Any, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:.0f}s for {what}")
            self._probe()
            time.sleep(0.02)

    def stop(self) -> None:
        """Delete the configuration, wait until the API server no longer calls the webhook, stop it."""
        self.cluster.client().delete(f"{CONFIGS}/{self.name}")
        with self._lock:
            self.failures = 0

        def forgotten() -> bool:
            before = self.dry_runs
            return self._probe() and self.dry_runs == before

        self._wait(forgotten, "the API server to drop the webhook")
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
