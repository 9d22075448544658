"""The whole event loop on one machine: emulators, the real functions, simulated cluster, log sinks.

``Stack(config).start()`` (or ``with Stack(config) as stack:``) brings up, on free loopback ports:

* the Pub/Sub emulator with infra's topics, push subscriptions, retry and dead-letter policies;
* the GKE API emulator, whose finished pools become Kubernetes Nodes (``sandbox.cluster.nodes``),
  and the Compute Engine emulator holding the tpu7x workload policies GKE checks a pool's placement
  policy against;
* the Kubernetes API with the JobSet (and Kueue) CRDs, plus a simulated JobSet controller,
  scheduler, node lifecycle (cordon, pod GC) and, unless ``StackConfig.kueue`` is off, Kueue;
* each event function under ``functions-framework`` as a child process, fed through the
  Eventarc-shaped relay (``sandbox.emulators.eventarc``);
* the log router playing Cloud Logging and the sinks (``sandbox.emulators.logging.router``).

``stop()`` stops all of it: child process groups by PID, servers and threads; it also runs on
``atexit`` and on SIGTERM (SIGINT already unwinds through ``with`` / ``finally``).
"""

from __future__ import annotations

import atexit
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from sandbox.cluster.common import JOBSET_API, SimContext, is_true
from sandbox.cluster.controllers import JobSetController
from sandbox.cluster.kueue import KueueController
from sandbox.cluster.lifecycle import PoolLifecycle
from sandbox.cluster.nodes import NodeMirror
from sandbox.cluster.scheduler import Scheduler, SchedulerConfig
from sandbox.emulators.compute.emulator import ComputeEmulator
from sandbox.emulators.eventarc import Delivery, EventarcRelay
from sandbox.emulators.gcloud_pubsub import PubsubEmulator
from sandbox.emulators.gke.emulator import ClusterSeed, GkeEmulator
from sandbox.emulators.iam import Iam, load_roles
from sandbox.emulators.kube.api import KubeApiServer
from sandbox.emulators.logging.router import LogRouter
from sandbox.polling import eventually
from sandbox.stack.config import REPO_ROOT, StackConfig
from sandbox.stack.functions import start_functions
from sandbox.stack.processes import ProcessRegistry
from sandbox.stack.summary import StackSummary, summarize
from sandbox.stack.timeline import Timeline
from sandbox.stack.wiring import SINKS, TOPIC_PREFIX, clients, create_wiring, wiring
from shared.core import labels
from shared.events.fields import ClusterId

__all__ = ["Stack", "StackConfig", "StackSummary"]

# The Event the product records when it hands a pool over to another JobSet.
ADOPTED_REASON = "TPUSliceAdopted"
# The principal kubectl and tpuprov status act as in the sandbox.
OPERATOR = "operator"

T = TypeVar("T")


