"""Loopback only, by construction: the real control plane runs in a network namespace with just ``lo``.

The release manifests point webhooks, CRD conversion and Kueue's visibility APIService at
Services, and the API server reaches a Service by dialling its cluster IP (10.96.x here). On the
host's network such a dial can leave the machine. In a fresh network namespace the only interface
is ``lo`` and there is no route at all, so every address but 127.0.0.0/8 (and ::1) fails at once
with ENETUNREACH, whatever object the API server is given.

Namespaces belong to threads: ``isolate()`` moves the calling thread, and every thread and child
process it starts afterwards inherits the namespace. Call it first thing in the process (the real
tests' conftest and ``tpuprov demo`` do) so that no earlier thread, such as a gRPC worker,
keeps dialling from the host's network. ``RealCluster.start`` calls it too, as a last guard.

Why not a ``--service-cluster-ip-range`` inside 127.0.0.0/8 instead: Kubernetes refuses loopback
addresses as endpoints (``ValidateEndpointIP``), a Service's cluster IP would then be a loopback
port nobody serves, and it would guard only Service dials, not any other address an object names.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

CLONE_NEWNET = 0x40000000  # <linux/sched.h>
_NET_DEV = Path("/proc/thread-self/net/dev")  # this thread's namespace (sysfs shows the mounter's)


def interfaces() -> list[str]:
    """The network interfaces of the calling thread's namespace."""
    lines = _NET_DEV.read_text().splitlines()[2:]  # two header lines
    return sorted(line.split(":", 1)[0].strip() for line in lines)


def loopback_only() -> bool:
    """Whether the calling thread's network namespace has no interface but ``lo``."""
    return interfaces() == ["lo"]


def isolate() -> None:
    """Move the calling thread into a new network namespace (unless it is in one with only ``lo``)
    and bring ``lo`` up there; RuntimeError when the kernel refuses (it needs CAP_SYS_ADMIN)."""
    if not loopback_only():
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise RuntimeError(
                f"cannot create a network namespace ({os.strerror(err)}); the real control plane "
                "runs only in one whose sole interface is lo (run as root, or under `unshare --net`)"
            )
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True, capture_output=True, timeout=10)
    if not loopback_only():
        raise RuntimeError(f"network namespace still has {interfaces()}")
