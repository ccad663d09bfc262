"""Commit log replication, the store's side (docs/store.md, "Replication primitives"): a primary
hands out its commit log bytes as they are (`read_chunk`), and a replica writes them at the same
offsets and derives its consume queues and index from them as recovery does (`LogReplica.apply`),
or cuts its log back to where it agrees with a new primary (`LogReplica.truncate`). A replica that
holds nothing starts its log, and each queue, where its primary's retained log starts them
(`LogReplica.reset`, with the primary's `LogReplica.queue_bases`): the primary no longer has what
came before.

Records are copied byte for byte, padding included, so that commit log offsets, and with them
every queue entry, message lookup and receipt handle, are the same on every member of a group.
"""

from __future__ import annotations

import asyncio
import heapq
import os
from collections.abc import Callable, Coroutine
from typing import Any

from . import codec
from .catalog import Catalog
from .checkpoint import Checkpointer, write_checkpoint_file
from .commitlog import CommitLog
from .config import StoreConfig, check_name
from .consumequeue import ENTRY, ENTRY_SIZE, ConsumeQueue
from .consumer import ConsumerProgress
from .epochs import EpochLog
from .errors import StoreError
from .index import MessageIndex
from .message import Message, entry_hash
from .popping import LongPolling
from .retention import SegmentStats
from .scheduling import DelayedMessages, Transactions
from .writer import GroupCommitWriter

MAX_QUEUES = 1024  # as Catalog.create_topic allows


class CorruptChunk(ValueError):
    """Replicated bytes that are not whole, valid records at their offsets."""


# ----------------------------------------------------------------------------- pure functions
def read_chunk(
    read: Callable[[int, int], bytes], segment_size: int, start: int, end: int, max_bytes: int
) -> bytes:
    """The commit log bytes of whole records from `start` (a record boundary) to at most
    `max_bytes`, never past `end` nor the end of `start`'s segment, and at least one record
    (however large) when `start < end`. A padding record, or the few zero bytes that end a
    segment, always ends the chunk at the segment's end. `read(offset, size)` reads the log.

    ValueError when `start` is not a record boundary; KeyError when it is no longer stored."""
    if not 0 <= start <= end:
        raise ValueError(f"offset {start} is outside the log (end {end})")
    if start == end:
        return b""
    seg_end = start - start % segment_size + segment_size
    limit = min(end, seg_end)
    tail = seg_end - start
    if tail < codec.MIN_RECORD:  # too small for a padding record: zeros to the segment's end
        data = read(start, tail)
        if any(data) or limit != seg_end:
            raise ValueError(f"offset {start} is not a record boundary")
        return data
    if limit - start < codec.MIN_RECORD:
        raise ValueError(f"offset {start} is not a record boundary")
    buf = read(start, min(limit - start, max(max_bytes, codec.MIN_RECORD)))
    first = codec.record_size_at(buf, 0)
    if first > len(buf) and start + first <= limit:
        buf = read(start, first)
    pos = 0
    while pos < len(buf):
        left = seg_end - (start + pos)
        if left < codec.MIN_RECORD:
            if pos + left <= len(buf):
                pos += left
            break
        if len(buf) - pos < codec.MIN_RECORD:
            break
        size = codec.record_size_at(buf, pos)
        if pos + size > len(buf) and pos:
            break
        try:
            size, magic = codec.check(buf, pos, len(buf))
        except codec.CorruptRecord as e:
            if pos == 0:
                raise ValueError(f"offset {start} is not a record boundary ({e})") from None
            raise ValueError(f"record at {start + pos} does not check out: {e}") from None
        pos += size
        if magic == codec.MAGIC_BLANK:
            break
    return bytes(buf[:pos])


def parse_chunk(data: bytes, start: int, segment_size: int) -> list[tuple[int, int, int]]:
    """Check that `data`, to be written at commit log offset `start`, is whole valid records (the
    checks recovery makes: length, magic, CRC-32), none crossing a segment end, padding only at
    a segment's end. Returns (commit log offset, position in data, size) of each message record;
    CorruptChunk when anything does not hold."""
    out: list[tuple[int, int, int]] = []
    pos, n = 0, len(data)
    while pos < n:
        at = start + pos
        left = segment_size - at % segment_size
        if left < codec.MIN_RECORD:
            if n - pos < left or any(data[pos : pos + left]):
                raise CorruptChunk(f"bytes at {at} should be the zeros that end a segment")
            pos += left
            continue
        try:
            size, magic = codec.check(data, pos, min(n, pos + left))
        except codec.CorruptRecord as e:
            raise CorruptChunk(f"record at {at}: {e}") from None
        if magic == codec.MAGIC_BLANK:
            if size != left:
                raise CorruptChunk(f"padding record at {at} does not end its segment")
        elif magic == codec.MAGIC_BATCH:
            try:
                inner = codec.iter_batch(data, pos, size)
            except codec.CorruptRecord as e:
                raise CorruptChunk(f"batch record at {at}: {e}") from None
            out.extend((start + ipos, ipos, isize) for ipos, isize in inner)
        else:
            out.append((at, pos, size))
        pos += size
    return out


