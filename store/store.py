"""The Store: the public, protocol-free API. It opens the data directory's files (the catalog of
topics, groups and queues: catalog.py; the commit log, the index, the epoch log), recovers them at
open (recovery.py), has the parts that do the work made over them (parts.py) and runs the
background work (background.py); its methods call into the parts, its hot calls are theirs. Rare,
slow file work (recovery, checkpoints, segment deletion, progress log flushes) runs, in order, on
one IO thread.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .background import BackgroundTasks
from .catalog import Catalog
from .commitlog import CommitLog
from .compaction import CompactionStats
from .config import GroupConfig, Metadata, RetryPolicy, StoreConfig, TopicConfig
from .consumequeue import ConsumeQueue
from .consumer import ConsumerProgress
from .dirlock import lock_dir
from .epochs import EpochLog
from .errors import InvalidReceiptHandle, StoreError, TieredRangeNotCached, TieredStorageUnavailable
from .filters import ALL, Filter
from .index import MessageIndex
from .kv import KeyValueStore
from .message import AppendResult, Message, PoppedMessage
from .parts import Parts
from .recovery import Recovery
from .retention import SegmentStats
from .state_replica import StateReplica
from .tiering import TieredLog, has_tiered_segments

__all__ = ["Store"]


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
    # and so are the tail reads, Tails' (tailing.py): tail(topic, positions, max_messages,
    # wait_ms) and tail_records (the same, as records), tail_now(topic, positions, max_messages)
    # and watch(topic, callback), the MQTT fan-out's.
    tail: Callable[..., Awaitable[list[Message]]]
    tail_records: Callable[..., Awaitable[list[tuple[int, bytes]]]]
    tail_now: Callable[[str, dict[int, int], int], list[Message] | None]
    watch: Callable[[str, Callable[[], object]], Callable[[], None]]
    # made by `open` once recovery is done
    progress: ConsumerProgress
    _parts: Parts
    _background: BackgroundTasks
    state: StateReplica  # consumer progress, key-value data and catalog of replica groups

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
        self._closed = False
        self.metrics = {"appends": 0, "flushes": 0, "pops": 0, "acks": 0, "redeliveries": 0, "dlq": 0}
        self.flush_latency_ms: list[float] = []

    # =========================================================================== lifecycle
    @classmethod
    async def open(cls, config: StoreConfig) -> Store:
        store = cls(config)
        store._loop = loop = asyncio.get_running_loop()
        try:
            recovery = Recovery(config, store.commitlog, store.index, store._catalog, store._segments)
            store.progress = await store._run_io(recovery.run)
            store._parts = parts = Parts(
                loop,
                store._run_io,
                config,
                store._catalog,
                store.commitlog,
                store.index,
                store._segments,
                store.epochs,
                store.kv,
                store.progress,
                store.metrics,
                store.flush_latency_ms,
                store._tier,
                store.fetch_tiered,
            )
        except BaseException:
            store._io.shutdown()
            store.meta.close()
            store.kv.close()
            os.close(store._lock_fd)  # the directory can be opened again
            raise
        store.append, store.append_many = parts.appender.append, parts.appender.append_many
        store.pop, store.ack, store.ack_many = parts.pops.pop, parts.pops.ack, parts.pops.ack_many
        tails = parts.tails
        store.tail, store.tail_records = tails.tail, tails.tail_records
        store.tail_now, store.watch = tails.tail_now, tails.watch
        store.state, store.cold = parts.state, parts.cold
        parts.delays.rebuild()
        parts.transactions.rebuild()
        store._background = BackgroundTasks(
            loop, store._run_io, config, parts, store.commitlog, store._tier, store.trim_sealed
        )
        store._background.start()
        return store

    @property
    def writes_on_its_own(self) -> bool:
        """Whether the store appends by itself: delayed messages due, transaction checks, retention."""
        return self._background.writes_on_its_own

    def pause_own_writes(self) -> None:
        """A replica's store: no delivery of delayed messages, no transaction checks, no retention,
        so that its log only ever holds what the primary wrote (`apply_log_chunk`)."""
        self._background.pause_own_writes()

    def resume_own_writes(self) -> None:
        """A replica promoted to primary: delayed and half messages are taken from the (replicated)
        queues again and the store's own appends resume."""
        if not self._closed:
            self._background.resume_own_writes()

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
        parts = self._parts
        self._closed = parts.appender.closed = parts.pops.closed = parts.tails.closed = True
        async with parts.replica.lock:  # an apply or truncate under way ends first
            parts.replica.closed = True
        await parts.writer.drain()
        await self._background.stop()
        parts.polls.wake_all()
        async with parts.compactor.lock:  # a compaction under way ends first
            pass
        await parts.checkpoints.checkpoint(consumer_snapshot=True)
        await self._run_io(self._close_files)
        parts.writer.close()
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
        self._parts.compactor.close()
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
        self._parts.polls.wake_all()  # pops waiting on the old queue list look again
        return t

    def trim_sealed(self) -> int:
        """Stop listing sealed queues (from the last) once retention has removed every message
        they held: until then every group can still consume them and offset reads (the Spark
        source) replay them. How many topics changed."""
        return sum(self._catalog.trim_sealed(t.name, _emptied) for t in self._catalog.sealed_topics())

    def delete_topic(self, name: str) -> None:
        self._catalog.delete_topic(name)
        self._parts.polls.wake(name, None)  # its readers learn it is gone (TopicNotFound on their next read)

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
        return self._parts.reader.get_message(commitlog_offset, size)

    def get_by_id(self, message_id: str) -> list[Message]:
        return self._parts.reader.get_by_id(message_id)

    def get_by_key(self, key: str) -> list[Message]:
        return self._parts.reader.get_by_key(key)

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
        return self._parts.reader.read(topic, queue_id, start, end, max_messages, filter)

    def queue_entries(
        self, topic: str, queue_id: int, start: int, end: int, max_entries: int
    ) -> tuple[int, Iterable]:
        """(first offset, entries) of one queue in [start, end) clamped to what is stored: at most
        `max_entries` (commit log offset, size, tag hash, store time) tuples, lazily."""
        return self._parts.reader.queue_entries(topic, queue_id, start, end, max_entries)

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
        fs = self._parts.appender.free_space
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
        out.update(self._parts.writer.fsync_seconds.flat("fsync_seconds"))
        for (group, topic), n in self._parts.pops.dead_letters.items():
            out[f"dead_letters:{group}\t{topic}"] = n
        return out

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after `timestamp_ms`."""
        return self._parts.reader.search_offset(topic, queue_id, timestamp_ms)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Offset-based consumers: everything below `offset` is consumed by `group`."""
        self._parts.reader.commit_offset(group, topic, queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's consumed-up-to offset for a queue (-1 when it never consumed it)."""
        return self._parts.reader.committed_offset(group, topic, queue_id)

    def backlog(self, group: str, topic: str) -> int:
        """Messages of `topic` not yet acked by `group`."""
        return self._parts.reader.backlog(group, topic)

    def inflight_count(self, group: str, topic: str) -> int:
        return self._parts.reader.inflight_count(group, topic)

    # =========================================================================== pop / ack
    def change_invisible_time(self, handle: str, invisible_time_ms: int) -> str:
        """Make a popped message visible again after `invisible_time_ms` from now; returns the new handle."""
        return self._parts.pops.change_invisible_time(handle, invisible_time_ms)

    def nack(self, handle: str) -> str:
        """Give a message back for a retry after the group's back-off for its attempt number."""
        return self._parts.pops.nack(handle)

    async def forward_to_dlq(self, handle: str, reason: str = "forwarded") -> AppendResult:
        """Move a popped message to `%DLQ%<group>` now and ack it."""
        return await self._parts.pops.forward_to_dlq(handle, reason)

    @property
    def _waiters(self) -> dict:
        """The pops waiting, by topic (tests look here to know a long poll is parked)."""
        return self._parts.polls.waiters

    # =========================================================================== transactions, retention
    async def end_transaction(self, transaction_id: int | str, commit: bool) -> AppendResult | None:
        """Commit (deliver) or roll back (discard) a half message, by commit log offset or message id.

        Returns where the committed message landed, or None for a rollback."""
        return await self._parts.transactions.end(transaction_id, commit)

    def set_dead_letter_listener(self, fn: Callable[[str, Message, str], None] | None) -> None:
        """`fn(group, message, reason)` for each message a pop moves to `%DLQ%<group>` after the
        group's last attempt (a client's own forward_to_dlq is not reported: its caller knows)."""
        self._parts.pops.on_dead_letter = fn

    @property
    def transaction_checker(self) -> Callable[[Message], Awaitable[None] | None] | None:
        """Called (sync or async) with each half message unresolved after `transaction_timeout_ms`."""
        return self._parts.transactions.checker

    @transaction_checker.setter
    def transaction_checker(self, fn: Callable[[Message], Awaitable[None] | None] | None) -> None:
        self._parts.transactions.checker = fn

    # =========================================================================== compacted topics
    async def compact(self, now: int | None = None) -> CompactionStats:
        """Compact every compacted topic now over the closed commit log segments (it also runs every
        `compaction_interval_ms`): older records of a key, and tombstones older than
        `tombstone_retention_ms`, are removed."""
        return await self._parts.compactor.run(now)

    def latest(self, topic: str, key: str, tombstones: bool = False) -> Message | None:
        """The latest record of `key` in compacted topic `topic`; None when there is none or it is a
        tombstone (an empty body), unless `tombstones`."""
        return self._parts.compactor.latest(topic, key, tombstones)

    def latest_items(self, topic: str, tombstones: bool = False) -> list[Message]:
        """The latest record of every key of compacted topic `topic`, by key (tombstones only with
        `tombstones`)."""
        return self._parts.compactor.latest_items(topic, tombstones)

    async def apply_retention(self, now: int | None = None) -> int:
        """Delete whole old segments past every contained topic's age/size limit; returns how many."""
        return await self._parts.retention.apply(now)

    # =========================================================================== replication
    @property
    def log_end(self) -> int:
        """The commit log end of the records written and durable per the flush policy (what a
        replica may be sent)."""
        return self._parts.replica.log_end

    def read_log_chunk(self, start: int, max_bytes: int) -> bytes:
        """Primary: the commit log bytes of whole records from `start` (a record boundary), at most
        `max_bytes` but at least one record, up to `log_end` and the end of `start`'s segment
        (padding included). ValueError: not a boundary; KeyError: no longer stored."""
        return self._parts.replica.read(start, max_bytes)

    async def apply_log_chunk(self, start: int, data: bytes) -> int:
        """Replica: write a primary's chunk at `start` (which must be `log_end`: else ValueError)
        after checking every record (`CorruptChunk`, nothing written), durably per the flush policy,
        and index it; returns the new `log_end`. The store must take no appends of its own."""
        return await self._parts.replica.apply(start, data)

    async def truncate_log(self, offset: int) -> None:
        """Replica: drop the log from `offset` (a record boundary <= `log_end`) with everything
        derived from it (queue and index entries, segment counts, epochs from there)."""
        await self._parts.replica.truncate(offset)

    @property
    def log_start(self) -> int:
        """The first commit log offset still stored (a segment base; retention raises it)."""
        return self._parts.replica.log_start

    def queue_bases(self, offset: int) -> dict[str, int]:
        """Primary: per queue ("topic/queue id"), the queue offset a log starting at commit log
        offset `offset` starts it at (only those above 0), for `reset_empty_log`."""
        return self._parts.replica.queue_bases(offset)

    async def reset_empty_log(self, start: int, queue_bases: dict[str, int] | None = None) -> None:
        """Replica that holds nothing: make its log start at segment base `start` (its primary's
        `log_start`) and each queue at its offset in `queue_bases` (the primary's `queue_bases`),
        durably, so that it catches up from there. StoreError when it holds a record or a queue
        entry or takes appends."""
        await self._parts.replica.reset(start, queue_bases or {})

    async def delete_log_before(self, offset: int) -> int:
        """Replica: delete the whole segments that end at or before `offset` (its primary's
        `log_start`), as retention does; returns how many."""
        return await self._parts.replica.delete_before(offset, self._parts.retention.delete_before)


def _emptied(cq: ConsumeQueue) -> bool:
    """A sealed queue retention has emptied (it takes no new messages)."""
    return cq.min_offset >= cq.next_offset
