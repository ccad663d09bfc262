"""The Store: the public, protocol-free API over commit log, consume queues, index and progress.

Appends are encoded and given their offsets in the event loop and written in batches by the group
commit writer (writer.py), which has a helper process fdatasync them (fsyncer.py). Rare, slow file
work (recovery, checkpoints, segment deletion, progress log flushes) runs, in order, on one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from . import codec
from .commitlog import CommitLog, StoreFullError
from .config import (
    DLQ_PREFIX,
    HALF_TOPIC,
    SCHEDULE_TOPIC,
    SYSTEM_TIMER_GROUP,
    SYSTEM_TXN_GROUP,
    GroupConfig,
    Metadata,
    RetryPolicy,
    StoreConfig,
    TopicConfig,
    check_name,
)
from .consumequeue import ENTRY, ConsumeQueue
from .consumer import ConsumerProgress, GroupTopic, Inflight
from .index import MessageIndex
from .kv import KeyValueStore
from .message import AppendResult, Message, MessageIdFactory, MessageType, PoppedMessage, now_ms, tag_hash
from .writer import GroupCommitWriter

_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)
log = logging.getLogger("store")

PROP_REAL_TOPIC = "__REAL_TOPIC"
PROP_REAL_QUEUE = "__REAL_QID"
PROP_ORIGIN_TOPIC = "ORIGIN_TOPIC"
PROP_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROP_ORIGIN_QUEUE = "ORIGIN_QUEUE_ID"
PROP_ORIGIN_OFFSET = "ORIGIN_QUEUE_OFFSET"
PROP_RECONSUME_TIMES = "RECONSUME_TIMES"
PROP_DLQ_REASON = "DLQ_REASON"
PROP_TXN_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"


class StoreError(Exception):
    """Base of the store's own errors."""


class TopicNotFound(StoreError):
    pass


class GroupNotFound(StoreError):
    pass


class InvalidReceiptHandle(StoreError):
    """The handle is malformed, already acked, or superseded by a later pop/change."""


class MessageTooLarge(StoreError):
    pass


class TransactionNotFound(StoreError):
    pass


@dataclass(slots=True, frozen=True)
class Filter:
    """What a consumer wants: tags (None = all) and/or a predicate over the decoded message."""

    tags: frozenset[str] | None = None
    predicate: Callable[[Message], bool] | None = None

    @classmethod
    def from_expression(cls, expr: str | None) -> Filter:
        """RocketMQ tag expression: `*`, empty, or `TagA || TagB`."""
        if not expr or expr.strip() == "*":
            return ALL
        return cls(tags=frozenset(t.strip() for t in expr.split("||") if t.strip()))

    def matches(self, msg: Message) -> bool:
        if self.tags is not None and msg.tag not in self.tags:
            return False
        return self.predicate is None or self.predicate(msg)


ALL = Filter()


def _tag_hashes(f: Filter) -> frozenset[int] | None:
    return None if f.tags is None else frozenset(tag_hash(t) for t in f.tags)


class _Waiter:
    __slots__ = ("fut", "hashes", "has_predicate")

    def __init__(self, fut: asyncio.Future[None], f: Filter) -> None:
        self.fut = fut
        self.hashes = _tag_hashes(f)
        self.has_predicate = f.predicate is not None


def encode_handle(seq: int, group: str, topic: str, qid: int, offset: int) -> str:
    return f"{seq:x} {qid} {offset} {topic} {group}"


def decode_handle(handle: str) -> tuple[int, str, str, int, int]:
    try:
        seq, qid, offset, topic, group = handle.split(" ")
        return int(seq, 16), group, topic, int(qid), int(offset)
    except ValueError:
        raise InvalidReceiptHandle(f"malformed receipt handle {handle!r}") from None


