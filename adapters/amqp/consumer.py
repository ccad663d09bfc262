"""A consumer (basic.consume): a DeliveryLoop over its queue's group whose handler writes
basic.deliver and waits until the client settles the delivery (or its channel ends); and the record
of an unacked delivery. Acks go back to the delivery loop, which sends those of one event-loop
iteration (a `multiple` ack, several acks in one read) to the store with one `ack_many`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from time import time_ns
from typing import TYPE_CHECKING, Any, Protocol

from messaging_processor import Action, Delivery, DeliveryLoop, Outcome, ProcessorError, Resource

from .codec import encode_deliver
from .mapping import P_EXPIRES, present
from .streams import with_offset

if TYPE_CHECKING:
    from messaging_processor import ClientContext, Message, MessagingProcessor
    from runtime.events import LazyEvent

    from .queues import Queue
    from .streams import StreamCursor

log = logging.getLogger("adapters.amqp")

OPEN, CLOSING, CLOSED = range(3)  # channel states
ACK, REQUEUE, REJECT = range(3)  # what the client asked for a delivery
UNLIMITED = 1000  # in-flight deliveries of a consumer without prefetch (and of no-ack consumers)


class Unacked:
    """A delivery the client has not settled yet."""

    __slots__ = ("tag", "handle", "queue", "message", "fut", "deadline", "delivered", "attempt")

    def __init__(self, tag: int, d: Delivery, queue: Queue, fut: asyncio.Future | None, popped: int) -> None:
        self.tag = tag
        self.handle = d.receipt_handle
        self.queue = queue
        self.message = d.message
        self.fut = fut  # the delivery loop's handler waits on it (None for basic.get)
        self.deadline = d.invisible_until
        self.delivered = popped  # epoch ms (when it was popped)
        self.attempt = d.delivery_attempt


class ConsumerBroker(Protocol):
    """What a consumer uses of the broker (broker.py `Broker`)."""

    processor: MessagingProcessor
    invisible_time_ms: int
    long_poll_ms: int
    secured: bool


class ConsumerConnection(Protocol):
    """What a consumer uses of its connection (session.py `Connection`)."""

    ctx: ClientContext
    pop_ctx: ClientContext
    frame_max: int
    max_outbound_bytes: int
    messages_out: int
    writable: LazyEvent

    def write(self, data: bytes) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task: ...


class ConsumerWork(Protocol):
    """What a consumer uses of the broker's work on messages (queue_work.py `QueueWork`)."""

    async def settle(self, ctx: ClientContext, rec: Unacked, action: int) -> None: ...
    async def requeue(self, ctx: ClientContext, q: Queue, handle: str) -> None: ...
    async def dead_letter(self, q: Queue, m: Message, reason: str) -> None: ...


class ConsumerChannel(Protocol):
    """What a consumer uses of its channel (channel.py `Channel`): handed in, so that this module
    does not import the channel's."""

    broker: ConsumerBroker
    conn: ConsumerConnection
    work: ConsumerWork
    number: int
    state: int
    delivery_tag: int
    global_prefetch: int
    unacked: dict[int, Unacked]
    room: asyncio.Event

    def server_cancel(self, cons: Consumer) -> None: ...


