"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and KWOK in the kubelets' place.

``RealCluster`` starts the binaries ``sandbox.kube.build`` made, each in its own process group on
free loopback ports with its files in one temp dir, and stops each by PID on exit. The API server
serves TLS with a certificate from the cluster's own CA, authenticates static tokens (an admin in
``system:masters``, the control-plane components under their bootstrap identities, and one token per
product function) and authorizes with Node and RBAC: each function gets exactly what its role in
``infra/`` grants (``sandbox.kube.rbac``), and a refusal names the IAM permission as GKE's does
(``sandbox.kube.iam_reason``). It writes an audit log of JobSet deletions, as the
sandbox's log router will read. ``kubeconfig`` is an admin kubeconfig for plain ``kubectl``.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml

from sandbox.emulators.sockets import free_ports
from sandbox.kube import build, kwok, netns, pki, rbac
from sandbox.kube.api import KubeClient
from sandbox.kube.iam_reason import IamReasonWebhook
from sandbox.stack.processes import ManagedProcess, ProcessRegistry

REPO = Path(__file__).resolve().parents[2]
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR: the in-cluster "kubernetes" Service
ADMIN = "admin"
# The users Kubernetes' bootstrap RBAC already binds to the scheduler's and controller manager's roles.
SCHEDULER_USER = "system:kube-scheduler"
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
# GKE keeps up to this many terminated pods before the pod GC deletes the oldest (upstream: 12500).
TERMINATED_POD_GC_THRESHOLD = 1000

# GKE's audit policy records JobSet deletions among much else; the log router needs only those.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Metadata",
            "verbs": ["delete", "deletecollection"],
            "resources": [{"group": "jobset.x-k8s.io", "resources": ["jobsets"]}],
        },
        {"level": "None"},
    ],
}


def audit_policy(users: Sequence[str] = ()) -> dict[str, object]:
    """``AUDIT_POLICY``, plus every request of ``users`` at Metadata level when any are named."""
    policy: dict[str, object] = dict(AUDIT_POLICY)
    if users:
        rules = AUDIT_POLICY["rules"]
        assert isinstance(rules, list)
        policy["rules"] = [{"level": "Metadata", "users": list(users)}, *rules]
    return policy


@dataclass(frozen=True)
class Identity:
    """One static-token user of the API server."""

    name: str
    user: str
    groups: tuple[str, ...] = ()
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))


def _identities() -> dict[str, Identity]:
    ids = [
        Identity(ADMIN, "sandbox-admin", ("system:masters",)),
        Identity("kube-scheduler", SCHEDULER_USER),
        Identity("kube-controller-manager", CONTROLLER_MANAGER_USER),
        # KWOK plays every node's kubelet with one client; a kubelet's Node-authorizer identity is
        # per node, so it gets the admin group instead.
        Identity("kwok", "kwok", ("system:masters",)),
        *(Identity(fn, rbac.user_name(fn)) for fn in rbac.FUNCTIONS),
    ]
    return {identity.name: identity for identity in ids}