class Store:
    """A durable message store. Open with `await Store.open(StoreConfig(...))`."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.sync = config.flush == "sync"
        d = config.data_dir
        os.makedirs(d, exist_ok=True)
        self._lock_fd = _lock_dir(d)
        self.meta = Metadata(d)
        self.kv = KeyValueStore(d)
        self.topic_configs = self.meta.load_topics()
        self.group_configs = self.meta.load_groups()
        self.commitlog = CommitLog(os.path.join(d, "commitlog"), config.segment_size, config.min_free_bytes)
        self.index = MessageIndex(os.path.join(d, "index"))
        self.cqs: dict[tuple[str, int], ConsumeQueue] = {}
        self._topic_queues: dict[str, list[ConsumeQueue]] = {}
        self._rr: dict[str, int] = {}
        self._ids = MessageIdFactory()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io = ThreadPoolExecutor(1, thread_name_prefix="store-io")
        self._writer: GroupCommitWriter | None = None
        self._max_size = config.max_message_size
        self._seg_size = config.segment_size
        # waiters, timers, transactions, retention
        self._waiters: dict[str, set[_Waiter]] = {}
        self._seg_stats: dict[int, dict[str, list[int]]] = {}
        self._timer_heap: list[tuple[int, int, int]] = []  # (deliver_at, queue offset, clo)
        self._delivering: list[int] = []  # commit log offsets of delayed messages being delivered
        self._timer_wake: asyncio.Event | None = None
        self._txn_heap: list[tuple[int, int, int]] = []  # (next check at, queue offset, clo)
        self._txn_checks: dict[int, int] = {}
        self._resolving: set[int] = set()  # half messages whose commit append is under way
        self.transaction_checker: Callable[[Message], Awaitable[None] | None] | None = None
        self._tasks: list[asyncio.Task] = []
        self._cp_lock = asyncio.Lock()  # one checkpoint (or retention file rewrite) at a time
        self._closed = False
        self.metrics = {"appends": 0, "flushes": 0, "pops": 0, "acks": 0, "redeliveries": 0, "dlq": 0}
        self.flush_latency_ms: list[float] = []

    # =========================================================================== lifecycle
    @classmethod
    async def open(cls, config: StoreConfig) -> Store:
        store = cls(config)
        store._loop = asyncio.get_running_loop()
        store._done_fut = store._loop.create_future()  # stands in for the futures of append_many
        store._done_fut.set_result(None)  # records before a batch's last: nobody waits on them
        store._timer_wake = asyncio.Event()
        try:
            await store._run_io(store._recover)
            store._writer = GroupCommitWriter(
                store._loop,
                store.commitlog,
                store.index,
                store.sync,
                store._on_readable,
                store._on_durable,
                store._on_failed,
                store.config.fsync_method,
            )
        except BaseException:
            store._io.shutdown()
            store.meta.close()
            store.kv.close()
            os.close(store._lock_fd)  # the directory can be opened again
            raise
        store._writer.written_end = store._writer.durable_end = store.commitlog.write_pos
        store._post_recover()
        store._start_tasks()
        return store

    def _recover(self) -> None:
        """Flusher thread, before anything else runs: bring files to a consistent state."""
        cp_path = os.path.join(self.config.data_dir, "checkpoint.json")
        cp = {}
        if os.path.exists(cp_path):
            with open(cp_path, "rb") as f:
                cp = json.loads(f.read())
        cl = self.commitlog
        start = max(cp.get("commitlog", 0), cl.min_offset)
        self._seg_stats = {int(k): v for k, v in cp.get("segments", {}).items()}
        expected = {}  # entries each queue had at the checkpoint: a shorter queue file was damaged
        for name, count in cp.get("queues", {}).items():
            topic, _, qid = name.rpartition("/")
            expected[(topic, int(qid))] = count
        for name in set(self._existing_queues()) | set(expected):
            self._cq(*name)
        if not self._tail_is_valid():
            start = max(start - start % cl.segment_size, cl.min_offset)
            log.warning("data before the checkpoint is damaged: recovering from offset %d", start)
        ok = self._replay_commitlog(start)
        if ok and any(self.cqs[k].max_offset < n for k, n in expected.items()):
            ok = False
        if not ok:
            log.warning("consume queues do not match the commit log: rebuilding them from %d", cl.min_offset)
            for cq in self.cqs.values():
                cq.truncate_to_commitlog(-1)
                cq.rebase(0)
            self._seg_stats = {}
            self._replay_commitlog(cl.min_offset, rebuild=True)
        cl.truncate(cl.scan_end)
        for cq in self.cqs.values():
            cq.set_min_by_commitlog(cl.min_offset)
        queues = {f"{t}/{q}": cq.max_offset for (t, q), cq in self.cqs.items()}
        for cq in self.cqs.values():
            os.fdatasync(cq.fd)
        self.index.sync()
        self._write_checkpoint(cl.scan_end, [], b"", None, queues)
        progress = self.progress
        cut = progress.clamp({k: cq.max_offset for k, cq in self.cqs.items()})
        if cut:
            log.warning("consumer progress of %d queues was past their recovered end: cut back", cut)
            progress.write_checkpoint(progress.snapshot(), progress.take_log())

    def _replay_commitlog(self, start: int, rebuild: bool = False) -> bool:
        cl = self.commitlog
        for cq in self.cqs.values():
            cq.truncate_to_commitlog(start)
        self.index.load(start)
        idx = bytearray()
        for clo, buf, pos, size in cl.scan(start):
            msg = codec.decode(buf, pos, clo)
            cq = self._cq(msg.topic, msg.queue_id)
            if rebuild and cq.next_offset == cq.base == 0 and msg.queue_offset > 0 and not cq.pending:
                cq.rebase(msg.queue_offset)  # rebuilt after retention removed the first entries
            if msg.queue_offset != cq.next_offset:
                if msg.queue_offset < cq.next_offset:
                    continue
                return False
            cq.reserve(clo, size, tag_hash(msg.tag), msg.store_timestamp)
            self.index.add(msg.message_id, msg.keys, clo)
            idx += MessageIndex.encode(msg.message_id, msg.keys, clo)
            self._count_segment(clo, msg.topic, size, msg.store_timestamp)
        for cq in self.cqs.values():
            if cq.pending:
                first = cq.max_offset
                cq.write_at(first, cq.take_pending())
                cq.max_offset = cq.file_offset = cq.next_offset
        self.index.append_file(bytes(idx))
        return True

    def _tail_is_valid(self) -> bool:
        """Do the newest consume queue entries point at valid records? (a cheap check at start)"""
        for cq in self.cqs.values():
            if cq.max_offset > cq.base:
                clo, size, _th, _ts = cq.entry(cq.max_offset - 1)
                try:
                    buf = self.commitlog.read(clo, size)
                    codec.check(buf, 0, len(buf))
                except (KeyError, codec.CorruptRecord):
                    return False
        return True

    def _existing_queues(self) -> list[tuple[str, int]]:
        root = os.path.join(self.config.data_dir, "consumequeue")
        out = []
        if os.path.isdir(root):
            for topic in os.listdir(root):
                for q in os.listdir(os.path.join(root, topic)):
                    if q.isdigit():
                        out.append((topic, int(q)))
        return out

    def _post_recover(self) -> None:
        """Loop: rebuild timers and pending transactions from their system progress."""
        for topic, group, heap in (
            (SCHEDULE_TOPIC, SYSTEM_TIMER_GROUP, self._timer_heap),
            (HALF_TOPIC, SYSTEM_TXN_GROUP, self._txn_heap),
        ):
            cq = self.cqs.get((topic, 0))
            if cq is None:
                continue
            q = self.progress.get(group, topic).queue(0)
            start = max(q.ack_wm, cq.min_offset)
            for i, (clo, size, _th, _ts) in enumerate(cq.entries(start, cq.max_offset - start)):
                off = start + i
                if off in q.done:
                    continue
                msg = codec.decode(self.commitlog.read(clo, size), 0, clo)
                when = (
                    msg.deliver_at
                    if topic == SCHEDULE_TOPIC
                    else msg.store_timestamp + self.config.transaction_timeout_ms
                )
                heap.append((when, off, clo))
            heapq.heapify(heap)

    def _start_tasks(self) -> None:
        loop = self._loop
        self._tasks = [
            loop.create_task(self._periodic(self.config.checkpoint_interval_ms, self._checkpoint)),
            loop.create_task(self._periodic(self.config.consumer_log_flush_ms, self._flush_progress)),
            loop.create_task(self._timer_loop()),
            loop.create_task(
                self._periodic(self.config.transaction_check_interval_ms, self._check_transactions)
            ),
            loop.create_task(self._periodic(self.config.retention_check_interval_ms, self.apply_retention)),
        ]
        if not self.sync:
            self._tasks.append(
                loop.create_task(self._periodic(self.config.flush_interval_ms, self._fsync_async))
            )

    async def _periodic(self, interval_ms: int, fn: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await fn()
            except StoreFullError:
                log.warning("store is full")
            except Exception:
                log.exception("store background task failed")

    def preallocate(self) -> None:
        """Start zero-filling, in the background, the segment the next append lands in when it
        does not exist yet (a fresh store): its first append then need not wait for the whole
        segment to be written. Servers call this after open; a library user may skip it."""
        cl = self.commitlog
        seg = self._seg_size
        cl._preallocate_next(cl.write_pos - cl.write_pos % seg)

    async def close(self) -> None:
        """Finish in-flight appends, persist progress, checkpoint and release files."""
        if self._closed:
            return
        self._closed = True
        await self._writer.drain()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.fut.done():
                    w.fut.set_result(None)
        await self._checkpoint(consumer_snapshot=True)
        await self._run_io(self._close_files)
        self._writer.close()
        self._io.shutdown(wait=True)
        self.meta.close()
        self.kv.close()
        os.close(self._lock_fd)

    def _close_files(self) -> None:
        if not self.sync:
            self.commitlog.sync()
        self.commitlog.close()
        for cq in self.cqs.values():
            cq.close()
        self.index.close()
        self.progress.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _run_io(self, fn: Callable, *args: object) -> asyncio.Future:
        return self._loop.run_in_executor(self._io, fn, *args)

    # =========================================================================== topics & groups
    def create_topic(
        self,
        name: str,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> TopicConfig:
        check_name("topic", name)
        t = TopicConfig(name, queues or self.config.default_queues, retention_ms, retention_bytes)
        if not 1 <= t.queues <= 1024:
            raise ValueError("a topic has 1 to 1024 queues")
        old = self.topic_configs.get(name)
        if old is not None and old.queues > t.queues:
            t.queues = old.queues  # queues are never removed while they may hold messages
        self.topic_configs[name] = t
        self.meta.save_topic(t)
        self._topic_queues.pop(name, None)
        return t

    def delete_topic(self, name: str) -> None:
        if name not in self.topic_configs:
            raise TopicNotFound(name)
        del self.topic_configs[name]
        self.meta.delete_topic(name)
        self._topic_queues.pop(name, None)

    def topics(self) -> list[TopicConfig]:
        return [t for n, t in sorted(self.topic_configs.items())]

    def topic(self, name: str, create: bool | None = None) -> TopicConfig:
        t = self.topic_configs.get(name)
        if t is None:
            system = name.startswith("%")  # %HALF%, %SCHEDULE%, %DLQ%...: always created on demand
            if system or (create if create is not None else self.config.auto_create_topics):
                return self.create_topic(name, 1 if system else None)
            raise TopicNotFound(name)
        return t

    def create_group(
        self, name: str, max_attempts: int = 16, retry: RetryPolicy | None = None
    ) -> GroupConfig:
        check_name("group", name)
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        g = GroupConfig(name, max_attempts, retry or RetryPolicy())
        self.group_configs[name] = g
        self.meta.save_group(g)
        return g

    def delete_group(self, name: str) -> None:
        if name not in self.group_configs:
            raise GroupNotFound(name)
        del self.group_configs[name]
        self.meta.delete_group(name)

    def groups(self) -> list[GroupConfig]:
        return [g for n, g in sorted(self.group_configs.items())]

    def group(self, name: str) -> GroupConfig:
        g = self.group_configs.get(name)
        if g is None:
            check_name("group", name)
            g = self.create_group(name)
        return g

    def _cq(self, topic: str, qid: int) -> ConsumeQueue:
        cq = self.cqs.get((topic, qid))
        if cq is None:
            path = os.path.join(self.config.data_dir, "consumequeue", topic, str(qid))
            cq = self.cqs[(topic, qid)] = ConsumeQueue(path, topic, qid)
        return cq

    def _queues(self, topic: str) -> list[ConsumeQueue]:
        qs = self._topic_queues.get(topic)
        if qs is None:
            n = self.topic(topic).queues
            qs = self._topic_queues[topic] = [self._cq(topic, i) for i in range(n)]
        return qs

    # =========================================================================== append
    def append(self, msg: Message) -> asyncio.Future[AppendResult]:
        """Store one message: `await store.append(msg)` returns once it is durable per the flush policy.

        Invalid input (closed store, oversized body, bad queue) raises at once."""
        if self._closed:
            raise StoreError("store is closed")
        if self._writer.broken is not None:
            raise StoreError(f"store failed and must be reopened: {self._writer.broken}")
        now = now_ms()
        if msg.msg_type == MessageType.TRANSACTION or msg.deliver_at > now:
            return self._append(self._redirected(msg), now, msg.topic)
        return self._append(msg, now)

    def _redirected(self, msg: Message) -> Message:
        """A transactional message as a half message, a message due later as a scheduled one, each
        carrying its real topic and queue as properties."""
        txn = msg.msg_type == MessageType.TRANSACTION
        self.topic(msg.topic)  # the real topic must exist (or be auto-created) now
        props = dict(msg.properties)
        props[PROP_REAL_TOPIC] = msg.topic
        props[PROP_REAL_QUEUE] = str(msg.queue_id)
        return Message(
            topic=HALF_TOPIC if txn else SCHEDULE_TOPIC,
            body=msg.body,
            tag=msg.tag,
            keys=msg.keys,
            properties=props,
            message_group=msg.message_group,
            deliver_at=msg.deliver_at,
            message_id=msg.message_id,
            born_timestamp=msg.born_timestamp,
            born_host=msg.born_host,
            queue_id=0,
            msg_type=MessageType.TRANSACTION if txn else MessageType.DELAY,
        )

    async def append_many(self, msgs: list[Message]) -> list[AppendResult]:
        """Store several messages, in order; returns once all are durable. Cheaper than one append
        per message: one future for the batch (the writer is FIFO, so when the last record is
        durable every earlier one is). A failure raises; records queued before it may be stored."""
        if self._closed:
            raise StoreError("store is closed")
        if self._writer.broken is not None:
            raise StoreError(f"store failed and must be reopened: {self._writer.broken}")
        now = now_ms()
        real: list[str] | None = None
        for i, msg in enumerate(msgs):
            if len(msg.body) > self._max_size:
                raise MessageTooLarge(f"body of {len(msg.body)} bytes exceeds {self._max_size}")
            if msg.msg_type == MessageType.TRANSACTION or msg.deliver_at > now:
                if real is None:
                    real = [m.topic for m in msgs]
                    msgs = list(msgs)
                msgs[i] = self._redirected(msg)
        fut = self._loop.create_future()
        out = self._place(msgs, now, fut, real)
        await fut
        return out

    def _place(
        self, msgs: Sequence[Message], now: int, fut: asyncio.Future, real: Sequence[str] | None = None
    ) -> list[AppendResult]:
        """Encode, place and queue records for the writer, in order (the hot path: keep it lean).
        The last is answered through `fut`; the others need no answer (the writer is FIFO, so the
        last durable means all are). `real` gives each result's topic when a message is redirected
        (delayed, half). A failure raises once the records placed before it are handed over."""
        tq = self._topic_queues
        rr = self._rr
        next_id = self._ids.next
        encode = codec.encode
        entry = ENTRY.pack
        index_entry = MessageIndex.encode
        cl = self.commitlog
        seg_size = self._seg_size
        largest = seg_size - codec.MIN_RECORD
        done = self._done_fut
        last = len(msgs) - 1
        out: list[AppendResult] = []
        recs: list[tuple] = []
        try:
            for i, msg in enumerate(msgs):
                topic = msg.topic
                qs = tq.get(topic) or self._queues(topic)
                qid = msg.queue_id
                if qid < 0:
                    if msg.message_group:
                        qid = codec.zlib.crc32(msg.message_group.encode()) % len(qs)
                    else:
                        qid = rr.get(topic, 0)
                        rr[topic] = (qid + 1) % len(qs)
                elif qid >= len(qs):
                    raise ValueError(f"topic {topic} has no queue {qid}")
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
                th = tag_hash(tag) if tag else 0
                keys = msg.keys
                res = _new_tuple(AppendResult, (mid, real[i] if real else topic, qid, qoff, clo, size, now))
                # record layout: see writer.py
                recs.append(
                    (
                        start,
                        rec,
                        cq,
                        entry(clo, size, th, now),
                        index_entry(mid, keys, clo),
                        fut if i == last else done,
                        res,
                        keys,
                        th,
                    )
                )
                out.append(res)
        finally:
            if recs:
                self._writer.put(recs)
        return out

    def _append(
        self, msg: Message, now: int, result_topic: str | None = None
    ) -> asyncio.Future[AppendResult]:
        if len(msg.body) > self._max_size:
            raise MessageTooLarge(f"body of {len(msg.body)} bytes exceeds {self._max_size}")
        fut = self._loop.create_future()
        self._place((msg,), now, fut, None if result_topic is None else (result_topic,))
        return fut

    def _on_readable(self, recs: list[tuple]) -> None:
        """Loop: a batch is written to the page cache: make it readable and index it. Under the
        `sync` policy this comes before its fsync (as in RocketMQ: consumers read what is written;
        appenders hear only when it is durable, in `_on_durable`)."""
        ids = self.index.ids
        index_add = self.index.add
        waiters = self._waiters
        touched: dict[str, set[int]] = {}
        special = False
        index_mem = self.index.mem
        for _start, _data, cq, entry, idx, _fut, res, keys, th in recs:
            cq.mem += entry
            cq.max_offset = res[3] + 1
            index_mem += idx
            mid = res[0]
            if keys or mid in ids:
                index_add(mid, keys, res[4])
            else:
                ids[mid] = res[4]
            topic = cq.topic
            if topic[0] == "%":
                special = True
            if waiters and topic in waiters:
                hs = touched.get(topic)
                if hs is None:
                    hs = touched[topic] = set()
                hs.add(th)
        if special:
            for r in recs:
                topic = r[2].topic
                if topic == SCHEDULE_TOPIC:
                    self._schedule_timer(r[6])
                elif topic == HALF_TOPIC:
                    res = r[6]
                    heapq.heappush(
                        self._txn_heap,
                        (
                            res.store_timestamp + self.config.transaction_timeout_ms,
                            res.queue_offset,
                            res.commitlog_offset,
                        ),
                    )
        for topic, hashes in touched.items():
            self._wake(topic, hashes)

    def _on_durable(self, recs: list[tuple], seconds: float) -> None:
        """Loop: a batch (already readable) is durable: answer its appenders, count its bytes
        per segment (counted here, like the checkpoint's commit log end, so a replay after a
        crash does not count them twice)."""
        per_topic: dict[str, list[int]] = {}  # topic -> [bytes, last store ts]
        for _start, _data, cq, _entry, _idx, fut, res, _keys, _th in recs:
            topic = cq.topic
            st = per_topic.get(topic)
            if st is None:
                per_topic[topic] = [res[5], res[6]]
            else:
                st[0] += res[5]
                st[1] = res[6]
            if not fut.done():
                fut.set_result(res)
        seg_size = self.config.segment_size
        first, last = recs[0][6][4], recs[-1][6][4]
        if first - first % seg_size == last - last % seg_size:
            seg = self._seg_stats.setdefault(last - last % seg_size, {})
            for topic, (nbytes, ts) in per_topic.items():
                st = seg.get(topic)
                if st is None:
                    seg[topic] = [nbytes, ts]
                else:
                    st[0] += nbytes
                    st[1] = ts
        else:
            for r in recs:
                self._count_segment(r[6][4], r[2].topic, r[6][5], r[6][6])
        self.metrics["appends"] += len(recs)
        self._record_flush(seconds)

    def _on_failed(self, recs: list[tuple], start: int | None, exc: BaseException) -> None:
        """Loop: a batch write failed. Fail its appenders and reuse its space (`start` given)."""
        if start is not None:
            self.commitlog.write_pos = start
            for cq in self.cqs.values():
                cq.next_offset = cq.max_offset
        if isinstance(exc, OSError) and not isinstance(exc, StoreFullError) and exc.errno in (28, 122, 27):
            exc = StoreFullError(str(exc))
        for r in recs:
            fut = r[5]
            if not fut.done():
                fut.set_exception(exc)

    def _record_flush(self, seconds: float) -> None:
        self.metrics["flushes"] += 1
        fl = self.flush_latency_ms
        fl.append(seconds * 1000)
        if len(fl) > 4096:
            del fl[:2048]

    def _count_segment(self, clo: int, topic: str, size: int, ts: int) -> None:
        base = clo - clo % self.config.segment_size
        seg = self._seg_stats.get(base)
        if seg is None:
            seg = self._seg_stats[base] = {}
        st = seg.get(topic)
        if st is None:
            seg[topic] = [size, ts]
        else:
            st[0] += size
            if ts > st[1]:
                st[1] = ts

    async def _fsync_async(self) -> None:
        segs = self._writer.take_unsynced_segments()
        if segs:
            await self._run_io(self.commitlog.sync, segs)

    # =========================================================================== reading
    def get_message(self, commitlog_offset: int, size: int | None = None) -> Message:
        """The message stored at a commit log offset."""
        if size is None:
            size = codec.record_size_at(self.commitlog.read(commitlog_offset, 4), 0)
        buf = self.commitlog.read(commitlog_offset, size)
        codec.check(buf, 0, len(buf))
        return codec.decode(buf, 0, commitlog_offset)

    def _read_entry(self, clo: int, size: int) -> Message | None:
        """The message a queue entry points at; None (and a log line) if it does not check out."""
        try:
            buf = self.commitlog.read(clo, size)
            codec.check(buf, 0, len(buf))
        except (KeyError, codec.CorruptRecord) as e:
            log.error("unreadable message at commit log offset %d: %s", clo, e)
            return None
        return codec.decode(buf, 0, clo)

    def get_by_id(self, message_id: str) -> list[Message]:
        return [m for m in self._live(self.index.by_id(message_id)) if m.message_id == message_id]

    def get_by_key(self, key: str) -> list[Message]:
        return [m for m in self._live(self.index.by_key(key)) if key in m.keys]

    def _live(self, offsets: Iterable[int]) -> list[Message]:
        low = self.commitlog.min_offset
        return [self.get_message(o) for o in offsets if o >= low]

    def queue_count(self, topic: str) -> int:
        return self.topic(topic, create=False).queues

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._queue(topic, queue_id).max_offset

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        if topic not in self.topic_configs:
            raise TopicNotFound(topic)
        qs = self._queues(topic)
        if not 0 <= queue_id < len(qs):
            raise ValueError(f"topic {topic} has no queue {queue_id}")
        return qs[queue_id]

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int | None = None,
        max_messages: int = 32,
        filter: Filter = ALL,
    ) -> list[Message]:
        """Messages with queue offsets in [start, end) (clamped to what is stored), at most max_messages.

        Replayable: the same arguments return the same messages while they are retained.
        """
        cq = self._queue(topic, queue_id)
        start = max(start, cq.min_offset)
        end = cq.max_offset if end is None else min(end, cq.max_offset)
        out: list[Message] = []
        hashes = _tag_hashes(filter)
        off = start
        while off < end and len(out) < max_messages:
            n = min(end - off, 256)
            for clo, size, th, _ts in cq.entries(off, n):
                if hashes is None or th in hashes:
                    m = self._read_entry(clo, size)
                    if m is not None and filter.matches(m):
                        out.append(m)
                        if len(out) >= max_messages:
                            return out
            off += n
        return out

    # Raw range reads for bulk consumers (the gateway's read API for Spark): record bytes instead of
    # one decoded Message per record. Record layout: store/codec.py and docs/store.md.
    def queue_entries(
        self, topic: str, queue_id: int, start: int, end: int, max_entries: int
    ) -> tuple[int, Iterable]:
        """(first offset, entries) of one queue in [start, end) clamped to what is stored: at most
        `max_entries` (commit log offset, size, tag hash, store time) tuples, lazily."""
        cq = self._queue(topic, queue_id)
        first = max(start, cq.min_offset)
        return first, cq.entries(first, max(0, min(max_entries, min(end, cq.max_offset) - first)))

    def read_log(self, offset: int, size: int) -> bytes:
        """`size` bytes of the commit log from `offset` (within one segment); KeyError when they
        are no longer stored (retention)."""
        return self.commitlog.read(offset, size)

    @property
    def segment_size(self) -> int:
        return self.commitlog.segment_size

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after `timestamp_ms`."""
        return self._queue(topic, queue_id).offset_for_timestamp(timestamp_ms)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Offset-based consumers: everything below `offset` is consumed by `group`."""
        self.group(group)
        cq = self._queue(topic, queue_id)
        offset = max(min(offset, cq.max_offset), 0)
        self.progress.committed(self.progress.get(group, topic), queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's consumed-up-to offset for a queue (-1 when it never consumed it)."""
        st = self.progress.states.get((group, topic))
        if st is None or queue_id not in st.queues:
            return -1
        return st.queues[queue_id].ack_wm

    def backlog(self, group: str, topic: str) -> int:
        """Messages of `topic` not yet acked by `group`."""
        qs = self._queues(topic)
        st = self.progress.states.get((group, topic))
        if st is None:
            return sum(cq.max_offset - cq.min_offset for cq in qs)
        return st.backlog({cq.queue_id: cq.max_offset for cq in qs})

    def inflight_count(self, group: str, topic: str) -> int:
        st = self.progress.states.get((group, topic))
        return 0 if st is None else sum(len(q.inflight) for q in st.queues.values())

    # =========================================================================== pop / ack
    async def pop(
        self,
        group: str,
        topic: str,
        max_messages: int = 32,
        invisible_time_ms: int = 30_000,
        filter: Filter = ALL,
        wait_ms: int = 0,
    ) -> list[PoppedMessage]:
        """Hand out up to `max_messages` visible messages from any queue, invisible until acked or
        `invisible_time_ms` passes. With `wait_ms`, wait (long polling) for a matching message."""
        if max_messages < 1:
            raise ValueError("max_messages must be positive")
        if invisible_time_ms < 0:
            raise ValueError("invisible_time_ms must not be negative")
        gconf = self.group(group)
        self.topic(topic, create=False)
        give_up = time.monotonic() + wait_ms / 1000
        while True:
            out, dlq = self._pop_now(gconf, topic, max_messages, invisible_time_ms, filter)
            for st, qid, offset, msg in dlq:
                try:
                    await self._to_dlq(gconf.name, st, qid, offset, msg, "max attempts reached")
                except StoreError:
                    raise
                except Exception as e:  # noqa: BLE001 - the message stays for a later try
                    log.warning("moving %s:%d:%d to the DLQ failed: %s", st.topic, qid, offset, e)
            if out or time.monotonic() >= give_up or self._closed:
                if not out and dlq and time.monotonic() < give_up:
                    continue
                self.metrics["pops"] += len(out)
                return out
            await self._wait_for(topic, filter, give_up, self.progress.get(group, topic).next_deadline())

    def _pop_now(
        self, gconf: GroupConfig, topic: str, max_n: int, invisible: int, f: Filter
    ) -> tuple[list[PoppedMessage], list]:
        progress = self.progress
        st = progress.get(gconf.name, topic)
        now = now_ms()
        out: list[PoppedMessage] = []
        dlq: list = []
        heap = st.retry_heap
        # 1. messages whose invisible time is over
        while heap and heap[0][0] <= now and len(out) < max_n:
            deadline, seq, qid, offset = heapq.heappop(heap)
            q = st.queues.get(qid)
            inf = q.inflight.get(offset) if q else None
            if inf is None or inf.seq != seq:
                continue  # stale heap entry
            cq = self.cqs.get((topic, qid))
            if cq is None or offset < cq.min_offset:
                progress.done(st, qid, offset)  # deleted by retention
                continue
            clo, size, _th, _ts = cq.entry(offset)
            msg = self._read_entry(clo, size)
            if msg is None:
                progress.done(st, qid, offset)
                continue
            if inf.attempts >= gconf.max_attempts:
                inf.seq = progress.next_seq()  # nobody else picks it while it moves to the DLQ
                dlq.append((st, qid, offset, msg))
                continue
            new_seq = progress.next_seq()
            progress.changed(st, qid, offset, new_seq, now + invisible, inf.attempts + 1)
            msg.reconsume_times = inf.attempts - 1
            out.append(
                PoppedMessage(msg, encode_handle(new_seq, gconf.name, topic, qid, offset), now + invisible)
            )
            self.metrics["redeliveries"] += 1
        # 2. new messages, round robin over queues
        if len(out) < max_n:
            qs = self._queues(topic)
            hashes = _tag_hashes(f)
            n = len(qs)
            start = st.rr % n
            st.rr += 1
            queues = st.queues
            for k in range(n):
                if len(out) >= max_n:
                    break
                cq = qs[(start + k) % n]
                q = queues.get(cq.queue_id)
                if q is not None and q.cursor >= cq.max_offset:  # (then also >= min_offset)
                    continue  # nothing new in this queue (the common case at low rates: skip the call)
                self._pop_queue(st, cq, gconf.name, topic, max_n, invisible, f, hashes, now, out)
        return out, dlq

    def _pop_queue(
        self,
        st: GroupTopic,
        cq: ConsumeQueue,
        group: str,
        topic: str,
        max_n: int,
        invisible: int,
        f: Filter,
        hashes: frozenset[int] | None,
        now: int,
        out: list[PoppedMessage],
    ) -> None:
        progress = self.progress
        qid = cq.queue_id
        q = st.queue(qid)
        if q.cursor < cq.min_offset:
            progress.committed(st, qid, cq.min_offset)
        while len(out) < max_n and q.cursor < cq.max_offset:
            base = q.cursor
            for i, (clo, size, th, _ts) in enumerate(cq.entries(base, max_n - len(out))):
                offset = base + i
                if hashes is not None and th not in hashes:
                    progress.done(st, qid, offset)
                    continue
                msg = self._read_entry(clo, size)
                if msg is None or not f.matches(msg):
                    progress.done(st, qid, offset)
                    continue
                mg = msg.message_group
                if mg and mg in st.fifo_busy:
                    return  # FIFO: this queue waits until the group's previous message is done
                inf = Inflight(progress.next_seq(), now + invisible, 1, mg)
                progress.popped(st, qid, offset, inf)
                out.append(
                    PoppedMessage(msg, encode_handle(inf.seq, group, topic, qid, offset), inf.deadline)
                )
                if len(out) >= max_n:
                    return

    def _resolve(self, handle: str) -> tuple[GroupTopic, int, int, Inflight]:
        seq, group, topic, qid, offset = decode_handle(handle)
        st = self.progress.states.get((group, topic))
        q = st.queues.get(qid) if st else None
        inf = q.inflight.get(offset) if q else None
        if inf is None or inf.seq != seq:
            raise InvalidReceiptHandle("receipt handle is expired or already acknowledged")
        return st, qid, offset, inf

    def ack(self, handle: str) -> None:
        """Acknowledge a popped message: it is done for its group."""
        st, qid, offset, inf = self._resolve(handle)
        self.progress.done(st, qid, offset)
        self.metrics["acks"] += 1
        if inf.message_group:
            self._wake(st.topic, None)

    def change_invisible_time(self, handle: str, invisible_time_ms: int) -> str:
        """Make a popped message visible again after `invisible_time_ms` from now; returns the new handle."""
        if invisible_time_ms < 0:
            raise ValueError("invisible_time_ms must not be negative")
        st, qid, offset, inf = self._resolve(handle)
        seq = self.progress.next_seq()
        self.progress.changed(st, qid, offset, seq, now_ms() + invisible_time_ms)
        self._wake(st.topic, None)  # waiting pops recompute their next retry deadline
        return encode_handle(seq, st.group, st.topic, qid, offset)

    def nack(self, handle: str) -> str:
        """Give a message back for a retry after the group's back-off for its attempt number."""
        st, _qid, _offset, inf = self._resolve(handle)
        delay = self.group(st.group).retry.delay_ms(inf.attempts)
        return self.change_invisible_time(handle, delay)

    async def forward_to_dlq(self, handle: str, reason: str = "forwarded") -> AppendResult:
        """Move a popped message to `%DLQ%<group>` now and ack it."""
        st, qid, offset, inf = self._resolve(handle)
        inf.seq = self.progress.next_seq()  # the handle stops working now, not after the append
        cq = self._queue(st.topic, qid)
        clo, size, _th, _ts = cq.entry(offset)
        return await self._to_dlq(st.group, st, qid, offset, self._read_entry(clo, size), reason)

    async def _to_dlq(
        self, group: str, st: GroupTopic, qid: int, offset: int, msg: Message, reason: str
    ) -> AppendResult:
        inf = st.queue(qid).inflight.get(offset)
        props = dict(msg.properties)
        props.update(
            {
                PROP_ORIGIN_TOPIC: msg.topic,
                PROP_ORIGIN_MESSAGE_ID: msg.message_id,
                PROP_ORIGIN_QUEUE: str(qid),
                PROP_ORIGIN_OFFSET: str(offset),
                PROP_RECONSUME_TIMES: str(inf.attempts if inf else 0),
                PROP_DLQ_REASON: reason,
            }
        )
        dlq_topic = DLQ_PREFIX + group
        self.topic(dlq_topic, create=True)
        copy = _with(msg, topic=dlq_topic, properties=props, queue_id=-1, message_group="")
        try:
            res = await self._append(copy, now_ms())
        except BaseException:
            if inf is not None and offset in st.queue(qid).inflight:
                inf.seq = self.progress.next_seq()  # visible again at its deadline: retried later
                st.track(qid, offset, inf)
            raise
        self.progress.done(st, qid, offset)
        self.metrics["dlq"] += 1
        if inf is not None and inf.message_group:
            self._wake(st.topic, None)
        return res

    # =========================================================================== long polling
    async def _wait_for(self, topic: str, f: Filter, give_up: float, next_due: int | None) -> None:
        timeout = give_up - time.monotonic()
        if next_due is not None:
            timeout = min(timeout, max((next_due - now_ms()) / 1000, 0.001))
        if timeout <= 0:
            return
        w = _Waiter(self._loop.create_future(), f)
        ws = self._waiters.setdefault(topic, set())
        ws.add(w)
        try:
            await asyncio.wait_for(w.fut, timeout)
        except TimeoutError:
            pass
        finally:
            ws.discard(w)

    def _wake(self, topic: str, hashes: set[int] | None) -> None:
        ws = self._waiters.get(topic)
        if not ws:
            return
        for w in ws:
            if w.fut.done():
                continue
            if hashes is None or w.hashes is None or w.has_predicate or not w.hashes.isdisjoint(hashes):
                w.fut.set_result(None)

    # =========================================================================== delay
    def _schedule_timer(self, res: AppendResult) -> None:
        msg = self._read_entry(res.commitlog_offset, res.size)
        heapq.heappush(self._timer_heap, (msg.deliver_at, res.queue_offset, res.commitlog_offset))
        if self._timer_heap[0][2] == res.commitlog_offset:
            self._timer_wake.set()

    async def _timer_loop(self) -> None:
        heap = self._timer_heap
        while True:
            self._timer_wake.clear()
            timeout = None if not heap else max((heap[0][0] - now_ms()) / 1000, 0)
            if timeout is None or timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._timer_wake.wait(), timeout)
                continue
            due = []
            now = now_ms()
            while heap and heap[0][0] <= now:
                due.append(heapq.heappop(heap))
            try:
                await self._deliver_delayed(due)
            except Exception:
                log.exception("delayed delivery failed; retrying in 1 s")
                for item in due:
                    heapq.heappush(heap, (item[0] + 1000, item[1], item[2]))
                await asyncio.sleep(1)

    async def _deliver_delayed(self, due: list[tuple[int, int, int]]) -> None:
        self._delivering = [clo for _when, _qoff, clo in due]  # retention keeps their segments
        try:
            await self._deliver_due(due)
        finally:
            self._delivering = []

    async def _deliver_due(self, due: list[tuple[int, int, int]]) -> None:
        st = self.progress.get(SYSTEM_TIMER_GROUP, SCHEDULE_TOPIC)
        batch: set[str] = set()
        futs, offs = [], []
        for _when, qoff, clo in due:
            if clo < self.commitlog.min_offset:
                self.progress.done(st, 0, qoff)
                continue
            held = self._read_entry(clo, codec.record_size_at(self.commitlog.read(clo, 4), 0))
            real = self._release(held)
            if real.message_id in batch or any(
                m.topic == real.topic and m.commitlog_offset > clo for m in self.get_by_id(real.message_id)
            ):
                # delivered before a crash, not yet marked done; or a copy left by a crash during
                # a retention move (_move_delayed)
                self.progress.done(st, 0, qoff)
                continue
            batch.add(real.message_id)
            futs.append(self._append(real, now_ms()))
            offs.append(qoff)
        for qoff, res in zip(offs, await asyncio.gather(*futs), strict=True):
            del res
            self.progress.done(st, 0, qoff)

    def _release(self, held: Message) -> Message:
        """The real message held under a system topic (delay or transaction)."""
        props = dict(held.properties)
        topic = props.pop(PROP_REAL_TOPIC)
        qid = int(props.pop(PROP_REAL_QUEUE, "-1"))
        if topic not in self.topic_configs:
            self.topic(topic, create=True)
        return _with(
            held,
            topic=topic,
            properties=props,
            queue_id=qid,
            msg_type=MessageType.NORMAL if not held.message_group else MessageType.FIFO,
        )

    # =========================================================================== transactions
    async def end_transaction(self, transaction_id: int | str, commit: bool) -> AppendResult | None:
        """Commit (deliver) or roll back (discard) a half message, by commit log offset or message id.

        Returns where the committed message landed, or None for a rollback."""
        clo, qoff, msg = self._find_half(transaction_id)
        if clo in self._resolving:
            raise TransactionNotFound(f"transaction {transaction_id} is being resolved")
        st = self.progress.get(SYSTEM_TXN_GROUP, HALF_TOPIC)
        res = None
        self._resolving.add(clo)
        try:
            if commit:
                res = await self._append(self._release(msg), now_ms())
        finally:
            self._resolving.discard(clo)
        self.progress.done(st, 0, qoff)
        self._txn_checks.pop(clo, None)
        return res

    def _find_half(self, transaction_id: int | str) -> tuple[int, int, Message]:
        if isinstance(transaction_id, str):
            cands = [m for m in self.get_by_id(transaction_id) if m.topic == HALF_TOPIC]
            if not cands:
                raise TransactionNotFound(transaction_id)
            msg = cands[-1]
        else:
            try:
                msg = self.get_message(transaction_id)
            except (KeyError, codec.CorruptRecord, ValueError):
                raise TransactionNotFound(str(transaction_id)) from None
            if msg.topic != HALF_TOPIC:
                raise TransactionNotFound(str(transaction_id))
        q = self.progress.get(SYSTEM_TXN_GROUP, HALF_TOPIC).queue(0)
        off = msg.queue_offset
        if off < q.ack_wm or off in q.done:
            raise TransactionNotFound(f"transaction {transaction_id} is already resolved")
        return msg.commitlog_offset, off, msg

    async def _check_transactions(self) -> None:
        heap = self._txn_heap
        now = now_ms()
        st = self.progress.get(SYSTEM_TXN_GROUP, HALF_TOPIC)
        q = st.queue(0)
        while heap and heap[0][0] <= now:
            _when, qoff, clo = heapq.heappop(heap)
            if qoff < q.ack_wm or qoff in q.done:
                continue
            n = self._txn_checks.get(clo, 0) + 1
            if n > self.config.transaction_max_checks or clo < self.commitlog.min_offset:
                log.warning("transaction at %d unresolved after %d checks: rolled back", clo, n - 1)
                self.progress.done(st, 0, qoff)
                self._txn_checks.pop(clo, None)
                continue
            self._txn_checks[clo] = n
            heapq.heappush(heap, (now + self.config.transaction_check_interval_ms, qoff, clo))
            if self.transaction_checker is not None:
                msg = self.get_message(clo)
                msg.properties[PROP_TXN_CHECK_TIMES] = str(n)
                try:
                    r = self.transaction_checker(msg)
                    if asyncio.iscoroutine(r):
                        await r
                except Exception:
                    log.exception("transaction check callback failed")

    # =========================================================================== retention
    async def apply_retention(self, now: int | None = None) -> int:
        """Delete whole old segments past every contained topic's age/size limit; returns how many."""
        now = now_ms() if now is None else now
        seg_size = self.config.segment_size
        active = self.commitlog.write_pos - self.commitlog.write_pos % seg_size
        bases = sorted(b for b in self._seg_stats if b < active)
        # bytes per topic in segments newer than each one, to apply size limits
        newer: dict[str, int] = {}
        expired_by_size: set[int] = set()
        for b in sorted(self._seg_stats, reverse=True):
            for topic, (nbytes, _ts) in self._seg_stats[b].items():
                tc = self.topic_configs.get(topic)
                if tc and tc.retention_bytes is not None and newer.get(topic, 0) >= tc.retention_bytes:
                    expired_by_size.add((b, topic))
                newer[topic] = newer.get(topic, 0) + nbytes
        delete_before = None
        for b in bases:
            ok = True
            for topic, (_nbytes, ts) in self._seg_stats[b].items():
                tc = self.topic_configs.get(topic)
                keep_ms = tc.retention_ms if tc and tc.retention_ms is not None else self.config.retention_ms
                if now - ts <= keep_ms and (b, topic) not in expired_by_size:
                    ok = False
                    break
            if not ok:
                break
            delete_before = b + seg_size
        if delete_before:
            await self._move_delayed(delete_before, now)
        # never delete undelivered delayed messages (those not moved: due now, being delivered, or
        # the move failed) nor unresolved half messages (they live seconds: no need to move them)
        held = [clo for _when, _off, clo in self._timer_heap + self._txn_heap]
        held += self._delivering
        if held and delete_before is not None:
            low = min(held)
            delete_before = min(delete_before, low - low % seg_size)
        if not delete_before:
            return 0
        n = await self._run_io(self.commitlog.delete_segments_before, delete_before)
        for b in [b for b in self._seg_stats if b < delete_before]:
            del self._seg_stats[b]
        async with self._cp_lock:
            await self._checkpoint_locked()  # entries into their files: compaction rewrites files
            low = self.commitlog.min_offset
            for cq in self.cqs.values():
                cq.set_min_by_commitlog(low)
                if cq.file_offset == cq.max_offset:
                    cq.compact()
            self.index.drop_below(low)
            await self._checkpoint_locked()
        return n

    async def _move_delayed(self, below: int, now: int) -> None:
        """Copy the delayed messages held in commit log segments below `below` (and not due yet)
        to the head of the log, and mark the old records delivered, so that retention can delete
        those segments: a message delayed past the retention period is kept until it is due.

        A crash between the copy and the mark leaves both pending; delivery then skips the second
        (the real message is found by id after it, see `_deliver_due`)."""
        heap = self._timer_heap
        moving = [e for e in heap if e[2] < below and e[0] > now]
        if not moving:
            return
        moved = set(moving)
        heap[:] = [e for e in heap if e not in moved]
        heapq.heapify(heap)
        futs, olds = [], []
        for e in moving:
            held = self._read_entry(e[2], codec.record_size_at(self.commitlog.read(e[2], 4), 0))
            if held is None:  # unreadable: leave it where it is (retention keeps its segment)
                heapq.heappush(heap, e)
                continue
            try:
                futs.append(self._append(_with(held, queue_id=0), now))
            except StoreError:
                heapq.heappush(heap, e)
                continue
            olds.append(e)
        results = await asyncio.gather(*futs, return_exceptions=True)
        st = self.progress.get(SYSTEM_TIMER_GROUP, SCHEDULE_TOPIC)
        for e, r in zip(olds, results, strict=True):
            if isinstance(r, BaseException):
                heapq.heappush(heap, e)  # not copied: the old record stays and is delivered
            else:
                self.progress.done(st, 0, e[1])
        await self._flush_progress()  # the old records are done on disk before their segment goes
        log.info("retention: moved %d delayed messages forward", len(olds))

    # =========================================================================== checkpoints
    async def _checkpoint(self, consumer_snapshot: bool = False) -> None:
        """Write the in-memory queue and index entries to their files, then the checkpoint. Once
        begun it runs to its end even when its caller is cancelled (close() cancels the periodic
        task): entries it took from memory must reach their files before a later checkpoint
        writes the ones after them (a cancelled IO job would leave a hole of zeros)."""
        await asyncio.shield(self._loop.create_task(self._checkpoint_serial(consumer_snapshot)))

    async def _checkpoint_serial(self, consumer_snapshot: bool) -> None:
        async with self._cp_lock:
            await self._checkpoint_locked(consumer_snapshot)

    async def _checkpoint_locked(self, consumer_snapshot: bool = False) -> None:
        w = self._writer
        # Everything below `end` is durable and its queue / index entries are in memory or files:
        # hand the in-memory ones to the IO thread, which writes and syncs them before recording.
        segs = None if self.sync else w.take_unsynced_segments()
        end = w.durable_end if self.sync else w.written_end
        # (under `sync`, entries of records written but not yet durable stay in memory: the queue
        # files never point past `end`; index entries may, and recovery cuts them at `end`)
        flushes = [f for f in ((cq, *cq.take_flush(end)) for cq in self.cqs.values() if cq.mem) if f[2]]
        idx = self.index.take_flush()
        queues = {f"{t}/{q}": cq.flushable_end for (t, q), cq in self.cqs.items()}
        try:
            await self._run_io(self._write_checkpoint, end, flushes, idx, segs, queues)
        except BaseException:
            for cq, _first, _data in flushes:
                cq.unflush()
            self.index.mem[:0] = idx  # written again (at the same place) by the next checkpoint
            raise
        for cq, _first, _data in flushes:
            cq.flushed()
        if consumer_snapshot or self.progress.ops >= self.config.consumer_checkpoint_ops:
            self.progress.ops = 0
            snap = self.progress.snapshot()
            await self._run_io(self.progress.write_checkpoint, snap, self.progress.take_log())

    async def _flush_progress(self) -> None:
        data = self.progress.take_log()
        if data:
            await self._run_io(self.progress.write_log, data)

    def _write_checkpoint(
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
            os.fdatasync(cq.fd)
        if idx:
            self.index.append_file(idx)
            self.index.sync()
        cp = {
            "commitlog": end,
            "queues": queues,
            "segments": {str(k): v for k, v in list(self._seg_stats.items())},
        }
        path = os.path.join(self.config.data_dir, "checkpoint.json")
        with open(path + ".tmp", "wb") as f:
            f.write(json.dumps(cp).encode())
            f.flush()
            os.fsync(f.fileno())
        os.rename(path + ".tmp", path)

    # progress is created lazily: at the end of recovery (in the io thread), once the queues are recovered
    @property
    def progress(self) -> ConsumerProgress:
        p = self.__dict__.get("_progress")
        if p is None:
            p = self.__dict__["_progress"] = ConsumerProgress(os.path.join(self.config.data_dir, "consumers"))
        return p


def _with(msg: Message, **changes: object) -> Message:
    """A copy of `msg` with some fields changed (dataclasses.replace is slower on the hot path)."""
    m = Message(
        msg.topic,
        msg.body,
        msg.tag,
        msg.keys,
        msg.properties,
        msg.message_group,
        msg.deliver_at,
        msg.message_id,
        msg.born_timestamp,
        msg.born_host,
        msg.queue_id,
        msg.msg_type,
    )
    for k, v in changes.items():
        setattr(m, k, v)
    return m


def _lock_dir(d: str) -> int:
    import fcntl

    fd = os.open(os.path.join(d, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreError(f"data directory {d} is in use by another process") from None
    return fd
