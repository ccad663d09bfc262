"""Reads by position, key and id: offset reads and tails, raw ranges, compacted topics' latest
values, queue offsets, committed offsets, the message browser.

`Reads` is handed the `StoreClient`, the processor's `Metrics` and `Limits`, its `Access` (the
SUBSCRIBE check of a client's read) and the `TraceRecorder` (None: no message trace). Operators'
reads (`browse`, `find_by_key`, `latest`) are not checked: the admin API checked the admin role."""

from __future__ import annotations

from collections.abc import Callable

from store import ALL, Filter, Message
from store.raw_range import RawRange

from .access import Access
from .errors import ErrorKind, ProcessorError, StoreCall
from .metrics import Metrics
from .model import Action, ClientContext, Resource
from .store_client import StoreClient
from .tracing import TRACE_TOPIC, TraceRecorder
from .validation import Limits, check_group


class Reads:
    """The processor's read calls over `store` (see the module docstring)."""

    def __init__(
        self,
        store: StoreClient,
        metrics: Metrics,
        limits: Limits,
        access: Access,
        tracer: TraceRecorder | None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.limits = limits
        self.access = access
        self.tracer = tracer

    async def read(
        self,
        ctx: ClientContext,
        topic: str,
        queue_id: int,
        start: int,
        end: int | None = None,
        max_messages: int = 32,
        filter: Filter = ALL,
        *,
        group: str | None = None,
    ) -> list[Message]:
        """Messages of one queue with offsets in [start, end): replayable range reads. `group`: a
        pull consumer's group, which reads them to consume them (traced as deliveries)."""
        access = self.access
        if access.authorizer is not None:
            await access.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
        with StoreCall(None, "", ""):
            msgs = await self.store.read(topic, queue_id, start, end, max_messages, filter)
        if msgs:
            self.metrics.messages_out[(ctx.protocol, topic)] += len(msgs)
            if group is not None and self.tracer is not None:
                self.tracer.pulled(ctx, group, topic, queue_id, msgs)
        return msgs

    async def tail(
        self,
        ctx: ClientContext,
        topic: str,
        positions: dict[int, int],
        max_messages: int = 128,
        wait_ms: int = 0,
        *,
        group: str | None,
    ) -> list[Message]:
        """Offset reads of a whole topic for a subscriber that does not compete (StoreClient.tail):
        no pop state and nothing to ack; the caller moves `positions` (queue id -> next offset) past
        what it gets. Traced as deliveries to `group`, acked at once (the reader keeps no progress
        in the store); group None: not traced (the proxy's own index reads, as `read` without one)."""
        access = self.access
        if access.authorizer is not None:
            await access.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
        with StoreCall(None, "", ""):
            msgs = await self.store.tail(topic, positions, max_messages, wait_ms)
        if msgs:
            self.metrics.messages_out[(ctx.protocol, topic)] += len(msgs)
            if self.tracer is not None and group is not None:
                self.tracer.tailed(ctx, group, msgs)
        return msgs

    def tail_now(
        self, ctx: ClientContext, topic: str, positions: dict[int, int], max_messages: int, *, group: str
    ) -> list[Message] | None:
        """`tail` without awaiting, for a reader woken by its watch (run to completion: no task):
        what is readable now. None when this read must be awaited (an authorizer to ask, a store
        with no synchronous tail, a tiered range to fetch): use `tail`."""
        now = getattr(self.store, "tail_now", None)
        if now is None or self.access.authorizer is not None:
            return None
        with StoreCall(None, "", ""):
            msgs = now(topic, positions, max_messages)
        if msgs:
            self.metrics.messages_out[(ctx.protocol, topic)] += len(msgs)
            if self.tracer is not None and group is not None:
                self.tracer.tailed(ctx, group, msgs)
        return msgs

    def watch(
        self, topic: str, callback: Callable[[], object], positions: dict[int, int]
    ) -> Callable[[], None] | None:
        """After a `tail` of `topic` at `positions` that found nothing (no await in between): call
        `callback` once when the topic next gets a record, holding no task or timer meanwhile;
        returns the function that ends the watch unfired. None when the store offers no watch (a
        network store of an older release, or a topic over several nodes: long-poll instead).
        TopicNotFound mapped as by `tail`."""
        watch = getattr(self.store, "watch", None)
        if watch is None:
            return None
        with StoreCall(None, "", ""):
            return watch(topic, callback, positions)

    async def read_raw(
        self,
        ctx: ClientContext,
        topic: str,
        queue_id: int,
        start: int,
        end: int,
        max_records: int,
        max_bytes: int,
    ) -> RawRange | None:
        """As `read`, the records' bytes undecoded (store/raw_range.py); None when the store
        client has no raw reads (then use `read`). Counting delivered messages is the caller's."""
        access = self.access
        if access.authorizer is not None:
            await access.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
        with StoreCall(None, "", ""):
            return await self.store.read_raw(topic, queue_id, start, end, max_records, max_bytes)

    # ------------------------------------------------------------------ compacted topics
    async def latest(self, topic: str, key: str) -> Message | None:
        """The latest value of `key` in compacted topic `topic` (None: none, or deleted)."""
        with StoreCall(None, "", ""):
            return await self.store.latest(topic, key)

    async def latest_items(self, topic: str) -> list[Message]:
        """The latest value of every key of compacted topic `topic` (deleted keys left out), by key."""
        with StoreCall(None, "", ""):
            return await self.store.latest_items(topic)

    # ------------------------------------------------------------------ offsets
    async def queue_offsets(self, topic: str, queue_id: int) -> tuple[int, int]:
        """(min, max) offsets of a queue: [min, max) are readable."""
        with StoreCall(None, "", ""):
            return await self.store.min_offset(topic, queue_id), await self.store.max_offset(topic, queue_id)

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        with StoreCall(None, "", ""):
            return await self.store.search_offset(topic, queue_id, timestamp_ms)

    async def commit_offset(
        self, ctx: ClientContext, group: str, topic: str, queue_id: int, offset: int
    ) -> None:
        check_group(group, self.limits)
        with StoreCall(None, "", ""):
            await self.store.commit_offset(group, topic, queue_id, offset)
        if self.tracer is not None:  # (the messages a pull consumer read below it are consumed)
            self.tracer.committed(ctx, group, topic, queue_id, offset)

    async def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        with StoreCall(None, "", ""):
            return await self.store.committed_offset(group, topic, queue_id)

    # ------------------------------------------------------------------ by id, key and position
    async def get_message_by_id(self, message_id: str) -> list[Message]:
        return await self.store.get_by_id(message_id)

    async def get_message_at(self, commitlog_offset: int) -> Message:
        """The message stored at `commitlog_offset`; MESSAGE_NOT_FOUND when none starts there
        (RocketMQ 4.x consumers hand failed messages back by commit log offset alone)."""
        try:
            msg = await self.store.get_message(commitlog_offset)
        except Exception as e:  # noqa: BLE001 - unknown, deleted or not a record start
            raise ProcessorError(
                ErrorKind.MESSAGE_NOT_FOUND, f"no message at commit log offset {commitlog_offset}"
            ) from e
        if msg.commitlog_offset != commitlog_offset:
            raise ProcessorError(
                ErrorKind.MESSAGE_NOT_FOUND, f"no message at commit log offset {commitlog_offset}"
            )
        return msg

    # ------------------------------------------------------------------ message browser
    # For operators (admin API, console, CLI): no ACL check and nothing counted as delivered.
    async def browse(
        self, topic: str, queue_id: int | None = None, offset: int | None = None, count: int = 20
    ) -> list[Message]:
        """Up to `count` messages of `topic` from `offset` (default: each queue's min) of queue
        `queue_id`, or of every readable queue merged by store time."""
        t = await self.store.get_topic(topic)
        if t is None:
            raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
        if queue_id is not None and not 0 <= queue_id < t.readable:
            raise ProcessorError(ErrorKind.BAD_REQUEST, f"topic {topic} has no queue {queue_id}")
        out: list[Message] = []
        with StoreCall(None, "", ""):
            for q in range(t.readable) if queue_id is None else (queue_id,):
                lo = await self.store.min_offset(topic, q)
                out += await self.store.read(topic, q, max(lo, offset or 0), None, count)
        out.sort(key=lambda m: (m.store_timestamp, m.queue_id, m.queue_offset))
        return out[:count]

    async def find_by_key(self, key: str) -> list[Message]:
        """Every stored record whose keys include `key` (the store's key index)."""
        with StoreCall(None, "", ""):
            found = await self.store.get_by_key(key)
        return [m for m in found if m.topic != TRACE_TOPIC]  # (the trace's own records are keyed too)
