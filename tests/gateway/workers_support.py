"""Helpers of the `gateway start --workers N` tests: which worker process serves a TCP connection
(found through /proc: the server side of the connection is a socket that one worker holds)."""

from __future__ import annotations

import os
from pathlib import Path


def children(pid: int) -> list[int]:
    """The live child processes of `pid`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def workers(supervisor: int) -> list[int]:
    """The worker processes of a supervisor (its children running `gateway.cli start`)."""
    out = []
    for pid in children(supervisor):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(b"--worker-of") for a in cmd):
            out.append(pid)
    return sorted(out)


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return out
    for fd in names:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def server_socket_inode(server_port: int, client_port: int) -> int | None:
    """The inode of the gateway's end of the loopback connection from `client_port`."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote, inode = f[1], f[2], int(f[9])
            if (
                int(local.rsplit(":", 1)[1], 16) == server_port
                and int(remote.rsplit(":", 1)[1], 16) == client_port
            ):
                return inode
    return None


def worker_serving(supervisor: int, server_port: int, client_port: int) -> int | None:
    """The pid of the worker that holds the connection from local port `client_port`."""
    inode = server_socket_inode(server_port, client_port)
    if inode is None:
        return None
    for pid in workers(supervisor):
        if inode in _socket_inodes(pid):
            return pid
    return None
