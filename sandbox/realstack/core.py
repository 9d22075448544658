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
from sandbox.kube import describe, netns, nodes
from sandbox.kube.api import ApiError
from sandbox.kube.cluster import RealCluster
from sandbox.polling import eventually
from sandbox.realstack.kubestate import RealKubeState, collection
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
from shared.events.fields import ClusterId
from shared.kueue.config import load_config, parse_config
from shared.kueue.render import KUEUE_API, render

T = TypeVar("T")
JOBSET_API = f"{labels.JOBSET_GROUP}/{labels.JOBSET_VERSION}"
ADOPTED_REASON = "TPUSliceAdopted"
OPERATOR = "operator"
DEFAULT_POOL = "default-pool"
NODE_REGISTER_ATTEMPTS = 5


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
        self.kube_cluster = RealCluster(self.workdir / "kube", roles=role_map)
        self.gke = GkeEmulator(
            [ClusterSeed(c.project, c.location, c.cluster_name, locations=c.cluster_zones or (c.location,))],
            op_delay=c.gke_op_delay,
        )
        self.compute = ComputeEmulator()
        self.iam = Iam.for_functions(role_map, c.project)
        self.iam.grant(self.iam.principal_of(OPERATOR), ("container.*", "compute.*"))
        self.pubsub = PubsubEmulator(c.project)
        self.relay = EventarcRelay(c.project)
        self.router: LogRouter | None = None
        self.kube: RealKubeState | None = None
        self.pods: PodFates | None = None
        self.releases: ReleaseWiring | None = None
        self.publisher: Any = None
        self.function_urls: dict[str, str] = {}
        self.startup_seconds = 0.0
        self._started_at = 0.0
        self._deleted_pools: list[str] = []
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
        self.kube_cluster.start()
        admin = self.kube_cluster.client()
        cpu = nodes.PoolNodes(DEFAULT_POOL, "e2-standard-4", {c.location: c.cpu_nodes})
        nodes.register_pool_nodes(admin, c.cluster_name, cpu)
        self.gke.set_iam(self.iam)
        self.compute.iam = self.iam
        self.gke.start()
        self.compute.start()
        self.gke.set_policy_lookup(self.compute.exists)
        self.gke.on_pool_ready(lambda cluster, pool: self._pool_ready(pool))
        self.gke.on_pool_deleted(lambda cluster, name: self._pool_deleted(name))
        self.gke.on_pool_updated(lambda cluster, pool: self._pool_updated(pool))
        self.relay.start()
        env = self._function_env()
        identities = {
            f: {
                "EMULATOR_ACCESS_TOKEN": self.iam.token_for(f),
                "KUBECONFIG": str(self.kube_cluster.kubeconfig_for(f)),
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
        self.kube = RealKubeState(admin, self.kube_cluster.audit_log)
        sink_topics = {sink: wiring(function).topic(TOPIC_PREFIX) for sink, function in SINKS.items()}
        self.router = LogRouter(
            self.kube, self.cluster_id, c.sinks_dir, sink_topics, self.publisher, self.timeline.add
        )
        self.gke.on_operation_done(self.router.operation_done)
        self.router.start()
        self.kube.start()
        self.pods = PodFates(admin)
        self.pods.start()
        self.releases = ReleaseWiring(self.kube_cluster)
        self.releases.start()

    def stop(self) -> None:
        """Stop everything started (idempotent): threads, functions, emulators, the control plane."""
        if self._stopped:
            return
        self._stopped = True
        steps: list[Callable[[], None]] = [
            lambda: self.releases.stop() if self.releases else None,
            lambda: self.pods.stop() if self.pods else None,
            lambda: self.kube.stop() if self.kube else None,
            self.relay.stop,
            self.processes.stop_all,
            lambda: self.router.stop() if self.router else None,
            lambda: self.publisher.transport.close() if self.publisher else None,
            self._stop_pubsub,
            self.kube_cluster.stop,
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

    def _pool_ready(self, pool: dict[str, Any]) -> None:
        spec = nodes.pool_from_gke(pool, self.compute.topology_of)
        # The emulator's hook only logs what it raises, and a pool whose Nodes never register leaves
        # its pods pending for good: an API server slow under load gets more tries (the kubelets of a
        # real pool keep trying to register too).
        for attempt in range(1, NODE_REGISTER_ATTEMPTS + 1):
            try:
                names = nodes.register_pool_nodes(self.kube_cluster.client(), self.config.cluster_name, spec)
                break
            except (ApiError, OSError) as exc:
                if isinstance(exc, ApiError) and exc.status < 500 and exc.status != 429:
                    raise
                if attempt == NODE_REGISTER_ATTEMPTS:
                    raise
                self.timeline.add("gke", f"pool {spec.pool}: registering its Nodes failed ({exc}); retrying")
                time.sleep(attempt)
        self.timeline.add("gke", f"pool {spec.pool} RUNNING: {len(names)} Node(s) registered")

    def _pool_updated(self, pool: dict[str, Any]) -> None:
        # GKE applies a pool's new node labels to its existing Nodes (UpdateNodePool).
        spec = nodes.pool_from_gke(pool, self.compute.topology_of)
        api = self.kube_cluster.client()
        for manifest in nodes.node_manifests(self.config.cluster_name, spec):
            patch = {"metadata": {"labels": manifest["metadata"]["labels"]}}
            try:
                api.patch(f"{nodes.NODES}/{manifest['metadata']['name']}", patch)
            except ApiError as exc:
                if exc.status != 404:
                    raise

    def _pool_deleted(self, name: str) -> None:
        with self._lock:
            self._deleted_pools.append(name)
        gone = nodes.delete_pool_nodes(self.kube_cluster.client(), name)
        self.timeline.add("gke", f"pool {name} deleted: {len(gone)} Node(s) gone")

    # -- using the stack ------------------------------------------------------------------------

    def setup(self, timeout: float = 300.0) -> None:
        """Publish the manual setup message (``{"cluster": path}``) and wait until setup_cluster has
        installed JobSet and Kueue, both local controllers serve, a JobSet create reaches their
        webhooks and the garbage collector acts on a deleted JobSet."""
        assert self.releases is not None
        topic = self.publisher.topic_path(self.config.project, wiring("setup_cluster").topic(TOPIC_PREFIX))
        data = json.dumps({"cluster": self.cluster_id.path}).encode()
        self.publisher.publish(topic, data).result(timeout=30)
        self.timeline.add("user", "published the setup message")
        deadline = time.monotonic() + timeout
        for release in ("jobset", "kueue"):
            if not self.releases.wait_ready(release, max(1.0, deadline - time.monotonic())):
                raise TimeoutError(f"{release} not serving after setup: {self.releases.errors}")
        self.wait_for(lambda: self.decisions("setup.component"), deadline - time.monotonic(), "setup")
        # A JobSet submitted next must reach both releases' webhooks, not a Service nothing serves.
        self.wait_for(self.releases.admits_jobsets, max(1.0, deadline - time.monotonic()), "the webhooks")
        # And a JobSet deleted next must take its Jobs with it, as on a cluster that has run a while.
        if not self.releases.garbage_collector_knows_jobsets(max(1.0, deadline - time.monotonic())):
            raise TimeoutError("the garbage collector never deleted a deleted JobSet's Jobs after setup")
        self.timeline.add("kube", "the garbage collector watches JobSets")

    def submit(self, jobset: Mapping[str, Any]) -> dict[str, Any]:
        """Create a JobSet as the operator (kubectl create)."""
        obj = {k: v for k, v in jobset.items()}
        obj["metadata"] = {k: v for k, v in jobset["metadata"].items() if k != "uid"}
        ns = str(obj["metadata"].get("namespace", "default"))
        self.timeline.add("user", f"submitted JobSet {ns}/{obj['metadata']['name']}")
        return self.kube_cluster.client().create(collection(JOBSET_API, "jobsets", ns), obj)

    def delete_jobset(self, namespace: str, name: str) -> bool:
        self.timeline.add("user", f"kubectl delete jobset {namespace}/{name}")
        return self.kube_cluster.client().delete(f"{collection(JOBSET_API, 'jobsets', namespace)}/{name}")

    def jobset(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube_cluster.client().get(f"{collection(JOBSET_API, 'jobsets', namespace)}/{name}")

    def jobset_state(self, namespace: str, name: str) -> str:
        """``Completed``, ``Failed``, ``Suspended``, ``Running`` or ``Gone``."""
        jobset = self.jobset(namespace, name)
        if jobset is None:
            return "Gone"
        conditions = (jobset.get("status") or {}).get("conditions") or []
        for state in ("Completed", "Failed", "Suspended"):
            if any(x.get("type") == state and x.get("status") == "True" for x in conditions):
                return state
        return "Running"

    def pools(self) -> list[dict[str, Any]]:
        return self.gke.pools(self.cluster_id.path)

    def managed_pools(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pools()
            if ((p.get("config") or {}).get("labels") or {}).get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE
        ]

    def events(self, reason: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        """Events in the API server (one namespace's, or all), optionally of one reason."""
        selector = f"reason={reason}" if reason is not None else ""
        return self.kube_cluster.client().list(collection("v1", "events", namespace), field_selector=selector)

    def publish_entry(self, function: str, entry: Mapping[str, Any]) -> str:
        """Publish a LogEntry to ``function``'s topic as a sink would; returns the message id."""
        if self.router is None:
            raise RuntimeError("the stack is not started")
        return self.router.publish(wiring(function).topic(TOPIC_PREFIX), entry)

    def apply_kueue(self, text: str | None = None, timeout: float = 60.0) -> None:
        """Publish a queue configuration (the packaged default when None) to apply_kueue's topic, as
        an operator does, and wait until the function says it applied it and its ClusterQueues
        exist. The queues appear while the function still writes the rest (and before its
        ``kueue.applied`` line): what an operator waits for is the function's answer."""
        config = parse_config(text) if text is not None else load_config()
        applied = len(self.decisions("kueue.applied", "apply_kueue"))
        topic = self.publisher.topic_path(self.config.project, wiring("apply_kueue").topic(TOPIC_PREFIX))
        self.publisher.publish(topic, (text or "").encode()).result(timeout=30)
        self.timeline.add("user", "published a Kueue configuration to apply_kueue's topic")
        api = self.kube_cluster.client()
        queues = [str(o["metadata"]["name"]) for o in render(config) if o["kind"] == "ClusterQueue"]
        path = collection(KUEUE_API, "clusterqueues", None)
        self.wait_for(
            lambda: (
                len(self.decisions("kueue.applied", "apply_kueue")) > applied
                and all(api.get(f"{path}/{q}") for q in queues)
            ),
            timeout,
            "apply_kueue to apply the Kueue queues",
        )

    def killed_pods(self) -> list[str]:
        """Pods a pool deletion killed, read from the real pods (``PodFates``)."""
        assert self.pods is not None, "the stack is not started"
        return self.pods.killed()

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
            return "\n".join([*(e.render() for e in self.timeline.entries()[-40:]), *self.cluster_now()])

        return eventually(predicate, timeout, what, interval, explain=tail)

    def cluster_now(self) -> list[str]:
        """``sandbox.kube.describe.cluster_now`` of this stack's cluster."""
        return describe.cluster_now(self.kube_cluster.client())

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
        pids = self.processes.pids + self.kube_cluster.registry.pids
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

    def summary(self) -> StackSummary:
        """The run's closing numbers; pods killed counted from the real pods (``PodFates``)."""
        assert self.pods is not None
        with self._lock:
            deleted = list(self._deleted_pools)
        return summarize(
            self.gke.calls,
            self.pools(),
            self.managed_pools(),
            deleted,
            self.relay.deliveries,
            time.monotonic() - self._started_at,
            adopted_events=len(self.events(ADOPTED_REASON)),
            pods_killed=self.pods.killed(),
        )
