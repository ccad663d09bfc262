"""Commit log: one append-only byte sequence over fixed-size, pre-zeroed segment files.

A segment is named by the 20-digit commit log offset of its first byte. The store reserves space
in the event loop (`reserve`) and writes whole batches at once (`write_batch`, group commit).
Segments are zero-filled ahead of use: on ext4 an fdatasync of an overwrite in place is far
cheaper than one that extends a file. Reads go through each segment's memory map; `read_message`
reads and checks one record (every consumer's read of a message comes here). With tiered storage
(tiering.py) the oldest closed segments live in object storage: `min_offset` still counts them,
`local_min_offset` is where the local files start, and reads below it go to the tier's cache.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import mmap
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from . import codec
from .message import Message


class TierReader(Protocol):
    """What the commit log reads of its segments in object storage (`tiering.TieredLog` is it)."""

    def has(self, offset: int) -> bool: ...
    def read(self, offset: int, size: int) -> bytes: ...


# Offsets from here address records a compacted topic's compaction kept (store/compaction.py); `read`
# hands them to `compacted_read`.
COMPACT_BASE = 1 << 62

log = logging.getLogger("store")

ZERO_CHUNK = bytes(1 << 20)


class StoreFullError(OSError):
    """The disk has no room for more data: the append is refused, nothing stored is harmed."""

    def __init__(self, msg: str = "no space left for the commit log") -> None:
        super().__init__(errno.ENOSPC, msg)


@dataclass(slots=True)
class Segment:
    base: int
    path: str
    fd: int
    mm: mmap.mmap | None = None  # read-only map for reads, made at the first one

    def close(self) -> None:
        if self.mm is not None:
            self.mm.close()
        os.close(self.fd)


class CommitLog:
    """Segments of one commit log directory. `reserve` and writes happen in the event loop; segment
    preallocation, deletion and recovery in other threads (the segment list is locked)."""

    def __init__(self, directory: str, segment_size: int, min_free_bytes: int = 0) -> None:
        self.compacted_read = _no_compacted_records
        if segment_size < 4096:
            raise ValueError("segment_size must be at least 4096 bytes")
        self.dir = directory
        self.segment_size = segment_size
        self.min_free_bytes = min_free_bytes
        os.makedirs(directory, exist_ok=True)
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._lock = threading.Lock()  # guards the segment list (loop, allocator, io thread)
        self._prealloc_thread: threading.Thread | None = None
        self._last_read: Segment | None = None  # the segment of the latest read (most reads hit it)
        # tiering.py: the segments below the local ones that are in object storage (None: tiering off)
        self.tier: TierReader | None = None
        self._tier_bases: list[int] = []
        for name in sorted(os.listdir(directory)):
            if name.isdigit() and len(name) == 20:
                self._add(int(name), create=False)
        self.write_pos = self._segments[0].base if self._segments else 0  # set by recovery

    # ----- segments -------------------------------------------------------------------------
    def _path(self, base: int) -> str:
        return os.path.join(self.dir, f"{base:020d}")

    def _add(self, base: int, create: bool) -> Segment:
        path = self._path(base)
        if create:
            self._check_free()
            tmp = path + ".tmp"
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                left = self.segment_size
                while left:
                    left -= os.write(fd, ZERO_CHUNK[: min(left, len(ZERO_CHUNK))])
                os.fsync(fd)
            except OSError as e:
                os.close(fd)
                os.unlink(tmp)
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise StoreFullError(f"cannot allocate segment {base}: {e.strerror}") from e
                raise
            os.rename(tmp, path)
            _fsync_dir(self.dir)
        else:
            fd = os.open(path, os.O_RDWR)
            if os.fstat(fd).st_size < self.segment_size:  # cut short outside our control
                os.ftruncate(fd, self.segment_size)
        seg = Segment(base, path, fd)
        with self._lock:
            i = bisect.bisect(self._bases, base)
            self._bases.insert(i, base)
            self._segments.insert(i, seg)
        return seg

    def _check_free(self) -> None:
        if self.min_free_bytes:
            st = os.statvfs(self.dir)
            if st.f_bavail * st.f_frsize < self.min_free_bytes + self.segment_size:
                raise StoreFullError("free disk space below min_free_bytes")

    def segment_for(self, offset: int) -> Segment | None:
        with self._lock:
            i = bisect.bisect(self._bases, offset) - 1
            return self._segments[i] if i >= 0 else None

    def _ensure_segment(self, base: int) -> Segment:
        seg = self.segment_for(base)
        if seg is not None and seg.base == base:
            return seg
        t = self._prealloc_thread
        if t is not None:
            t.join()
            seg = self.segment_for(base)
            if seg is not None and seg.base == base:
                return seg
        return self._add(base, create=True)

    def _preallocate_next(self, base: int) -> None:
        if self._prealloc_thread is not None and self._prealloc_thread.is_alive():
            return
        seg = self.segment_for(base)
        if seg is not None and seg.base == base:
            return

        def run() -> None:
            # on failure the writer allocates it itself and reports the error to the appenders
            with contextlib.suppress(OSError):
                self._add(base, create=True)

        self._prealloc_thread = threading.Thread(target=run, name="segment-prealloc", daemon=True)
        self._prealloc_thread.start()

    @property
    def min_offset(self) -> int:
        """The lowest readable offset: of the oldest tiered segment, else of the oldest local one."""
        with self._lock:
            if self._tier_bases:
                return self._tier_bases[0]
            return self._segments[0].base if self._segments else self.write_pos

    @property
    def local_min_offset(self) -> int:
        """The lowest offset in a local segment file."""
        with self._lock:
            return self._segments[0].base if self._segments else self.write_pos

    def attach_tier(self, tier: TierReader, bases: list[int]) -> None:
        """Reads below the local segments go to `tier` (object storage), which holds `bases`."""
        self.tier = tier
        self.set_tiered(bases)

    def set_tiered(self, bases: list[int]) -> None:
        """The (sorted) bases of the tiered segments, after an upload or retention."""
        with self._lock:
            self._tier_bases = list(bases)

    def drop_local(self, base: int) -> None:
        """Delete the local file of segment `base` (tiered and verified); no-op when gone."""
        seg = self.segment_for(base)
        if seg is not None and seg.base == base:
            self._drop(seg)
            _fsync_dir(self.dir)

    def segments(self) -> list[Segment]:
        with self._lock:
            return list(self._segments)

    # ----- writing ----------------------------------------------------------------------------
    def reserve(self, size: int) -> tuple[int, bytes | None]:
        """Reserve `size` bytes; returns (offset, filler) where filler pads the previous segment."""
        if size > self.segment_size - codec.MIN_RECORD:
            raise ValueError(f"record of {size} bytes does not fit a segment of {self.segment_size}")
        pos = self.write_pos
        seg_end = (pos // self.segment_size + 1) * self.segment_size
        filler = None
        if pos + size > seg_end:
            left = seg_end - pos
            # batches are written as one contiguous run, so even a gap too small for a padding
            # record travels as (zero) bytes
            filler = codec.encode_blank(left) if left >= codec.MIN_RECORD else bytes(left)
            pos = seg_end
        self.write_pos = pos + size
        return pos, filler

    def write_batch(self, start: int, data: bytes, sync: bool) -> list[str]:
        """Write `data` at commit log offset `start` (may cross segments); fdatasync when `sync`.

        Returns the paths of the segments written."""
        touched: list[Segment] = []
        pos, view = start, memoryview(data)
        cur: tuple[Segment, int] | None = None
        done = 0
        try:
            while view:
                base = pos - pos % self.segment_size
                seg = self._ensure_segment(base)
                n = min(len(view), base + self.segment_size - pos)
                done = 0
                cur = (seg, pos)
                while done < n:
                    try:
                        done += os.pwrite(seg.fd, view[done:n], pos - base + done)
                    except OSError as e:
                        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                            raise StoreFullError(e.strerror or "no space") from e
                        raise
                touched.append(seg)
                pos += n
                view = view[n:]
                cur = None
        except BaseException:
            # the batch is refused: what of it reached a segment must not be recovered later
            with contextlib.suppress(OSError):
                for seg in touched:
                    lo = max(start, seg.base) - seg.base
                    hi = min(pos, seg.base + self.segment_size) - seg.base
                    os.pwrite(seg.fd, bytes(hi - lo), lo)
                if cur is not None and done:  # a short write in the failing segment
                    seg, at = cur
                    os.pwrite(seg.fd, bytes(done), at - seg.base)
            raise
        if sync:
            for seg in touched:
                os.fdatasync(seg.fd)
        if pos % self.segment_size > self.segment_size // 2:
            self._preallocate_next(pos - pos % self.segment_size + self.segment_size)
        return [seg.path for seg in touched]

    def sync(self, paths: list[str] | None = None) -> None:
        """fdatasync the given segments (default: the one being written)."""
        if paths is None:
            seg = self.segment_for(max(self.write_pos - 1, 0))
            segs = [seg] if seg is not None else []
        else:
            segs = [s for s in self.segments() if s.path in paths]
        for seg in segs:
            os.fdatasync(seg.fd)

    # ----- reading ----------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes:
        """`size` bytes at `offset`, through the segment's memory map (a copy: no syscall, unlike
        pread; consumers read mostly what was just written, from the page cache)."""
        seg = self._last_read
        if seg is None or not seg.base <= offset < seg.base + self.segment_size:
            if offset >= COMPACT_BASE:
                return self.compacted_read(offset, size)
            seg = self._last_read = self.segment_for(offset)
            if seg is None and self.tier is not None:
                return self.tier.read(offset, size)  # below the local range: object storage
        if seg is None or offset + size > seg.base + self.segment_size:
            raise KeyError(f"commit log offset {offset} is not stored")
        mm = seg.mm
        try:
            if mm is None:
                mm = seg.mm = mmap.mmap(seg.fd, self.segment_size, access=mmap.ACCESS_READ)
            pos = offset - seg.base
            return mm[pos : pos + size]
        except (ValueError, OSError):  # the segment was dropped (retention, tiering) meanwhile
            if self.tier is not None and self.tier.has(offset):
                return self.tier.read(offset, size)
            raise KeyError(f"commit log offset {offset} is not stored") from None

    def read_message(self, clo: int, size: int) -> Message | None:
        """The message of the record at `clo`; None (and a log line) if it is no longer stored or
        does not check out (length, magic, CRC32). TieredRangeNotCached passes through: the record
        exists (fetch it and read again)."""
        try:
            return codec.decode_checked(self.read(clo, size), clo)
        except (KeyError, codec.CorruptRecord) as e:
            if not size:
                return None  # a record compaction removed
            log.error("unreadable message at commit log offset %d: %s", clo, e)
            return None

    def read_record(self, clo: int, size: int) -> bytes:
        """The record at `clo` as stored, checked (length, magic, CRC) but not decoded; b"" (and a
        log line) where `read_message` gives None. TieredRangeNotCached passes through."""
        try:
            rec = self.read(clo, size)
            if codec.check(rec, 0, size)[0] != size or rec[8] != codec.MAGIC_MESSAGE:
                raise codec.CorruptRecord("not one message record")
            return rec
        except (KeyError, codec.CorruptRecord) as e:
            if size:
                log.error("unreadable message at commit log offset %d: %s", clo, e)
            return b""

    def scan(self, start: int) -> Iterator[tuple[int, memoryview, int, int]]:
        """Yield (offset, buffer, pos, size) of valid message records from `start`.

        Stops at the first record that is not valid; `self.scan_end` is then where valid data ends.
        """
        self.scan_end = start
        for seg in self.segments():
            if seg.base + self.segment_size <= start:
                continue
            with mmap.mmap(seg.fd, self.segment_size, access=mmap.ACCESS_READ) as mm:
                buf = memoryview(mm)
                try:
                    pos = max(start - seg.base, 0)
                    while True:
                        if self.segment_size - pos < codec.MIN_RECORD:
                            break  # the rest of the segment is padding
                        if buf[pos : pos + 4] == b"\0\0\0\0":
                            return  # nothing written here: end of the log
                        try:
                            size, magic = codec.check(buf, pos, self.segment_size)
                        except codec.CorruptRecord:
                            return
                        if magic == codec.MAGIC_MESSAGE:
                            yield seg.base + pos, buf, pos, size
                        elif magic == codec.MAGIC_BATCH:
                            try:
                                inner = codec.iter_batch(buf, pos, size)
                            except codec.CorruptRecord:
                                return
                            for ipos, isize in inner:
                                yield seg.base + ipos, buf, ipos, isize
                        pos += size
                        self.scan_end = seg.base + pos
                        if magic == codec.MAGIC_BLANK:
                            break
                finally:
                    buf.release()
            self.scan_end = seg.base + self.segment_size

    def truncate(self, offset: int) -> None:
        """Discard everything from `offset` on: zero the rest of its segment, then drop later
        segments, newest first (a crash in between leaves a log that ends at `offset`)."""
        self.write_pos = offset
        seg = self.segment_for(offset)
        if seg is not None:
            pos = offset - seg.base
            while pos < self.segment_size:
                n = min(len(ZERO_CHUNK), self.segment_size - pos)
                if os.pread(seg.fd, n, pos) == ZERO_CHUNK[:n]:
                    break
                os.pwrite(seg.fd, ZERO_CHUNK[:n], pos)
                pos += n
            os.fsync(seg.fd)
        later = [s for s in self.segments() if s.base > offset]
        for s in reversed(later):
            self._drop(s)
        if later:
            _fsync_dir(self.dir)

    def _drop(self, seg: Segment) -> None:
        with self._lock:
            i = self._segments.index(seg)
            del self._segments[i]
            del self._bases[i]
            if self._last_read is seg:
                self._last_read = None
        seg.close()
        os.unlink(seg.path)

    def reset_empty(self, base: int) -> None:
        """Start a log that holds no record at segment base `base` (a replica catching up from a
        primary whose log starts there): its empty segments are dropped, `base`'s is created and
        `write_pos` set. A crash part way leaves an empty log (at its old base or at `base`)."""
        if base % self.segment_size:
            raise ValueError(f"offset {base} is not a segment base")
        self.settle()  # no segment appears behind our back
        for seg in reversed(self.segments()):
            if seg.base != base:
                self._drop(seg)
        _fsync_dir(self.dir)
        self._ensure_segment(base)  # the segment's name is where the log starts, at the next open
        self.write_pos = base

    def delete_segments_before(self, offset: int) -> int:
        """Delete whole segments that end at or before `offset` (never the one being written)."""
        n = 0
        for seg in self.segments():
            if seg.base + self.segment_size <= min(
                offset, self.write_pos - self.write_pos % self.segment_size
            ):
                self._drop(seg)
                n += 1
        if n:
            _fsync_dir(self.dir)
        return n

    def settle(self) -> None:
        """Wait until the next segment being preallocated in the background, if any, is there."""
        if self._prealloc_thread is not None:
            self._prealloc_thread.join()

    def close(self) -> None:
        self.settle()
        for seg in self.segments():
            seg.close()
        self._last_read = None
        self._segments.clear()
        self._bases.clear()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_compacted_records(offset: int, size: int) -> bytes:
    raise KeyError(f"commit log offset {offset} is not stored")
