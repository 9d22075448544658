"""``tpuprov demo``: a ``demo`` flow on the real components, its live timeline and a summary.

The timeline is the stack's (functions' decisions, routed log entries, GKE pool changes) plus the
few cluster Events that tell the story between them: the real scheduler binding a pod, Kueue
admitting a Workload. The summary's numbers come from ``RealStack.summary()``: pools created, handed
over (``TPUSliceAdopted`` Events), deleted and leaked, and pods a pool deletion killed, read from
the real pods' status; in the fleet scenario, for each cluster. The summary also says what the stack's
processes took of the machine (``usage``: peak memory, CPU time). The exit code is 0 only when the
flow ended clean.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from typing import Any, TextIO

from sandbox.realstack import demo
from sandbox.realstack.core import RealStack
from sandbox.realstack.usage import Usage, UsageSampler
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig
from sandbox.stack.timeline import TimelineEntry

# Routine lines a person does not need to follow the story (``--verbose`` prints them too).
_ROUTINE_EVENTS = (".exists:", ".ignored:", ".nothing:", ".skipped:", ".resumed:", "gke.")
# Cluster Events worth a timeline line that no sink routes (reason -> the involved object's kind).
_STORY = {"Scheduled": "Pod", "Admitted": "Workload", "Preempted": "Workload"}


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """What the demo runs: the scenario, the basic scenario's slice shape and how long things take."""

    scenario: str = "kueue"  # or "basic", or "fleet" (the Kueue flow in two clusters at once)
    topology: str = "2x2"  # basic: v6e 2x2 is one VM per slice; 4x4 is four
    slices: int = 2
    run_seconds: float = 5.0
    timeout: float = 600.0
    verbose: bool = False
    width: int = 160


def is_routine(entry: TimelineEntry) -> bool:
    """Lines the default output leaves out: acknowledged deliveries and no-op decisions."""
    if entry.source == "relay":
        return " HTTP 2" in entry.text
    if entry.source in ("gke", "router", "cluster"):
        return False
    return any(marker in entry.text for marker in _ROUTINE_EVENTS)


def story_line(event_type: str, event: dict[str, Any]) -> str:
    """The timeline text of a cluster Event in ``_STORY`` ("" for any other)."""
    involved = event.get("involvedObject") or {}
    if event_type != "ADDED" or _STORY.get(str(event.get("reason"))) != involved.get("kind"):
        return ""
    target = f"{involved.get('namespace', '')}/{involved.get('name', '')}"
    return f"{event['reason']} {involved['kind']} {target}: {event.get('message', '')}"


def main(options: DemoOptions | None = None, out: TextIO = sys.stdout) -> int:
    """Run the chosen flow with the live timeline; 0 when it ends clean."""
    options = options or DemoOptions()
    lock = threading.Lock()
    quiet = threading.Event()  # once the summary prints, late timeline lines would interleave

    def show(entry: TimelineEntry) -> None:
        if not options.verbose and is_routine(entry):
            return
        line = entry.render()
        with lock:
            if not quiet.is_set():
                print(line if len(line) <= options.width else line[: options.width - 3] + "...", file=out)
                out.flush()

    print("tpuprov demo: etcd, kube-apiserver, scheduler, controller manager, KWOK, JobSet and", file=out)
    print(
        "Kueue controllers, GKE + Compute emulators, Pub/Sub emulator, the functions (loopback only)",
        file=out,
    )
    started = time.monotonic()
    fleet = options.scenario == "fleet"
    config = demo.fleet_config() if fleet else StackConfig(functions=ALL_FUNCTIONS, gke_op_delay=1.0)
    try:
        with RealStack(config) as stack:
            for plane in stack.planes:
                print(
                    f"started in {stack.startup_seconds:.1f}s; {plane.cluster_id.name}'s API server "
                    f"{plane.kube_cluster.server}",
                    file=out,
                )
            print(f"child processes (pids): {' '.join(map(str, stack.pids))}", file=out, flush=True)
            sampler = UsageSampler(lambda: stack.pids).start()
            stack.timeline.listen(show)
            for plane in stack.planes:
                assert plane.kube is not None
                name = plane.cluster_id.name

                def on_event(event_type: str, event: dict[str, Any], name: str = name) -> None:
                    text = story_line(event_type, event)
                    if text:
                        stack.timeline.add("cluster", f"{name}: {text}" if fleet else text)

                plane.kube.on_change(on_event)
            if options.scenario == "basic":
                outcome = demo.run_basic(
                    stack, options.slices, options.topology, options.run_seconds, options.timeout
                )
            elif fleet:
                outcome = demo.run_fleet(stack, run_seconds=options.run_seconds, timeout=options.timeout)
            else:
                outcome = demo.run(stack, run_seconds=options.run_seconds, timeout=options.timeout)
            quiet.set()
            usage = sampler.stop()
            calls = len(stack.relay.deliveries)
    except KeyboardInterrupt:
        print("\ntpuprov demo: interrupted; every process it started was stopped", file=out)
        return 130
    _print_summary(outcome, calls, time.monotonic() - started, usage, out)
    return 1 if outcome.problems else 0


def _print_summary(outcome: demo.Outcome, calls: int, wall: float, usage: Usage, out: TextIO) -> None:
    summary = outcome.summary
    print("\nSummary (real Kubernetes components)", file=out)
    print(f"  JobSets:        {', '.join(f'{n} {s}' for n, s in outcome.states.items())}", file=out)
    for name, numbers in outcome.clusters.items() or [("", summary)]:
        print(
            f"  node pools:     {name + ': ' if name else ''}created {numbers.pools_created}, handed over "
            f"{numbers.pools_adopted}, deleted {numbers.pools_deleted}, leaked {len(numbers.pools_leaked)}",
            file=out,
        )
    killed = (
        sum(n.pods_killed for n in outcome.clusters.values()) if outcome.clusters else summary.pods_killed
    )
    print(f"  pods killed by a pool deletion: {killed} (read from the real pods)", file=out)
    print(f"  function calls: {calls} ({summary.redeliveries} redelivered)", file=out)
    print(f"  phases:         {', '.join(f'{k} {v:.1f}s' for k, v in outcome.seconds.items())}", file=out)
    print(f"  wall time:      {wall:.1f}s (stack up and down included)", file=out)
    print(f"  machine:        {usage.render()}", file=out)
    for problem in outcome.problems:
        print(f"  PROBLEM: {problem.splitlines()[0]}", file=out)
    if not outcome.problems:
        print("  result:         OK", file=out)
