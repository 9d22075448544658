"""Helpers for scenario tests on a running stack: fast settings, submission and the end checks.

The checks every scenario makes are in one place so that each test states only what is special
about it: exactly one successful create per slice, no pool left once the JobSet is over, and the
product's Events recorded in the Kubernetes API.

They read a stack through ``ScenarioStack``, which the real stack (``RealStack``: the real API
server, scheduler, controller manager, JobSet, Kueue and KWOK) provides.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from sandbox.emulators.gke.emulator import GkeEmulator
from sandbox.jobsets import tpu_jobset
from sandbox.realstack.core import RealStack
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from shared.app.deployment import RetryPolicy
from shared.core import labels

T = TypeVar("T")
KUEUE_API = "kueue.x-k8s.io/v1beta2"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"

# Same policy shape as infra (exponential, capped), scaled down so a redelivery takes a second.
FAST_RETRY = RetryPolicy(minimum_backoff_seconds=1, maximum_backoff_seconds=4)
# A stockout backoff of seconds, not minutes: 2, 4, 8, 8... (tests wait it out or walk through it).
FAST_ENV = {"STOCKOUT_BACKOFF_SECONDS": "2", "STOCKOUT_BACKOFF_MAX_SECONDS": "8"}
# The real stack in scenario tests: every function (setup_cluster installs JobSet and Kueue,
# apply_kueue the queues), a preempted JobSet's pools up for release a second after Kueue
# suspends it (infra: minutes), GKE operations of half a second. How long a pod runs is its
# template's ``run-seconds`` annotation, played by KWOK.
SUSPEND_GRACE = 1
REAL_FAST = StackConfig(
    functions=ALL_FUNCTIONS,
    gke_op_delay=0.5,
    retry=FAST_RETRY,
    function_env={**FAST_ENV, "SUSPEND_GRACE_SECONDS": str(SUSPEND_GRACE)},
)


def real_config(**function_env: str) -> StackConfig:
    """``REAL_FAST`` with some functions' settings changed (``CORDON_SETTLE_SECONDS="5"``...)."""
    return dataclasses.replace(REAL_FAST, function_env={**REAL_FAST.function_env, **function_env})


class KubeReader(Protocol):
    """Reads of the Kubernetes API by group/version and plural (``v1`` is the core group)."""

    def get(
        self, api_version: str, plural: str, namespace: str | None, name: str, /
    ) -> dict[str, Any] | None: ...

    def list(
        self, api_version: str, plural: str, namespace: str | None = None, label_selector: str = "", /
    ) -> list[dict[str, Any]]: ...


