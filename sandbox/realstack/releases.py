"""JobSet and Kueue as the product's ``setup_cluster`` installs them, their controllers run here.

``setup_cluster`` server-side applies the unmodified release manifests. Their webhooks and CRD
conversion name the controllers' Services, and their Deployments ask for a controller pod. The
sandbox then does what envtest does for a controller run outside the cluster: as soon as a
webhook configuration or CRD of a release appears, it repoints every webhook naming that release's
namespace at ``https://127.0.0.1:<port><path>`` with the cluster CA as ``caBundle``, deletes
Kueue's visibility APIServices (an aggregated API is reachable only through a Service) and starts
the controller as a local process under the release's own ServiceAccount
(``sandbox.kube.addons.run_controller``). The Deployment's pod is played by KWOK on the default
pool's Nodes, so ``setup_cluster`` sees it Available as on GKE, while the local process does the
work. Until the repoint lands, a call to a webhook fails at once: the control plane's network
namespace has only ``lo`` (``sandbox.kube.netns``). A later re-apply by ``setup_cluster`` is
repointed again.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Mapping
from typing import Any

from sandbox.emulators.sockets import free_ports
from sandbox.jobsets import cpu_jobset
from sandbox.kube import addons
from sandbox.kube.api import ApiError
from sandbox.kube.cluster import RealCluster
from shared.cloud.objects import FIELD_MANAGER

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
HOOK_KINDS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
API_SERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"
DEPLOYMENTS = "/apis/apps/v1/namespaces/{ns}/deployments/{name}"
_TYPES = {
    "mutatingwebhookconfigurations": {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
    },
    "validatingwebhookconfigurations": {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
    },
    "customresourcedefinitions": {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
    },
}


class ReleaseWiring:
    """Repoints the releases' webhooks and starts their controllers (see the module docstring)."""

    def __init__(
        self, cluster: RealCluster, releases: tuple[addons.Addon, ...] = (addons.JOBSET, addons.KUEUE)
    ):
        self.cluster = cluster
        self.api = cluster.client()
        self.releases = releases
        ports = free_ports(len(releases))
        self.installed = {a.namespace: addons.Installed(a, p) for a, p in zip(releases, ports, strict=True)}
        self.ca = base64.b64encode(cluster.ca_pem).decode()
        self.repointed: list[str] = []  # "<kind>/<name>" of every object repointed, in order
        self.started: dict[str, threading.Thread] = {}
        self.errors: list[str] = []
        self._ready: dict[str, threading.Event] = {a.name: threading.Event() for a in releases}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="release-wiring", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def wait_ready(self, name: str, timeout: float) -> bool:
        """Whether, within ``timeout`` seconds, release ``name``'s local controller serves and no
        webhook or CRD conversion names its Service any more (the controller may be up before the
        loop's next pass repoints a configuration applied meanwhile)."""
        deadline = time.monotonic() + timeout
        if not self._ready[name].wait(timeout):
            return False
        namespace = next(a.namespace for a in self.releases if a.name == name)
        while self.unwired(namespace):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def unwired(self, namespace: str) -> list[str]:
        """``<kind>/<name>`` of every webhook configuration and CRD still naming a Service of
        ``namespace`` (what the API server would try to dial and fail)."""
        found = []
        for kind in HOOK_KINDS:
            for config in self.api.list(f"{ADMISSION}/{kind}"):
                hooks = config.get("webhooks") or []
                if any(_service_namespace(h.get("clientConfig") or {}) == namespace for h in hooks):
                    found.append(f"{kind}/{config['metadata']['name']}")
        for crd in self.api.list(CRDS):
            webhook = ((crd.get("spec") or {}).get("conversion") or {}).get("webhook") or {}
            if _service_namespace(webhook.get("clientConfig") or {}) == namespace:
                found.append(f"customresourcedefinitions/{crd['metadata']['name']}")
        return found

    def admits_jobsets(self, namespace: str = "default") -> bool:
        """Whether a JobSet create reaches every webhook now: a server-side dry run (webhooks run,
        nothing is stored) that the API server did not fail for a webhook it could not call. The
        repoint is read back by the API server's own watch, a moment after it is written."""
        probe = cpu_jobset("webhook-probe", namespace)
        probe["metadata"].pop("uid", None)
        path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"
        try:
            self.api.request("POST", path, probe, query={"dryRun": "All"})
        except ApiError as exc:
            return not (exc.status >= 500 and "failed calling webhook" in exc.message)
        return True

    def _local(self, client_config: Mapping[str, Any]) -> dict[str, Any] | None:
        service = client_config.get("service") or {}
        installed = self.installed.get(str(service.get("namespace", "")))
        if installed is None:
            return None
        return {
            "url": f"https://127.0.0.1:{installed.webhook_port}{service.get('path', '/')}",
            "caBundle": self.ca,
        }

    def _repoint_hooks(self) -> None:
        for kind in HOOK_KINDS:
            for config in self.api.list(f"{ADMISSION}/{kind}"):
                changed = False
                for hook in config.get("webhooks") or []:
                    local = self._local(hook.get("clientConfig") or {})
                    if local is not None:
                        hook["clientConfig"], changed = local, True
                if changed:
                    self._update(f"{ADMISSION}/{kind}/{config['metadata']['name']}", config, kind)

    def _repoint_crds(self) -> None:
        for crd in self.api.list(CRDS):
            webhook = ((crd.get("spec") or {}).get("conversion") or {}).get("webhook") or {}
            local = self._local(webhook.get("clientConfig") or {})
            if local is not None:
                webhook["clientConfig"] = local
                self._update(f"{CRDS}/{crd['metadata']['name']}", crd, "customresourcedefinitions")

    def _update(self, path: str, obj: dict[str, Any], kind: str) -> None:
        # Written as part of setup_cluster's own applied configuration (its field manager), so its
        # next apply of the release replaces the url with the Service again instead of adding the
        # Service beside it (the API server refuses a webhook with both); the loop then repoints.
        body = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}
        body.update(_TYPES[kind])  # list items carry no apiVersion and kind; an apply needs them
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        try:
            # resourceVersion as read: a concurrent apply wins (409), the next pass repoints again
            self.api.request("PATCH", path, body, content_type="application/apply-patch+yaml", query=query)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
            return
        self.repointed.append(f"{kind}/{obj['metadata']['name']}")

    def _drop_api_services(self) -> None:
        for release in self.releases:
            for name in release.api_services:
                if self.api.delete(f"{API_SERVICES}/{name}"):
                    self.repointed.append(f"apiservices/{name} (deleted)")

    def _start_controllers(self) -> None:
        for installed in self.installed.values():
            release = installed.addon
            if release.name in self.started:
                continue
            path = DEPLOYMENTS.format(ns=release.namespace, name=release.deployment)
            if self.api.get(path) is None:
                continue  # setup_cluster has not reached this release's Deployment yet
            thread = threading.Thread(
                target=self._run_controller, args=(installed,), name=f"start-{release.name}", daemon=True
            )
            self.started[release.name] = thread
            thread.start()

    def _run_controller(self, installed: addons.Installed) -> None:
        try:
            addons.run_controller(self.cluster, installed)
        except Exception as exc:  # reported by wait_ready's caller through errors
            self.errors.append(f"{installed.addon.name}: {exc}")
            return
        self._ready[installed.addon.name].set()

    def _loop(self) -> None:
        interval = 0.3
        while not self._stop.wait(interval):
            try:
                self._repoint_hooks()
                self._repoint_crds()
                self._drop_api_services()
                self._start_controllers()
            except (ApiError, OSError) as exc:
                self.errors.append(repr(exc))
            # Once both controllers serve, only a re-apply can undo the repoint: look less often.
            interval = 2.0 if all(e.is_set() for e in self._ready.values()) else 0.3


def _service_namespace(client_config: Mapping[str, Any]) -> str:
    return str((client_config.get("service") or {}).get("namespace", ""))
