"""``tpuprov demo`` and ``tpuprov sandbox up``: the product end to end on this machine.

By default the demo runs GKE's Kueue multislice flow (``sandbox.stack.demo_kueue``): queued JobSets
admitted by the simulated Kueue, pools handed over between them, none left at the end.

``--scenario basic`` starts the sandbox stack, submits a two-slice TPU JobSet and a CPU-only JobSet,
prints the timeline as it happens (pods pending, events routed, function calls, pools requested,
nodes ready, pods running, JobSet completed, pools deleted) and ends with a summary. It exits 0 only
when both JobSets completed, every pool the product created is gone and the CPU JobSet got none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TextIO

from sandbox.jobsets import cpu_jobset, tpu_jobset
from sandbox.stack.config import StackConfig
from sandbox.stack.core import Stack
from sandbox.stack.demo_kueue import run_kueue_scenario
from sandbox.stack.timeline import TimelineEntry
from shared.core import labels

NAMESPACE = "default"
TPU_JOBSET = "demo-train"
CPU_JOBSET = "demo-cpu"
# Routine lines a person does not need to follow the story (``--verbose`` prints them too).
_ROUTINE_EVENTS = (".exists:", ".ignored:", ".nothing:", "gke.")


@dataclasses.dataclass(frozen=True)
class DemoOptions:
    """What the demo runs: the scenario, the basic scenario's slice shape and how long things take."""

    topology: str = "2x2"  # v6e 2x2 is one VM per slice; 4x4 is four
    slices: int = 2
    run_seconds: float = 3.0
    timeout: float = 60.0
    verbose: bool = False
    width: int = 160
    scenario: str = "kueue"  # or "basic"


def is_routine(entry: TimelineEntry) -> bool:
    """Lines the default output leaves out: acknowledged deliveries and no-op decisions."""
    if entry.source == "relay":
        return " HTTP 2" in entry.text
    if entry.source in ("gke", "router"):
        return False
    return any(marker in entry.text for marker in _ROUTINE_EVENTS)


def _finished(stack: Stack, name: str) -> Callable[[], bool]:
    return lambda: stack.jobset_state(NAMESPACE, name) in ("Completed", "Failed")


def run_demo(options: DemoOptions, config: StackConfig | None = None, out: TextIO = sys.stdout) -> int:
    """Run the demo; returns the process exit code (0 success, 1 leak or timeout)."""
    config = config or StackConfig(default_run_seconds=options.run_seconds)
    lock = threading.Lock()

    def show(entry: TimelineEntry) -> None:
        if options.verbose or not is_routine(entry):
            line = entry.render()
            if len(line) > options.width:
                line = line[: options.width - 3] + "..."
            with lock:
                print(line, file=out, flush=True)

    print(
        "tpuprov demo: starting the local sandbox (Pub/Sub emulator, GKE + Kubernetes APIs, functions)",
        file=out,
    )
    started = time.monotonic()
    with Stack(config) as stack:
        print(f"child processes (pids): {' '.join(map(str, stack.pids))}", file=out, flush=True)
        stack.timeline.listen(show)
        if options.scenario == "kueue":
            return _kueue(stack, options, started, out)
        tpu = tpu_jobset(
            TPU_JOBSET,
            NAMESPACE,
            replicas=options.slices,
            topology=options.topology,
            run_seconds=options.run_seconds,
            # One slice per node pool, as multislice training JobSets ask for.
            annotations={labels.EXCLUSIVE_TOPOLOGY: labels.NODEPOOL},
        )
        tpu["metadata"].pop("uid", None)
        cpu = cpu_jobset(CPU_JOBSET, NAMESPACE)
        cpu["metadata"].pop("uid", None)
        stack.submit(tpu)
        stack.submit(cpu)
        problems: list[str] = []
        deadline = started + options.timeout
        try:
            for name in (TPU_JOBSET, CPU_JOBSET):
                stack.wait_for(
                    _finished(stack, name),
                    max(1.0, deadline - time.monotonic()),
                    f"JobSet {name} to finish",
                )
            stack.wait_for(
                lambda: not stack.managed_pools() and stack.summary().pools_deleted >= options.slices,
                max(1.0, deadline - time.monotonic()),
                "every TPU pool to be deleted",
            )
        except TimeoutError as exc:
            problems.append(str(exc).splitlines()[0])
        summary = stack.summary()
        states = {name: stack.jobset_state(NAMESPACE, name) for name in (TPU_JOBSET, CPU_JOBSET)}
        cpu_pools = [p for p in stack.managed_pools() if CPU_JOBSET in str(p.get("name"))]
        calls = len(stack.relay.deliveries)
    for name, state in states.items():
        if state != "Completed":
            problems.append(f"JobSet {name} ended {state}")
    if summary.pools_created != options.slices:
        problems.append(f"expected {options.slices} pools created, saw {summary.pools_created}")
    if summary.pools_leaked:
        problems.append(f"leaked pools: {', '.join(summary.pools_leaked)}")
    if cpu_pools:
        problems.append(f"the CPU JobSet got pools: {cpu_pools}")
    wall = time.monotonic() - started
    print("", file=out)
    print("Summary", file=out)
    print(f"  JobSets:        {', '.join(f'{n} {s}' for n, s in states.items())}", file=out)
    print(
        f"  node pools:     created {summary.pools_created}, deleted {summary.pools_deleted}, "
        f"leaked {len(summary.pools_leaked)}",
        file=out,
    )
    print(f"  function calls: {calls} ({summary.redeliveries} redelivered)", file=out)
    print(f"  wall time:      {wall:.1f}s (stack up and down included)", file=out)
    if problems:
        for problem in problems:
            print(f"  PROBLEM: {problem}", file=out)
        return 1
    print("  result:         OK", file=out)
    return 0