def _unverified() -> ssl.SSLContext:
    # Health probes of our own children on loopback: the components serve self-signed certificates.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class RealCluster:
    """The control plane as a context manager (see the module docstring)."""

    def __init__(
        self,
        workdir: Path | None = None,
        roles: Mapping[str, Sequence[str]] | None = None,
        start_timeout: float = 120.0,
        api_only: bool = False,
        audit_users: Sequence[str] = (),
    ) -> None:
        self._own_dir = workdir is None
        # etcd and the API server alone: nothing binds, runs, garbage-collects or evicts a pod, so a
        # test sees exactly the state it wrote (the function tests' cluster, sandbox.testing.fixtures).
        self.api_only = api_only
        # Users whose every request the audit log records (Metadata level), for request counts.
        self.audit_users = tuple(audit_users)
        self.dir = Path(tempfile.mkdtemp(prefix="tpuprov-kube-")) if workdir is None else workdir
        self.roles = dict(roles) if roles is not None else rbac.load_roles(REPO / "infra")
        self.start_timeout = start_timeout
        self.identities = _identities()
        self.registry = ProcessRegistry()
        self.procs: dict[str, ManagedProcess] = {}
        self.server = ""
        self.kubeconfig = self.dir / "kubeconfig"
        self.audit_log = self.dir / "audit.log"
        self._ca: pki.CertificateAuthority | None = None
        self._iam_webhook: IamReasonWebhook | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> RealCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Build if needed, then start etcd, the API server, the controllers and KWOK; wait for each.

        Everything runs in a network namespace with only ``lo`` (``sandbox.kube.netns``): whatever
        address an applied object names, the API server cannot dial off this machine."""
        bins = build.ensure_built()
        netns.isolate()
        self.kubebin = str(bins / "kubebin")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._ca = pki.CertificateAuthority(self.dir)
        etcd_port, peer_port, api_port, kcm_port, sched_port, kwok_port = free_ports(6)
        self._start_etcd(etcd_port, peer_port)
        self._api_ports = (api_port, etcd_port)
        self._start_apiserver(api_port, etcd_port)
        self._write_kubeconfigs()
        self.client().apply_all(rbac.all_objects(self.roles))
        if self.api_only:
            return
        self._start_controller_manager(kcm_port)
        self._start_scheduler(sched_port)
        self._start_kwok(kwok_port)
        self._wait_default_service_account()

    def stop(self) -> None:
        """Stop every process this cluster started (newest first), by PID; remove its temp dir."""
        self.registry.stop_all(grace=5.0)
        if self._iam_webhook is not None:
            self._iam_webhook.stop()
            self._iam_webhook = None
        if self._own_dir and not os.environ.get("TPUPROV_KEEP_KUBE_DIR"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def stop_apiserver(self) -> None:
        """Stop the API server alone, by PID: an outage every client meets as a refused connection."""
        self.procs["kube-apiserver"].stop(grace=5.0)

    def start_apiserver(self) -> None:
        """Start the API server again on its port after ``stop_apiserver``; wait until it is ready."""
        self._start_apiserver(*self._api_ports)

    # -- clients -------------------------------------------------------------------------------

    @property
    def ca_pem(self) -> bytes:
        assert self._ca is not None, "cluster not started"
        return self._ca.pem

    def kubeconfig_for(self, name: str) -> Path:
        """A kubeconfig authenticating as identity ``name`` (``admin`` or a function name)."""
        return self.kubeconfig if name == ADMIN else self.dir / f"kubeconfig-{name}"

    def client(self, name: str = ADMIN) -> KubeClient:
        """A REST client of the API server as identity ``name``."""
        return KubeClient(self.server, self.identities[name].token, self.ca_pem)

    def kubectl(
        self, *args: str, identity: str = ADMIN, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster as ``identity`` (``input``: its stdin)."""
        argv = [self.kubebin, "kubectl", f"--kubeconfig={self.kubeconfig_for(identity)}", *args]
        return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=60, input=input)

    def logs(self, component: str, lines: int = 40) -> str:
        """The last lines a component wrote (for failure messages)."""
        proc = self.procs.get(component)
        return proc.tail(lines) if proc else ""

    def log_lines(self, component: str, containing: str, limit: int = 10) -> list[str]:
        """The last ``limit`` lines of a component's log that mention ``containing``."""
        proc = self.procs.get(component)
        if proc is None:
            return []
        try:
            text = proc.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [line[:400] for line in text.splitlines() if containing in line][-limit:]

    # -- components ----------------------------------------------------------------------------

    def start_process(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        """Start and register one child of this cluster (its log is ``<dir>/<name>.log``)."""
        proc = self.registry.start(name, argv, dict(os.environ), self.dir, self.dir / f"{name}.log")
        self.procs[name] = proc
        return proc

    def _start(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        return self.start_process(name, [self.kubebin, name, *argv])

    def wait_url(
        self,
        url: str,
        proc: ManagedProcess,
        token: str | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        """Wait until ``url`` answers 200; RuntimeError with the process's log if it dies or times out."""
        deadline = time.monotonic() + self.start_timeout
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
        while True:
            try:
                with urllib.request.urlopen(request, timeout=2.0, context=context) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass  # not listening yet, or not ready (an HTTP error is a URLError too)
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail(40)}")
            if time.monotonic() > deadline:
                limit = f"{self.start_timeout:.0f}s"
                raise RuntimeError(f"{proc.name} not ready at {url} in {limit}:\n{proc.tail(40)}")
            time.sleep(0.2)

    def _start_etcd(self, port: int, peer_port: int) -> None:
        client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
        proc = self._start(
            "etcd",
            [
                "--name=sandbox",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=sandbox={peer_url}",
                # A throwaway store: losing it on a crash costs nothing, syncing it costs every write.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self.etcd_url = client_url
        self.wait_url(f"{client_url}/health", proc)

    def _start_apiserver(self, port: int, etcd_port: int) -> None:
        assert self._ca is not None
        serving = self._ca.apiserver_serving(SERVICE_IP)
        sa = pki.service_account_keys(self.dir)
        tokens = self.dir / "tokens.csv"
        tokens.write_text(
            "".join(f'{i.token},{i.user},{i.user},"{",".join(i.groups)}"\n' for i in self.identities.values())
        )
        tokens.chmod(0o600)
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(audit_policy(self.audit_users)))
        proc = self._start(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self._ca.cert_path}",
                f"--token-auth-file={tokens}",
                f"--authorization-config={self._authorization_config()}",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
                "--profiling=false",
                # GKE Standard admits privileged containers (only Autopilot refuses them: GKE "About
                # privileged workload admission in Autopilot mode"); kube-apiserver's own default is
                # false (kubernetes v1.36 cmd/kube-apiserver/app/options/options.go), which would
                # refuse most public TPU manifests, whose containers run privileged to reach /dev/accel*.
                "--allow-privileged=true",
            ],
        )
        self.server = f"https://127.0.0.1:{port}"
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        self.wait_url(f"{self.server}/readyz", proc, self.identities[ADMIN].token, context)

    def _authorization_config(self) -> Path:
        """Node, RBAC, then GKE's IAM reason for what RBAC refused a function (``iam_reason``)."""
        assert self._ca is not None
        if self._iam_webhook is None:
            cert = self._ca.issue("iam-webhook")
            self._iam_webhook = IamReasonWebhook(self.dir, cert.cert, cert.key, self.ca_pem)
            return self._iam_webhook.start()
        return self.dir / "authorization-config.yaml"

    def write_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig for this cluster authenticating with ``token`` (``kubeconfig-<name>``)."""
        ca = base64.b64encode(self.ca_pem).decode()
        cluster = {"server": self.server, "certificate-authority-data": ca}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sandbox", "cluster": cluster}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "sandbox", "user": name}}],
            "current-context": name,
        }
        path = self.kubeconfig_for(name)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def issue_serving_cert(self, name: str) -> pki.CertPair:
        """A loopback serving certificate signed by the cluster CA (webhook servers)."""
        assert self._ca is not None, "cluster not started"
        return self._ca.issue(name)

    def _write_kubeconfigs(self) -> None:
        for identity in self.identities.values():
            self.write_kubeconfig(identity.name, identity.token)

    def _start_controller_manager(self, port: int) -> None:
        proc = self._start(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig_for('kube-controller-manager')}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.dir / 'kcm-certs'}",
                # Each controller acts as its own service account, whose tokens this key signs.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.dir / 'sa.key'}",
                f"--root-ca-file={self.dir / 'ca.crt'}",
                f"--terminated-pod-gc-threshold={TERMINATED_POD_GC_THRESHOLD}",
            ],
        )
        self.wait_url(f"https://127.0.0.1:{port}/healthz", proc, context=_unverified())

    def _start_scheduler(self, port: int) -> None:
        proc = self._start(
            "kube-scheduler",
            [
                f"--kubeconfig={self.kubeconfig_for('kube-scheduler')}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.dir / 'scheduler-certs'}",
            ],
        )
        self.wait_url(f"https://127.0.0.1:{port}/healthz", proc, context=_unverified())

    def _start_kwok(self, port: int) -> None:
        config = self.dir / "kwok.yaml"
        config.write_text(kwok.config_yaml(f"127.0.0.1:{port}"))
        proc = self._start("kwok", [f"--kubeconfig={self.kubeconfig_for('kwok')}", f"--config={config}"])
        self.wait_url(f"http://127.0.0.1:{port}/healthz", proc)

    def _wait_default_service_account(self) -> None:
        # Pods are admitted only once their namespace's "default" ServiceAccount exists; the
        # controller manager creates it shortly after it starts.
        client = self.client()
        deadline = time.monotonic() + self.start_timeout
        while client.get("/api/v1/namespaces/default/serviceaccounts/default") is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no default ServiceAccount:\n" + self.logs("kube-controller-manager"))
            time.sleep(0.2)
