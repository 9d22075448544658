"""A simulated kube-scheduler (and kubelet) for the sandbox's Kubernetes API.

Scheduling: a Pending pod without a node is bound to any Ready, schedulable (not cordoned) node
whose labels satisfy its nodeSelector and required node affinity and that has enough allocatable
``google.com/tpu`` left after the pods already bound (or being bound) there, whichever pool the
node belongs to, as kube-scheduler does; JobSet exclusive placement is honoured through the
required pod (anti-)affinity the JobSet webhook adds (``sandbox.cluster.affinity``). A pod that
fits nowhere gets ``PodScheduled=False/Unschedulable`` and a ``FailedScheduling`` Event with the
scheduler's message, and is retried with a doubling backoff (like the real scheduler's
unschedulable queue) that a Node change resets. A repeat failure bumps the Event's count, as the
API aggregates repeats; each emission is a new write and so a new log entry, as in GKE.

Binding: with ``bind_delay`` > 0 the decision and the bind are apart, like the real scheduler's
asynchronous binding cycle: the chosen node's capacity is reserved at once, and after the delay
the pod is bound to it without looking at the node again (only a pod deleted meanwhile is not
bound). A node cordoned or deleted in between still gets the pod: the cordon race.

Running: a bound pod runs for its ``sandbox.tpuprov.dev/run-seconds`` annotation (default from the
config) and then Succeeds, or Fails while its restart attempt is below
``sandbox.tpuprov.dev/fail-until-attempt``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from sandbox.cluster.affinity import PodPlacement
from sandbox.cluster.common import (
    FAIL_UNTIL_ATTEMPT_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    Loop,
    SimContext,
    is_true,
    now_rfc3339,
    ref,
    with_condition,
)
from shared.core import labels

COMPONENT = "default-scheduler"


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """Retry backoff of unschedulable pods and the default run time of scheduled ones."""

    initial_backoff: float = 1.0
    max_backoff: float = 10.0
    default_run_seconds: float = 3.0
    interval: float = 0.1
    bind_delay: float = 0.0  # seconds between the scheduling decision and the bind (0: at once)


@dataclasses.dataclass
class _Assumed:
    """A pod the scheduler decided on but has not bound yet (the scheduler cache's assumed pod)."""

    pod: dict[str, Any]
    node: str
    need: int
    due: float


@dataclasses.dataclass
class _Backoff:
    attempts: int = 0
    next_at: float = 0.0
    event: dict[str, Any] | None = None


def tpu_request(pod: Mapping[str, Any]) -> int:
    """Chips a pod asks for (requests, or limits when requests are omitted)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        amount = (resources.get("requests") or {}).get(labels.TPU_RESOURCE)
        if amount is None:
            amount = (resources.get("limits") or {}).get(labels.TPU_RESOURCE)
        try:
            total += int(str(amount)) if amount is not None else 0
        except ValueError:
            continue
    return total


def selector_matches(pod: Mapping[str, Any], node_labels: Mapping[str, str]) -> bool:
    """nodeSelector (all must match) and required node affinity (any term; In/NotIn/Exists)."""
    spec = pod.get("spec") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if node_labels.get(key) != str(value):
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(_term_matches(term, node_labels) for term in terms)


def _term_matches(term: Mapping[str, Any], node_labels: Mapping[str, str]) -> bool:
    for expr in term.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
        present = key in node_labels
        if op == "In" and (not present or node_labels[key] not in values):
            return False
        if op == "NotIn" and present and node_labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _allocatable_tpu(node: Mapping[str, Any]) -> int:
    try:
        return int(str(((node.get("status") or {}).get("allocatable") or {}).get(labels.TPU_RESOURCE, "0")))
    except ValueError:
        return 0


class Scheduler(Loop):
    """Binds pending pods to nodes, reports the ones that fit nowhere, and runs bound pods to the end."""

    name = "scheduler"

    def __init__(self, ctx: SimContext, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        super().__init__(self.config.interval)
        self.ctx = ctx
        self._backoff: dict[str, _Backoff] = {}
        self._started: dict[str, float] = {}
        self._assumed: dict[str, _Assumed] = {}
        self._binds_held = False
        self._nodes_changed = False
        ctx.api.on_change(self._changed)

    def hold_binds(self, held: bool = True) -> None:
        """Keep assumed pods unbound past their ``bind_delay`` until called with ``held=False``.

        A slow binding cycle on demand: tests use it to make "decided before the cordon, bound
        after it" happen whatever the load, instead of hoping it fits in ``bind_delay``.
        """
        with self.ctx.lock:
            self._binds_held = held
        self.wake()

    def _changed(self, event_type: str, obj: dict[str, Any]) -> None:
        kind = obj.get("kind")
        if kind == "Node" and event_type in ("ADDED", "DELETED"):
            self._nodes_changed = True  # the real scheduler moves unschedulable pods back to active
            self.wake()
        elif kind == "Pod" and event_type == "ADDED":
            self.wake()

    def step(self) -> None:
        """One scheduling pass plus the kubelet's progress on running pods."""
        now = time.monotonic()
        with self.ctx.lock:
            api = self.ctx.api
            for uid, assumed in list(self._assumed.items()):
                if now >= assumed.due and not self._binds_held:
                    del self._assumed[uid]
                    self._bind(assumed.pod, assumed.node)
            nodes = [n for n in api.list("v1", "nodes") if is_true(n, "Ready")]
            pods = api.list("v1", "pods")
            reset, self._nodes_changed = self._nodes_changed, False
            placement = PodPlacement(nodes, pods)
            used: dict[str, int] = {}
            for pod in pods:
                node = (pod.get("spec") or {}).get("nodeName")
                if node and (pod.get("status") or {}).get("phase") in ("Pending", "Running"):
                    used[node] = used.get(node, 0) + tpu_request(pod)
            for assumed in self._assumed.values():
                used[assumed.node] = used.get(assumed.node, 0) + assumed.need
                placement.add(assumed.pod, assumed.node)
            live = set()
            for pod in pods:
                uid = str(pod["metadata"].get("uid", ""))
                live.add(uid)
                phase = (pod.get("status") or {}).get("phase", "Pending")
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                if uid in self._assumed:
                    continue  # decided; the bind comes after the delay
                if phase == "Pending" and not (pod.get("spec") or {}).get("nodeName"):
                    state = self._backoff.setdefault(uid, _Backoff())
                    if reset:
                        state.next_at = 0.0
                    if now >= state.next_at:
                        self._schedule(pod, nodes, used, placement, state, now)
                elif phase == "Running":
                    self._progress(pod, now)
            for uid in list(self._backoff):
                if uid not in live:
                    del self._backoff[uid]
            for uid in list(self._started):
                if uid not in live:
                    del self._started[uid]
            for uid in list(self._assumed):
                if uid not in live:
                    del self._assumed[uid]

    # -- scheduling -------------------------------------------------------------------------------

    def _schedule(
        self,
        pod: dict[str, Any],
        nodes: list[dict[str, Any]],
        used: dict[str, int],
        placement: PodPlacement,
        state: _Backoff,
        now: float,
    ) -> None:
        need = tpu_request(pod)
        mismatched = insufficient = cordoned = 0
        affinity: dict[str, int] = {}
        chosen = None
        for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
            node_labels = (node.get("metadata") or {}).get("labels") or {}
            if (node.get("spec") or {}).get("unschedulable"):
                cordoned += 1
                continue
            if not selector_matches(pod, node_labels):
                mismatched += 1
                continue
            name = str(node["metadata"]["name"])
            if need and _allocatable_tpu(node) - used.get(name, 0) < need:
                insufficient += 1
                continue
            why = placement.violation(pod, node_labels)
            if why:
                affinity[why] = affinity.get(why, 0) + 1
                continue
            chosen = name
            break
        if chosen is not None:
            used[chosen] = used.get(chosen, 0) + need
            placement.add(pod, chosen)
            uid = str(pod["metadata"].get("uid", ""))
            self._backoff.pop(uid, None)
            if self.config.bind_delay > 0:
                self._assumed[uid] = _Assumed(pod, chosen, need, now + self.config.bind_delay)
                self.ctx.timeline.add("scheduler", f"pod {ref(pod)} assumed on {chosen}, binding")
            else:
                self._bind(pod, chosen)
            return
        message = _unschedulable_message(len(nodes), mismatched, insufficient, affinity, cordoned)
        self._unschedulable(pod, message, state)
        state.attempts += 1
        delay = min(self.config.initial_backoff * 2 ** (state.attempts - 1), self.config.max_backoff)
        state.next_at = now + delay

    def _bind(self, pod: dict[str, Any], node: str) -> None:
        if self.config.bind_delay > 0:
            # The binding call names the pod, not the node: only a pod that is gone fails it.
            meta = pod["metadata"]
            current = self.ctx.api.get("v1", "pods", meta.get("namespace"), str(meta.get("name", "")))
            if current is None or current["metadata"].get("uid") != meta.get("uid"):
                return
            if current["metadata"].get("deletionTimestamp") or (current.get("spec") or {}).get("nodeName"):
                return
            pod = current
        status = dict(pod.get("status") or {})
        status["conditions"] = with_condition(status, "PodScheduled", True, "", "")
        status["conditions"] = with_condition(status, "Ready", True, "", "")
        status.update(phase="Running", startTime=now_rfc3339(), hostIP="10.0.0.2", podIP="10.4.0.9")
        pod["spec"]["nodeName"] = node
        pod["status"] = status
        self.ctx.api.put(pod)
        self._started[str(pod["metadata"].get("uid", ""))] = time.monotonic()
        involved = {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}
        self.ctx.record_event(
            involved, "Scheduled", f"Successfully assigned {ref(pod)} to {node}", component=COMPONENT
        )
        self.ctx.timeline.add("scheduler", f"pod {ref(pod)} bound to {node}, Running")

    def _unschedulable(self, pod: dict[str, Any], message: str, state: _Backoff) -> None:
        status = dict(pod.get("status") or {})
        conditions = with_condition(status, "PodScheduled", False, "Unschedulable", message)
        if conditions != status.get("conditions"):
            status["conditions"] = conditions
            pod["status"] = status
            self.ctx.api.put(pod)
        if state.event is not None:
            state.event = self.ctx.bump_event(state.event, message)
        if state.event is None:
            involved = {"apiVersion": "v1", "kind": "Pod", "metadata": pod["metadata"]}
            state.event = self.ctx.record_event(
                involved, "FailedScheduling", message, warning=True, component=COMPONENT
            )
        if state.attempts == 0:
            self.ctx.timeline.add("scheduler", f"pod {ref(pod)} Pending: {message.split('. preemption')[0]}")

    # -- running ----------------------------------------------------------------------------------

    def _progress(self, pod: dict[str, Any], now: float) -> None:
        uid = str(pod["metadata"].get("uid", ""))
        started = self._started.setdefault(uid, now)
        annotations = pod["metadata"].get("annotations") or {}
        try:
            run_for = float(annotations.get(RUN_SECONDS_ANNOTATION, self.config.default_run_seconds))
        except ValueError:
            run_for = self.config.default_run_seconds
        if run_for <= 0:
            run_for = self.config.default_run_seconds
        if now - started < run_for:
            return
        attempt = int(pod["metadata"].get("labels", {}).get(labels.RESTART_ATTEMPT, "0") or 0)
        fail_until = int(annotations.get(FAIL_UNTIL_ATTEMPT_ANNOTATION, "0") or 0)
        phase = "Failed" if attempt < fail_until else "Succeeded"
        status = dict(pod.get("status") or {})
        status["conditions"] = with_condition(status, "Ready", False, "PodCompleted", "")
        status["phase"] = phase
        self.ctx.api.patch_status(
            "v1", "pods", pod["metadata"].get("namespace"), pod["metadata"]["name"], status
        )
        self.ctx.timeline.add("kubelet", f"pod {ref(pod)} {phase}")


_AFFINITY_REASONS = {
    "affinity": "didn't match pod affinity rules",
    "anti-affinity": "didn't match pod anti-affinity rules",
    "existing anti-affinity": "didn't satisfy existing pods anti-affinity rules",
}


def _unschedulable_message(
    total: int,
    mismatched: int,
    insufficient: int,
    affinity: Mapping[str, int] | None = None,
    cordoned: int = 0,
) -> str:
    parts = []
    if insufficient:
        parts.append(f"{insufficient} Insufficient {labels.TPU_RESOURCE}")
    for why, count in sorted((affinity or {}).items()):
        parts.append(f"{count} node(s) {_AFFINITY_REASONS[why]}")
    if mismatched:
        parts.append(f"{mismatched} node(s) didn't match Pod's node affinity/selector")
    if cordoned:
        parts.append(f"{cordoned} node(s) were unschedulable")
    reasons = ", ".join(parts) or "no nodes available to schedule pods"
    preemption = []
    if insufficient:
        preemption.append(f"{insufficient} No preemption victims found for incoming pod")
    unhelpful = mismatched + cordoned + sum((affinity or {}).values())
    if unhelpful:
        preemption.append(f"{unhelpful} Preemption is not helpful for scheduling")
    tail = ", ".join(preemption) or "no nodes available"
    return f"0/{total} nodes are available: {reasons}. preemption: 0/{total} nodes are available: {tail}."
