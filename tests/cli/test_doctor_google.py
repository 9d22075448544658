"""The production doctor adapter over real HTTP: Service Usage, IAM, Resource Manager and Cloud Run Admin
answered by a local fake speaking their JSON (pages, 404 for an absent role, Google's error body)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from google.auth.credentials import AnonymousCredentials

from shared.core.errors import TpuProvError
from shared.core.settings import Settings
from tpuprov.doctor.google import ApiRoots, GoogleDeployment
from tpuprov.doctor.views import Expected, RoleView, function_roles

pytestmark = pytest.mark.integration

ENABLED = ["container.googleapis.com", "compute.googleapis.com", "pubsub.googleapis.com"]
RELEASE_ROLE = "projects/p/roles/tpuprov_release"


class _Fake(ThreadingHTTPServer):
    daemon_threads = True
    roles: dict[str, dict[str, Any]]
    bindings: list[dict[str, Any]]
    elsewhere: dict[str, list[dict[str, Any]]]  # another project -> its policy's bindings
    services: dict[str, str]
    denied: set[str]


class _Handler(BaseHTTPRequestHandler):
    server: _Fake

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path in self.server.denied:
            error = {"code": 403, "message": "Permission denied on resource", "status": "PERMISSION_DENIED"}
            return self._answer(403, {"error": error})
        if url.path == "/su/projects/p/services":
            assert parse_qs(url.query)["filter"] == ["state:ENABLED"]
            start = int((parse_qs(url.query).get("pageToken") or ["0"])[0])
            page = [
                {"name": f"projects/1/services/{s}", "config": {"name": s}}
                for s in ENABLED[start : start + 2]
            ]
            more = {"nextPageToken": str(start + 2)} if start + 2 < len(ENABLED) else {}
            return self._answer(200, {"services": page, **more})
        if url.path.startswith("/iam/projects/") and "/roles/" in url.path:
            role = self.server.roles.get(url.path.removeprefix("/iam/"))
            if role is None:
                return self._answer(
                    404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}}
                )
            return self._answer(200, role)
        if url.path.startswith("/run/projects/p/locations/us-central1/services/"):
            name = url.path.rsplit("/", 1)[-1]
            if name not in self.server.services:
                return self._answer(
                    404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}}
                )
            return self._answer(200, {"name": url.path, "uri": self.server.services[name]})
        self._answer(400, {"error": {"code": 400, "message": f"unexpected {url.path}"}})

    def do_POST(self) -> None:
        if self.path == "/crm/projects/p:getIamPolicy":
            return self._answer(200, {"version": 1, "bindings": self.server.bindings})
        project = self.path.removeprefix("/crm/projects/").removesuffix(":getIamPolicy")
        if project in self.server.elsewhere:
            return self._answer(200, {"version": 1, "bindings": self.server.elsewhere[project]})
        self._answer(400, {"error": {"code": 400, "message": f"unexpected {self.path}"}})


@pytest.fixture
def google() -> Iterator[tuple[GoogleDeployment, _Fake]]:
    server = _Fake(("127.0.0.1", 0), _Handler)
    server.roles = {
        RELEASE_ROLE: {"name": RELEASE_ROLE, "includedPermissions": list(function_roles()["release"])[:-1]},
    }
    server.bindings = [
        {"role": RELEASE_ROLE, "members": ["serviceAccount:tpuprov-release@p.iam.gserviceaccount.com"]},
        {
            "role": "roles/container.admin",
            "members": ["serviceAccount:tpuprov-setup@p.iam.gserviceaccount.com"],
        },
    ]
    server.services = {"tpuprov-release": "https://tpuprov-release-abc-uc.a.run.app"}
    reader = "projects/owner-proj/roles/tpuprov_reservation_reader"
    server.roles[reader] = {"name": reader, "includedPermissions": ["compute.reservations.get"]}
    server.elsewhere = {
        "owner-proj": [
            {"role": reader, "members": ["serviceAccount:tpuprov-provision@p.iam.gserviceaccount.com"]}
        ]
    }
    server.denied = set()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    roots = ApiRoots(f"{base}/su", f"{base}/iam", f"{base}/crm", f"{base}/run")
    deployment = GoogleDeployment(
        Settings(unlimited_spending=True, project_id="p"), Expected("p"), "us-central1", roots
    )
    deployment.__dict__["_credentials"] = AnonymousCredentials()  # no ADC on a test machine
    try:
        yield deployment, server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_reads_enabled_services_across_pages(google: tuple[GoogleDeployment, _Fake]) -> None:
    assert google[0].enabled_services() == frozenset(ENABLED)


def test_reads_what_a_function_holds_in_another_project(google: tuple[GoogleDeployment, _Fake]) -> None:
    deployment, _ = google
    # The roles bound there to the function's account, each read for its permissions.
    assert deployment.held_in("owner-proj", "provision") == frozenset({"compute.reservations.get"})
    assert deployment.held_in("owner-proj", "reconcile") == frozenset()


def test_reads_roles_and_their_bindings(google: tuple[GoogleDeployment, _Fake]) -> None:
    deployment, _ = google
    release = function_roles()["release"]
    assert deployment.role("release") == RoleView(
        "release", RELEASE_ROLE, True, frozenset(release[:-1]), True
    )
    assert deployment.role("provision") == RoleView(
        "provision", "projects/p/roles/tpuprov_provision", False, frozenset(), False
    )
    assert deployment.role("setup_cluster") == RoleView(
        "setup_cluster", "roles/container.admin", True, frozenset(), True
    )


def test_reads_the_cloud_run_url(google: tuple[GoogleDeployment, _Fake]) -> None:
    deployment, _ = google
    assert deployment.function_url("release") == "https://tpuprov-release-abc-uc.a.run.app"
    assert deployment.function_url("provision") == ""


def test_a_refused_read_names_the_call_and_googles_message(google: tuple[GoogleDeployment, _Fake]) -> None:
    deployment, server = google
    server.denied.add("/su/projects/p/services")
    with pytest.raises(TpuProvError, match=r"HTTP 403: Permission denied on resource") as refused:
        deployment.enabled_services()
    assert "/su/projects/p/services" in refused.value.why
