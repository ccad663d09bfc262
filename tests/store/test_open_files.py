"""The bound on open consume queue files (store/openfiles.py): many queues, few descriptors; a queue
whose file the bound closed reads, appends and recovers as before."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from store import Message
from store.openfiles import OpenFiles


def cq_fds() -> int:
    """Descriptors of this process open on consume queue files."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone
            n += os.readlink(f"/proc/self/fd/{fd}").endswith(".cq")
    return n


async def test_many_queues_few_descriptors(make_store, tmp_path):
    before = cq_fds()
    s = await make_store(max_open_queue_files=4)
    for i in range(40):
        s.create_topic(f"t{i}", queues=1)
        await s.append(Message(f"t{i}", f"a{i}".encode()))
    await s._parts.checkpoints.checkpoint()  # entries into their files: reads below go to the files
    for i in range(40):
        assert [m.body for m in s.read(f"t{i}", 0, 0)] == [f"a{i}".encode()]
    assert len(s._catalog.files) <= 4
    assert cq_fds() - before <= 4, "more queue files open than the bound"
    assert s._catalog.files.closes > 0
    # appends to queues whose file was closed land after their first entry, and checkpoint there
    for i in range(40):
        r = await s.append(Message(f"t{i}", f"b{i}".encode()))
        assert r.queue_offset == 1
    await s._parts.checkpoints.checkpoint()
    for i in range(0, 40, 3):
        assert [m.body for m in s.read(f"t{i}", 0, 0)] == [f"a{i}".encode(), f"b{i}".encode()]
    popped = await s.pop("g", "t7", max_messages=8, invisible_time_ms=30_000)
    assert [p.message.body for p in popped] == [b"a7", b"b7"]
    await s.close()
    assert cq_fds() == before
    s2 = await make_store(max_open_queue_files=4)
    for i in range(40):
        assert [m.body for m in s2.read(f"t{i}", 0, 0)] == [f"a{i}".encode(), f"b{i}".encode()]
        assert s2.max_offset(f"t{i}", 0) == 2
    assert cq_fds() - before <= 4


async def test_recovery_replays_into_closed_files(make_store):
    """Entries past the last checkpoint are rebuilt from the commit log into queues whose files the
    bound keeps closed, and only those files are synced."""
    s = await make_store(max_open_queue_files=2, checkpoint_interval_ms=3_600_000)
    for i in range(10):
        s.create_topic(f"r{i}", queues=1)
        await s.append(Message(f"r{i}", b"x"))
    s._parts.checkpoints.checkpoint = _no_checkpoint  # a crash: close writes no entries
    for cq in s.cqs.values():
        cq.mem.clear()
    s._closed = True
    s._parts.appender.closed = s._parts.pops.closed = s._parts.tails.closed = True
    await s._run_io(s._close_files)
    s._io.shutdown(wait=True)
    s.meta.close()
    s.kv.close()
    os.close(s._lock_fd)
    s2 = await make_store(max_open_queue_files=2)
    for i in range(10):
        assert [m.body for m in s2.read(f"r{i}", 0, 0)] == [b"x"]
    assert len(s2._catalog.files) <= 2


async def _no_checkpoint(*_a, **_k) -> None:
    return None


class _F:
    def __init__(self, path: str) -> None:
        self.path, self._fd, self._pins = path, -1, 0


def test_pinned_files_stay_open(tmp_path):
    files = OpenFiles(2)
    fs = [_F(str(tmp_path / f"{i}.cq")) for i in range(5)]
    pinned = files.acquire(fs[0])  # in use (another thread reading it)
    for f in fs[1:]:
        files.acquire(f)
        files.release(f)
    assert fs[0]._fd == pinned >= 0, "the bound closed a file in use"
    os.pwrite(pinned, b"ok", 0)
    files.release(fs[0])
    assert [f._fd >= 0 for f in fs].count(True) == 2
    files.acquire(fs[1])
    files.release(fs[1])
    assert fs[0]._fd == -1, "the least recently used file stays open"
    assert Path(fs[0].path).read_bytes() == b"ok"
    for f in fs:
        files.close(f)
    assert len(files) == 0
    with pytest.raises(ValueError):
        OpenFiles(0)


async def test_idle_checkpoint_does_not_rewrite_the_file(make_store, tmp_path):
    """With nothing new, a checkpoint leaves checkpoint.json alone (it lists every queue: with
    100,000 of them, rewriting and syncing it every second was an idle cost)."""
    s = await make_store(checkpoint_interval_ms=3_600_000)
    for i in range(5):
        await s.append(Message(f"c{i}", b"x"))
    await s._parts.checkpoints.checkpoint()
    path = tmp_path / "data" / "checkpoint.json"
    inode = os.stat(path).st_ino
    await s._parts.checkpoints.checkpoint()
    assert os.stat(path).st_ino == inode, "an idle checkpoint rewrote the file"
    await s.append(Message("c0", b"y"))
    await s._parts.checkpoints.checkpoint()
    assert os.stat(path).st_ino != inode
    s.create_topic("fresh", queues=1)
    s.read("fresh", 0, 0)  # its queue exists now: the next checkpoint lists it
    inode = os.stat(path).st_ino
    await s._parts.checkpoints.checkpoint()
    assert os.stat(path).st_ino != inode
