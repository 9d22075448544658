"""The IAM half of GKE's authorization, as far as a refused request shows it: the permission it needed.

On GKE a Kubernetes request is allowed when RBAC or IAM allows it, and the 403 of a request both
refuse carries IAM's reason: ``... at the cluster scope: requires one of ["container.nodes.update"]
permission(s).`` The product reads that permission (``shared.cloud.permissions.denied_permission``)
to log which role to fix. The sandbox grants each function its IAM role as RBAC (``sandbox.kube.rbac``),
so RBAC decides here. This authorization webhook comes last in the API server's chain and is asked
only about the functions' service accounts, only after RBAC found no rule: it never allows anything,
it answers "no opinion" with the permission the request maps to, and the API server appends that
reason to its Forbidden message as GKE's does. Decisions are not cached, so a role changed during a
test takes effect at once.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from sandbox.kube import rbac

SERVICE_ACCOUNT_SUFFIX = "@sandbox.iam.gserviceaccount.com"
SAR_API = "authorization.k8s.io/v1"


def reason(review: dict[str, Any]) -> str:
    """IAM's reason for a SubjectAccessReview that RBAC did not allow ("" when no permission covers it)."""
    attributes = (review.get("spec") or {}).get("resourceAttributes")
    if not isinstance(attributes, dict):
        return ""
    permission = rbac.permission_for(
        str(attributes.get("verb", "")),
        str(attributes.get("group", "")),
        str(attributes.get("resource", "")),
        str(attributes.get("subresource", "")),
    )
    return f'requires one of ["{permission}"] permission(s).' if permission else ""


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            review = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            review = {}
        status = {"allowed": False, "reason": reason(review if isinstance(review, dict) else {})}
        body = json.dumps({"apiVersion": SAR_API, "kind": "SubjectAccessReview", "status": status}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class IamReasonWebhook:
    """The webhook server (HTTPS on loopback, a certificate of the cluster's CA) and its config files."""

    def __init__(self, directory: Path, cert: Path, key: Path, ca_pem: bytes) -> None:
        self.directory = directory
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._ca_pem = ca_pem
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._server.server_address[1]}/authorize"

    def start(self) -> Path:
        """Serve; return the ``--authorization-config`` file: Node, RBAC, then this webhook."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="iam-reason", daemon=True)
        self._thread.start()
        return self._write_configs()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _write_configs(self) -> Path:
        kubeconfig = self.directory / "iam-webhook-kubeconfig"
        cluster = {"server": self.url, "certificate-authority-data": base64.b64encode(self._ca_pem).decode()}
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "iam", "cluster": cluster}],
                    "users": [{"name": "apiserver", "user": {}}],
                    "contexts": [{"name": "iam", "context": {"cluster": "iam", "user": "apiserver"}}],
                    "current-context": "iam",
                }
            )
        )
        webhook = {
            "timeout": "3s",
            "authorizedTTL": "0s",
            "cacheAuthorizedRequests": False,
            "unauthorizedTTL": "0s",
            "cacheUnauthorizedRequests": False,
            "subjectAccessReviewVersion": "v1",
            "matchConditionSubjectAccessReviewVersion": "v1",
            # Unreachable: the request is refused as RBAC refused it, only without IAM's reason.
            "failurePolicy": "NoOpinion",
            "connectionInfo": {"type": "KubeConfigFile", "kubeConfigFile": str(kubeconfig)},
            "matchConditions": [{"expression": f"request.user.endsWith('{SERVICE_ACCOUNT_SUFFIX}')"}],
        }
        config = self.directory / "authorization-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.config.k8s.io/v1",
                    "kind": "AuthorizationConfiguration",
                    "authorizers": [
                        {"type": "Node", "name": "node"},
                        {"type": "RBAC", "name": "rbac"},
                        {"type": "Webhook", "name": "gke-iam.sandbox.local", "webhook": webhook},
                    ],
                },
                sort_keys=False,
            )
        )
        return config
