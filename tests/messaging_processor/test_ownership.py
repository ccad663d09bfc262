"""messaging_processor/ownership.py: owner names, whether the owner still runs, and leases."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from messaging_processor import ownership as owners

NS = "test.leases"  # the namespace of the leases (each adapter names its own)


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


def test_owners_on_other_hosts_are_foreign_and_left_to_their_leases():
    here = socket.gethostname()
    assert owners.foreign("elsewhere/12/345")
    for owner in (f"{here}/12/345", None, 42, "", "elsewhere", "elsewhere/x/1", "elsewhere/1/", "/1/2"):
        assert not owners.foreign(owner)


class MemoryTable:
    """An in-memory key-value table (the processor's, as the leases use it)."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], bytes] = {}
        self.puts = 0

    async def kv_get(self, ns: str, key: str) -> bytes | None:
        return self.data.get((ns, key))

    async def kv_put(self, ns: str, key: str, value: bytes) -> None:
        self.puts += 1
        self.data[(ns, key)] = value

    async def kv_delete(self, ns: str, key: str) -> bool:
        return self.data.pop((ns, key), None) is not None


async def test_a_lease_that_moves_is_a_running_process_and_a_still_or_missing_one_is_gone():
    kv = MemoryTable()
    running = owners.OwnerLeases(kv, "a-host/1/1", NS, interval_s=0.05)
    await running.start()
    try:
        kv.data[(NS, "b-host/2/2")] = b"stale"  # a process that died: its lease stays
        checker = owners.OwnerLeases(kv, "me-host/9/9", NS, interval_s=0.05)
        assert checker.ttl_s == pytest.approx(0.15)  # three beats
        everyone = {"a-host/1/1", "b-host/2/2", "c-host/3/3"}
        assert await checker.gone(everyone) == {"b-host/2/2", "c-host/3/3"}
        assert kv.puts >= 3  # the running one beat meanwhile
    finally:
        await running.close()
    assert (NS, "a-host/1/1") not in kv.data  # a clean stop deletes its lease
    assert await checker.gone({"a-host/1/1"}) == {"a-host/1/1"}