class Stack:
    """Everything the sandbox runs, started and stopped as one."""

    def __init__(self, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()
        c = self.config
        self.cluster = ClusterId(c.project, c.location, c.cluster_name)
        self.timeline = Timeline()
        self.processes = ProcessRegistry()
        self.gke = GkeEmulator(
            [ClusterSeed(c.project, c.location, c.cluster_name, locations=c.cluster_zones or (c.location,))],
            op_delay=c.gke_op_delay,
        )
        self.compute = ComputeEmulator()  # in-process, a thread; workload policies for tpu7x
        crds = [c.manifests_dir / c.jobset_manifest]
        if c.kueue:
            crds.append(c.manifests_dir / c.kueue_manifest)
        self.kube = KubeApiServer(crd_files=crds)
        # Who may call what: each function's service account holds its infra/ role; the operator
        # (kubectl, tpuprov status) holds everything, as a project owner would.
        self.iam = Iam.for_functions(load_roles(REPO_ROOT), c.project)
        self.iam.grant(self.iam.principal_of(OPERATOR), ("container.*", "compute.*"))
        self.admin_token = self.iam.token_for(OPERATOR)
        self.pubsub = PubsubEmulator(c.project)
        self.relay = EventarcRelay(c.project)
        self.ctx = SimContext(self.kube, self.timeline)
        self.jobsets = JobSetController(self.ctx)
        self.scheduler = Scheduler(
            self.ctx,
            SchedulerConfig(
                initial_backoff=c.scheduler_initial_backoff,
                max_backoff=c.scheduler_max_backoff,
                default_run_seconds=c.default_run_seconds,
                bind_delay=c.scheduler_bind_delay,
            ),
        )
        self.nodes = NodeMirror(self.ctx, self.cluster.path)
        self.lifecycle = PoolLifecycle(self.ctx, self.cluster.path)
        self.kueue = KueueController(self.ctx) if c.kueue else None
        self.router: LogRouter | None = None
        self.publisher: Any = None
        self.function_urls: dict[str, str] = {}
        # A temporary workdir (logs, kubeconfig) goes away with the stack; a given one is kept.
        self._own_workdir = c.workdir is None
        self.workdir = Path(c.workdir) if c.workdir else Path(tempfile.mkdtemp(prefix="tpuprov-sandbox-"))
        self.kubeconfig = self.workdir / "kubeconfig"
        self._started_at = 0.0
        self._started = False
        self._stopped = False
        self._deleted_pools: list[str] = []
        self._decisions: list[dict[str, Any]] = []
        self._decisions_lock = threading.Lock()
        self._previous_sigterm: Any = None
        self._gke_seen = 0
        self._gke_watch = threading.Event()
        self._gke_thread: threading.Thread | None = None
        self._pubsub_thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Stack:
        """Start every component; on any failure stop what was started and re-raise."""
        if self._started:
            return self
        self._started, self._started_at = True, time.monotonic()
        atexit.register(self.stop)
        self._install_sigterm()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.timeline.add("stack", f"sandbox up in {time.monotonic() - self._started_at:.1f}s")
        return self

    def _start(self) -> None:
        c = self.config
        self.workdir.mkdir(parents=True, exist_ok=True)
        emulator_error: list[BaseException] = []

        def start_pubsub() -> None:
            try:
                self.pubsub.start()
            except BaseException as exc:  # re-raised on the main thread below
                emulator_error.append(exc)

        # The Java emulator is the slowest part; the rest starts while it boots.
        pubsub_thread = threading.Thread(target=start_pubsub, name="pubsub-start", daemon=True)
        self._pubsub_thread = pubsub_thread
        pubsub_thread.start()
        if c.enforce_iam:
            self.gke.set_iam(self.iam)
            self.compute.iam = self.iam
            self.kube.set_iam(self.iam, anonymous=self.iam.principal_of(OPERATOR))
        self.gke.start()
        self.compute.start()
        self.gke.set_policy_lookup(self.compute.exists)  # GKE refuses a pool naming a missing policy
        self.kube.start()
        self.kube.write_kubeconfig(self.kubeconfig, token=self.admin_token)
        self.nodes.policy_topology = self.compute.topology_of
        self.nodes.attach(self.gke)
        self.lifecycle.attach(self.gke)
        self.gke.on_pool_deleted(lambda cluster, name: self._deleted_pools.append(name))
        self.nodes.start()
        self.nodes.add_cpu_nodes(c.cpu_nodes)
        self.relay.start()
        self.relay.listen(self._on_delivery)
        env = self._function_env()
        identities = {f: {"EMULATOR_ACCESS_TOKEN": self.iam.token_for(f)} for f in c.functions}
        waiters = start_functions(
            self.processes, c.functions, env, self.workdir, REPO_ROOT, self._on_function_line, identities
        )
        pubsub_thread.join(timeout=c.startup_timeout)
        if emulator_error:
            raise emulator_error[0]
        if pubsub_thread.is_alive():
            raise RuntimeError(f"the Pub/Sub emulator did not start within {c.startup_timeout:.0f}s")
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
        self.publisher, _subscriber = clients(self.pubsub.host)
        _subscriber.close()
        sink_topics = {sink: wiring(function).topic(TOPIC_PREFIX) for sink, function in SINKS.items()}
        self.router = LogRouter(
            self.kube, self.cluster, c.sinks_dir, sink_topics, self.publisher, self.timeline.add
        )
        self.gke.on_operation_done(self.router.operation_done)  # GKE's audit log of finished operations
        self.router.start()
        self.jobsets.start()
        self.scheduler.start()
        self.lifecycle.start()
        if self.kueue is not None:
            self.kueue.start()
        self._gke_thread = threading.Thread(target=self._watch_gke, name="gke-watch", daemon=True)
        self._gke_thread.start()

    def stop(self) -> None:
        """Stop everything that was started (idempotent; safe to call from any exit path)."""
        if self._stopped or not self._started:
            if self._own_workdir and not self._started:
                shutil.rmtree(self.workdir, ignore_errors=True)
            return
        self._stopped = True
        atexit.unregister(self.stop)
        self._restore_sigterm()
        self._gke_watch.set()
        steps: list[Callable[[], None]] = [
            lambda: self.kueue.stop() if self.kueue else None,
            self.lifecycle.stop,
            self.jobsets.stop,
            self.scheduler.stop,
            self.relay.stop,
            self.processes.stop_all,
            lambda: self.router.stop() if self.router else None,
            self.nodes.stop,
            lambda: self.publisher.transport.close() if self.publisher else None,
            self._stop_pubsub,
            self.kube.stop,
            self.gke.stop,
            self.compute.stop,
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:  # keep stopping the rest; report at the end
                print(f"sandbox: stop step failed: {exc!r}", file=sys.stderr)
        if self._gke_thread is not None:
            self._gke_thread.join(timeout=5)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self.start()

    def _stop_pubsub(self) -> None:
        # A failure elsewhere can stop the stack while the emulator is still booting on its thread;
        # let that finish first, or the emulator would come up after stop() and outlive us.
        if self._pubsub_thread is not None:
            self._pubsub_thread.join(timeout=self.config.startup_timeout)
        self.pubsub.stop()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)  # unwinds through finally/with, which stop the stack

        self._previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    # -- wiring helpers -------------------------------------------------------------------------

    def _function_env(self) -> dict[str, str]:
        c = self.config
        return {
            "PROJECT_ID": c.project,
            "LOCATION": c.location,
            "CLUSTER_NAME": c.cluster_name,
            "GKE_API_ENDPOINT": self.gke.url,
            "COMPUTE_API_ENDPOINT": self.compute.url,
            "KUBE_API_ENDPOINT": self.kube.url,
            "MAX_EVENT_AGE_SECONDS": str(c.max_event_age_seconds),
            "MANIFESTS_DIR": str(c.manifests_dir),
            **dict(c.function_env),
        }

    def _on_function_line(self, function: str, line: str) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if isinstance(record, dict) and record.get("event"):
            with self._decisions_lock:
                self._decisions.append({**record, "function": function})
            self.timeline.add(function, f"{record['event']}: {record.get('message', '')}")

    def _on_delivery(self, delivery: Delivery) -> None:
        again = f" (delivery {delivery.attempt})" if delivery.attempt > 1 else ""
        self.timeline.add(
            "relay",
            f"{delivery.function} <- message {delivery.message_id}{again}: HTTP {delivery.status} "
            f"in {delivery.latency * 1000:.0f} ms",
        )

    def _watch_gke(self) -> None:
        while not self._gke_watch.wait(0.1):
            calls = self.gke.calls
            for call in calls[self._gke_seen :]:
                if call.method in ("create", "delete"):
                    what = call.summary or call.path.rsplit("/", 1)[-1]
                    self.timeline.add("gke", f"{call.method} node pool {what}")
            self._gke_seen = len(calls)

    # -- using the stack ------------------------------------------------------------------------

    def submit(self, jobset: Mapping[str, Any]) -> dict[str, Any]:
        """Create a JobSet (the API assigns its uid); returns the stored object."""
        stored = self.kube.put(dict(jobset))
        meta = stored["metadata"]
        self.timeline.add("user", f"submitted JobSet {meta.get('namespace')}/{meta.get('name')}")
        self.jobsets.wake()
        return stored

    def delete_jobset(self, namespace: str, name: str) -> bool:
        """Delete a JobSet as ``kubectl delete`` would (its pods are garbage-collected)."""
        self.timeline.add("user", f"kubectl delete jobset {namespace}/{name}")
        return self.kube.delete(JOBSET_API, labels.JOBSET_PLURAL, namespace, name)

    def jobset(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The JobSet as the API has it now."""
        return self.kube.get(JOBSET_API, labels.JOBSET_PLURAL, namespace, name)

    def jobset_state(self, namespace: str, name: str) -> str:
        """``Completed``, ``Failed``, ``Suspended``, ``Running`` or ``Gone``."""
        jobset = self.jobset(namespace, name)
        if jobset is None:
            return "Gone"
        for state in ("Completed", "Failed", "Suspended"):
            if is_true(jobset, state):
                return state
        return "Running"

    def pools(self) -> list[dict[str, Any]]:
        """The cluster's node pools as GKE JSON."""
        return self.gke.pools(self.cluster.path)

    def managed_pools(self) -> list[dict[str, Any]]:
        """Pools carrying the product's managed-by node label."""
        return [
            p
            for p in self.pools()
            if ((p.get("config") or {}).get("labels") or {}).get(labels.MANAGED_BY) == labels.MANAGED_BY_VALUE
        ]

    def events(self, reason: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        """Kubernetes Events in the API, optionally of one reason."""
        items = self.kube.list("v1", "events", namespace)
        return [e for e in items if reason is None or e.get("reason") == reason]

    def decisions(self, event: str | None = None, function: str | None = None) -> list[dict[str, Any]]:
        """The functions' structured decision log lines (``provision.created``...), oldest first."""
        with self._decisions_lock:
            records = list(self._decisions)
        return [
            r
            for r in records
            if (event is None or r.get("event") == event)
            and (function is None or r.get("function") == function)
        ]

    def killed_pods(self) -> list[str]:
        """Pods a pool deletion killed (``SimContext.pods_killed``)."""
        return list(self.ctx.pods_killed)

    def publish_entry(self, function: str, entry: Mapping[str, Any]) -> str:
        """Publish a LogEntry to ``function``'s topic as a sink would; returns the message id."""
        if self.router is None:
            raise RuntimeError("the stack is not started")
        return self.router.publish(wiring(function).topic(TOPIC_PREFIX), entry)

    def trigger_reconcile(self) -> str:
        """Publish a Cloud Scheduler tick to the reconcile topic (the payload infra sends)."""
        topic = self.publisher.topic_path(self.config.project, wiring("reconcile").topic(TOPIC_PREFIX))
        data = json.dumps({"source": "cloud-scheduler", "action": "reconcile"}).encode()
        self.timeline.add("cron", "Cloud Scheduler tick -> reconcile topic")
        return str(self.publisher.publish(topic, data).result(timeout=30))

    def wait_for(
        self, predicate: Callable[[], T], timeout: float, what: str = "", interval: float = 0.1
    ) -> T:
        """Poll ``predicate`` until it returns something truthy; TimeoutError with the timeline tail."""

        def tail() -> str:
            return "\n".join(e.render() for e in self.timeline.entries()[-40:])

        return eventually(predicate, timeout, what, interval, explain=tail)

    def env(self) -> dict[str, str]:
        """What to export to use the running sandbox from a shell (gcloud, kubectl, tpuprov publish)."""
        return {
            "PUBSUB_EMULATOR_HOST": self.pubsub.host,
            "PUBSUB_PROJECT_ID": self.config.project,
            "KUBECONFIG": str(self.kubeconfig),
            **self._function_env(),
            "EMULATOR_ACCESS_TOKEN": self.admin_token,
            # The functions' log lines (<function>.log), the sandbox's Cloud Logging for `tpuprov why`.
            "SANDBOX_LOG_DIR": str(self.workdir),
        }

    @property
    def pids(self) -> list[int]:
        """PIDs of the child processes (function servers and the emulator's process group)."""
        pids = self.processes.pids
        if self.pubsub.pid is not None:
            pids.append(self.pubsub.pid)
        return pids

    def summary(self) -> StackSummary:
        """Pools created (distinct pools that came to exist), adopted, deleted, leaked; pods killed; time."""
        return summarize(
            self.gke.calls,
            self.pools(),
            self.managed_pools(),
            list(self._deleted_pools),
            self.relay.deliveries,
            time.monotonic() - self._started_at,
            adopted_events=len(self.events(ADOPTED_REASON)),
            pods_killed=list(self.ctx.pods_killed),
        )
