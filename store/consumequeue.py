"""Consume queues: per (topic, queue) an array of fixed-width entries pointing into the commit log.

Entry (28 bytes, little endian): i64 commit log offset, u32 size, u64 tag hash, i64 store timestamp.
A queue file is named by the queue offset of its first entry (`<base:020d>.cq`); retention rewrites
it from a later base. Entries are derived data: recovery truncates them to the recovery checkpoint
and rebuilds the rest from the commit log. New entries are kept in memory (`mem`) once their
record is written and go to the file with the first checkpoint after the record is durable, off
the event loop. The file is opened on first use and closed again by the store's bound on open
queue files (openfiles.py): an idle queue holds no descriptor.
"""

from __future__ import annotations

import bisect
import itertools
import os
import struct
from collections.abc import Iterator

from .openfiles import FLAGS, OpenFiles

ENTRY = struct.Struct("<qIQq")
ENTRY_SIZE = ENTRY.size


class ConsumeQueue:
    """One queue's entries. `max_offset` counts entries readable now; `next_offset` those reserved.
    Slotted: one is held per queue, and a fleet's persistent sessions have a queue each."""

    __slots__ = (
        "topic",
        "queue_id",
        "dir",
        "base",
        "path",
        "_files",
        "_fd",
        "_pins",
        "dirty",
        "max_offset",
        "next_offset",
        "file_offset",
        "flushing",
        "mem",
        "min_offset",
        "pending",
        "compacted",
        "compacted_upto",
        "__weakref__",
    )

    def __init__(self, directory: str, topic: str, queue_id: int, files: OpenFiles) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.dir = directory
        os.makedirs(directory, exist_ok=True)
        names = sorted(n for n in os.listdir(directory) if n.endswith(".cq"))
        for stale in names[:-1]:  # left over from an interrupted retention rewrite
            os.unlink(os.path.join(directory, stale))
        if names:
            self.base = int(names[-1][:-3])
        else:
            self.base = 0
        self.path = os.path.join(directory, f"{self.base:020d}.cq")
        self._files = files
        self._fd = -1  # open while in `files` (openfiles.py)
        self._pins = 0
        self.dirty = False  # written or cut since the last `sync`
        if names:
            count = os.stat(self.path).st_size // ENTRY_SIZE
        else:
            os.close(os.open(self.path, FLAGS, 0o644))
            count = 0
        self.max_offset = self.base + count
        self.next_offset = self.max_offset
        self.file_offset = self.max_offset  # entries in the file; [file_offset, max_offset) in memory
        self.flushing = b""  # entries [file_offset, +len/ENTRY_SIZE) being written by a checkpoint
        self.mem = bytearray()  # entries after those, up to max_offset
        self.min_offset = self.base
        self.pending = bytearray()  # entries rebuilt by recovery, not yet written
        # a compacted topic's queue (compaction.py): offsets below `compacted_upto` are served from
        # its current generation (`CompactedRange`) instead of this file
        self.compacted = None
        self.compacted_upto = 0

    # ----- recovery ----------------------------------------------------------------------------
    def truncate_to_commitlog(self, clo: int) -> None:
        """Drop entries pointing at or past commit log offset `clo` (they will be re-dispatched)."""
        lo = self.first_at(clo, self.base)
        if lo < self.max_offset or os.stat(self.path).st_size != (lo - self.base) * ENTRY_SIZE:
            os.truncate(self.path, (lo - self.base) * ENTRY_SIZE)
            self.dirty = True
        self.max_offset = self.next_offset = self.file_offset = lo

    def rebase(self, base: int) -> None:
        """Start an empty queue at queue offset `base` (a rebuild after retention)."""
        assert self.max_offset == self.base and not self.pending
        path = os.path.join(self.dir, f"{base:020d}.cq")
        if path != self.path:
            self._files.close(self)
            os.rename(self.path, path)
            self.path = path
        self.base = self.min_offset = self.max_offset = self.next_offset = base
        self.file_offset = base

    def set_min_by_commitlog(self, min_clo: int) -> None:
        """Entries pointing below `min_clo` are gone with their segment: advance `min_offset`."""
        if self.compacted is not None:
            return  # below its compacted end it reads its generation; retention keeps the rest
        self.min_offset = self.first_at(min_clo, self.min_offset)

    def first_at(self, clo: int, lo: int) -> int:
        """The first queue offset in [lo, max_offset) whose entry points at or past commit log
        offset `clo` (max_offset when none: entries are in commit log order)."""
        hi = self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self._own_entry(mid)[0] >= clo:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def compact(self) -> None:
        """Rewrite the file from `min_offset` when most of it is dead (after retention)."""
        if (
            self.min_offset - self.base < 4096
            or self.next_offset != self.max_offset
            or self.file_offset != self.max_offset
        ):
            return
        data = self.file_range(self.min_offset, self.max_offset)
        path = os.path.join(self.dir, f"{self.min_offset:020d}.cq")
        fd = os.open(path, FLAGS | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._files.close(self)
        os.unlink(self.path)
        self.path, self.base = path, self.min_offset

    # ----- writing -----------------------------------------------------------------------------
    def reserve(self, clo: int, size: int, tag_hash: int, store_ts: int) -> int:
        off = self.next_offset
        self.next_offset = off + 1
        self.pending += ENTRY.pack(clo, size, tag_hash, store_ts)
        return off

    def take_pending(self) -> bytes:
        data = bytes(self.pending)
        self.pending.clear()
        return data

    def write_at(self, first_offset: int, data: bytes) -> None:
        fd = self._files.acquire(self)
        try:
            os.pwrite(fd, data, (first_offset - self.base) * ENTRY_SIZE)
        finally:
            self._files.release(self)
        self.dirty = True

    def sync(self) -> None:
        """fdatasync the file if it was written or cut since the last time (IO thread)."""
        if self.dirty:
            fd = self._files.acquire(self)
            try:
                os.fdatasync(fd)
            finally:
                self._files.release(self)
            self.dirty = False

    def cut_file(self, offset: int) -> None:
        """Cut the file after queue offset `offset` (a replica's truncation), durably."""
        size = (offset - self.base) * ENTRY_SIZE
        if os.stat(self.path).st_size > size:
            os.truncate(self.path, size)
            self.dirty = True
            self.sync()

    def file_range(self, start: int, end: int) -> bytes:
        """The raw entries [start, end) of the file (all below `file_offset`)."""
        fd = self._files.acquire(self)
        try:
            return os.pread(fd, (end - start) * ENTRY_SIZE, (start - self.base) * ENTRY_SIZE)
        finally:
            self._files.release(self)

    def take_flush(self, below: int) -> tuple[int, bytes]:
        """Loop: hand the in-memory entries of records below commit log offset `below` (the
        durable ones) to a checkpoint as (first offset, data); they stay readable until
        `flushed()`. Entries after them stay in memory."""
        assert not self.flushing
        mem = self.mem  # entries [file_offset, max_offset)
        if mem and ENTRY.unpack_from(mem, len(mem) - ENTRY_SIZE)[0] >= below:
            cut = (self.first_at(below, self.file_offset) - self.file_offset) * ENTRY_SIZE
            self.flushing = bytes(mem[:cut])
            self.mem = mem[cut:]
        else:
            self.flushing = bytes(mem)
            self.mem = bytearray()
        return self.file_offset, self.flushing

    @property
    def flushable_end(self) -> int:
        """Queue offset after the entries in the file or being written there by a checkpoint."""
        return self.file_offset + len(self.flushing) // ENTRY_SIZE

    def flushed(self) -> None:
        """Loop: the checkpoint wrote (and synced) what `take_flush` returned."""
        self.file_offset += len(self.flushing) // ENTRY_SIZE
        self.flushing = b""

    def unflush(self) -> None:
        """Loop: the checkpoint failed: what `take_flush` returned goes back in front of the
        in-memory entries, for the next checkpoint to write at the same place."""
        self.mem[:0] = self.flushing
        self.flushing = b""

    def rollback(self, to_offset: int) -> None:
        self.next_offset = to_offset
        self.pending.clear()

    # ----- reading -----------------------------------------------------------------------------
    def entry(self, offset: int) -> tuple[int, int, int, int]:
        if offset < self.compacted_upto:
            return self.compacted.entry(offset)
        return self._own_entry(offset)

    def _own_entry(self, offset: int) -> tuple[int, int, int, int]:
        """The entry of this queue's own file or memory (compacted or not)."""
        i = offset - self.file_offset
        if i < 0:
            return ENTRY.unpack(self.file_range(offset, offset + 1))
        fl = self.flushing
        if fl:
            n = len(fl) // ENTRY_SIZE
            if i < n:
                return ENTRY.unpack_from(fl, i * ENTRY_SIZE)
            i -= n
        return ENTRY.unpack_from(self.mem, i * ENTRY_SIZE)

    def entries(self, start: int, count: int) -> Iterator[tuple[int, int, int, int]]:
        """Up to `count` entries from queue offset `start` (clamped to the readable range)."""
        start = max(start, self.min_offset)
        end = min(start + count, self.max_offset)
        if end <= start:
            return iter(())
        if start < self.compacted_upto:
            mid = min(end, self.compacted_upto)
            head = self.compacted.entries(start, mid)
            return iter(head) if mid == end else itertools.chain(head, self.entries(mid, end - mid))
        fo = self.file_offset
        if end <= fo:
            return ENTRY.iter_unpack(self.file_range(start, end))
        parts = []
        if start < fo:
            parts.append(self.file_range(start, fo))
        tail = self.flushing + self.mem if self.flushing else self.mem
        lo = max(start - fo, 0) * ENTRY_SIZE
        parts.append(tail[lo : (end - fo) * ENTRY_SIZE])
        return ENTRY.iter_unpack(b"".join(parts) if len(parts) > 1 else bytes(parts[0]))

    def offset_for_timestamp(self, ts: int) -> int:
        """First queue offset whose store timestamp is >= ts (max_offset when none)."""
        keys = _TimeView(self)
        return self.min_offset + bisect.bisect_left(keys, ts)

    @property
    def is_open(self) -> bool:
        """Whether the file holds a descriptor now (tests; the bound closes idle ones)."""
        return self._fd >= 0

    def close(self) -> None:
        self._files.close(self)


class _TimeView:
    """Sequence view of a queue's store timestamps, for bisect."""

    def __init__(self, cq: ConsumeQueue) -> None:
        self.cq = cq

    def __len__(self) -> int:
        return self.cq.max_offset - self.cq.min_offset

    def __getitem__(self, i: int) -> int:
        return self.cq.entry(self.cq.min_offset + i)[3]
