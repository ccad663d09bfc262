"""Checkpoints: every `checkpoint_interval_ms` the queue and index entries held in memory for
durable records are written and fsynced to their files (on the IO thread), then `checkpoint.json`
records the commit log offset they cover, where recovery starts. Consumer progress: its log is
flushed every `consumer_log_flush_ms`, and a checkpoint snapshots it every `consumer_checkpoint_ops`
operations."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable

from .commitlog import CommitLog
from .config import StoreConfig
from .consumequeue import ConsumeQueue
from .consumer import ConsumerProgress
from .index import MessageIndex
from .retention import SegmentStats
from .writer import GroupCommitWriter


def write_checkpoint_file(data_dir: str, end: int, queues: dict[str, int], segments: SegmentStats) -> None:
    """Record (atomically) that queue and index files are valid up to commit log offset `end`."""
    cp = {
        "commitlog": end,
        "queues": queues,
        "segments": segments.to_json(),
    }
    path = os.path.join(data_dir, "checkpoint.json")
    with open(path + ".tmp", "wb") as f:
        f.write(json.dumps(cp).encode())
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


class Checkpointer:
    """`lock` serializes checkpoints (and retention's file rewrites between two of them)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        run_io: Callable[..., asyncio.Future],
        config: StoreConfig,
        writer: GroupCommitWriter,
        commitlog: CommitLog,
        index: MessageIndex,
        cqs: dict[tuple[str, int], ConsumeQueue],
        segments: SegmentStats,
        progress: ConsumerProgress,
    ) -> None:
        self.loop = loop
        self.run_io = run_io
        self.config = config
        self.sync = config.flush == "sync"
        self.writer = writer
        self.commitlog = commitlog
        self.index = index
        self.cqs = cqs
        self.segments = segments
        self.progress = progress
        self.lock = asyncio.Lock()  # one checkpoint (or retention file rewrite) at a time
        self._written: tuple[int, ...] = ()  # what the last checkpoint file recorded (`_state`)

    async def checkpoint(self, consumer_snapshot: bool = False) -> None:
        """Write the in-memory queue and index entries to their files, then the checkpoint. Once
        begun it runs to its end even when its caller is cancelled (close() cancels the periodic
        task): entries it took from memory must reach their files before a later checkpoint
        writes the ones after them (a cancelled IO job would leave a hole of zeros)."""
        await asyncio.shield(self.loop.create_task(self._checkpoint_serial(consumer_snapshot)))

    async def _checkpoint_serial(self, consumer_snapshot: bool) -> None:
        async with self.lock:
            await self.checkpoint_locked(consumer_snapshot)

    async def checkpoint_locked(self, consumer_snapshot: bool = False) -> None:
        """A checkpoint, the caller holding `lock`."""
        w = self.writer
        # Everything below `end` is durable and its queue / index entries are in memory or files:
        # hand the in-memory ones to the IO thread, which writes and syncs them before recording.
        segs = None if self.sync else w.take_unsynced_segments()
        end = w.durable_end if self.sync else w.written_end
        # (under `sync`, entries of records written but not yet durable stay in memory: the queue
        # files never point past `end`; index entries may, and recovery cuts them at `end`)
        flushes = [f for f in ((cq, *cq.take_flush(end)) for cq in self.cqs.values() if cq.mem) if f[2]]
        idx = self.index.take_flush()
        state = self._state(end)
        if flushes or idx or segs or state != self._written:  # else the file says it all already
            # an empty queue from offset 0 tells recovery nothing: the file lists the others only
            queues = {f"{t}/{q}": n for (t, q), cq in self.cqs.items() if (n := cq.flushable_end)}
            try:
                await self.run_io(self._write, end, flushes, idx, segs, queues)
            except BaseException:
                for cq, _first, _data in flushes:
                    cq.unflush()
                self.index.mem[:0] = idx  # written again (at the same place) by the next checkpoint
                raise
            self._written = state
        for cq, _first, _data in flushes:
            cq.flushed()
        if consumer_snapshot or self.progress.ops >= self.config.consumer_checkpoint_ops:
            self.progress.ops = 0
            snap = self.progress.snapshot()
            await self.run_io(self.progress.write_checkpoint, snap, self.progress.take_log())

    def _state(self, end: int) -> tuple[int, ...]:
        """What a checkpoint file records, in short: an idle store (100,000 queues) skips rewriting
        and syncing the same file every second. Queue ends move only with `end` (or a flush)."""
        cl = self.commitlog
        return (end, len(self.cqs), len(self.segments.by_base), cl.min_offset, cl.write_pos)

    async def flush_progress(self) -> None:
        """Append the consumer progress operations since the last flush to its log."""
        data = self.progress.take_log()
        if data:
            await self.run_io(self.progress.write_log, data)

    def _write(
        self,
        end: int,
        flushes: list[tuple[ConsumeQueue, int, bytes]],
        idx: bytes,
        segments: list[str] | None,
        queues: dict[str, int],
    ) -> None:
        """IO thread: write and sync queue and index entries, then record that the files are valid
        up to commit log offset `end` (everything below it was written, and under `sync` fsynced)."""
        if segments:
            self.commitlog.sync(segments)
        for cq, first, data in flushes:
            cq.write_at(first, data)
            cq.sync()
        if idx:
            self.index.append_file(idx)
            self.index.sync()
        write_checkpoint_file(self.config.data_dir, end, queues, self.segments)
