"""Loopback ports for the sandbox's child servers, and who listens on them.

A child server (the Java Pub/Sub emulator, a functions-framework process) is told its port on the
command line, so the port must be chosen before the child binds it, seconds later. A port chosen by
binding port 0 comes from the kernel's ephemeral range, the same range every outgoing connection
and every other ``bind(0)`` on the machine draws from; under a busy test run one of them can take
the port in that gap. Ports here are therefore drawn below the ephemeral range, where only explicit
binds land. That makes a collision rare, not impossible, so callers still check that the listener
they reach is their own child (:func:`listener_is_ours`) and start again elsewhere when it is not.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
from pathlib import Path

# Linux's default ephemeral range; read from /proc when it is there.
_DEFAULT_EPHEMERAL = (32768, 60999)
# Below this the ports belong to well-known and registered services more often than not.
_LOWEST = 10000
# Fewer candidates than this below the ephemeral range and the kernel's own choice is used instead.
_MIN_SPAN = 2000
_ATTEMPTS = 50
_random = random.Random(os.urandom(16))


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for automatically chosen local ports (``ip_local_port_range``)."""
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def _bind_candidate(sock: socket.socket, host: str) -> int:
    low = ephemeral_range()[0]
    if low - _LOWEST >= _MIN_SPAN:
        for _ in range(_ATTEMPTS):
            port = _random.randrange(_LOWEST, low)
            try:
                sock.bind((host, port))
            except OSError:
                continue  # in use (by us too: earlier picks are still bound): try another
            return port
    sock.bind((host, 0))  # no room below the ephemeral range (or all tries taken): the kernel's choice
    return int(sock.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A port below the ephemeral range that nothing was bound to a moment ago."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports (their sockets are held together, so none is handed out twice)."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            ports.append(_bind_candidate(sock, host))
        return ports


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie, read from /proc."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def listening_sockets(port: int) -> set[str]:
    """Inodes of the TCP sockets listening on ``port`` (any address), from /proc/net."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # fields: sl, local_address (HEXIP:HEXPORT), rem_address, st (0A = LISTEN), ..., inode
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listener_is_ours(port: int, pgid: int) -> bool:
    """Whether every socket listening on ``port`` belongs to process group ``pgid``.

    When someone else took the port between choosing and binding it, the child fails to bind while
    the other listener (if any) answers in its place; this tells the two apart.
    """
    wanted = listening_sockets(port)
    if not wanted:
        return False
    owned: set[str] = set()
    for pid in group_members(pgid):
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue  # closed meanwhile
            if link.startswith("socket:["):
                owned.add(link[len("socket:[") : -1])
    return wanted <= owned
