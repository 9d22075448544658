"""``python -m sandbox.kube``: bring the real control plane up for a person, until Ctrl-C.

It prints the admin kubeconfig and the kubectl to use with it (entering this process's network
namespace, where the control plane lives); ``--addons`` also installs the JobSet
and Kueue releases with their controllers running locally. Every process stops on exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType

from sandbox.kube import addons
from sandbox.kube.cluster import RealCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.kube", description=__doc__)
    parser.add_argument("--addons", action="store_true", help="install JobSet and Kueue and run them")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    with RealCluster() as cluster:
        if args.addons:
            for release in [addons.apply_release(cluster, a) for a in (addons.JOBSET, addons.KUEUE)]:
                addons.run_controller(cluster, release)
        # The control plane lives in this process's loopback-only network namespace
        # (sandbox.kube.netns): a shell reaches it by entering that namespace.
        enter = f"nsenter --net=/proc/{os.getpid()}/ns/net"
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        print(f"alias kubectl='{enter} {cluster.kubebin} kubectl'")
        print(f"# API server {cluster.server}; logs in {cluster.dir}; Ctrl-C stops everything", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
