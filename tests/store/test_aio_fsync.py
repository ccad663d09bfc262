"""fdatasync through Linux AIO (store/aio_fsync.py): results reach the loop, errors carry the
kernel's errno, and a store syncing this way acknowledges only what the helper-process way would."""

from __future__ import annotations

import asyncio
import errno
import os
import platform
import sys

import pytest

from store import Message
from store.aio_fsync import AioFsync
from store.fsyncer import FsyncClient

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.machine() not in ("x86_64", "aarch64"),
    reason="Linux AIO fdatasync is used on x86_64/aarch64 Linux only (elsewhere the helper process)",
)


async def _client(tmp_path):
    loop = asyncio.get_running_loop()
    results: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    aio = AioFsync.open(loop, lambda rid, err: results.put_nowait((rid, err)), str(tmp_path))
    assert aio is not None, "this kernel should do AIO fdatasync (Linux >= 4.18)"
    return aio, results


async def test_sync_of_several_files_is_one_result(tmp_path):
    aio, results = await _client(tmp_path)
    try:
        paths = []
        for i in range(3):
            p = tmp_path / f"f{i}"
            p.write_bytes(os.urandom(4096))
            paths.append(str(p))
        rid1 = aio.request(paths)
        rid2 = aio.request(paths[:1])
        got = dict([await asyncio.wait_for(results.get(), 10) for _ in range(2)])
        assert got == {rid1: 0, rid2: 0}
        assert results.empty()
        assert aio._inflight == 0 and not aio._pending
    finally:
        aio.close()


async def test_a_file_that_cannot_be_synced_reports_the_kernels_errno(tmp_path):
    aio, results = await _client(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # so that opening it read-only does not block
    try:
        ok = tmp_path / "ok"
        ok.write_bytes(b"x")
        rid = aio.request([str(ok), str(fifo)])  # a pipe has no fsync: EINVAL from the kernel
        assert await asyncio.wait_for(results.get(), 10) == (rid, errno.EINVAL)
        rid = aio.request([str(tmp_path / "missing")])
        assert await asyncio.wait_for(results.get(), 10) == (rid, errno.ENOENT)
        rid = aio.request([str(ok)])  # and it goes on working
        assert await asyncio.wait_for(results.get(), 10) == (rid, 0)
    finally:
        os.close(keep)
        aio.close()


async def test_store_picks_aio_by_default_and_helper_on_request(make_store, tmp_path):
    s = await make_store()
    assert isinstance(s._parts.writer.fsync, AioFsync)
    h = await make_store(data_dir=str(tmp_path / "h"), fsync_method="helper")
    assert isinstance(h._parts.writer.fsync, FsyncClient)
    with pytest.raises(ValueError):
        await make_store(data_dir=str(tmp_path / "x"), fsync_method="threads")


async def test_appends_are_acknowledged_after_their_sync_and_survive_reopen(make_store, tmp_path):
    s = await make_store(fsync_method="aio", segment_size=64 << 10)
    writer = s._parts.writer
    synced = []
    orig = writer._synced

    def spy(rid: int, err: int) -> None:
        synced.append(writer._inflight[2])  # the commit log end this sync covers
        orig(rid, err)

    writer.fsync.on_done = spy
    bodies = [os.urandom(700) for _ in range(300)]  # crosses segments: multi-file syncs
    results = await asyncio.gather(*(s.append(Message("T", b)) for b in bodies))
    for r in results:  # no append answered before a completed sync covered it
        assert any(r.commitlog_offset + r.size <= end for end in synced)
    await s.close()
    s2 = await make_store()
    got = {}
    for q in range(s2.topic("T").queues):
        for m in s2.read("T", q, 0, None, 1000):
            got[m.body] = got.get(m.body, 0) + 1
    assert got == {b: 1 for b in bodies}


async def test_auto_falls_back_to_the_helper_where_aio_is_missing(make_store, tmp_path, monkeypatch):
    """A kernel without AIO fdatasync (or a seccomp filter refusing io_setup): `auto` syncs through
    the helper process and appends still work; `aio` refuses to open."""
    import store.writer as writer_mod

    monkeypatch.setattr(writer_mod.AioFsync, "open", classmethod(lambda cls, *a: None))
    with pytest.raises(OSError, match="AIO"):
        await make_store(fsync_method="aio")
    s = await make_store()  # the same directory: the failed open released it
    assert isinstance(s._parts.writer.fsync, FsyncClient)
    r = await s.append(Message("T", b"via the helper"))
    assert s.get_message(r.commitlog_offset).body == b"via the helper"


async def test_a_request_over_more_files_than_the_cache_syncs_each_file(tmp_path):
    """The client keeps a few segment files open. A request naming more must still submit one
    descriptor per file, each open on that file: closing one of them before the submit would let
    the next open reuse its number, and a file would go unsynced."""
    aio, results = await _client(tmp_path)
    submitted: list[tuple[int, int]] = []  # (device, inode) each submitted descriptor is open on
    orig = aio._submit

    def spy(fds: list[int], rid: int) -> None:
        submitted.extend((os.fstat(fd).st_dev, os.fstat(fd).st_ino) for fd in fds)
        orig(fds, rid)

    aio._submit = spy
    try:
        paths = []
        for i in range(7):
            p = tmp_path / f"seg{i}"
            p.write_bytes(b"x" * 100)
            paths.append(str(p))
        rid = aio.request(paths)
        assert await asyncio.wait_for(results.get(), 10) == (rid, 0)
        assert sorted(submitted) == sorted((os.stat(p).st_dev, os.stat(p).st_ino) for p in paths)
        assert len(aio._fds) <= 7  # ... and the cache shrinks back once other files are synced
        rid = aio.request(paths[:1])
        assert await asyncio.wait_for(results.get(), 10) == (rid, 0)
        assert len(aio._fds) == 4
    finally:
        aio.close()
