"""The JobSet controller and Kueue's controller manager as local processes, webhooks included.

The release manifests install everything a cluster needs (CRDs, RBAC, the webhook configurations,
a Deployment of the controller). Here the controller runs on this machine instead of in a pod,
the way envtest runs one: under the identity of the manifest's own ServiceAccount (a token from
the TokenRequest API, so it has exactly the release's RBAC), serving its webhooks on loopback with
a certificate from the cluster's CA.

The manifest is rewritten before it is applied, never after: every webhook of the release
(admission and CRD conversion) points at ``https://127.0.0.1:<port><path>`` with the CA as
``caBundle`` instead of at its Service, the Deployment has no replicas (the local process is the
controller) and Kueue's visibility APIServices are left out. A Service reference would make the
API server dial the Service's cluster IP, an address off this machine; an aggregated API can only
be reached through a Service, and loopback is not an endpoint address.
"""

from __future__ import annotations

import base64
import copy
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sandbox.emulators.sockets import free_ports
from sandbox.kube import build
from sandbox.kube.api import KubeClient
from sandbox.kube.cluster import RealCluster

MANIFESTS = Path(__file__).resolve().parents[3] / "shared" / "manifests"
TOKEN_SECONDS = 24 * 3600


@dataclass(frozen=True)
class Addon:
    """Where a release's controller lives in its manifest."""

    name: str
    namespace: str
    service_account: str
    deployment: str
    config_map: str
    manifest: str
    api_services: tuple[str, ...] = ()


JOBSET = Addon(
    "jobset",
    "jobset-system",
    "jobset-controller-manager",
    "jobset-controller-manager",
    "jobset-manager-config",
    "jobset-v0.10.1.yaml",
)
KUEUE = Addon(
    "kueue",
    "kueue-system",
    "kueue-controller-manager",
    "kueue-controller-manager",
    "kueue-manager-config",
    "kueue-v0.19.2.yaml",
    ("v1beta1.visibility.kueue.x-k8s.io", "v1beta2.visibility.kueue.x-k8s.io"),
)


@dataclass(frozen=True)
class Installed:
    """A release applied to a cluster, its webhooks expecting a server on ``webhook_port``;
    ``binary`` is the controller of another version than the pinned one (``build.Release``)."""

    addon: Addon
    webhook_port: int
    binary: Path | None = None


def _local_client_config(
    client_config: Mapping[str, Any], addon: Addon, port: int, ca: str
) -> dict[str, Any]:
    service = client_config.get("service") or {}
    if service.get("namespace") != addon.namespace:
        return dict(client_config)
    return {"url": f"https://127.0.0.1:{port}{service.get('path', '/')}", "caBundle": ca}


def local_release(docs: list[dict[str, Any]], addon: Addon, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The release's objects as this sandbox installs them (see the module docstring)."""
    ca = base64.b64encode(ca_pem).decode()
    out = []
    for doc in copy.deepcopy(docs):
        kind = doc.get("kind")
        if kind == "APIService" and doc["metadata"]["name"] in addon.api_services:
            continue
        if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in doc.get("webhooks") or []:
                hook["clientConfig"] = _local_client_config(hook["clientConfig"], addon, port, ca)
        if kind == "CustomResourceDefinition":
            webhook = (doc["spec"].get("conversion") or {}).get("webhook")
            if webhook and webhook.get("clientConfig"):
                webhook["clientConfig"] = _local_client_config(webhook["clientConfig"], addon, port, ca)
        if kind == "Deployment" and doc["metadata"]["name"] == addon.deployment:
            doc["spec"]["replicas"] = 0
        out.append(doc)
    return out


def apply_release(cluster: RealCluster, addon: Addon, manifests: Path = MANIFESTS) -> Installed:
    """Server-side apply of the addon's release, rewritten for local controllers, with kubectl."""
    docs = [d for d in yaml.safe_load_all((manifests / addon.manifest).read_text()) if d]
    (port,) = free_ports(1)
    text = yaml.safe_dump_all(local_release(docs, addon, port, cluster.ca_pem), sort_keys=False)
    result = cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=text, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"applying {addon.manifest} failed:\n{result.stderr}")
    return Installed(addon, port)


