"""The product end to end on the real Kubernetes components (the emulators only where GKE is).

``RealStack(config)`` brings up, in a network namespace with only ``lo``:

* ``RealCluster``: etcd, kube-apiserver (TLS, RBAC, a token per function, an audit log),
  kube-controller-manager, kube-scheduler and KWOK; the cluster's default pool is registered as
  ``config.cpu_nodes`` CPU Nodes, where KWOK plays the JobSet and Kueue controller pods;
* the GKE and Compute emulators with IAM enforced (each function's role in ``infra/``); a pool
  that reaches RUNNING registers its Nodes (``sandbox.kube.nodes.pool_from_gke``), a deleted
  pool's Nodes are deleted, and what becomes of their pods is the real controller manager's pod GC;
* the real Pub/Sub emulator with infra's topics and push subscriptions, the Eventarc relay, and
  the product's functions as processes: each reaches the API server with its own kubeconfig
  (``KUBECONFIG``: the cluster CA and the function's token) and the emulators with its own token;
* the log router fed by the real API server's Events and audit log (``kubestate``), routing
  through the ``sinks/`` filters to the functions' topics;
* the JobSet and Kueue controllers, started locally once ``setup_cluster`` has applied their
  releases (``releases``: the webhooks are repointed at them as envtest does).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sandbox.emulators.compute.emulator import ComputeEmulator
from sandbox.emulators.eventarc import EventarcRelay
from sandbox.emulators.gcloud_pubsub import PubsubEmulator
from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.emulators.iam import Iam, load_roles
from sandbox.emulators.logging.router import LogRouter
from sandbox.kube import kubeconfig, netns
from sandbox.kube.cluster import RealCluster
from sandbox.polling import eventually
from sandbox.realstack.kubestate import RealKubeState, collection
from sandbox.realstack.plane import DEFAULT_POOL, JOBSET_API, ClusterPlane
from sandbox.realstack.pods import PodFates
from sandbox.realstack.releases import ReleaseWiring
from sandbox.stack.config import REPO_ROOT, StackConfig
from sandbox.stack.functions import start_functions
from sandbox.stack.processes import ProcessRegistry
from sandbox.stack.summary import StackSummary, summarize
from sandbox.stack.timeline import Timeline
from sandbox.stack.wiring import clients, create_wiring
from shared.app.deployment import SINKS, TOPIC_PREFIX, wiring
from shared.core import labels
from shared.core.settings import fleet_context
from shared.events.fields import ClusterId
from shared.events.trigger import KUEUE_CLUSTER_ATTRIBUTE
from shared.kueue.config import load_config, parse_config
from shared.kueue.render import KUEUE_API, render

T = TypeVar("T")
ADOPTED_REASON = "TPUSliceAdopted"
OPERATOR = "operator"
__all__ = ["DEFAULT_POOL", "JOBSET_API", "RealStack"]


class RealStack:
    """Everything above, started and stopped as one (``with RealStack(config) as stack:``)."""

    def __init__(
        self, config: StackConfig | None = None, roles: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        self.config = c = config or StackConfig()
        self.cluster_id = ClusterId(c.project, c.location, c.cluster_name)
        self.timeline = Timeline()
        self.processes = ProcessRegistry()
        self._own_workdir = c.workdir is None
        self.workdir = Path(c.workdir) if c.workdir else Path(tempfile.mkdtemp(prefix="tpuprov-realstack-"))
        role_map: dict[str, Sequence[str]] = dict(roles if roles is not None else load_roles(REPO_ROOT))
        self.home = ClusterPlane(
            self.cluster_id, c.cluster_zones, self.workdir / "kube", role_map, self.timeline.add
        )
        self.fleet = [
            ClusterPlane(
                ClusterId(c.project, zone, name),
                (zone,),
                self.workdir / f"kube-{name}",
                role_map,
                self.timeline.add,
            )
            for zone, name in c.fleet
        ]
        self.gke = GkeEmulator(
            [
                ClusterSeed(c.project, p.cluster_id.location, p.cluster_id.name, locations=p.zones)
                for p in self.planes
            ],
            op_delay=c.gke_op_delay,
        )
        self.compute = ComputeEmulator(reservations=self.gke.capacity.reservations)
        self.iam = Iam.for_functions(role_map, c.project)
        self.iam.grant(self.iam.principal_of(OPERATOR), ("container.*", "compute.*"))
        self.pubsub = PubsubEmulator(c.project)
        self.relay = EventarcRelay(c.project)
        self.publisher: Any = None
        self.function_urls: dict[str, str] = {}
        self.startup_seconds = 0.0
        self._started_at = 0.0
        self._decisions: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stopped = False
        self._pubsub_thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> RealStack:
        self._started_at = time.monotonic()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - self._started_at
        self.timeline.add("stack", f"real sandbox up in {self.startup_seconds:.1f}s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self) -> None:
        c = self.config
        netns.isolate()  # before any thread or child: all of them inherit the loopback-only namespace
        self.workdir.mkdir(parents=True, exist_ok=True)
        pubsub_error: list[BaseException] = []

        def start_pubsub() -> None:
            try:
                self.pubsub.start()
            except BaseException as exc:  # re-raised below
                pubsub_error.append(exc)

        pubsub_thread = threading.Thread(target=start_pubsub, name="pubsub-start", daemon=True)
        self._pubsub_thread = pubsub_thread
        pubsub_thread.start()
        for plane in self.planes:
            plane.start_control_plane(c.cpu_nodes)
        self.gke.set_iam(self.iam)
        self.compute.iam = self.iam
        self.gke.start()
        self.compute.start()
        self.gke.set_policy_lookup(self.compute.exists)
        topology = self.compute.topology_of
        self.gke.on_pool_ready(lambda cluster, pool: self.plane(cluster).pool_ready(pool, topology))
        self.gke.on_pool_deleted(lambda cluster, name: self.plane(cluster).pool_deleted(name))
        self.gke.on_pool_updated(lambda cluster, pool: self.plane(cluster).pool_updated(pool, topology))
        self.relay.start()
        env = self._function_env()
        identities = {
            f: {
                "EMULATOR_ACCESS_TOKEN": self.iam.token_for(f),
                "KUBECONFIG": str(self._kubeconfig_for(f)),
            }
            for f in c.functions
        }
        waiters = start_functions(
            self.processes, c.functions, env, self.workdir, REPO_ROOT, self._on_function_line, identities
        )
        pubsub_thread.join(timeout=c.startup_timeout)
        if pubsub_error:
            raise pubsub_error[0]
        for function, wait in waiters.items():
            url = wait(c.startup_timeout)
            self.function_urls[function] = url
            self.relay.route(wiring(function).topic(TOPIC_PREFIX), function, url)
        create_wiring(
            self.pubsub.host,
            c.project,
            {f: self.relay.push_endpoint(wiring(f).topic(TOPIC_PREFIX)) for f in c.functions},
            retry=c.retry,
            max_delivery_attempts=c.max_delivery_attempts,
        )
        self.publisher, subscriber = clients(self.pubsub.host)
        subscriber.close()
        sink_topics = {sink: wiring(function).topic(TOPIC_PREFIX) for sink, function in SINKS.items()}
        for plane in self.planes:
            router = plane.start_watchers(c.sinks_dir, sink_topics, self.publisher)
            self.gke.on_operation_done(router.operation_done)

    def stop(self) -> None:
        """Stop everything started (idempotent): threads, functions, emulators, the control plane."""
        if self._stopped:
            return
        self._stopped = True
        steps: list[Callable[[], None]] = [
            *(step for plane in self.planes for step in plane.stop_watchers()),
            self.relay.stop,
            self.processes.stop_all,
            *(plane.stop_router for plane in self.planes),
            lambda: self.publisher.transport.close() if self.publisher else None,
            self._stop_pubsub,
            *(plane.kube_cluster.stop for plane in self.planes),
            self.gke.stop,
            self.compute.stop,
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:  # keep stopping the rest
                print(f"realstack: stop step failed: {exc!r}", file=sys.stderr)
        if self._own_workdir and not os.environ.get("TPUPROV_KEEP_KUBE_DIR"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _stop_pubsub(self) -> None:
        # A failure elsewhere (the control plane) can stop the stack while the emulator still boots
        # on its thread; let that finish first, or the emulator would come up after stop().
        if self._pubsub_thread is not None:
            self._pubsub_thread.join(timeout=self.config.startup_timeout)
        self.pubsub.stop()

    def _function_env(self) -> dict[str, str]:
        c = self.config
        return {
            "PROJECT_ID": c.project,
            "LOCATION": c.location,
            "CLUSTER_NAME": c.cluster_name,
            "GKE_API_ENDPOINT": self.gke.url,
            "COMPUTE_API_ENDPOINT": self.compute.url,
            "MAX_EVENT_AGE_SECONDS": str(c.max_event_age_seconds),
            "MANIFESTS_DIR": str(c.manifests_dir),
            # The sandbox states its spending on purpose, as a deployment must
            # (shared.provisioning.tenancy.spending); a scenario of budgets sets its own in function_env.
            "UNLIMITED_SPENDING": "true",
            **({"FLEET_CLUSTERS": ",".join(p.path for p in self.fleet)} if self.fleet else {}),
            **dict(c.function_env),
        }

    def _on_function_line(self, function: str, line: str) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if isinstance(record, dict) and record.get("event"):
            with self._lock:
                self._decisions.append({**record, "function": function})
            self.timeline.add(function, f"{record['event']}: {record.get('message', '')}")

    # -- the clusters ---------------------------------------------------------------------------

    @property
    def planes(self) -> list[ClusterPlane]:
        """Every cluster of the stack: the managed one first, then the fleet's."""
        return [self.home, *self.fleet]

    def plane(self, cluster: str) -> ClusterPlane:
        """The cluster whose path or name is ``cluster``."""
        for plane in self.planes:
            if cluster in (plane.path, plane.cluster_id.name):
                return plane
        raise KeyError(f"no cluster {cluster} in this stack")

    def _kubeconfig_for(self, function: str) -> Path:
        """The function's kubeconfig: the managed cluster's credentials as the current context, and
        each fleet cluster's under the context name ``gcloud container clusters get-credentials``
        gives it (``shared.core.settings.fleet_context``), which is where the functions look."""
        path = self.home.kube_cluster.kubeconfig_for(function)
        if not self.fleet:
            return path
        others = {
            fleet_context(*dataclasses.astuple(plane.cluster_id)): kubeconfig.load(
                plane.kube_cluster.kubeconfig_for(function)
            )
            for plane in self.fleet
        }
        return kubeconfig.with_contexts(path, others, self.workdir / f"kubeconfig-fleet-{function}")

    # The managed cluster's parts, as a single-cluster stack has always named them.
    @property
    def kube_cluster(self) -> RealCluster:
        return self.home.kube_cluster

    @property
    def kube(self) -> RealKubeState | None:
        return self.home.kube

    @property
    def router(self) -> LogRouter | None:
        return self.home.router

    @property
    def pods(self) -> PodFates | None:
        return self.home.pods

    @property
    def releases(self) -> ReleaseWiring | None:
        return self.home.releases

    # -- using the stack ------------------------------------------------------------------------
    # Each call acts on the managed cluster, or on the fleet cluster ``cluster`` names (its path or
    # name); ``stack.plane(cluster)`` has the rest of one cluster's view.

    def _on(self, cluster: str | None) -> ClusterPlane:
        return self.home if cluster is None else self.plane(cluster)

    def setup(self, timeout: float = 300.0, cluster: str | None = None) -> None:
        """Publish the manual setup message (``{"cluster": path}``) and wait until setup_cluster has
        installed JobSet and Kueue, both local controllers serve, a JobSet create reaches their
        webhooks and the garbage collector acts on a deleted JobSet."""
        plane = self._on(cluster)
        releases = plane.releases
        assert releases is not None
        topic = self.publisher.topic_path(self.config.project, wiring("setup_cluster").topic(TOPIC_PREFIX))
        data = json.dumps({"cluster": plane.path}).encode()
        self.publisher.publish(topic, data).result(timeout=30)
        self.timeline.add("user", f"published the setup message for {plane.cluster_id.name}")
        deadline = time.monotonic() + timeout
        for release in ("jobset", "kueue"):
            if not releases.wait_ready(release, max(1.0, deadline - time.monotonic())):
                raise TimeoutError(f"{release} not serving after setup: {releases.errors}")
        self.wait_for(
            lambda: [d for d in self.decisions("setup.component") if d.get("cluster") == plane.path],
            deadline - time.monotonic(),
            "setup",
        )
        # A JobSet submitted next must reach both releases' webhooks, not a Service nothing serves.
        self.wait_for(releases.admits_jobsets, max(1.0, deadline - time.monotonic()), "the webhooks")
        # And a JobSet deleted next must take its Jobs with it, as on a cluster that has run a while.
        if not releases.garbage_collector_knows_jobsets(max(1.0, deadline - time.monotonic())):
            raise TimeoutError("the garbage collector never deleted a deleted JobSet's Jobs after setup")
        self.timeline.add("kube", f"{plane.cluster_id.name}: the garbage collector watches JobSets")

    def submit(self, jobset: Mapping[str, Any], cluster: str | None = None) -> dict[str, Any]:
        """Create a JobSet as the operator (kubectl create)."""
        return self._on(cluster).submit(jobset)

    def delete_jobset(self, namespace: str, name: str, cluster: str | None = None) -> bool:
        return self._on(cluster).delete_jobset(namespace, name)

    def jobset(self, namespace: str, name: str, cluster: str | None = None) -> dict[str, Any] | None:
        return self._on(cluster).jobset(namespace, name)

    def jobset_state(self, namespace: str, name: str, cluster: str | None = None) -> str:
        """``Completed``, ``Failed``, ``Suspended``, ``Running`` or ``Gone``."""
        return self._on(cluster).jobset_state(namespace, name)

    def pools(self, cluster: str | None = None) -> list[dict[str, Any]]:
        return self.gke.pools(self._on(cluster).path)

    def managed_pools(self, cluster: str | None = None) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pools(cluster)
            if ((p.get("config") or {}).get("labels") or {}).get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE
        ]

    def wait_pools_gone(self, timeout: float, cluster: str | None = None, window: float = 120.0) -> None:
        """Wait until the cluster's managed pools are gone, as a deployment sees it: the releases
        delete every pool within ``timeout``, except a pool a release kept idle for a queued JobSet
        of its shape (stamped ``idle-since``) that nobody then took: that one is the reconcile
        sweep's once its handover window (``window``, IDLE_POOL_SECONDS) is over, so Cloud
        Scheduler's tick is sent (infra: every 5 minutes) until it goes."""

        def unstamped() -> list[str]:
            return [
                str(p.get("name"))
                for p in self.managed_pools(cluster)
                if not ((p.get("config") or {}).get("labels") or {}).get(labels.IDLE_SINCE)
            ]

        self.wait_for(lambda: not unstamped(), timeout, "every TPU pool not kept idle to be deleted")
        if not self.managed_pools(cluster):
            return

        def swept() -> bool:
            self.trigger_reconcile()
            return not self.managed_pools(cluster)

        self.wait_for(swept, window + 60.0, "pools kept idle to go at the reconcile sweep", interval=5.0)

    def events(
        self, reason: str | None = None, namespace: str | None = None, cluster: str | None = None
    ) -> list[dict[str, Any]]:
        """Events in the API server (one namespace's, or all), optionally of one reason."""
        return self._on(cluster).events(reason, namespace)

    def publish_entry(self, function: str, entry: Mapping[str, Any]) -> str:
        """Publish a LogEntry to ``function``'s topic as a sink would; returns the message id."""
        if self.router is None:
            raise RuntimeError("the stack is not started")
        return self.router.publish(wiring(function).topic(TOPIC_PREFIX), entry)

    def apply_kueue(self, text: str | None = None, timeout: float = 60.0, cluster: str | None = None) -> None:
        """Publish a queue configuration (the packaged default when None) to apply_kueue's topic, as
        an operator does (naming a fleet cluster in the message's ``cluster`` attribute), and wait
        until the function says it applied it there and its ClusterQueues exist. The queues appear
        while the function still writes the rest (and before its ``kueue.applied`` line): what an
        operator waits for is the function's answer."""
        plane = self._on(cluster)
        config = parse_config(text) if text is not None else load_config()

        def applied() -> int:
            return len(
                [d for d in self.decisions("kueue.applied", "apply_kueue") if d.get("cluster") == plane.path]
            )

        before = applied()
        topic = self.publisher.topic_path(self.config.project, wiring("apply_kueue").topic(TOPIC_PREFIX))
        attributes = {} if plane is self.home else {KUEUE_CLUSTER_ATTRIBUTE: plane.path}
        self.publisher.publish(topic, (text or "").encode(), **attributes).result(timeout=30)
        self.timeline.add("user", f"published a Kueue configuration for {plane.cluster_id.name}")
        api = plane.kube_cluster.client()
        queues = [str(o["metadata"]["name"]) for o in render(config) if o["kind"] == "ClusterQueue"]
        path = collection(KUEUE_API, "clusterqueues", None)
        self.wait_for(
            lambda: applied() > before and all(api.get(f"{path}/{q}") for q in queues),
            timeout,
            "apply_kueue to apply the Kueue queues",
        )

    def killed_pods(self, cluster: str | None = None) -> list[str]:
        """Pods a pool deletion killed, read from the real pods (``PodFates``)."""
        return self._on(cluster).killed_pods()

    def decisions(self, event: str | None = None, function: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            records = list(self._decisions)
        return [
            r
            for r in records
            if (event is None or r.get("event") == event)
            and (function is None or r.get("function") == function)
        ]

    def wait_for(
        self, predicate: Callable[[], T], timeout: float, what: str = "", interval: float = 0.3
    ) -> T:
        """Poll ``predicate`` until truthy; TimeoutError with the timeline's tail."""

        def tail() -> str:
            now = [line for plane in self.planes for line in plane.cluster_now()]
            return "\n".join(
                [
                    *(
                        e.render()
                        for e in self.timeline.entries()[
                            -int(os.environ.get("TPUPROV_TIMELINE_TAIL", "40")) :
                        ]
                    ),
                    *now,
                ]
            )

        return eventually(predicate, timeout, what, interval, explain=tail)

    def cluster_now(self, cluster: str | None = None) -> list[str]:
        """``sandbox.kube.describe.cluster_now`` of the stack's cluster."""
        return self._on(cluster).cluster_now()

    def env(self) -> dict[str, str]:
        """What a shell exports to use this stack (kubectl, tpuprov status/why, tpuprov publish); the
        shell must enter ``enter_command()``'s network namespace to reach any of it."""
        return {
            "PUBSUB_EMULATOR_HOST": self.pubsub.host,
            "PUBSUB_PROJECT_ID": self.config.project,
            "KUBECONFIG": str(self.kube_cluster.kubeconfig),
            **self._function_env(),
            "EMULATOR_ACCESS_TOKEN": self.iam.token_for(OPERATOR),
            "SANDBOX_LOG_DIR": str(self.workdir),
        }

    @property
    def pids(self) -> list[int]:
        """Every child process this stack runs: functions, control plane, controllers, Pub/Sub."""
        pids = self.processes.pids + [
            pid for plane in self.planes for pid in plane.kube_cluster.registry.pids
        ]
        if self.pubsub.pid:
            pids.append(self.pubsub.pid)
        return pids

    @staticmethod
    def enter_command() -> str:
        """The prefix that runs a command in this process's loopback-only network namespace."""
        return f"nsenter --net=/proc/{os.getpid()}/ns/net"

    def trigger_reconcile(self) -> str:
        """Publish a Cloud Scheduler tick to the reconcile topic (the payload infra sends)."""
        topic = self.publisher.topic_path(self.config.project, wiring("reconcile").topic(TOPIC_PREFIX))
        data = json.dumps({"source": "cloud-scheduler", "action": "reconcile"}).encode()
        self.timeline.add("cron", "Cloud Scheduler tick -> reconcile topic")
        return str(self.publisher.publish(topic, data).result(timeout=30))

    def summary(self, cluster: str | None = None) -> StackSummary:
        """The run's closing numbers for one cluster (the managed one unless ``cluster`` names
        another); pods killed counted from the real pods (``PodFates``). Redeliveries count every
        delivery: a message is the deployment's, whichever cluster it named."""
        plane = self._on(cluster)
        assert plane.pods is not None
        calls = [c for c in self.gke.calls if f"{plane.path}/" in f"{c.path}/"]
        return summarize(
            calls,
            self.pools(plane.path),
            self.managed_pools(plane.path),
            list(plane.deleted_pools),
            self.relay.deliveries,
            time.monotonic() - self._started_at,
            adopted_events=len(plane.events(ADOPTED_REASON)),
            pods_killed=plane.pods.killed(),
        )