# ----------------------------------------------------------------------------- the replica side
class LogReplica:
    """Applies replicated commit log bytes to one store, or cuts its log back. Both run one at a
    time, and need a store that takes no appends of its own (none in flight: StoreError)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        run_io: Callable[..., asyncio.Future],
        config: StoreConfig,
        catalog: Catalog,
        commitlog: CommitLog,
        index: MessageIndex,
        segments: SegmentStats,
        writer: GroupCommitWriter,
        checkpoints: Checkpointer,
        progress: ConsumerProgress,
        polls: LongPolling,
        delays: DelayedMessages,
        transactions: Transactions,
        epochs: EpochLog,
    ) -> None:
        self.loop = loop
        self.run_io = run_io
        self.config = config
        self.sync = config.flush == "sync"
        self.catalog = catalog
        self.commitlog = commitlog
        self.index = index
        self.segments = segments
        self.writer = writer
        self.checkpoints = checkpoints
        self.progress = progress
        self.polls = polls
        self.delays = delays
        self.transactions = transactions
        self.epochs = epochs
        self.closed = False
        self.lock = asyncio.Lock()

    @property
    def log_end(self) -> int:
        """The end of the records written and durable per the flush policy."""
        return self.writer.durable_end

    @property
    def log_start(self) -> int:
        """The first commit log offset still stored: the first segment's base (`log_end` when the
        log holds nothing below it)."""
        return min(self.commitlog.min_offset, self.log_end)

    def queue_bases(self, clo: int) -> dict[str, int]:
        """Per queue ("topic/queue id"), the queue offset of its first entry at or after commit log
        offset `clo` (its max offset when it has none there): where a log that starts at `clo`
        starts each queue. Only queues where that is above 0."""
        out = {}
        for (topic, qid), cq in list(self.catalog.cqs.items()):
            lo = cq.min_offset  # (retention usually left it there: no search)
            base = lo if lo == cq.max_offset or cq.entry(lo)[0] >= clo else cq.first_at(clo, lo + 1)
            if base:
                out[f"{topic}/{qid}"] = base
        return out

    def read(self, start: int, max_bytes: int) -> bytes:
        """`read_chunk` of this store's log, up to `log_end`."""
        cl = self.commitlog
        return read_chunk(cl.read, cl.segment_size, start, self.log_end, max_bytes)

    async def apply(self, start: int, data: bytes) -> int:
        """Check, write (durably) and index `data` at `start` (the log end); returns the new log end.
        Runs to its end once begun, even if the caller is cancelled."""
        return await self._shielded(self._apply(start, data))

    async def truncate(self, offset: int) -> None:
        """Drop the log from `offset` (a record boundary at or below the log end), with the queue
        and index entries, segment counts and epochs of what is dropped."""
        await self._shielded(self._truncate(offset))

    async def reset(self, start: int, queue_bases: dict[str, int]) -> None:
        """Start a log that holds nothing at segment base `start`, each queue at its offset in
        `queue_bases` ("topic/queue id": offset, as `queue_bases` gives them; 0 for the others).
        StoreError when the store holds a record or a queue entry, or takes appends."""
        await self._shielded(self._reset(start, queue_bases))

    async def delete_before(self, offset: int, delete: Callable[[int], Coroutine[Any, Any, int]]) -> int:
        """`delete(offset)` (retention's deletion of the whole segments below `offset`), one at a
        time with applies and truncations; returns how many segments went."""
        return await self._shielded(self._delete_before(offset, delete))

    async def _delete_before(self, offset: int, delete: Callable[[int], Coroutine[Any, Any, int]]) -> int:
        async with self.lock:
            if self.closed:
                raise StoreError("store is closed")
            return await delete(offset)

    async def _shielded(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await asyncio.shield(self.loop.create_task(coro))

    def _check_quiet(self) -> None:
        if self.closed:
            raise StoreError("store is closed")
        w = self.writer
        if w.broken is not None:
            raise StoreError(f"store failed and must be reopened: {w.broken}")
        if not w.idle or self.commitlog.write_pos != w.durable_end:
            raise StoreError("appends of this store are in flight: a replica takes none")

    # ----- apply ---------------------------------------------------------------------------
    async def _apply(self, start: int, data: bytes) -> int:
        async with self.lock:
            self._check_quiet()
            end = self.log_end
            if start != end:
                raise ValueError(f"chunk starts at {start}, the log ends at {end}")
            if not data:
                return end
            cl = self.commitlog
            msgs = self._check(parse_chunk(data, start, cl.segment_size), data)
            new_end = start + len(data)
            cl.write_pos = new_end
            try:
                segs = await self.run_io(cl.write_batch, start, data, self.sync)
            except BaseException:
                cl.write_pos = start
                raise
            w = self.writer
            w.written_end = w.durable_end = new_end
            if not self.sync:
                w.unsynced_segments.update(segs)  # fsynced by the `async` policy's periodic flush
            self._dispatch(msgs)
            return new_end

    def _check(self, records: list[tuple[int, int, int]], data: bytes) -> list[Message]:
        """Decode the records and check that each takes the next offset of its queue."""
        msgs: list[Message] = []
        expected: dict[tuple[str, int], int] = {}
        for clo, pos, _size in records:
            try:
                msg = codec.decode(data, pos, clo)
                check_name("topic", msg.topic)
            except Exception as e:  # noqa: BLE001 - checked bytes that still do not decode
                raise CorruptChunk(f"record at {clo} does not decode: {e}") from None
            key = (msg.topic, msg.queue_id)
            if not 0 <= msg.queue_id < MAX_QUEUES:
                raise CorruptChunk(f"record at {clo} has queue id {msg.queue_id}")
            nxt = expected.get(key)
            if nxt is None:
                cq = self.catalog.cqs.get(key)
                nxt = 0 if cq is None else cq.next_offset
            if msg.queue_offset != nxt:
                raise CorruptChunk(
                    f"record at {clo} has offset {msg.queue_offset} in {msg.topic}/{msg.queue_id},"
                    f" which holds {nxt}"
                )
            expected[key] = nxt + 1
            msgs.append(msg)
        return msgs

    def _dispatch(self, msgs: list[Message]) -> None:
        """Queue and index entries of written records, as recovery's replay makes them (in memory
        until the next checkpoint, as for appends); long polls of their topics are woken. Held
        records (%SCHEDULE%, %HALF%) are only indexed: the primary delivers and resolves them."""
        index, count = self.index, self.segments.count
        touched: dict[str, set[int]] = {}
        for msg in msgs:
            cq = self._queue(msg.topic, msg.queue_id)
            clo, size, th = msg.commitlog_offset, msg.size, entry_hash(msg)
            cq.mem += ENTRY.pack(clo, size, th, msg.store_timestamp)
            cq.max_offset = cq.next_offset = msg.queue_offset + 1
            index.mem += MessageIndex.encode(msg.message_id, msg.keys, clo)
            index.add(msg.message_id, msg.keys, clo)
            count(clo, msg.topic, size, msg.store_timestamp)
            touched.setdefault(msg.topic, set()).add(th)
        self.polls.wake_topics(touched)

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """A queue of a replicated record: its topic is created, or given more queues, on demand
        (a new topic gets as many as an auto-created one would)."""
        catalog = self.catalog
        t = catalog.topic_configs.get(topic)
        if t is None:
            default = 1 if topic.startswith("%") else self.config.default_queues
            catalog.create_topic(topic, max(queue_id + 1, default))
        elif t.queues <= queue_id:
            catalog.create_topic(
                topic, queue_id + 1, t.retention_ms, t.retention_bytes, t.compacted, t.tier_retention_ms
            )
        return catalog.cq(topic, queue_id)

    # ----- reset ----------------------------------------------------------------------------
    async def _reset(self, start: int, queue_bases: dict[str, int]) -> None:
        async with self.lock:
            self._check_quiet()
            cl = self.commitlog
            if start < 0 or start % cl.segment_size:
                raise ValueError(f"offset {start} is not a segment base")
            if self.log_end != cl.min_offset:
                raise StoreError(f"the log holds records from {cl.min_offset} to {self.log_end}")
            full = [f"{t}/{q}" for (t, q), cq in self.catalog.cqs.items() if _holds_entries(cq)]
            if full:
                raise StoreError(f"queues {', '.join(sorted(full)[:5])} hold entries")
            queues = []
            for name, base in queue_bases.items():
                topic, _, qid = name.rpartition("/")
                if not 0 <= int(qid) < MAX_QUEUES or base < 0:
                    raise ValueError(f"queue {name} at {base}")
                check_name("topic", topic)
                queues.append((self._queue(topic, int(qid)), base))
            named = {id(cq) for cq, _ in queues}
            queues += [(cq, 0) for cq in self.catalog.cqs.values() if id(cq) not in named]
            self.segments.by_base = {}  # (counts of no record)
            async with self.checkpoints.lock:
                try:
                    await self.run_io(self._reset_files, start, queues)
                finally:
                    w = self.writer
                    w.written_end = w.durable_end = cl.write_pos

    def _reset_files(self, start: int, queues: list[tuple[ConsumeQueue, int]]) -> None:
        """IO thread: the log first, then each queue's (empty) file renamed to its base and its
        directory synced, then the checkpoint (recovery starts there)."""
        self.commitlog.reset_empty(start)
        for cq, base in queues:
            if cq.base != base:
                cq.rebase(base)
                _fsync_dir(cq.dir)
        queues_at = {f"{t}/{q}": cq.max_offset for (t, q), cq in self.catalog.cqs.items()}
        write_checkpoint_file(self.config.data_dir, start, queues_at, self.segments)

    # ----- truncate -------------------------------------------------------------------------
    async def _truncate(self, offset: int) -> None:
        async with self.lock:
            self._check_quiet()
            cl, end = self.commitlog, self.log_end
            if offset < cl.min_offset or offset > end:
                raise ValueError(f"offset {offset} is outside the stored log [{cl.min_offset}, {end}]")
            if offset < end:
                read_chunk(cl.read, cl.segment_size, offset, end, 1)  # ValueError if not a boundary
            async with self.checkpoints.lock:
                # every in-memory queue and index entry goes to its file first: then only files are cut
                await self.checkpoints.checkpoint_locked()
                cuts = [(cq, self._cut_queue(cq, offset)) for cq in self.catalog.cqs.values()]
                self.index.forget_from(offset)
                w = self.writer
                cl.write_pos = w.written_end = w.durable_end = offset
                for held in (self.delays.heap, self.transactions.heap):
                    held[:] = [e for e in held if e[2] < offset]
                    heapq.heapify(held)
                queues = {f"{t}/{q}": cq.max_offset for (t, q), cq in self.catalog.cqs.items()}
                await self.run_io(self._truncate_files, offset, cuts, queues)
            progress = self.progress
            if progress.clamp({k: cq.max_offset for k, cq in self.catalog.cqs.items()}):
                await self.run_io(progress.write_checkpoint, progress.snapshot(), progress.take_log())

    @staticmethod
    def _cut_queue(cq: ConsumeQueue, offset: int) -> int:
        """Loop: forget the entries of `cq` pointing at or past commit log offset `offset`; returns
        how many entries its file keeps (queue offset), for `_truncate_files`."""
        lo = cq.first_at(offset, cq.min_offset)
        if lo >= cq.file_offset:
            del cq.mem[(lo - cq.file_offset) * ENTRY_SIZE :]
        else:
            cq.mem = bytearray()
            cq.file_offset = lo
        cq.max_offset = cq.next_offset = lo
        return lo

    def _truncate_files(
        self, offset: int, cuts: list[tuple[ConsumeQueue, int]], queues: dict[str, int]
    ) -> None:
        """IO thread: the checkpoint first (recovery then starts at `offset`, so a crash part way
        leaves either the old or the new state), then queue and index files, then the log."""
        cl = self.commitlog
        if cl._prealloc_thread is not None:
            cl._prealloc_thread.join()  # no segment appears behind our back
        base = offset - offset % cl.segment_size
        kept: dict[str, list[int]] = {}  # the counts of `offset`'s segment, of the records kept
        for clo, buf, pos, size in cl.scan(base):
            if clo >= offset:
                break
            msg = codec.decode(buf, pos, clo)
            st = kept.setdefault(msg.topic, [0, 0])
            st[0] += size
            st[1] = max(st[1], msg.store_timestamp)
        stats = {b: v for b, v in self.segments.by_base.items() if b < base}
        if kept:
            stats[base] = kept
        self.segments.by_base = stats
        write_checkpoint_file(self.config.data_dir, offset, queues, self.segments)
        for cq, lo in cuts:
            cq.cut_file(lo)
        self.index.cut_file(offset)
        cl.truncate(offset)
        self.epochs.truncate_from(offset)


def _holds_entries(cq: ConsumeQueue) -> bool:
    """Whether a queue holds an entry, readable, in memory or in its file (even one retention
    left behind)."""
    return bool(cq.max_offset != cq.base or cq.next_offset != cq.max_offset or cq.mem or cq.pending)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
