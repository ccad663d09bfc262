"""The Store: the public, protocol-free API. It opens the data directory's files and hands each part
of the work only what that part uses: the catalog of topics, groups and queues (catalog.py), the
append path (appending.py, writing through writer.py), reads (reading.py), pop consumption and long
polling (popping.py), delayed and transactional messages (scheduling.py), retention (retention.py),
checkpoints (checkpoint.py) and recovery at open (recovery.py). Rare, slow file work (recovery,
checkpoints, segment deletion, progress log flushes) runs, in order, on one IO thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from .appending import Appender
from .catalog import Catalog
from .checkpoint import Checkpointer
from .cold_reads import ColdReads
from .commitlog import CommitLog, StoreFullError
from .compaction import CompactionStats, Compactor
from .config import GroupConfig, Metadata, RetryPolicy, StoreConfig, TopicConfig
from .consumequeue import ConsumeQueue
from .consumer import ConsumerProgress
from .dirlock import lock_dir
from .diskspace import CHECK_INTERVAL_MS
from .epochs import EpochLog
from .errors import InvalidReceiptHandle, StoreError, TieredRangeNotCached, TieredStorageUnavailable
from .filters import ALL, Filter
from .index import MessageIndex
from .kv import KeyValueStore
from .message import AppendResult, Message, PoppedMessage
from .popping import LongPolling, Popper
from .reading import Reader
from .recovery import Recovery
from .replication import LogReplica
from .retention import Retention, SegmentStats
from .scheduling import DelayedMessages, Transactions
from .state_replica import StateReplica
from .tier_reads import TierFetches
from .tiering import TieredLog, has_tiered_segments
from .writer import GroupCommitWriter

__all__ = ["Store"]

log = logging.getLogger("store")
T = TypeVar("T")


class Store:
    """A durable message store. Open with `await Store.open(StoreConfig(...))`."""

    # The hot calls are the parts' own methods, bound by `open` (no delegating frame): append(msg),
    # a future done once durable, and append_many(msgs) are Appender's; pop(group, topic,
    # max_messages, invisible_time_ms, filter, wait_ms), ack(handle) and ack_many(handles) are Popper's.
    append: Callable[[Message], asyncio.Future[AppendResult]]
    append_many: Callable[[list[Message]], Awaitable[list[AppendResult]]]
    pop: Callable[..., Awaitable[list[PoppedMessage]]]
    ack: Callable[[str], None]
    ack_many: Callable[[Sequence[str]], list[InvalidReceiptHandle | None]]
    # made by `open` once recovery is done
    progress: ConsumerProgress
    _writer: GroupCommitWriter
    _appender: Appender
    _reader: Reader
    _polls: LongPolling
    _pops: Popper
    _checkpoints: Checkpointer
    _delays: DelayedMessages
    _transactions: Transactions
    _retention: Retention
    _replica: LogReplica
    state: StateReplica  # consumer progress, key-value data and catalog of replica groups
    _compactor: Compactor

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.sync = config.flush == "sync"
        d = config.data_dir
        os.makedirs(d, exist_ok=True)
        if not config.tier_endpoint and has_tiered_segments(d):
            raise StoreError(f"the commit log of {d} starts in object storage: tiering must be configured")
        self._lock_fd = lock_dir(d)
        self.meta = Metadata(d)
        self.kv = KeyValueStore(d)
        self._catalog = Catalog(config, self.meta)
        self.topic_configs = self._catalog.topic_configs
        self.group_configs = self._catalog.group_configs
        self.cqs = self._catalog.cqs
        self.commitlog = CommitLog(os.path.join(d, "commitlog"), config.segment_size, config.min_free_bytes)
        self.index = MessageIndex(os.path.join(d, "index"))
        self.epochs = EpochLog(d)
        self._segments = SegmentStats(config.segment_size)
        # tiered storage (tiering.py): known before recovery, which counts tiered segments as stored
        self._tier = TieredLog(config, self.commitlog, self._segments) if config.tier_endpoint else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io = ThreadPoolExecutor(1, thread_name_prefix="store-io")
        self._tasks: list[asyncio.Task] = []
        self._own_writes: list[asyncio.Task] = []  # the tasks that append by themselves
        self._closed = False
        self.metrics = {"appends": 0, "flushes": 0, "pops": 0, "acks": 0, "redeliveries": 0, "dlq": 0}
        self.flush_latency_ms: list[float] = []

    # =========================================================================== lifecycle
    @classmethod
    async def open(cls, config: StoreConfig) -> Store:
        store = cls(config)
        store._loop = asyncio.get_running_loop()
        try:
            recovery = Recovery(config, store.commitlog, store.index, store._catalog, store._segments)
            store.progress = await store._run_io(recovery.run)
            store._assemble()
        except BaseException:
            store._io.shutdown()
            store.meta.close()
            store.kv.close()
            os.close(store._lock_fd)  # the directory can be opened again
            raise
        store._delays.rebuild()
        store._transactions.rebuild()
        store._start_tasks()
        return store

    def _assemble(self) -> None:
        """Make the parts that work on the recovered files, each handed what it uses."""
        loop, config, catalog, progress = self._loop, self.config, self._catalog, self.progress
        cl, index, segments, run_io = self.commitlog, self.index, self._segments, self._run_io
        self._polls = polls = LongPolling(loop)
        self._appender = appender = Appender(
            loop, config, catalog, cl, index, segments, polls, self.metrics, self.flush_latency_ms
        )
        self._writer = appender.writer
        self._reader = reader = Reader(cl, index, catalog, progress)
        self._pops = Popper(catalog, progress, cl.read_message, appender.submit, polls, self.metrics)
        self._checkpoints = checkpoints = Checkpointer(
            loop, run_io, config, self._writer, cl, index, catalog.cqs, segments, progress
        )
        self._delays = delays = DelayedMessages(
            catalog,
            cl,
            progress,
            cl.read_message,
            reader.get_by_id,
            appender.submit,
            checkpoints.flush_progress,
        )
        self._transactions = transactions = Transactions(
            config, catalog, cl, progress, reader.get_message, reader.get_by_id, appender.submit
        )
        appender.on_delayed = delays.schedule
        appender.on_half = transactions.track
        self.append, self.append_many = appender.append, appender.append_many
        self.pop, self.ack, self.ack_many = self._pops.pop, self._pops.ack, self._pops.ack_many
        self._compactor = compactor = Compactor(
            config, catalog, cl, run_io, cl.read_message, checkpoints.checkpoint
        )
        compactor.attach()
        self._retention = Retention(
            config, catalog, cl, index, segments, delays, transactions, checkpoints, run_io
        )
        self._retention.uncompacted_floor = compactor.uncompacted_floor
        self._retention.expire()  # (what per-topic retention hid stays hidden after a restart)
        self.cold = ColdReads(config, catalog, cl)  # old data's reads, apart from the live tail
        if self._tier is not None:
            self._tier.run_io = run_io
            self._tier.floor = self._retention.held_floor  # (read synchronously: stays local)
            self._pops.fetch_tiered = self.fetch_tiered
        self.state = StateReplica(run_io, catalog, progress, self.kv, checkpoints)
        self._replica = LogReplica(
            loop,
            run_io,
            config,
            catalog,
            cl,
            index,
            segments,
            self._writer,
            checkpoints,
            progress,
            polls,
            delays,
            transactions,
            self.epochs,
        )

    def _start_tasks(self) -> None:
        loop, config, checkpoints = self._loop, self.config, self._checkpoints
        self._tasks = [
            loop.create_task(self._periodic(config.checkpoint_interval_ms, checkpoints.checkpoint)),
            loop.create_task(self._periodic(config.consumer_log_flush_ms, checkpoints.flush_progress)),
            loop.create_task(self._periodic(config.compaction_interval_ms, self._compactor.run)),
            loop.create_task(self._periodic(config.checkpoint_interval_ms, self._trim_sealed)),
        ]
        if not self.sync:
            self._tasks.append(loop.create_task(self._periodic(config.flush_interval_ms, self._fsync_async)))
        if self._tier is not None:
            self._tasks.append(loop.create_task(self._periodic(config.tier_interval_ms, self._tier.run)))
        free_space = self._appender.free_space
        if free_space.limit > 0:
            free_space.refresh(0)
            self._tasks.append(loop.create_task(self._periodic(CHECK_INTERVAL_MS, free_space.poll)))
        self._start_own_writes()

    def _start_own_writes(self) -> None:
        loop, config = self._loop, self.config
        self._own_writes = [
            loop.create_task(self._delays.run()),
            loop.create_task(self._periodic(config.transaction_check_interval_ms, self._transactions.check)),
            loop.create_task(self._periodic(config.retention_check_interval_ms, self._retention.apply)),
        ]

    @property
    def writes_on_its_own(self) -> bool:
        """Whether the store appends by itself: delayed messages due, transaction checks, retention."""
        return bool(self._own_writes)

    def pause_own_writes(self) -> None:
        """A replica's store: no delivery of delayed messages, no transaction checks, no retention,
        so that its log only ever holds what the primary wrote (`apply_log_chunk`)."""
        for t in self._own_writes:
            t.cancel()
        self._own_writes = []

    def resume_own_writes(self) -> None:
        """A replica promoted to primary: delayed and half messages are taken from the (replicated)
        queues again and the store's own appends resume."""
        if self._own_writes or self._closed:
            return
        self._delays.heap.clear()
        self._delays.rebuild()
        self._transactions.heap.clear()
        self._transactions.rebuild()
        self._start_own_writes()

    async def _periodic(self, interval_ms: int, fn: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await fn()
            except StoreFullError:
                log.warning("store is full")
            except Exception:
                log.exception("store background task failed")

    async def _fsync_async(self) -> None:
        """The `async` flush policy: fsync the segments written since the last time."""
        segs = self._writer.take_unsynced_segments()
        if segs:
            await self._run_io(self.commitlog.sync, segs)

    def preallocate(self) -> None:
        """Start zero-filling, in the background, the segment the next append lands in when it
        does not exist yet (a fresh store): its first append then need not wait for the whole
        segment to be written. Servers call this after open; a library user may skip it."""
        cl = self.commitlog
        seg = self.config.segment_size
        cl._preallocate_next(cl.write_pos - cl.write_pos % seg)

    async def close(self) -> None:
        """Finish in-flight appends, persist progress, checkpoint and release files."""
        if self._closed:
            return
        self._closed = self._appender.closed = self._pops.closed = True
        async with self._replica.lock:  # an apply or truncate under way ends first
            self._replica.closed = True
        await self._writer.drain()
        self._tasks += self._own_writes
        self._own_writes = []
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._polls.wake_all()
        async with self._compactor.lock:  # a compaction under way ends first
            pass
        await self._checkpoints.checkpoint(consumer_snapshot=True)
        await self._run_io(self._close_files)
        self._writer.close()
        self._io.shutdown(wait=True)
        if self._tier is not None:
            self._tier.close()
        self.meta.close()
        self.kv.close()
        os.close(self._lock_fd)

    def _close_files(self) -> None:
        if not self.sync:
            self.commitlog.sync()
        self.commitlog.close()
        for cq in self.cqs.values():
            cq.close()
        self._compactor.close()
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
        compacted: bool = False,
        tier_retention_ms: int | None = None,
    ) -> TopicConfig:
        """Create a topic or change its settings (queues are never removed). `compacted`: the
        latest record per key wins (compaction.py). Retention per topic: retention.py."""
        args = (queues, retention_ms, retention_bytes, compacted, tier_retention_ms)
        return self._catalog.create_topic(name, *args)

    def resize_topic(self, name: str, queues: int) -> TopicConfig:
        """Logic queues: `queues` take new messages from now on; no message moves. Queues left
        out stay readable until retention empties them (`trim_sealed`), offsets keep increasing, and a message
        group's (MQTT path's) later messages wait for its earlier ones (docs/store.md)."""
        t = self._catalog.resize(name, queues)
        self._polls.wake_all()  # pops waiting on the old queue list look again
        return t

    def trim_sealed(self) -> int:
        """Stop listing sealed queues (from the last) once retention has removed every message
        they held: until then every group can still consume them and offset reads (the Spark
        source) replay them. How many topics changed."""
        return sum(self._catalog.trim_sealed(t.name, _emptied) for t in self._catalog.sealed_topics())

    async def _trim_sealed(self) -> None:
        self.trim_sealed()

    def delete_topic(self, name: str) -> None:
        self._catalog.delete_topic(name)
        self._polls.wake(name, None)  # its readers learn it is gone (TopicNotFound on their next read)

    def topics(self) -> list[TopicConfig]:
        return self._catalog.topics()

    def topic(self, name: str, create: bool | None = None) -> TopicConfig:
        """A topic's settings; an unknown one is created if `create` (default: auto_create_topics)."""
        return self._catalog.topic(name, create)

    def create_group(
        self, name: str, max_attempts: int = 16, retry: RetryPolicy | None = None
    ) -> GroupConfig:
        return self._catalog.create_group(name, max_attempts, retry)

    def delete_group(self, name: str) -> None:
        self._catalog.delete_group(name)

    def groups(self) -> list[GroupConfig]:
        return self._catalog.groups()

    def group(self, name: str) -> GroupConfig:
        """A group's settings (created with defaults on first use)."""
        return self._catalog.group(name)

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        return self._catalog.queue(topic, queue_id)

    # =========================================================================== reading
    def get_message(self, commitlog_offset: int, size: int | None = None) -> Message:
        """The message stored at a commit log offset."""
        return self._reader.get_message(commitlog_offset, size)

    def get_by_id(self, message_id: str) -> list[Message]:
        return self._reader.get_by_id(message_id)

    def get_by_key(self, key: str) -> list[Message]:
        return self._reader.get_by_key(key)

    def queue_count(self, topic: str) -> int:
        """Queues that may hold messages (the writable ones and the sealed ones: logic queues)."""
        return self._catalog.topic(topic, create=False).readable

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._catalog.queue(topic, queue_id).min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._catalog.queue(topic, queue_id).max_offset

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
        return self._reader.read(topic, queue_id, start, end, max_messages, filter)

    async def tail(
        self, topic: str, positions: dict[int, int], max_messages: int = 128, wait_ms: int = 0
    ) -> list[Message]:
        """Offset reads for subscribers that do not compete: no pop state, nothing to ack. Up to
        `max_messages` messages of `topic` at or after each queue's position (queue id -> next
        offset; a queue missing from `positions` is read from its first retained offset); with none
        there, wait up to `wait_ms` for an append to the topic. The caller keeps its positions and
        moves each past the messages it got (`Message.queue_offset` + 1)."""
        return await self._tail(self._reader.tail, topic, positions, max_messages, wait_ms)

    async def tail_records(
        self, topic: str, positions: dict[int, int], max_messages: int = 128, wait_ms: int = 0
    ) -> list[tuple[int, bytes]]:
        """`tail` as (commit log offset, record bytes as stored) pairs, for a store node to send on
        without decoding and encoding each message (codec.decode reads a record)."""
        return await self._tail(self._reader.tail_records, topic, positions, max_messages, wait_ms)

    async def _tail(
        self,
        read: Callable[[str, dict[int, int], int], list[T]],
        topic: str,
        positions: dict[int, int],
        max_messages: int,
        wait_ms: int,
    ) -> list[T]:
        if max_messages < 1:
            raise ValueError("max_messages must be positive")
        self._catalog.topic(topic, create=False)
        give_up = time.monotonic() + wait_ms / 1000
        fetches: TierFetches | None = None
        while True:
            try:
                out = read(topic, positions, max_messages)
            except TieredRangeNotCached as miss:  # a queue read from its start reached a tiered range
                fetches = fetches or TierFetches()
                await fetches.fetch(miss, self.fetch_tiered)
                continue
            if out or self._pops.closed or time.monotonic() >= give_up:
                return out
            await self._polls.wait(topic, ALL, give_up, None)
            self._catalog.topic(topic, create=False)  # (deleted meanwhile: TopicNotFound)

    def queue_entries(
        self, topic: str, queue_id: int, start: int, end: int, max_entries: int
    ) -> tuple[int, Iterable]:
        """(first offset, entries) of one queue in [start, end) clamped to what is stored: at most
        `max_entries` (commit log offset, size, tag hash, store time) tuples, lazily."""
        return self._reader.queue_entries(topic, queue_id, start, end, max_entries)

    def read_log(self, offset: int, size: int) -> bytes:
        """`size` bytes of the commit log from `offset` (within one segment); KeyError when they
        are no longer stored (retention), TieredRangeNotCached when they are in object storage and
        not cached (`fetch_tiered`, then read again)."""
        return self.commitlog.read(offset, size)

    # =========================================================================== tiered storage
    async def fetch_tiered(self, miss: TieredRangeNotCached) -> None:
        """Bring the range a read missed (TieredRangeNotCached) into the tier's local cache;
        TieredStorageUnavailable when the object store does not answer in time."""
        if self._tier is None:
            raise TieredStorageUnavailable("tiered storage is not configured")
        await self._tier.fetch(miss)

    async def tier_now(self, now: int | None = None) -> int:
        """Run one tiering pass now (it also runs every `tier_interval_ms`): closed segments past
        `tier_after` are uploaded, verified and deleted locally; returns how many."""
        return 0 if self._tier is None else await self._tier.run(now, force=True)

    def drop_tier_cache(self) -> None:
        """Empty the local cache of tiered blocks (the next tiered read fetches again)."""
        if self._tier is not None:
            self._tier.cache.clear()

    def tier_stats(self) -> dict[str, int]:
        """Tiered segments and bytes, cached bytes, and whether the object store answers (empty
        when tiering is off)."""
        return {} if self._tier is None else self._tier.describe()

    @property
    def segment_size(self) -> int:
        return self.commitlog.segment_size

    def disk_space(self) -> dict[str, int]:
        """The disk low-watermark: `disk_alarm` (1 while client appends are refused),
        `disk_free_bytes` (the data volume's free space: the watermark's last reading, or read now
        when it is off) and `disk_free_limit_bytes` (0: off)."""
        fs = self._appender.free_space
        free = fs.free
        if free < 0:
            st = os.statvfs(fs.directory)
            free = st.f_bavail * st.f_frsize
        return {"disk_alarm": int(fs.low), "disk_free_bytes": free, "disk_free_limit_bytes": fs.limit}

    def observed(self) -> dict[str, float]:
        """Numbers for /metrics, flat so that CLUSTER mode can sum them over nodes: `commitlog_bytes`
        (retained commit log, tiered segments included), the fsync histogram (`fsync_seconds_*`,
        Histogram.flat) and `dead_letters:<group>\t<topic>` (messages moved to a DLQ since start)."""
        out: dict[str, float] = {"commitlog_bytes": self.commitlog.write_pos - self.commitlog.min_offset}
        out.update(self._writer.fsync_seconds.flat("fsync_seconds"))
        for (group, topic), n in self._pops.dead_letters.items():
            out[f"dead_letters:{group}\t{topic}"] = n
        return out

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after `timestamp_ms`."""
        return self._reader.search_offset(topic, queue_id, timestamp_ms)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Offset-based consumers: everything below `offset` is consumed by `group`."""
        self._reader.commit_offset(group, topic, queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's consumed-up-to offset for a queue (-1 when it never consumed it)."""
        return self._reader.committed_offset(group, topic, queue_id)

    def backlog(self, group: str, topic: str) -> int:
        """Messages of `topic` not yet acked by `group`."""
        return self._reader.backlog(group, topic)

    def inflight_count(self, group: str, topic: str) -> int:
        return self._reader.inflight_count(group, topic)

    # =========================================================================== pop / ack
    def change_invisible_time(self, handle: str, invisible_time_ms: int) -> str:
        """Make a popped message visible again after `invisible_time_ms` from now; returns the new handle."""
        return self._pops.change_invisible_time(handle, invisible_time_ms)

    def nack(self, handle: str) -> str:
        """Give a message back for a retry after the group's back-off for its attempt number."""
        return self._pops.nack(handle)

    async def forward_to_dlq(self, handle: str, reason: str = "forwarded") -> AppendResult:
        """Move a popped message to `%DLQ%<group>` now and ack it."""
        return await self._pops.forward_to_dlq(handle, reason)

    @property
    def _waiters(self) -> dict:
        """The pops waiting, by topic (tests look here to know a long poll is parked)."""
        return self._polls.waiters

    # =========================================================================== transactions, retention
    async def end_transaction(self, transaction_id: int | str, commit: bool) -> AppendResult | None:
        """Commit (deliver) or roll back (discard) a half message, by commit log offset or message id.

        Returns where the committed message landed, or None for a rollback."""
        return await self._transactions.end(transaction_id, commit)

    def tail_now(self, topic: str, positions: dict[int, int], max_messages: int) -> list[Message] | None:
        """`tail` without a wait, read now: None when it would reach a tiered range not cached
        (the caller awaits `tail`, which fetches it). TopicNotFound for an unknown topic."""
        self._catalog.topic(topic, create=False)
        try:
            return self._reader.tail(topic, positions, max_messages)
        except TieredRangeNotCached:
            return None

    def watch(self, topic: str, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback` once when `topic` next gets a record (or is deleted, or the store closes),
        for an offset reader that has caught up: no task or timer while it waits (LongPolling.watch:
        watch right after a `tail` that found nothing, with no await in between). Returns the
        function that ends the watch unfired. TopicNotFound for an unknown topic."""
        self._catalog.topic(topic, create=False)
        return self._polls.watch(topic, callback)

    def set_dead_letter_listener(self, fn: Callable[[str, Message, str], None] | None) -> None:
        """`fn(group, message, reason)` for each message a pop moves to `%DLQ%<group>` after the
        group's last attempt (a client's own forward_to_dlq is not reported: its caller knows)."""
        self._pops.on_dead_letter = fn

    @property
    def transaction_checker(self) -> Callable[[Message], Awaitable[None] | None] | None:
        """Called (sync or async) with each half message unresolved after `transaction_timeout_ms`."""
        return self._transactions.checker

    @transaction_checker.setter
    def transaction_checker(self, fn: Callable[[Message], Awaitable[None] | None] | None) -> None:
        self._transactions.checker = fn

    # =========================================================================== compacted topics
    async def compact(self, now: int | None = None) -> CompactionStats:
        """Compact every compacted topic now over the closed commit log segments (it also runs every
        `compaction_interval_ms`): older records of a key, and tombstones older than
        `tombstone_retention_ms`, are removed."""
        return await self._compactor.run(now)

    def latest(self, topic: str, key: str, tombstones: bool = False) -> Message | None:
        """The latest record of `key` in compacted topic `topic`; None when there is none or it is a
        tombstone (an empty body), unless `tombstones`."""
        return self._compactor.latest(topic, key, tombstones)

    def latest_items(self, topic: str, tombstones: bool = False) -> list[Message]:
        """The latest record of every key of compacted topic `topic`, by key (tombstones only with
        `tombstones`)."""
        return self._compactor.latest_items(topic, tombstones)

    async def apply_retention(self, now: int | None = None) -> int:
        """Delete whole old segments past every contained topic's age/size limit; returns how many."""
        return await self._retention.apply(now)

    # =========================================================================== replication
    @property
    def log_end(self) -> int:
        """The commit log end of the records written and durable per the flush policy (what a
        replica may be sent)."""
        return self._replica.log_end

    def read_log_chunk(self, start: int, max_bytes: int) -> bytes:
        """Primary: the commit log bytes of whole records from `start` (a record boundary), at most
        `max_bytes` but at least one record, up to `log_end` and the end of `start`'s segment
        (padding included). ValueError: not a boundary; KeyError: no longer stored."""
        return self._replica.read(start, max_bytes)

    async def apply_log_chunk(self, start: int, data: bytes) -> int:
        """Replica: write a primary's chunk at `start` (which must be `log_end`: else ValueError)
        after checking every record (`CorruptChunk`, nothing written), durably per the flush policy,
        and index it; returns the new `log_end`. The store must take no appends of its own."""
        return await self._replica.apply(start, data)

    async def truncate_log(self, offset: int) -> None:
        """Replica: drop the log from `offset` (a record boundary <= `log_end`) with everything
        derived from it (queue and index entries, segment counts, epochs from there)."""
        await self._replica.truncate(offset)

    @property
    def log_start(self) -> int:
        """The first commit log offset still stored (a segment base; retention raises it)."""
        return self._replica.log_start

    def queue_bases(self, offset: int) -> dict[str, int]:
        """Primary: per queue ("topic/queue id"), the queue offset a log starting at commit log
        offset `offset` starts it at (only those above 0), for `reset_empty_log`."""
        return self._replica.queue_bases(offset)

    async def reset_empty_log(self, start: int, queue_bases: dict[str, int] | None = None) -> None:
        """Replica that holds nothing: make its log start at segment base `start` (its primary's
        `log_start`) and each queue at its offset in `queue_bases` (the primary's `queue_bases`),
        durably, so that it catches up from there. StoreError when it holds a record or a queue
        entry or takes appends."""
        await self._replica.reset(start, queue_bases or {})

    async def delete_log_before(self, offset: int) -> int:
        """Replica: delete the whole segments that end at or before `offset` (its primary's
        `log_start`), as retention does; returns how many."""
        return await self._replica.delete_before(offset, self._retention.delete_before)


def _emptied(cq: ConsumeQueue) -> bool:
    """A sealed queue retention has emptied (it takes no new messages)."""
    return cq.min_offset >= cq.next_offset
