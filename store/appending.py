"""The append path. In the event loop: check a message, hold a delayed or transactional one in its
system topic (scheduling.py), give it its id (`MessageIdFactory`), encode it and give it its queue
and commit log offsets, and queue the record for the group commit writer (writer.py). As the writer
reports a batch: once written, make it readable (queue and index entries in memory, long polls
woken, timers and transactions told); once durable, answer its appenders and count its bytes for
retention; on failure, fail them. Several messages of one queue go as batch records (batch_append.py)."""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import sys
import zlib
from collections.abc import Callable, Iterator, Sequence
from time import time_ns
from types import ModuleType

from . import codec
from .batch_append import BatchPlacer, one_queue
from .catalog import Catalog
from .commitlog import CommitLog, StoreFullError
from .compaction import compaction_key, key_queue
from .config import HALF_TOPIC, SCHEDULE_TOPIC, StoreConfig
from .consumequeue import ENTRY
from .diskspace import FreeSpaceWatermark, watermark_bytes
from .errors import MessageTooLarge, StoreError
from .index import ID32, KIND_ID, MessageIndex
from .message import PATH_HASH_BIT, PATH_PROPERTY, AppendResult, Message, MessageType, tag_hash
from .popping import LongPolling
from .retention import SegmentStats
from .scheduling import hold
from .writer import GroupCommitWriter, Record

_crc32, _adler32 = zlib.crc32, zlib.adler32

_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)


def bind_speedups(module: ModuleType) -> None:
    """Hand the compiled append path what it uses from the store."""
    module.bind_append(
        sys.modules[__name__],  # its `time_ns` is read per call (tests replace the store's clocks)
        Record,
        AppendResult,
        StoreError,
        MessageTooLarge,
        hold,
        compaction_key,
        key_queue,
        MessageIndex.encode,
        MessageType.TRANSACTION,
        SCHEDULE_TOPIC,
        HALF_TOPIC,
        PATH_PROPERTY,
    )


def _load_speedups() -> ModuleType | None:
    """The compiled append path (`store._append_speedups`, docs/store.md "Compiled hot path"), or
    None: codec.py chooses for the whole store (GATEWAY_PURE_PYTHON=1, or no extension built: pure
    Python), and the compiled loop encodes with the compiled codec."""
    if codec.speedups is None:
        return None
    try:
        from . import _append_speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _append_speedups


_compiled = _load_speedups()
if _compiled is not None:
    bind_speedups(_compiled)


class MessageIdFactory:
    """Unique 32-hex-digit ids in the shape of RocketMQ's UNIQ_KEY: host/process prefix, time, counter."""

    def __init__(self) -> None:
        seed = zlib.crc32(f"{socket.gethostname()}/{os.getpid()}/{time_ns()}".encode())
        self._prefix = f"{seed:08X}{os.getpid() & 0xFFFF:04X}{time_ns() // 1_000_000_000 & 0xFFFFFFFF:08X}"
        self.next: Callable[[], str] = self._ids().__next__  # ~4x cheaper than formatting each id

    def _ids(self) -> Iterator[str]:
        """prefix + 12 hex digits of a counter from 1, the low 3 digits from a table."""
        low = [f"{i:03X}" for i in range(4096)]
        for high in itertools.count(0):
            head = f"{self._prefix}{high & 0xFFFFFFFFF:09X}"
            for t in low[1:] if high == 0 else low:
                yield head + t


