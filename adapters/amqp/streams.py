"""Stream queues (`x-queue-type: stream`), as RabbitMQ's over AMQP 0-9-1: a replayable view of the
queue's store topic. Every consumer reads the topic by offset (`MessagingProcessor.tail`) from the
point its `x-stream-offset` names, with its own position in memory: consumers do not compete, each
gets every message, and nothing is removed. Acks only give the consumer room (its prefetch).

A stream offset is the message's queue offset when the topic has one store queue (every topic an
AMQP queue creates has one); for a topic of Q queues it is `queue offset * Q + queue id`, so every
message has one number and a numeric `x-stream-offset` N starts each queue at its first message
numbered N or above."""

from __future__ import annotations

import re
from collections.abc import Sequence
from time import time_ns
from typing import TYPE_CHECKING, Any

from messaging_processor import (
    ClientContext,
    Delivery,
    ErrorKind,
    Message,
    MessagingProcessor,
    ProcessorError,
)

from .codec import AMQPError, ReplyCode
from .codec.properties import decode_properties, encode_properties
from .codec.wire import Timestamp

if TYPE_CHECKING:
    from .queues import Queue

OFFSET_ARG = "x-stream-offset"
# queue.declare arguments a stream refuses (RabbitMQ: "... of queue type rabbit_stream_queue")
UNSUPPORTED_ARGS = (
    "x-message-ttl",
    "x-expires",
    "x-max-length",
    "x-overflow",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-priority",
    "x-delivery-limit",
)
_INTERVAL = re.compile(r"^([0-9]+)([YMDhms])$")
_UNIT_S = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
FAR_MS = 10 * 365 * 86400 * 1000  # a stream delivery has no invisible time to renew


def _rs(q: Queue) -> str:
    return f"queue '{q.name}' in vhost '{q.vhost}'"


def declares_stream(args: dict[str, Any]) -> bool:
    return args.get("x-queue-type") in ("stream", b"stream")


def check_declare(
    vhost: str, name: str, args: dict[str, Any], exclusive: bool, durable: bool, auto_delete: bool
) -> None:
    """406 PRECONDITION_FAILED for a stream RabbitMQ would not declare."""
    rs = f"queue '{name}' in vhost '{vhost}'"
    bad = "exclusive" if exclusive else "non-durable" if not durable else "auto-delete" if auto_delete else ""
    if bad:
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED, f"invalid property '{bad}' for {rs}", class_id=50, method_id=10
        )
    for key in UNSUPPORTED_ARGS:
        if key in args:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg '{key}' for {rs} of queue type rabbit_stream_queue",
                class_id=50,
                method_id=10,
            )


def attach(q: Queue, processor: MessagingProcessor, ctx: ClientContext) -> Queue:
    """`q`, with its StreamFeeds when it is a stream (made on first use)."""
    if q.stream and q.feed is None:
        q.feed = StreamFeeds(processor, ctx, q)
    return q


def check_consume(q: Queue, no_ack: bool, prefetch: int) -> None:
    """RabbitMQ's rules for basic.consume on a stream, in its order: a consumer prefetch (406), manual
    acks (540)."""
    if not prefetch:
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED,
            f"consumer prefetch count is not set for '{_rs(q)}'",
            class_id=60,
            method_id=20,
        )
    if no_ack:
        raise AMQPError(
            ReplyCode.NOT_IMPLEMENTED,
            f"automatic acknowledgement not supported by stream queues {_rs(q)}",
            class_id=60,
            method_id=20,
        )


def refuse_get(q: Queue) -> None:
    raise AMQPError(
        ReplyCode.NOT_IMPLEMENTED,
        f"basic.get not supported by stream queues {_rs(q)}",
        class_id=60,
        method_id=70,
    )


def parse_offset(args: dict[str, Any], q: Queue) -> tuple[str, int]:
    """The start an `x-stream-offset` names: ("first" | "last" | "next", 0), ("offset", N) or
    ("time", epoch ms) (a timestamp, or an interval back from now: `<n>Y|M|D|h|m|s`)."""
    v = args.get(OFFSET_ARG)
    if v is None:
        return "next", 0
    if isinstance(v, bytes):
        v = v.decode("utf-8", "surrogateescape")
    if isinstance(v, Timestamp):
        return "time", int(v) * 1000
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return "offset", int(v)
    if isinstance(v, str):
        if v in ("first", "last", "next"):
            return v, 0
        m = _INTERVAL.match(v)
        if m:
            return "time", time_ns() // 1_000_000 - int(m.group(1)) * _UNIT_S[m.group(2)] * 1000
    raise AMQPError(
        ReplyCode.PRECONDITION_FAILED,
        f"invalid arg '{OFFSET_ARG}' for {_rs(q)}: {v!r}",
        class_id=60,
        method_id=20,
    )


def with_offset(raw: bytes, offset: int) -> bytes:
    """Delivery properties with the `x-stream-offset` header RabbitMQ adds to stream deliveries."""
    props = decode_properties(raw)
    headers = dict(props.headers or {})
    headers[OFFSET_ARG] = offset
    props.headers = headers
    return encode_properties(props)