class Consumer:
    __slots__ = (
        "tag",
        "tag_b",
        "channel",
        "queue",
        "no_ack",
        "exclusive",
        "prefetch",
        "loop",
        "cancelled",
        "cursor",
        "_loop",
        "_settle",
        "_read",
    )

    def __init__(
        self,
        channel: ConsumerChannel,
        tag: str,
        queue: Queue,
        no_ack: bool,
        exclusive: bool,
        prefetch: int,
        cursor: StreamCursor | None = None,
    ) -> None:
        self.channel = channel
        self.tag = tag
        self.tag_b = tag.encode("utf-8", "surrogateescape")
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.loop: DeliveryLoop | None = None
        self.cancelled = False
        self.cursor = cursor  # a stream consumer's own reading of the queue's topic (streams.py)
        self._loop = asyncio.get_running_loop()
        self._settle = channel.work.settle
        self._read = Resource("topic", queue.topic)  # re-checked per delivery with security on

    def max_inflight(self) -> int:
        if self.no_ack:
            return UNLIMITED
        n = self.prefetch or UNLIMITED
        g = self.channel.global_prefetch
        return min(n, g) if g else n

    def start(self) -> None:
        if self.loop is not None or self.cancelled:
            return
        ch = self.channel
        b = ch.broker
        q = self.queue
        mi = self.max_inflight()
        self.loop = DeliveryLoop(
            # (an exclusive queue's deliveries are kept in memory: LocalFeed; a stream's: its cursor)
            self.cursor or q.feed or b.processor,
            ch.conn.pop_ctx,
            q.group,
            q.topic,
            self.handle,
            max_inflight=mi,
            invisible_time_ms=b.invisible_time_ms,
            long_poll_ms=b.long_poll_ms,
            batch=min(mi, 256),
            on_error=self._ended,
            # with a bound: pop only while the connection is writable; a no-ack consumer's deliveries
            # also count until written (unacked ones are basic.qos's: see docs/limits.md)
            gate=ch.conn.writable if ch.conn.max_outbound_bytes else None,
            max_inflight_bytes=ch.conn.max_outbound_bytes if self.no_ack else 0,
        ).start()

    def _ended(self, e: ProcessorError) -> None:
        if not self.cancelled:
            log.info("amqp consumer %s on %r ends: %s", self.tag, self.queue.name, e)
            self.channel.server_cancel(self)

    async def stop(self) -> None:
        self.cancelled = True
        if self.loop is not None:
            await self.loop.stop(drain_timeout=2.0)
        if self.cursor is not None and self.queue.feed is not None:
            self.queue.feed.forget(self.cursor)  # type: ignore[union-attr]  (a stream's StreamFeeds)

    async def handle(self, d: Delivery) -> Outcome:
        ch = self.channel
        if self.cancelled or ch.state != OPEN:
            return Outcome.REQUEUE
        q = self.queue
        b = ch.broker
        m = d.message
        exp = m.properties.get(P_EXPIRES)  # (mapping.expires_at inlined: the hot path)
        if exp and int(exp) <= time_ns() // 1_000_000 and self.cursor is None:
            await ch.work.dead_letter(q, m, "expired")
            return Outcome.ACK
        if q.delivery_limit is not None and d.delivery_attempt - 1 > q.delivery_limit:
            await ch.work.dead_letter(q, m, "delivery_limit")
            return Outcome.ACK
        conn = ch.conn
        if b.secured and not b.processor.permits(conn.ctx.identity, Action.SUBSCRIBE, self._read):
            ch.server_cancel(self)  # the rules changed (or the user went away) since basic.consume
            return Outcome.REQUEUE
        try:
            if not conn.writable.is_set():
                await conn.writable.wait()
            g = ch.global_prefetch
            if g and not self.no_ack:
                while len(ch.unacked) >= g:
                    ch.room.clear()
                    await ch.room.wait()
                    g = ch.global_prefetch
                    if not g:
                        break
        except asyncio.CancelledError:
            conn.spawn(ch.work.requeue(conn.ctx, q, d.receipt_handle))
            raise
        if self.cancelled or ch.state != OPEN:
            return Outcome.REQUEUE
        tag = ch.delivery_tag = ch.delivery_tag + 1
        ex, rk, raw = present(m)
        if self.cursor is not None:
            raw = with_offset(raw, self.cursor.stream_offset(m))
        conn.messages_out += 1
        conn.write(
            encode_deliver(
                ch.number, self.tag_b, tag, d.delivery_attempt > 1, ex, rk, raw, m.body, conn.frame_max
            )
        )
        if self.no_ack:
            return Outcome.ACK
        fut = self._loop.create_future()
        rec = ch.unacked[tag] = Unacked(tag, d, q, fut, d.invisible_until - b.invisible_time_ms)
        action = await fut
        if action == ACK:
            d.receipt_handle = rec.handle  # (renewed meanwhile: Channel.renew)
            return Outcome.ACK  # the delivery loop acks those settled in one iteration with one ack_many
        await self._settle(conn.ctx, rec, action)
        return Outcome.SETTLED