class Appender:
    """Owns the writer. `closed` is set when the store closes; `on_delayed` and `on_half` (set by the
    store) hear of each readable `%SCHEDULE%` / `%HALF%` record."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        config: StoreConfig,
        catalog: Catalog,
        commitlog: CommitLog,
        index: MessageIndex,
        segments: SegmentStats,
        polls: LongPolling,
        metrics: dict[str, int],
        flush_latency_ms: list[float],
    ) -> None:
        self.loop = loop
        self.catalog = catalog
        self.commitlog = commitlog
        self.index = index
        self.segments = segments
        self.waiters = polls.waiters
        self.wake_topics = polls.wake_topics
        self.metrics = metrics
        self.flush_latency_ms = flush_latency_ms
        self.max_size = config.max_message_size
        self.seg_size = config.segment_size
        self.ids = MessageIdFactory()
        self.free_space = FreeSpaceWatermark(
            commitlog.dir,
            watermark_bytes(commitlog.dir, config.disk_free_limit_bytes, config.disk_free_limit_ratio),
        )
        self.rr: dict[str, int] = {}  # next queue per topic (round robin)
        self.closed = False
        self.on_delayed: Callable[[AppendResult], None] = _unset
        self.on_half: Callable[[AppendResult], None] = _unset
        self.done = loop.create_future()  # stands in for the futures of append_many
        self.done.set_result(None)  # records before a batch's last: nobody waits on them
        self.writer = GroupCommitWriter(
            loop,
            commitlog,
            index,
            config.flush == "sync",
            self.on_readable,
            self.on_durable,
            self.on_failed,
            config.fsync_method,
        )
        self.writer.written_end = self.writer.durable_end = commitlog.write_pos
        self.batches = BatchPlacer(  # (append_many of one queue: batch records, batch_append.py)
            catalog,
            commitlog,
            self.ids,
            self.rr,
            self.seg_size,
            metrics,
            self.writer,
            self.done,
            self._writable,
        )

    def append(self, msg: Message) -> asyncio.Future[AppendResult]:
        """`Store.append`: store one message; the future is done once it is durable per the flush
        policy. Invalid input (closed store, oversized body, bad queue) raises at once."""
        if self.closed:
            raise StoreError("store is closed")
        if self.writer.broken is not None:
            raise StoreError(f"store failed and must be reopened: {self.writer.broken}")
        now = time_ns() // 1_000_000  # (now_ms inlined: one call less per message)
        if self.free_space.low:  # the disk low-watermark (read in the background)
            self.free_space.refuse()
        if msg.msg_type == MessageType.TRANSACTION or msg.deliver_at > now:
            return self.submit(hold(msg, self.catalog), now, msg.topic)
        # (submit, inlined: one call less per message)
        if len(msg.body) > self.max_size:
            raise MessageTooLarge(f"body of {len(msg.body)} bytes exceeds {self.max_size}")
        fut = self.loop.create_future()
        self.place((msg,), now, fut)
        return fut

    async def append_many(self, msgs: list[Message]) -> list[AppendResult]:
        """`Store.append_many`: store several messages, in order; returns once all are durable.
        Cheaper than one append per message: one future for the batch (the writer is FIFO, so when
        the last record is durable every earlier one is). A failure raises; records queued before
        it may be stored."""
        if self.closed:
            raise StoreError("store is closed")
        if self.writer.broken is not None:
            raise StoreError(f"store failed and must be reopened: {self.writer.broken}")
        now = time_ns() // 1_000_000
        if self.free_space.low:
            self.free_space.refuse()
        real: list[str] | None = None
        for i, msg in enumerate(msgs):
            if len(msg.body) > self.max_size:
                raise MessageTooLarge(f"body of {len(msg.body)} bytes exceeds {self.max_size}")
            if msg.msg_type == MessageType.TRANSACTION or msg.deliver_at > now:
                if real is None:
                    real = [m.topic for m in msgs]
                    msgs = list(msgs)
                msgs[i] = hold(msg, self.catalog)
        fut = self.loop.create_future()
        if real is None and len(msgs) > 1 and one_queue(msgs, self.catalog.compacted):
            out = self.batches.place(msgs, now, fut)
        else:
            out = self.place(msgs, now, fut, real)
        await fut
        return out

    def submit(self, msg: Message, now: int, result_topic: str | None = None) -> asyncio.Future[AppendResult]:
        """Append one message as it is (the store's own appends: DLQ, delivery of held messages;
        they go on while the store closes). `result_topic` is the result's topic when `msg` is held."""
        if len(msg.body) > self.max_size:
            raise MessageTooLarge(f"body of {len(msg.body)} bytes exceeds {self.max_size}")
        fut = self.loop.create_future()
        self.place((msg,), now, fut, None if result_topic is None else (result_topic,))
        return fut

    def place(
        self, msgs: Sequence[Message], now: int, fut: asyncio.Future, real: Sequence[str] | None = None
    ) -> list[AppendResult]:
        """Encode, place and queue records for the writer, in order (the hot path: keep it lean).
        The last is answered through `fut`; the others need no answer (the writer is FIFO, so the
        last durable means all are). `real` gives each result's topic when a message is held
        (delayed, half). A failure raises once the records placed before it are handed over."""
        tq = self.catalog.topic_queues
        queues = self.catalog.queues
        compacted = self.catalog.compacted
        rr = self.rr
        next_id = self.ids.next
        encode = codec.encode
        entry = ENTRY.pack
        index_entry = MessageIndex.encode
        id32 = ID32.pack  # the common index entry (`MessageIndex.encode`'s first case), no Python call
        cl = self.commitlog
        seg_size = self.seg_size
        largest = seg_size - codec.MIN_RECORD
        done = self.done
        last = len(msgs) - 1
        out: list[AppendResult] = []
        recs: list[Record] = []
        try:
            for i, msg in enumerate(msgs):
                topic = msg.topic
                qs = tq.get(topic) or queues(topic)
                qid = msg.queue_id
                if qid < 0:
                    if msg.message_group:
                        qid = zlib.crc32(msg.message_group.encode()) % len(qs)
                    elif compacted and topic in compacted and (key := compaction_key(msg)) is not None:
                        qid = key_queue(key, len(qs))  # a key's records stay in one queue
                    elif key := msg.order_key:  # (set above the store: messaging_processor/ordering.py)
                        qid = _crc32(key.encode()) % len(qs)  # one queue per order key: its order
                    else:
                        qid = rr.get(topic, 0) % len(qs)  # (% : the topic may have shrunk)
                        rr[topic] = (qid + 1) % len(qs)
                elif qid >= len(qs):
                    qid = self._writable(topic, qid, len(qs))
                cq = qs[qid]
                mid = msg.message_id or next_id()
                qoff = cq.next_offset
                rec = encode(msg, qid, qoff, now, mid, msg.born_timestamp or now)
                size = len(rec)
                if size > largest:
                    raise MessageTooLarge(f"a record of {size} bytes does not fit a {seg_size}-byte segment")
                clo = cl.write_pos
                if clo % seg_size + size <= seg_size:
                    cl.write_pos = clo + size
                    start = clo
                else:
                    clo, filler = cl.reserve(size)
                    start = clo - len(filler)
                    rec = filler + rec
                cq.next_offset = qoff + 1
                tag = msg.tag
                if tag:
                    th = tag_hash(tag)
                elif (props := msg.properties) and (path := props.get(PATH_PROPERTY)):
                    # message.path_hash, inlined in the append loop (tests check they agree)
                    b = path.encode()
                    th = PATH_HASH_BIT | _crc32(b) << 30 | _adler32(b) & 0x3FFFFFFF
                else:
                    th = 0
                keys = msg.keys
                mb = mid.encode()
                if not keys and len(mb) == 32:
                    idx = id32(KIND_ID, 32, mb, clo)
                else:
                    idx = index_entry(mid, keys, clo)
                res = _new_tuple(AppendResult, (mid, real[i] if real else topic, qid, qoff, clo, size, now))
                recs.append(
                    _new_tuple(
                        Record,
                        (
                            start,
                            rec,
                            cq,
                            entry(clo, size, th, now),
                            idx,
                            fut if i == last else done,
                            res,
                            keys,
                            th,
                        ),
                    )
                )
                out.append(res)
        finally:
            if recs:
                self.writer.put(recs)
        return out

    def _writable(self, topic: str, qid: int, writable: int) -> int:
        """The queue a message sent to queue `qid` goes to: a sealed queue's (a client's route
        from before a shrink) goes to `qid % writable`, as RocketMQ's broker maps a queue id past
        its write queues; past every queue it is an error."""
        if qid < self.catalog.topic(topic).readable:
            return qid % writable
        raise ValueError(f"topic {topic} has no queue {qid}")

    def on_readable(self, recs: list[Record]) -> None:
        """Loop: a batch is written to the page cache: make it readable and index it. Under the
        `sync` policy this comes before its fsync (as in RocketMQ: consumers read what is written;
        appenders hear only when it is durable, in `on_durable`)."""
        index = self.index
        ids = index.ids
        index_add = index.add
        index_mem = index.mem
        waiters = self.waiters
        touched: dict[str, set[int]] = {}
        special = False
        for r in recs:
            cq = r.cq
            res = r.result
            cq.mem += r.entry
            cq.max_offset = res.queue_offset + 1
            index_mem += r.idx
            mid = res.message_id
            keys = r.keys
            topic = cq.topic
            if keys.__class__ is list:  # a batch record (BatchPlacer.place): each of its messages
                mids, poss, keyed = keys
                if ids.keys().isdisjoint(mids):
                    ids.update(zip(mids, poss, strict=True))
                else:
                    keyed = keyed + [(m, (), p) for m, p in zip(mids, poss, strict=True)]
                for mid, keys, clo in keyed:  # noqa: B020 - the batch's own, in turn
                    index_add(mid, keys, clo)
                if waiters and topic in waiters:
                    touched.setdefault(topic, set()).update(r.tag_hash)
                continue
            if keys or mid in ids:
                index_add(mid, keys, res.commitlog_offset)
            else:
                ids[mid] = res.commitlog_offset
            if topic[0] == "%":
                special = True
            if waiters and topic in waiters:
                hs = touched.get(topic)
                if hs is None:
                    hs = touched[topic] = set()
                hs.add(r.tag_hash)
        if special:
            for r in recs:
                topic = r.cq.topic
                if topic == SCHEDULE_TOPIC:
                    self.on_delayed(r.result)
                elif topic == HALF_TOPIC:
                    self.on_half(r.result)
        if touched:
            self.wake_topics(touched)

    def on_durable(self, recs: list[Record], seconds: float) -> None:
        """Loop: a batch (already readable) is durable: answer its appenders, count its bytes
        per segment (counted here, like the checkpoint's commit log end, so a replay after a
        crash does not count them twice)."""
        per_topic: dict[str, list[int]] = {}  # topic -> [bytes, last store ts]
        for r in recs:
            res = r.result
            topic = r.cq.topic
            st = per_topic.get(topic)
            if st is None:
                per_topic[topic] = [res.size, res.store_timestamp]
            else:
                st[0] += res.size
                st[1] = res.store_timestamp
            fut = r.fut
            if not fut.done():
                fut.set_result(res)
        self.metrics["appends"] += len(recs)
        self.metrics["flushes"] += 1
        fl = self.flush_latency_ms
        fl.append(seconds * 1000)
        if len(fl) > 4096:
            del fl[:2048]
        seg_size = self.seg_size
        first, last = recs[0].result.commitlog_offset, recs[-1].result.commitlog_offset
        if first - first % seg_size == last - last % seg_size:
            self.segments.add(last - last % seg_size, per_topic)
        else:
            count = self.segments.count
            for r in recs:
                res = r.result
                count(res.commitlog_offset, r.cq.topic, res.size, res.store_timestamp)

    def on_failed(self, recs: list[Record], start: int | None, exc: BaseException) -> None:
        """Loop: a batch write failed. Fail its appenders and reuse its space (`start` given)."""
        if start is not None:
            self.commitlog.write_pos = start
            for cq in self.catalog.cqs.values():
                cq.next_offset = cq.max_offset
        if isinstance(exc, OSError) and not isinstance(exc, StoreFullError) and exc.errno in (28, 122, 27):
            exc = StoreFullError(str(exc))
        for r in recs:
            fut = r.fut
            if not fut.done():
                fut.set_exception(exc)

    # The pure-Python methods above are the reference; the compiled ones do the same steps.
    py_append, py_place, py_on_readable, py_on_durable = append, place, on_readable, on_durable
    if _compiled is not None:
        append, place, on_readable, on_durable = (  # type: ignore[assignment]
            _compiled.append,
            _compiled.place,
            _compiled.on_readable,
            _compiled.on_durable,
        )


def _unset(res: AppendResult) -> None:
    raise RuntimeError("the store wires on_delayed and on_half before the first append")