def _wait_for(api: KubeClient, path: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while (found := api.get(path)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear in {timeout:.0f}s")
        time.sleep(0.2)
    return found


def _controller_config(raw: str, addon: Addon, webhook_port: int, health_port: int, cert_dir: Path) -> str:
    config = yaml.safe_load(raw)
    config["internalCertManagement"] = {"enable": False}  # certificates come from the sandbox CA
    config["webhook"] = {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)}
    config["health"] = {"healthProbeBindAddress": f"127.0.0.1:{health_port}"}
    config["metrics"] = {"bindAddress": "0"}  # off: nothing scrapes it here
    config.setdefault("leaderElection", {})["leaderElect"] = False
    if addon is KUEUE:
        config["namespace"] = addon.namespace
        config.pop("pprofBindAddress", None)
    return yaml.safe_dump(config, sort_keys=False)


# Kueue without its internal cert management reads its metrics certificate from this fixed path
# (cmd/kueue/main.go), even with metrics off, and exits when it is missing.
_KUEUE_METRICS_CERTS = Path("kueue/metrics/certs")
# Mount an overlay of /etc whose upper layer holds those certificates, then exec the controller:
# in its own mount namespace, so the machine's /etc is never written.
_OVERLAY_ETC = (
    'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && exec "$@"'
)


def _with_kueue_metrics_certs(workdir: Path, cert_dir: Path, argv: list[str]) -> list[str]:
    upper, work = workdir / "kueue-etc" / "upper", workdir / "kueue-etc" / "work"
    certs = upper / _KUEUE_METRICS_CERTS
    certs.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        shutil.copyfile(cert_dir / name, certs / name)
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        _OVERLAY_ETC,
        "sh",
        str(upper),
        str(work),
        *argv,
    ]


def run_controller(cluster: RealCluster, installed: Installed, timeout: float = 120.0) -> None:
    """Start the release's controller locally (see the module docstring) and wait until it is ready."""
    addon = installed.addon
    api = cluster.client()
    ns = addon.namespace
    _wait_for(api, f"/api/v1/namespaces/{ns}/serviceaccounts/{addon.service_account}", timeout)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
    token = api.create(
        f"/api/v1/namespaces/{ns}/serviceaccounts/{addon.service_account}/token",
        {**request, "spec": {"expirationSeconds": TOKEN_SECONDS}},
    )["status"]["token"]
    kubeconfig = cluster.write_kubeconfig(addon.name, token)
    cert_dir = cluster.dir / f"{addon.name}-webhook-certs"
    cert_dir.mkdir(exist_ok=True)
    pair = cluster.issue_serving_cert(f"{addon.name}-webhook")
    os.replace(pair.cert, cert_dir / "tls.crt")
    os.replace(pair.key, cert_dir / "tls.key")
    (health_port,) = free_ports(1)
    config_map = _wait_for(api, f"/api/v1/namespaces/{ns}/configmaps/{addon.config_map}", timeout)
    raw = next(iter(config_map["data"].values()))
    config = yaml.safe_load(_controller_config(raw, addon, installed.webhook_port, health_port, cert_dir))
    if addon is KUEUE:
        # The on-demand visibility API is served through an APIService, which is left out (above).
        config.setdefault("featureGates", {})["VisibilityOnDemand"] = False
    config_path = cluster.dir / f"{addon.name}-config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    controller = installed.binary or build.binary(addon.name)
    argv = [str(controller), f"--config={config_path}", f"--kubeconfig={kubeconfig}"]
    if addon is KUEUE:
        argv = _with_kueue_metrics_certs(cluster.dir, cert_dir, argv)
    proc = cluster.start_process(addon.name, [*argv, "--zap-log-level=2"])
    cluster.wait_url(f"http://127.0.0.1:{health_port}/readyz", proc)