class StreamCursor:
    """One consumer's reading of a stream: positions in memory, the deliveries it has out. It has
    the calls a DeliveryLoop makes (`pop`, `ack_many`, `change_invisible_time`, `nack`)."""

    __slots__ = ("processor", "ctx", "queue", "start", "cid", "positions", "width", "held", "_n", "_begun")

    def __init__(
        self,
        processor: MessagingProcessor,
        ctx: ClientContext,
        queue: Queue,
        start: tuple[str, int],
        cid: int,
    ) -> None:
        self.processor = processor
        self.ctx = ctx  # reads are authorized and traced as the consumer's connection
        self.queue = queue
        self.start = start
        self.cid = cid
        self.positions: dict[int, int] = {}
        self.width = 1  # store queues of the topic (stream offsets interleave them)
        self.held: set[str] = set()
        self._n = 0
        self._begun = False

    def stream_offset(self, m: Message) -> int:
        return m.queue_offset * self.width + m.queue_id

    async def begin(self) -> None:
        """Positions where `x-stream-offset` says (called at basic.consume: `next` is then)."""
        p, topic = self.processor, self.queue.topic
        route = await p.query_route(self.ctx, topic)
        ids = [r.queue_id for r in route.queues]
        self.width = max(ids, default=0) + 1
        kind, value = self.start
        for qid in ids:
            lo, hi = await p.queue_offsets(topic, qid)
            if kind == "first":
                at = lo
            elif kind == "last":
                at = max(hi - 1, lo)
            elif kind == "next":
                at = hi
            elif kind == "offset":
                at = -(-(value - qid) // self.width)  # the first o with o * width + qid >= value
            else:
                at = await p.search_offset(topic, qid, value)
            self.positions[qid] = min(max(at, lo), hi)
        self._begun = True

    async def pop(
        self,
        ctx: ClientContext,
        group: str,
        topic: str,
        *,
        filter: Any = None,  # noqa: A002 - MessagingProcessor.pop's name; a stream reads everything
        max_messages: int = 32,
        invisible_time_ms: int = 30_000,
        long_poll_ms: int = 0,
    ) -> list[Delivery]:
        if not self._begun:
            await self.begin()
        if self.queue.deleted:
            raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"queue {self.queue.name} is gone")
        msgs = await self.processor.tail(
            self.ctx, self.queue.topic, self.positions, max_messages, long_poll_ms, group=self.queue.group
        )
        until = time_ns() // 1_000_000 + FAR_MS
        out: list[Delivery] = []
        positions = self.positions
        for m in msgs:
            if len(out) >= max_messages:
                break
            positions[m.queue_id] = max(positions.get(m.queue_id, 0), m.queue_offset + 1)
            self._n += 1
            handle = f"stream:{self.cid}:{self._n}"
            self.held.add(handle)
            out.append(Delivery(m, handle, until, 1))
        return out

    def settle(self, handle: str) -> None:
        self.held.discard(handle)

    async def ack(self, ctx: ClientContext, handle: str) -> None:
        self.settle(handle)

    async def ack_many(self, ctx: ClientContext, handles: Sequence[str]) -> list[ProcessorError | None]:
        for h in handles:
            self.settle(h)
        return [None] * len(handles)

    async def change_invisible_time(self, ctx: ClientContext, handle: str, invisible_time_ms: int) -> str:
        """A requeue (nack, reject, a closed channel) releases the delivery: a stream keeps it."""
        if invisible_time_ms <= 0:
            self.settle(handle)
        return handle

    async def nack(self, ctx: ClientContext, handle: str) -> str:
        return await self.change_invisible_time(ctx, handle, 0)

    async def forward_to_dlq(self, ctx: ClientContext, handle: str, reason: str) -> None:
        self.settle(handle)


class StreamFeeds:
    """A stream queue's `feed` (queues.Queue.feed): the settlements of its consumers' deliveries go
    to the cursor that handed them out (by receipt handle); counts are the stream's messages."""

    __slots__ = ("processor", "ctx", "queue", "cursors", "_next")

    def __init__(self, processor: MessagingProcessor, ctx: ClientContext, queue: Queue) -> None:
        self.processor = processor
        self.ctx = ctx  # the adapter's own (counting the messages)
        self.queue = queue
        self.cursors: dict[int, StreamCursor] = {}
        self._next = 0

    def cursor(self, ctx: ClientContext, args: dict[str, Any]) -> StreamCursor:
        start = parse_offset(args, self.queue)
        self._next += 1
        c = self.cursors[self._next] = StreamCursor(self.processor, ctx, self.queue, start, self._next)
        return c

    def forget(self, cursor: StreamCursor) -> None:
        self.cursors.pop(cursor.cid, None)

    def _of(self, handle: str) -> StreamCursor | None:
        try:
            return self.cursors.get(int(handle.split(":", 2)[1]))
        except (IndexError, ValueError):
            return None

    async def ack(self, ctx: ClientContext, handle: str) -> None:
        c = self._of(handle)
        if c is not None:
            c.settle(handle)

    async def ack_many(self, ctx: ClientContext, handles: Sequence[str]) -> list[ProcessorError | None]:
        for h in handles:
            await self.ack(ctx, h)
        return [None] * len(handles)

    async def change_invisible_time(self, ctx: ClientContext, handle: str, invisible_time_ms: int) -> str:
        if invisible_time_ms <= 0:
            await self.ack(ctx, handle)
        return handle

    async def nack(self, ctx: ClientContext, handle: str) -> str:
        return await self.change_invisible_time(ctx, handle, 0)

    async def forward_to_dlq(self, ctx: ClientContext, handle: str, reason: str) -> None:
        await self.ack(ctx, handle)

    def position(self, queue_id: int) -> int:
        return -1

    async def ready(self) -> int:
        """The messages in the stream (declare-ok's message count)."""
        p, topic = self.processor, self.queue.topic
        try:
            route = await p.query_route(self.ctx, topic)
        except ProcessorError:
            return 0
        n = 0
        for r in route.queues:
            lo, hi = await p.queue_offsets(topic, r.queue_id)
            n += hi - lo
        return n

    async def purge(self) -> int:
        """A stream is not purged (its messages stay for every reader)."""
        return 0

    async def close(self) -> None:
        self.cursors.clear()
