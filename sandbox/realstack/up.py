"""``tpuprov sandbox up``: RealStack with JobSet and Kueue installed, kept up until Ctrl-C.

The stack lives in this process's loopback-only network namespace, so the printed commands enter
it (``nsenter --net=/proc/<pid>/ns/net``); inside, plain ``kubectl`` with the printed KUBECONFIG (the
cluster administrator's), ``tpuprov status``/``why`` and ``tpuprov publish`` work as against any
cluster.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from types import FrameType
from typing import TextIO

from sandbox.realstack.core import RealStack
from sandbox.stack.config import ALL_FUNCTIONS, StackConfig


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the ``with``, which stops every process


def run_up(gke_op_delay: float = 2.0, quiet: bool = False, out: TextIO = sys.stdout) -> int:
    """Start, install JobSet and Kueue through setup_cluster, print how to use it, wait for Ctrl-C."""
    print(
        "tpuprov sandbox up: starting (real control plane, JobSet, Kueue, KWOK nodes)...",
        file=out,
        flush=True,
    )
    # Ctrl-C and SIGTERM both stop the stack, even where the shell started us with SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    started = time.monotonic()
    try:
        with RealStack(StackConfig(functions=ALL_FUNCTIONS, gke_op_delay=gke_op_delay)) as stack:
            stack.setup()
            enter = stack.enter_command()
            print(f"up in {time.monotonic() - started:.1f}s. In another shell (as root):", file=out)
            for key, value in stack.env().items():
                print(f"  export {key}={shlex.quote(value)}", file=out)
            print(f"  alias kubectl='{enter} {stack.kube_cluster.kubebin} kubectl'", file=out)
            print("", file=out)
            print(
                "  kubectl get nodes; kubectl get jobsets,pods,events -A; kubectl describe jobset NAME",
                file=out,
            )
            print(
                f"  {enter} .venv/bin/tpuprov status    # any tpuprov command, inside the namespace", file=out
            )
            print(f"  API server: {stack.kube_cluster.server}; GKE API emulator: {stack.gke.url}", file=out)
            print(f"  logs: {stack.workdir}", file=out)
            print(f"  child processes (pids): {' '.join(map(str, stack.pids))}", file=out)
            print("Press Ctrl-C to stop every process the sandbox started.", file=out, flush=True)
            if not quiet:
                stack.timeline.listen(lambda entry: print(entry.render(), file=out, flush=True))
            while True:
                time.sleep(1.0)
    except KeyboardInterrupt:
        print("\nstopping the sandbox...", file=out, flush=True)
    return 0
