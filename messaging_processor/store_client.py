"""The processor's only view of storage: the `StoreClient` port and its in-process implementation
over `store.Store` (LOCAL mode). CLUSTER mode's network implementation is cluster/remote_store.py:
the processor and the adapters above it do not know which one they run on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from store import (
    ALL,
    AppendResult,
    CompactionStats,
    Filter,
    GroupConfig,
    Message,
    PoppedMessage,
    RetryPolicy,
    Store,
    TopicConfig,
    TopicNotFound,
)
from store.raw_range import RawRange, read_range
from store.tier_reads import read_through

T = TypeVar("T")


class StoreClient(Protocol):
    """Everything the processor asks of a store. All methods are coroutines so that a remote
    implementation fits; store exceptions (store.StoreError and subclasses, StoreFullError,
    ValueError for bad arguments) pass through and the processor maps them. An `append_many` that
    failed after storing some of its messages, other than by placing them in order up to a missing
    topic as the Store does (`stored_despite`), raises PartlyStored naming them."""

    async def append(self, msg: Message) -> AppendResult: ...
    async def append_many(self, msgs: list[Message]) -> list[AppendResult]: ...
    async def pop(
        self, group: str, topic: str, max_messages: int, invisible_time_ms: int, filter: Filter, wait_ms: int
    ) -> list[PoppedMessage]: ...
    # offset reads of a whole topic for subscribers that do not compete (Store.tail); positions:
    # queue id -> next offset, kept and moved on by the caller
    async def tail(
        self, topic: str, positions: dict[int, int], max_messages: int, wait_ms: int
    ) -> list[Message]: ...
    async def ack(self, handle: str) -> None: ...
    # per handle None (acked) or the error; the others are acked all the same
    async def ack_many(self, handles: Sequence[str]) -> list[Exception | None]: ...
    async def change_invisible_time(self, handle: str, invisible_time_ms: int) -> str: ...
    async def nack(self, handle: str) -> str: ...
    async def forward_to_dlq(self, handle: str, reason: str) -> AppendResult: ...
    async def end_transaction(self, transaction_id: int | str, commit: bool) -> AppendResult | None: ...
    def set_transaction_checker(self, fn: Callable[[Message], Awaitable[None]] | None) -> None: ...

    async def get_topic(self, name: str) -> TopicConfig | None: ...
    async def create_topic(
        self,
        name: str,
        queues: int | None,
        retention_ms: int | None,
        retention_bytes: int | None,
        compacted: bool = False,
    ) -> TopicConfig: ...
    async def resize_topic(self, name: str, queues: int) -> TopicConfig: ...
    async def delete_topic(self, name: str) -> None: ...
    async def list_topics(self) -> list[TopicConfig]: ...
    async def get_group(self, name: str) -> GroupConfig | None: ...
    async def create_group(self, name: str, max_attempts: int, retry: RetryPolicy | None) -> GroupConfig: ...
    async def delete_group(self, name: str) -> None: ...
    async def list_groups(self) -> list[GroupConfig]: ...
    async def subscriptions(self) -> list[tuple[str, str]]: ...  # (group, topic) pairs with progress

    async def min_offset(self, topic: str, queue_id: int) -> int: ...
    async def max_offset(self, topic: str, queue_id: int) -> int: ...
    async def read(
        self, topic: str, queue_id: int, start: int, end: int | None, max_messages: int, filter: Filter
    ) -> list[Message]: ...
    async def read_raw(
        self, topic: str, queue_id: int, start: int, end: int, max_records: int, max_bytes: int
    ) -> RawRange | None: ...  # None: no raw reads here (use read)
    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...
    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...
    async def committed_offset(self, group: str, topic: str, queue_id: int) -> int: ...
    async def backlog(self, group: str, topic: str) -> int: ...
    async def inflight_count(self, group: str, topic: str) -> int: ...
    async def get_by_id(self, message_id: str) -> list[Message]: ...
    async def get_by_key(self, key: str) -> list[Message]: ...
    async def get_message(self, commitlog_offset: int) -> Message: ...
    async def latest(self, topic: str, key: str, tombstones: bool = False) -> Message | None: ...
    async def latest_items(self, topic: str, tombstones: bool = False) -> list[Message]: ...
    async def compact(self) -> CompactionStats: ...
    async def kv_put(self, ns: str, key: str, value: bytes) -> None: ...
    async def kv_put_many(self, ns: str, items: dict[str, bytes | None]) -> None: ...
    async def kv_put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None: ...
    async def kv_get(self, ns: str, key: str) -> bytes | None: ...
    async def kv_delete(self, ns: str, key: str) -> bool: ...
    async def kv_scan(self, ns: str, prefix: str) -> list[tuple[str, bytes]]: ...
    def stats(self) -> dict[str, object]: ...
    def store_count(
        self,
    ) -> int: ...  # stores a topic's queues are spread over (create_topic's count is per store)
    async def close(self) -> None: ...


class PartlyStored(Exception):
    """An `append_many` failed (`error`, a store exception) after storing some of its messages:
    `stored`, their indices (ClusterStoreClient: a batch of several topics goes as one request per
    topic, each stored or refused as a whole). The processor maps it as `error`."""

    def __init__(self, error: Exception, stored: frozenset[int]) -> None:
        super().__init__(error)
        self.error = error
        self.stored = stored


def stored_despite(exc: BaseException, msgs: Sequence[Message]) -> frozenset[int] | None:
    """The indices of `msgs` that a failed `append_many` of them stored all the same (None: not
    known). PartlyStored names them. A missing topic (TopicNotFound, whose message is the topic)
    stops the Store at the first message of that topic, the ones before it stored (Store.append_many
    places a batch in order); a ClusterStoreClient raises it bare only for a request of that one
    topic, refused as a whole (its first message is the batch's first: none stored)."""
    if isinstance(exc, PartlyStored):
        return exc.stored
    if isinstance(exc, TopicNotFound) and exc.args:
        topic = exc.args[0]
        for i, m in enumerate(msgs):
            if m.topic == topic:
                return frozenset(range(i))
    return None


class LocalStoreClient:
    """StoreClient over a Store in this process and event loop (LOCAL mode)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # The hot calls are the store's own (no delegating frame): append (a future: awaiting it is
        # the same as awaiting a coroutine), append_many, pop and tail are the Store's methods.
        self.append = store.append
        self.append_many = store.append_many
        self.pop = store.pop
        self.tail = store.tail

    async def _tiered(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)`, a synchronous read of the store, read through the tier's cache
        (store/tier_reads.py: a tiered range not cached is fetched and the read tried again)."""
        return await read_through(fn, self.store.fetch_tiered, *args)

    async def ack(self, handle: str) -> None:
        self.store.ack(handle)

    async def ack_many(self, handles: Sequence[str]) -> list[Exception | None]:
        return self.store.ack_many(handles)  # type: ignore[return-value]

    async def change_invisible_time(self, handle: str, invisible_time_ms: int) -> str:
        return self.store.change_invisible_time(handle, invisible_time_ms)

    async def nack(self, handle: str) -> str:
        return self.store.nack(handle)

    async def forward_to_dlq(self, handle: str, reason: str = "forwarded") -> AppendResult:
        return await self.store.forward_to_dlq(handle, reason)

    async def end_transaction(self, transaction_id: int | str, commit: bool) -> AppendResult | None:
        return await self.store.end_transaction(transaction_id, commit)

    def set_transaction_checker(self, fn: Callable[[Message], Awaitable[None]] | None) -> None:
        self.store.transaction_checker = fn

    def tail_now(self, topic: str, positions: dict[int, int], max_messages: int) -> list[Message] | None:
        """LOCAL mode only: Store.tail_now."""
        return self.store.tail_now(topic, positions, max_messages)

    def watch(
        self, topic: str, callback: Callable[[], object], positions: dict[int, int] | None = None
    ) -> Callable[[], None]:
        """Store.watch (`positions` are the network store client's: cluster/watches.py; here the
        caller's empty read and this call share one loop turn, so nothing is appended between)."""
        return self.store.watch(topic, callback)

    def set_dead_letter_listener(self, fn: Callable[[str, Message, str], None] | None) -> None:
        """LOCAL mode only (a network store client has none): see Store.set_dead_letter_listener."""
        self.store.set_dead_letter_listener(fn)

    async def get_topic(self, name: str) -> TopicConfig | None:
        return self.store.topic_configs.get(name)

    async def create_topic(
        self,
        name: str,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        compacted: bool = False,
    ) -> TopicConfig:
        t = self.store.create_topic(name, queues, retention_ms, retention_bytes, compacted)
        await self.store.meta.durable()  # (answered once on disk: Metadata batches per loop turn)
        return t

    async def resize_topic(self, name: str, queues: int) -> TopicConfig:
        t = self.store.resize_topic(name, queues)
        await self.store.meta.durable()
        return t

    async def delete_topic(self, name: str) -> None:
        self.store.delete_topic(name)
        await self.store.meta.durable()

    async def list_topics(self) -> list[TopicConfig]:
        return self.store.topics()

    async def get_group(self, name: str) -> GroupConfig | None:
        return self.store.group_configs.get(name)

    async def create_group(
        self, name: str, max_attempts: int = 16, retry: RetryPolicy | None = None
    ) -> GroupConfig:
        g = self.store.create_group(name, max_attempts, retry)
        await self.store.meta.durable()
        return g

    async def delete_group(self, name: str) -> None:
        self.store.delete_group(name)
        await self.store.meta.durable()

    async def list_groups(self) -> list[GroupConfig]:
        return self.store.groups()

    async def subscriptions(self) -> list[tuple[str, str]]:
        return sorted(k for k in self.store.progress.states if not k[0].startswith("%"))

    async def min_offset(self, topic: str, queue_id: int) -> int:
        return self.store.min_offset(topic, queue_id)

    async def max_offset(self, topic: str, queue_id: int) -> int:
        return self.store.max_offset(topic, queue_id)

    async def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int | None = None,
        max_messages: int = 32,
        filter: Filter = ALL,
    ) -> list[Message]:
        args = (topic, queue_id, start, end, max_messages, filter)
        cold = self.store.cold
        if cold.is_cold(topic, queue_id, start):  # old data: its own turn (store/cold_reads.py)
            return await cold.read(self.store.read, self.store.fetch_tiered, *args)
        return await self._tiered(self.store.read, *args)

    async def read_raw(
        self, topic: str, queue_id: int, start: int, end: int, max_records: int, max_bytes: int
    ) -> RawRange:
        """The read API's raw ranges; a cold one takes at most the cold reads' step a call."""
        store, cold = self.store, self.store.cold
        if cold.is_cold(topic, queue_id, start):
            max_records, max_bytes = cold.step(topic, queue_id, start, max_records, max_bytes)
            args = (store, topic, queue_id, start, end, max_records, max_bytes)
            return await cold.read(read_range, store.fetch_tiered, *args)
        return await self._tiered(read_range, store, topic, queue_id, start, end, max_records, max_bytes)

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return self.store.search_offset(topic, queue_id, timestamp_ms)

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.store.commit_offset(group, topic, queue_id, offset)

    async def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        return self.store.committed_offset(group, topic, queue_id)

    async def backlog(self, group: str, topic: str) -> int:
        return self.store.backlog(group, topic)

    async def inflight_count(self, group: str, topic: str) -> int:
        return self.store.inflight_count(group, topic)

    async def get_by_key(self, key: str) -> list[Message]:
        """Messages whose keys include `key` (the store's key index)."""
        return await self._tiered(self.store.get_by_key, key)

    async def get_by_id(self, message_id: str) -> list[Message]:
        return await self._tiered(self.store.get_by_id, message_id)

    async def latest(self, topic: str, key: str, tombstones: bool = False) -> Message | None:
        return await self._tiered(self.store.latest, topic, key, tombstones)

    async def latest_items(self, topic: str, tombstones: bool = False) -> list[Message]:
        return await self._tiered(self.store.latest_items, topic, tombstones)

    async def compact(self) -> CompactionStats:
        return await self.store.compact()

    async def get_message(self, commitlog_offset: int) -> Message:
        return await self._tiered(self.store.get_message, commitlog_offset)

    async def kv_put(self, ns: str, key: str, value: bytes) -> None:
        await self.store.kv.put(ns, key, value)

    async def kv_put_many(self, ns: str, items: dict[str, bytes | None]) -> None:
        await self.store.kv.put_many(ns, items)

    async def kv_put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None:
        return await self.store.kv.put_if_absent(ns, key, value)

    async def kv_get(self, ns: str, key: str) -> bytes | None:
        return await self.store.kv.get(ns, key)

    async def kv_delete(self, ns: str, key: str) -> bool:
        return await self.store.kv.delete(ns, key)

    async def kv_scan(self, ns: str, prefix: str = "") -> list[tuple[str, bytes]]:
        return await self.store.kv.scan(ns, prefix)

    def store_count(self) -> int:
        return 1

    def stats(self) -> dict[str, object]:
        """Store counters (appends, flushes, pops, acks, redeliveries, dlq), the disk watermark's
        state (Store.disk_space), Store.observed (commit log bytes, fsync histogram, dead letters)
        and recent flush latencies."""
        return {
            **self.store.metrics,
            **self.store.disk_space(),
            **self.store.observed(),
            "flush_latency_ms": list(self.store.flush_latency_ms[-1024:]),
        }

    async def close(self) -> None:
        await self.store.close()
