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

Versions: the controller started is the one of the version the Deployment deploys (the installer's
stamp, else the image tag: ``shared.setup.manifests.deployed_version``), the pinned binaries or an
extra version's from ``sandbox.kube.build`` (``make test-matrix``). When the Deployment's pod
template changes (``setup_cluster`` upgrading the release, an operator's ``kubectl rollout
restart`` after editing Kueue's ConfigMap), the local controller is stopped and started again from
the new template's version and the ConfigMap as it is then, as the Deployment's rollout would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sandbox.emulators.sockets import free_ports
from sandbox.jobsets import cpu_jobset
from sandbox.kube import addons, build
from sandbox.kube.api import ApiError
from sandbox.kube.cluster import RealCluster
from shared.cloud.objects import FIELD_MANAGER
from shared.setup import manifests

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


def built_binary(name: str, version: str) -> Path:
    """The controller binary of ``name`` at ``version`` (``sandbox.kube.build``); FileNotFoundError
    naming the build command when that version was not built."""
    release = build.Release(name, version)
    if not release.binary.exists():
        raise FileNotFoundError(
            f"no {name} {version} controller in {release.binary}: "
            f"python -m sandbox.kube.build --versions {release}"
        )
    return release.binary


def _template_digest(deployment: Mapping[str, Any]) -> str:
    template = (deployment.get("spec") or {}).get("template") or {}
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()


class ReleaseWiring:
    """Repoints the releases' webhooks and starts their controllers (see the module docstring)."""

    def __init__(
        self,
        cluster: RealCluster,
        releases: tuple[addons.Addon, ...] = (addons.JOBSET, addons.KUEUE),
        binary_for: Callable[[str, str], Path] = built_binary,
    ):
        self.cluster = cluster
        self.binary_for = binary_for
        # release name -> (version, pod template digest) of the controller started last
        self.running: dict[str, tuple[str, str]] = {}
        self.restarts: list[str] = []  # "<name> <old version> -> <new version>", in order
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

    def garbage_collector_knows_jobsets(self, timeout: float, namespace: str = "default") -> bool:
        """Whether, within ``timeout`` seconds, the controller manager's garbage collector acts on a
        deleted JobSet. It watches only the kinds it found at its last discovery pass, and it passes
        every 30 s (kubernetes v1.36 cmd/kube-controller-manager/app/core.go, ``syncPeriod``): until
        then a deleted JobSet's Jobs survive and JobSet's controller counts them for a new JobSet of
        the same name, which a long-lived GKE cluster never shows. The probe is one suspended JobSet
        deleted in the foreground: the API server keeps it, with the ``foregroundDeletion``
        finalizer, until the garbage collector has deleted its Jobs and seen it through a watch of
        the JobSet kind (Kubernetes "Garbage Collection", foreground cascading deletion)."""
        probe = cpu_jobset("sandbox-gc-probe", namespace)
        probe["metadata"].pop("uid", None)
        probe["spec"]["suspend"] = True
        collection = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"
        path = f"{collection}/sandbox-gc-probe"
        self.api.create(collection, probe)
        self.api.request("DELETE", path, {"propagationPolicy": "Foreground"})
        deadline = time.monotonic() + timeout
        while self.api.get(path) is not None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
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

    def _apply(self, path: str, obj: dict[str, Any], kind: str, manager: str, force: bool) -> bool:
        body = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}
        body.update(_TYPES[kind])  # list items carry no apiVersion and kind; an apply needs them
        query = {"fieldManager": manager, **({"force": "true"} if force else {})}
        try:
            # resourceVersion as read: a concurrent apply wins (409), the next pass repoints again
            self.api.request("PATCH", path, body, content_type="application/apply-patch+yaml", query=query)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
            return False
        return True

    def _adopt(self, path: str, obj: dict[str, Any], kind: str) -> bool:
        """Make setup_cluster's field manager the only applier of a release object another manager
        applied (an operator's ``kubectl apply --server-side``, as xpk installs); True when it did
        (the next pass repoints what it reads then). Otherwise the Service that manager applied
        stays beside the url and the API server refuses the webhook. setup_cluster's own forced
        apply over it would share those fields the same way; here the other manager then lets go
        of them (its apply of nothing), so the repoint and setup's next apply own them alone."""
        others = {
            entry["manager"]
            for entry in obj["metadata"].get("managedFields") or []
            if entry.get("operation") == "Apply" and entry.get("manager") != FIELD_MANAGER
        }
        if not others:
            return False
        current = self.api.get(path)
        if current is None or not self._apply(path, current, kind, FIELD_MANAGER, force=True):
            return True
        bare = {"metadata": {"name": current["metadata"]["name"]}}
        for manager in sorted(others):
            self._apply(path, bare, kind, manager, force=False)
        self.repointed.append(f"{kind}/{obj['metadata']['name']} (adopted from {', '.join(sorted(others))})")
        return True

    def _update(self, path: str, obj: dict[str, Any], kind: str) -> None:
        # Written as part of setup_cluster's own applied configuration (its field manager), so its
        # next apply of the release replaces the url with the Service again instead of adding the
        # Service beside it (the API server refuses a webhook with both); the loop then repoints.
        if not self._adopt(path, obj, kind) and self._apply(path, obj, kind, FIELD_MANAGER, force=True):
            self.repointed.append(f"{kind}/{obj['metadata']['name']}")

    def _drop_api_services(self) -> None:
        for release in self.releases:
            for name in release.api_services:
                if self.api.delete(f"{API_SERVICES}/{name}"):
                    self.repointed.append(f"apiservices/{name} (deleted)")

    def _start_controllers(self) -> None:
        for installed in self.installed.values():
            release = installed.addon
            path = DEPLOYMENTS.format(ns=release.namespace, name=release.deployment)
            deployment = self.api.get(path)
            if deployment is None:
                continue  # setup_cluster has not reached this release's Deployment yet
            component = next(c for c in manifests.COMPONENTS if c.name == release.name)
            wanted = (manifests.deployed_version(deployment, component), _template_digest(deployment))
            if release.name in self.started:
                if self.running.get(release.name) == wanted or self.started[release.name].is_alive():
                    continue  # unchanged, or a start still under way (compared again next pass)
                self.restarts.append(f"{release.name} {self.running[release.name][0]} -> {wanted[0]}")
                self._ready[release.name].clear()
            self.running[release.name] = wanted
            thread = threading.Thread(
                target=self._run_controller,
                args=(installed, wanted[0]),
                name=f"start-{release.name}",
                daemon=True,
            )
            self.started[release.name] = thread
            thread.start()

    def _run_controller(self, installed: addons.Installed, version: str) -> None:
        name = installed.addon.name
        try:
            previous = self.cluster.procs.get(name)
            if previous is not None:
                previous.stop(grace=5.0)  # the old pod goes before the new one serves on its port
            binary = self.binary_for(name, version)
            installed = addons.Installed(installed.addon, installed.webhook_port, binary)
            addons.run_controller(self.cluster, installed)
        except Exception as exc:  # reported by wait_ready's caller through errors
            self.errors.append(f"{name} {version}: {exc}")
            return
        self._ready[name].set()

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