class ScenarioStack(Protocol):
    """What the helpers read of a running stack."""

    @property
    def gke(self) -> GkeEmulator: ...

    @property
    def kube(self) -> KubeReader | None: ...

    def submit(self, jobset: Mapping[str, Any]) -> dict[str, Any]: ...

    def jobset(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def jobset_state(self, namespace: str, name: str) -> str: ...

    def managed_pools(self) -> list[dict[str, Any]]: ...

    def events(self, reason: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]: ...

    def decisions(self, event: str | None = None, function: str | None = None) -> list[dict[str, Any]]: ...

    def killed_pods(self) -> list[str]: ...

    def wait_for(
        self, predicate: Callable[[], T], timeout: float, what: str = "", interval: float = ...
    ) -> T: ...


def kube(stack: ScenarioStack) -> KubeReader:
    """The stack's Kubernetes reads (it must be running)."""
    assert stack.kube is not None, "the stack is not started"
    return stack.kube


def apply_kueue(stack: RealStack, text: str | None = None, timeout: float = 60.0) -> None:
    """Apply a queue configuration (the packaged default when None) through the product's
    ``apply_kueue`` function, and wait until its ClusterQueues exist."""
    stack.apply_kueue(text, timeout)


def exclusive_tpu_jobset(name: str, **options: Any) -> dict[str, Any]:
    """A TPU JobSet placing one Job per node pool, as multislice training JobSets do."""
    annotations = {labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL, **options.pop("annotations", {})}
    return tpu_jobset(name, annotations=annotations, **options)


def mixed_tpu_jobset(
    name: str, topologies: tuple[str, ...] = ("2x2", "2x4"), **options: Any
) -> dict[str, Any]:
    """One slice per topology, each its own replicated job.

    Pools of one shape are interchangeable to the scheduler: a slice whose pool comes late can
    find its pod already running on another slice's pool. Distinct shapes keep each pod on the
    pool made for it, so a scenario about faults stays deterministic.
    """
    jobset = exclusive_tpu_jobset(name, replicas=1, topology=topologies[0], replicated_job="s0", **options)
    for index, topology in enumerate(topologies[1:], start=1):
        other = tpu_jobset(name, replicas=1, topology=topology, replicated_job=f"s{index}", **options)
        jobset["spec"]["replicatedJobs"] += other["spec"]["replicatedJobs"]
    return jobset


def queued(jobset: Mapping[str, Any], queue: str = "multislice-queue", priority: str = "") -> dict[str, Any]:
    """A copy of ``jobset`` labelled for Kueue's LocalQueue ``queue`` (and WorkloadPriorityClass)."""
    body = copy.deepcopy(dict(jobset))
    meta_labels = body["metadata"].setdefault("labels", {})
    meta_labels[QUEUE_NAME_LABEL] = queue
    if priority:
        meta_labels[PRIORITY_CLASS_LABEL] = priority
    return body


def workload(stack: ScenarioStack, name: str, namespace: str = "default") -> dict[str, Any] | None:
    """The Kueue Workload of JobSet ``namespace/name`` (the one its controller owner names), or None."""
    jobset = stack.jobset(namespace, name)
    if jobset is None:
        return None
    uid = jobset["metadata"]["uid"]
    for found in kube(stack).list(KUEUE_API, "workloads", namespace):
        owners = (found.get("metadata") or {}).get("ownerReferences") or []
        if any(o.get("uid") == uid and o.get("kind") == "JobSet" for o in owners):
            return found
    return None


def condition(obj: Mapping[str, Any] | None, kind: str) -> bool:
    """Whether the object's status carries condition ``kind`` with status True."""
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def admitted(stack: ScenarioStack, name: str, namespace: str = "default") -> bool:
    """Whether Kueue admitted JobSet ``name``'s Workload (its ``Admitted`` condition)."""
    return condition(workload(stack, name, namespace), "Admitted")


def submit(stack: ScenarioStack, jobset: Mapping[str, Any]) -> dict[str, Any]:
    """Submit a builder JobSet, letting the API assign the uid as it would for ``kubectl apply``."""
    body = copy.deepcopy(dict(jobset))
    body["metadata"].pop("uid", None)
    return stack.submit(body)


def owned_pools(stack: ScenarioStack, name: str, namespace: str = "default") -> list[dict[str, Any]]:
    """Current pools whose ownership labels name JobSet ``namespace/name``."""
    result = []
    for pool in stack.managed_pools():
        node_labels = (pool.get("config") or {}).get("labels") or {}
        if (
            node_labels.get(labels.OWNER_NAME) == name
            and node_labels.get(labels.OWNER_NAMESPACE) == namespace
        ):
            result.append(pool)
    return result


def create_requests(stack: ScenarioStack, name: str) -> Counter[str]:
    """Create requests GKE received for the pools of JobSet ``name`` (by pool name)."""
    counts: Counter[str] = Counter()
    for call in stack.gke.calls:
        if call.method != "create":
            continue
        pool = next((p.split("=", 1)[1] for p in call.summary.split() if p.startswith("name=")), "")
        if pool.startswith(f"tpu-{name}-"):
            counts[pool] += 1
    return counts


def created_decisions(stack: ScenarioStack, name: str) -> list[dict[str, Any]]:
    """The ``provision.created`` lines (creates GKE accepted) for JobSet ``name``'s pools, oldest first."""
    return [
        d
        for d in stack.decisions("provision.created")
        if str(d.get("slice", "")).split(" ")[0].endswith(f"/{name}")
    ]


def successful_creates(stack: ScenarioStack, name: str) -> Counter[str]:
    """Pools of JobSet ``name`` that a function created (``provision.created``), by pool name."""
    return Counter(str(d.get("pool")) for d in created_decisions(stack, name))


def events_about(
    stack: ScenarioStack, reason: str, name: str, namespace: str = "default"
) -> list[dict[str, Any]]:
    """Events of ``reason`` about JobSet ``name`` or one of its pods."""
    found = []
    for event in stack.events(reason, namespace):
        involved = event.get("involvedObject") or {}
        target = str(involved.get("name", ""))
        if target == name or target.startswith(f"{name}-"):
            found.append(event)
    return found


def wait_finished(stack: ScenarioStack, name: str, timeout: float = 30.0, namespace: str = "default") -> str:
    """Wait until the JobSet is Completed or Failed; returns which."""
    stack.wait_for(
        lambda: stack.jobset_state(namespace, name) in ("Completed", "Failed"),
        timeout,
        f"JobSet {name} to finish",
    )
    return stack.jobset_state(namespace, name)


def wait_released(stack: ScenarioStack, name: str, timeout: float = 20.0, namespace: str = "default") -> None:
    """Wait until no pool of the JobSet is left and its Nodes are gone too.

    Waiting for the Nodes keeps the next scenario's pods off nodes that are about to disappear.
    """

    def released() -> bool:
        if owned_pools(stack, name, namespace):
            return False
        nodes = kube(stack).list("v1", "nodes", None, f"{labels.OWNER_NAME}={name}")
        return not [n for n in nodes if n["metadata"]["labels"].get(labels.OWNER_NAMESPACE) == namespace]

    stack.wait_for(released, timeout, f"pools and nodes of {name} to be deleted")


def assert_clean_run(
    stack: ScenarioStack, name: str, slices: int, creates_per_pool: int = 1, released_event: bool = True
) -> None:
    """The checks of every scenario once its JobSet is over.

    Exactly ``slices`` pools, each created successfully ``creates_per_pool`` times (1, except when a
    scenario recycles a failed pool), none left, and the Requested/Released Events recorded (the
    Released one names every pool; ``released_event=False`` when the JobSet itself was deleted).
    """
    created = successful_creates(stack, name)
    assert len(created) == slices, f"pools created for {name}: {dict(created)}"
    assert set(created.values()) == {creates_per_pool}, f"successful creates per pool: {dict(created)}"
    assert set(create_requests(stack, name)) == set(created), "GKE saw creates for other pool names"
    assert owned_pools(stack, name) == [], "pools left behind"
    # One Requested Event per group, on the JobSet and on the pod that asked, naming its pools.
    requested = events_about(stack, labels.REASON_REQUESTED, name)
    on_jobset = [e for e in requested if (e.get("involvedObject") or {}).get("kind") == "JobSet"]
    named = {
        word.rstrip(",")
        for event in on_jobset
        for word in str(event.get("message", "")).split(" for ")[0].split()
        if word.startswith("tpu-")
    }
    assert named == set(created), [e.get("message") for e in requested]
    assert len(requested) == 2 * len(on_jobset), [e.get("message") for e in requested]
    if not released_event:  # a deleted JobSet has nothing left to record the release on
        return

    def released_pools() -> set[str]:
        return {
            word
            for event in events_about(stack, labels.REASON_RELEASED, name)
            for word in str(event.get("message", "")).split(":")[0].replace(",", " ").split()
            if word.startswith("tpu-")
        }

    # Release records the Event after its last delete request, from another process: the pools
    # can be gone a moment before it is written.
    with contextlib.suppress(TimeoutError):
        stack.wait_for(lambda: released_pools() == set(created), 10, f"the Released Event of {name}")
    assert released_pools() == set(created), f"released {released_pools()}, created {set(created)}"


def pods_killed(stack: ScenarioStack, *names: str, namespace: str = "default") -> list[str]:
    """Pods of the named JobSets that a pool deletion killed (on the real stack: failed by the pod
    GC because their Node went, or still bound to a Node that is gone)."""
    prefixes = tuple(f"{namespace}/{name}-" for name in names)
    return [pod for pod in stack.killed_pods() if pod.startswith(prefixes)]


def restarts(stack: ScenarioStack, name: str, namespace: str = "default") -> int:
    """The JobSet's ``status.restarts`` (how many times its failurePolicy restarted it)."""
    jobset = stack.jobset(namespace, name) or {}
    return int((jobset.get("status") or {}).get("restarts") or 0)


def gke_requests(stack: ScenarioStack, method: str, pool: str) -> int:
    """How many ``method`` (create/delete) requests GKE received for node pool ``pool``."""
    count = 0
    for call in stack.gke.calls:
        if call.method != method:
            continue
        if method == "create":
            named = next((p.split("=", 1)[1] for p in call.summary.split() if p.startswith("name=")), "")
        else:
            named = call.path.rstrip("/").rsplit("/", 1)[-1]
        count += named == pool
    return count


SLICE_LABELS = (
    labels.OWNER_NAMESPACE,
    labels.OWNER_NAME,
    labels.OWNER_UID,
    labels.OWNER_REPLICATED_JOB,
    labels.OWNER_JOB_INDEX,
)


class PoolWatch:
    """Samples the GKE emulator's managed pools in the background while a scenario runs.

    A slice is what the ownership labels name (JobSet namespace, name, uid, replicated job, index);
    ``crowded`` lists every sample where more than one pool carried the same slice's labels (a slice
    paid for twice). Creates and deletes take ``gke_op_delay`` each, so a 50 ms period cannot miss a
    real overlap.
    """

    def __init__(self, stack: ScenarioStack, interval: float = 0.05) -> None:
        self.stack = stack
        self.interval = interval
        self.crowded: list[dict[str, list[str]]] = []
        self.owners: dict[str, list[tuple[str, ...]]] = {}  # pool -> the slices it carried, in order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-watch", daemon=True)

    def __enter__(self) -> PoolWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """Record one look at the pools."""
        by_slice: dict[tuple[str, ...], list[str]] = {}
        for pool in self.stack.managed_pools():
            pool_labels = (pool.get("config") or {}).get("labels") or {}
            key = tuple(str(pool_labels.get(k, "")) for k in SLICE_LABELS)
            name = str(pool.get("name"))
            by_slice.setdefault(key, []).append(name)
            seen = self.owners.setdefault(name, [])
            if not seen or seen[-1] != key:
                seen.append(key)
        crowded = {"/".join(key): names for key, names in by_slice.items() if len(names) > 1}
        if crowded:
            self.crowded.append(crowded)

    def carried_by(self, pool: str) -> list[str]:
        """The JobSet names that owned ``pool`` over the run, in order."""
        return [key[1] for key in self.owners.get(pool, [])]