def _kueue(stack: Stack, options: DemoOptions, started: float, out: TextIO) -> int:
    outcome = run_kueue_scenario(stack, options.run_seconds, options.timeout - (time.monotonic() - started))
    summary = outcome.summary
    print("", file=out)
    print("Summary", file=out)
    print(f"  JobSets:        {', '.join(f'{n} {s}' for n, s in outcome.states.items())}", file=out)
    print(
        f"  node pools:     created {summary.pools_created}, handed over {summary.pools_adopted}, "
        f"deleted {summary.pools_deleted}, leaked {len(summary.pools_leaked)}",
        file=out,
    )
    print(f"  pods killed by a pool deletion: {summary.pods_killed}", file=out)
    print(f"  function calls: {len(stack.relay.deliveries)} ({summary.redeliveries} redelivered)", file=out)
    print(f"  wall time:      {time.monotonic() - started:.1f}s (stack up included)", file=out)
    for problem in outcome.problems:
        print(f"  PROBLEM: {problem}", file=out)
    if outcome.problems:
        return 1
    print("  result:         OK", file=out)
    return 0


def run_up(
    config: StackConfig | None = None,
    quiet: bool = False,
    out: TextIO = sys.stdout,
    step: Callable[[str], AbstractContextManager[Any]] | None = None,
) -> int:
    """Start the stack, print how to use it, and keep it running until Ctrl-C (or SIGTERM).

    ``step(what)`` (the CLI's progress line) wraps the start, which takes seconds (the Java emulator).
    """
    stack = Stack(config or StackConfig())
    try:
        with (
            step("Starting the sandbox (Pub/Sub emulator, GKE and Kubernetes APIs, functions)")
            if step
            else (contextlib.nullcontext())
        ):
            stack.start()
        print("tpuprov sandbox is up. In another shell:", file=out)
        for key, value in stack.env().items():
            print(f"  export {key}={shlex.quote(value)}", file=out)
        print("", file=out)
        print(f"  kubectl get jobsets,pods -A        # Kubernetes API at {stack.kube.url}", file=out)
        print(f"  GKE API emulator:                  {stack.gke.url}", file=out)
        print(f"  function logs:                     {stack.workdir}", file=out)
        print(f"  child processes (pids):            {' '.join(map(str, stack.pids))}", file=out)
        print("Press Ctrl-C to stop every process the sandbox started.", file=out, flush=True)
        if not quiet:
            stack.timeline.listen(lambda entry: print(entry.render(), file=out, flush=True))
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        print("\nstopping the sandbox...", file=out, flush=True)
        return 0
    finally:
        stack.stop()
