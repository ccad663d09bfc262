"""The flusher: one thread that writes queued records and runs file jobs, strictly in order.

The event loop encodes each append, gives it its offsets and puts it on a queue. The thread takes
everything queued, writes it with one write and one fsync (group commit), updates the derived queue
and index files, and hands the batch back to the loop. While it waits for the disk the loop keeps
encoding the next batch, so CPU and fsync overlap. Jobs (checkpoints, retention, log flushes) ride
the same queue so that they never race a batch write.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from .commitlog import CommitLog
from .index import MessageIndex

STOP = object()


class Rec(NamedTuple):
    """One queued append: `data` (a padding record, maybe, and the record) lands at `start`."""

    gen: int
    start: int
    data: bytes
    cq: Any  # ConsumeQueue
    entry: bytes
    idx: bytes
    fut: asyncio.Future
    res: Any  # AppendResult
    keys: tuple[str, ...]
    th: int


class Job(NamedTuple):
    fn: Callable[..., Any]
    args: tuple
    fut: asyncio.Future


class Flusher:
    def __init__(self, loop: asyncio.AbstractEventLoop, commitlog: CommitLog, index: MessageIndex, sync: bool,
                 on_written: Callable[[list[Rec], float], None],
                 on_failed: Callable[[list[Rec], int | None, BaseException], None]) -> None:
        self.loop = loop
        self.commitlog = commitlog
        self.index = index
        self.sync = sync
        self.on_written = on_written
        self.on_failed = on_failed
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.put = self.q.put
        self.failed_gen = -1
        self.written_end = 0
        self.dirty_cqs: set = set()  # queue files written since the last checkpoint
        self.thread = threading.Thread(target=self._run, name="store-flusher", daemon=True)
        self.thread.start()

    def job(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Run `fn(*args)` on the flusher thread after everything queued so far."""
        fut = self.loop.create_future()
        self.q.put(Job(fn, args, fut))
        return fut

    def stop(self) -> None:
        self.q.put(STOP)
        self.thread.join()

    def _run(self) -> None:
        q = self.q
        nxt = None
        while True:
            item = q.get() if nxt is None else nxt
            nxt = None
            if item is STOP:
                return
            if type(item) is Job:
                self._run_job(item)
                continue
            recs = [item]
            while True:
                try:
                    nxt = q.get_nowait()
                except queue.Empty:
                    nxt = None
                    break
                if type(nxt) is not Rec:
                    break
                recs.append(nxt)
                nxt = None
            self._write(recs)

    def _run_job(self, job: Job) -> None:
        try:
            res = job.fn(*job.args)
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            self.loop.call_soon_threadsafe(_set_exception, job.fut, e)
        else:
            self.loop.call_soon_threadsafe(_set_result, job.fut, res)

    def _write(self, recs: list[Rec]) -> None:
        if recs[0].gen <= self.failed_gen:  # reserved before the loop saw a failed write: void
            stale = [r for r in recs if r.gen <= self.failed_gen]
            self.loop.call_soon_threadsafe(self.on_failed, stale, None, self._failure)
            recs = recs[len(stale):]
            if not recs:
                return
        t0 = time.perf_counter()
        start = recs[0].start
        data = b"".join([r.data for r in recs])
        per_cq: dict = {}
        for r in recs:
            w = per_cq.get(r.cq)
            if w is None:
                per_cq[r.cq] = (r.res.queue_offset, [r.entry])
            else:
                w[1].append(r.entry)
        try:
            self.commitlog.write_batch(start, data, self.sync)
            for cq, (first, entries) in per_cq.items():
                cq.write_at(first, b"".join(entries))
            self.dirty_cqs.update(per_cq)
            self.index.append_file(b"".join([r.idx for r in recs]))
        except BaseException as e:  # noqa: BLE001 - every appender of the batch hears of it
            self.failed_gen = recs[-1].gen
            self._failure = e
            self.loop.call_soon_threadsafe(self.on_failed, recs, start, e)
            return
        self.written_end = start + len(data)
        self.loop.call_soon_threadsafe(self.on_written, recs, time.perf_counter() - t0)


def _set_result(fut: asyncio.Future, res: Any) -> None:
    if not fut.done():
        fut.set_result(res)


def _set_exception(fut: asyncio.Future, e: BaseException) -> None:
    if not fut.done():
        fut.set_exception(e)
