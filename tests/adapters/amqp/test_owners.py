"""owners.py: the process that recorded a transient declaration, and whether it still runs."""

from __future__ import annotations

import socket
import subprocess
import sys

from adapters.amqp import owners


def test_a_running_process_is_alive_and_an_ended_or_reused_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        started = owners._start_time(child.pid)
        assert started
        owner = f"{socket.gethostname()}/{child.pid}/{started}"
        assert owners.alive(owner)
        # the same pid with another start time: a reused pid, not that process
        assert not owners.alive(f"{socket.gethostname()}/{child.pid}/{int(started) + 1}")
        assert not owners.alive(f"another-host/{child.pid}/{started}")  # cannot tell: dead
    finally:
        child.stdin.close()
        child.wait(10)
    assert not owners.alive(owner)


def test_this_process_and_unreadable_owners_count_as_gone():
    """A proxy starting in a process that recorded before (tests restart proxies in-process) cleans
    up what the earlier one left; records without a readable owner are cleaned up as before."""
    assert owners.this_process().startswith(f"{socket.gethostname()}/")
    assert not owners.alive(owners.this_process())
    for owner in (None, 42, "", "host-only", f"{socket.gethostname()}/x/1", f"{socket.gethostname()}/1/"):
        assert not owners.alive(owner)
