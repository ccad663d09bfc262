"""Which process declared a transient exchange or queue, and whether that process still runs.

A proxy that starts removes the transient declarations (non-durable exchanges, non-durable and
exclusive queues) that a process which died left in the shared records. It must not remove those of
processes still running: the other workers of `gateway start --workers N`, or CLUSTER proxies on
the same host. So each such record names its owner, `<host>/<pid>/<start time>` (the start time
from /proc, so that a reused pid is not taken for the old process), and `alive` checks it. A record
without an owner, or of another host, or where /proc cannot tell, counts as dead: it is removed,
as every transient record was before owners were recorded."""

from __future__ import annotations

import functools
import os
import socket


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()  # after the command name, which may hold spaces
    return fields[19].decode() if len(fields) > 19 else None


@functools.cache
def this_process() -> str:
    """The owner name of this process (fixed for its life)."""
    pid = os.getpid()
    return f"{socket.gethostname()}/{pid}/{_start_time(pid) or ''}"


def alive(owner: object) -> bool:
    """Whether the process named `owner` runs (on this host) now, and is another process: what
    this process recorded before a proxy in it starts belongs to an earlier proxy (tests restart
    one in the same process)."""
    if not isinstance(owner, str) or owner == this_process():
        return False
    host, _, rest = owner.partition("/")
    pid, _, started = rest.partition("/")
    if host != socket.gethostname() or not pid.isdigit() or not started:
        return False
    return _start_time(int(pid)) == started
