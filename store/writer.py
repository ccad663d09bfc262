"""Group commit on the event loop: records queued during one loop iteration are written to the
page cache with one write, and one fdatasync covers every batch written while the previous one
was syncing (one at a time: two in flight through AIO made each slower, and the batches grew to
every appender at once, so throughput fell). The sync runs through Linux AIO (aio_fsync.py) or,
where that is missing, a helper process (fsyncer.py). A batch is made readable (`on_readable`)
once written, and its appenders' futures resolve when it is durable (`on_durable`).

The append path (appending.py) queues one `Record` per message.
"""

from __future__ import annotations

import asyncio
import os
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import NamedTuple

from .aio_fsync import AioFsync
from .commitlog import CommitLog
from .consumequeue import ConsumeQueue
from .fsyncer import FsyncClient
from .histogram import Histogram
from .index import MessageIndex
from .message import AppendResult

EARLY_RECORDS = 8  # with the disk idle, at least this many queued records are written and synced at once


class Record(NamedTuple):
    """One appended message on its way to the disk. The append path builds it with
    `tuple.__new__(Record, (...))` (NamedTuple's own `__new__` is Python code: slower)."""

    start: int  # commit log offset where `data` lands
    data: bytes  # a padding record (when the record starts a new segment), then the record
    cq: ConsumeQueue  # its queue
    # its consume queue entry and index entries: kept in memory once the record is readable, and
    # written to their files by the first checkpoint after it is durable
    entry: bytes
    idx: bytes
    fut: asyncio.Future  # answered when the record is durable (a shared, done one if nobody waits)
    result: AppendResult
    keys: tuple[str, ...]
    tag_hash: int


class GroupCommitWriter:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        commitlog: CommitLog,
        index: MessageIndex,
        sync: bool,
        on_readable: Callable[[list[Record]], None],
        on_durable: Callable[[list[Record], float], None],
        on_failed: Callable[[list[Record], int | None, BaseException], None],
        fsync_method: str = "auto",
    ) -> None:
        self.loop = loop
        self.commitlog = commitlog
        self.index = index
        self.on_readable = on_readable
        self.on_durable = on_durable
        self.on_failed = on_failed
        self.pending: list[Record] = []
        self._scheduled = False
        self.unsynced: list[list[Record]] = []
        self._inflight: tuple[list[list[Record]], float, int] | None = None
        self.written_end = 0  # commit log bytes written to the page cache
        self.durable_end = 0  # ... and known durable (fsynced, or written under the async policy)
        self.unsynced_segments: set[str] = set()
        self.broken: BaseException | None = None
        self._drain: list[asyncio.Future] = []
        self.early = EARLY_RECORDS
        self._unsynced_n = 0
        self._last_n = 0
        self.fsync_seconds = Histogram()  # request to completion of each fdatasync (sync policy)
        self.fsync = self._fsync_client(fsync_method) if sync else None

    def _fsync_client(self, method: str) -> AioFsync | FsyncClient:
        if method != "helper":
            aio = AioFsync.open(self.loop, self._synced, self.commitlog.dir)
            if aio is not None:
                return aio
            if method == "aio":
                raise OSError("fsync_method 'aio': this kernel cannot do AIO fdatasync")
        return FsyncClient(self.loop, self._synced)

    def put(self, recs: list[Record]) -> None:
        """Queue records (in order) for the next batch write."""
        pending = self.pending
        pending.extend(recs)
        idle_disk = self._inflight is None and self.fsync is not None
        if idle_disk and len(pending) + self._unsynced_n >= self.early:
            self._write()  # the disk is idle: start it now, later appends form the next batch
        elif not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._write)

    def _write(self) -> None:
        self._scheduled = False
        recs, self.pending = self.pending, []
        if not recs:
            if self.unsynced and self._inflight is None:
                self._request()
            return
        t0 = time.perf_counter()
        start = recs[0].start
        data = b"".join([r.data for r in recs])
        try:
            segs = self.commitlog.write_batch(start, data, sync=False)
        except BaseException as e:  # noqa: BLE001 - every appender of the batch hears of it
            self.on_failed(recs, start, e)
            self._maybe_idle()
            return
        self.written_end = start + len(data)
        self.unsynced_segments.update(segs)
        if self.fsync is None:
            self.durable_end = self.written_end
            self.on_readable(recs)
            self.on_durable(recs, time.perf_counter() - t0)
            self._maybe_idle()
            return
        self.unsynced.append(recs)
        self._unsynced_n += len(recs)
        if self._inflight is None:
            self._request()
        # Readable now, before the fsync completes (its result comes in a later loop iteration);
        # after the request, so that the disk starts as early as possible.
        self.on_readable(recs)

    def _request(self) -> None:
        paths = list(self.unsynced_segments)
        self.unsynced_segments.clear()
        self._inflight = (self.unsynced, time.perf_counter(), self.written_end)
        self.unsynced = []
        self._unsynced_n = 0
        self.fsync.request(paths)

    def _synced(self, _rid: int, err: int) -> None:
        if self._inflight is None:  # the helper died with no sync in flight
            self.broken = OSError(err or 5, "the fsync helper process exited")  # (helper only)
            for recs in self.unsynced:
                self.on_failed(recs, None, self.broken)
            self.unsynced = []
            self._maybe_idle()
            return
        batches, t0, end = self._inflight
        self._inflight = None
        if err:
            self.broken = OSError(err, f"fdatasync failed: {os.strerror(err)}")
            for recs in batches + self.unsynced:
                self.on_failed(recs, None, self.broken)
            self.unsynced = []
        else:
            self.durable_end = end
            dt = time.perf_counter() - t0
            h = self.fsync_seconds  # (Histogram.observe inlined: this is every message's path)
            h.counts[bisect_left(h.bounds, dt)] += 1
            h.sum += dt
            h.count += 1
            n = 0
            for recs in batches:
                n += len(recs)
                self.on_durable(recs, dt)
            # Aim each fsync at half the appenders: the other half encodes meanwhile.
            self.early = max(EARLY_RECORDS, (n + self._last_n) // 2)
            self._last_n = n
            if self.unsynced and not self._scheduled:
                # let the appenders just woken queue their next records first (see put)
                self._scheduled = True
                self.loop.call_soon(self._write)
        self._maybe_idle()

    @property
    def idle(self) -> bool:
        return not self.pending and not self.unsynced and self._inflight is None

    def _maybe_idle(self) -> None:
        if self._drain and self.idle:
            for f in self._drain:
                if not f.done():
                    f.set_result(None)
            self._drain.clear()

    async def drain(self) -> None:
        """Return once everything queued so far is durable (or failed)."""
        while not self.idle:
            fut = self.loop.create_future()
            self._drain.append(fut)
            await fut

    def take_unsynced_segments(self) -> list[str]:
        segs = list(self.unsynced_segments)
        self.unsynced_segments.clear()
        return segs

    def close(self) -> None:
        if self.fsync is not None:
            self.fsync.close()
