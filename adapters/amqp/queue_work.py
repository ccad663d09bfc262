"""Work on queues' messages in the store: the store copies of a publish and their sends (chunked;
a full store blocks connections), the settlement of deliveries, dead-lettering with RabbitMQ's
x-death headers, x-max-length (drop-head) and the TTL expiry of queues without consumers. Owned by
Broker, shared by its channels."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from messaging_processor import ClientContext, ErrorKind, Message, MessagingProcessor, ProcessorError

from .codec import decode_properties
from .consumer import ACK, REJECT, REQUEUE, Unacked
from .mapping import P_EXPIRES, base_properties, dead_letter_properties, expires_at, now_ms, present, tag_for
from .queues import Queue
from .routing import VHost

log = logging.getLogger("adapters.amqp")


class QueueWork:
    """Stores, moves and expires messages of queues."""

    def __init__(
        self,
        processor: MessagingProcessor,
        ctx: ClientContext,
        vhosts: dict[str, VHost],
        ready_count: Callable[[Queue], Awaitable[int]],
        block: Callable[[str], None],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task],
    ) -> None:
        self.processor = processor
        self.ctx = ctx  # the broker's own context (dead-lettering, trimming, expiry)
        self.vhosts = vhosts
        self.ready_count = ready_count
        self.block = block
        self.spawn = spawn
        self.closed = False
        # of these queue topics, those gone (deleted through another proxy): Registry.missing_topics,
        # which also brings this proxy's bindings in step (set by the broker)
        self.missing_topics: Callable[[set[str]], Awaitable[set[str]]] = self._missing_topics

    def close(self) -> None:
        """No new TTL sweeper from now on (the broker cancels the running ones)."""
        self.closed = True

    def copies(
        self,
        queues: tuple[Queue, ...] | list[Queue],
        exchange: str,
        rk: str,
        raw: bytes,
        body: bytes,
        readable: Any,
        ttl_ms: int | None,
        now: int,
    ) -> list[Message]:
        """One store message per destination queue (properties shared unless a TTL applies)."""
        base = base_properties(exchange, rk, raw, readable)
        tag = tag_for(rk) if exchange else ""
        out = []
        for q in queues:
            p = base
            exp = now + ttl_ms if ttl_ms is not None else 0
            if q.ttl is not None:
                e = now + q.ttl
                exp = min(exp, e) if exp else e
            if exp:
                p = dict(base)
                p[P_EXPIRES] = str(exp)
                if not q.has_expiring:
                    q.has_expiring = True
                    self.start_sweeper(q)
            out.append(Message(q.topic, body, tag, (), p))
        return out

    async def send(self, ctx: ClientContext, msgs: list[Message], queues: Iterable[Queue]) -> None:
        """processor.send in chunks of the processor's batch limit; blocks connections when the
        store is full. The topics of `queues` (the copies' queues) are never created here: a queue
        deleted through another proxy a moment ago fails the send with TOPIC_NOT_FOUND (the caller
        drops its copies) rather than leave its topic behind; the MQTT exchange's store topics are
        created on first use, as MQTT does."""
        p = self.processor
        step = p.limits.max_batch
        owned = {q.topic for q in queues}
        creatable = {m.topic for m in msgs if m.topic not in owned}
        i = 0
        try:
            for i in range(0, len(msgs), step):
                chunk = msgs[i : i + step] if len(msgs) > step else msgs
                await p.send(ctx, chunk, auto_create=creatable, receipts=False)
        except ProcessorError as e:
            if e.kind is ErrorKind.STORE_FULL:
                self.block(str(e))
            if i and e.stored is not None:  # (indices of `msgs`: the chunks before are stored)
                e.stored = frozenset(range(i)) | {i + k for k in e.stored}
            raise

    async def send_routed(self, ctx: ClientContext, msgs: list[Message], queues: Iterable[Queue]) -> None:
        """`send`; when a destination queue's topic is gone (deleted through another proxy a moment
        ago), its copies are dropped and the others not stored yet sent again, as if routed a moment
        later. (The failed send may have stored some: a worker's send of several topics goes as one
        request per topic, the Store places a batch in order up to the missing topic. Sending those
        again stored them twice: the live queue of tests/gateway/test_workers.py's kill -9 test
        got a message twice once.)"""
        queues = list(queues)
        try:
            await self.send(ctx, msgs, queues)
        except ProcessorError as e:
            if e.kind is not ErrorKind.TOPIC_NOT_FOUND or e.stored is None:
                raise
            stored = e.stored
            gone = await self.missing_topics({q.topic for q in queues})
            if not gone:
                raise
            rest = [m for i, m in enumerate(msgs) if m.topic not in gone and i not in stored]
            if rest:
                await self.send(ctx, rest, queues)

    async def _missing_topics(self, topics: set[str]) -> set[str]:
        gone = set()
        for topic in topics:
            try:
                await self.processor.get_topic(topic)
            except ProcessorError:
                gone.add(topic)
        return gone

    def after_publish(self, queues: set[Queue]) -> None:
        """Once stored: wake TTL sweepers, trim queues over x-max-length (drop-head)."""
        for q in queues:
            if q.has_expiring and not q.consumers:
                q.wake.set()
            if q.max_length is not None and q.overflow == "drop-head":
                if q.trimming:
                    q.trimming = 2
                else:
                    q.trimming = 1
                    self.spawn(self._trim(q))

    async def _trim(self, q: Queue) -> None:
        """x-max-length with drop-head: drop (dead-letter, reason maxlen) the oldest ready messages."""
        p, ctx = q.feed or self.processor, self.ctx
        try:
            while not q.deleted:
                excess = await self.ready_count(q) - (q.max_length or 0)
                if excess > 0:
                    ds = await p.pop(
                        ctx, q.group, q.topic, max_messages=min(excess, 1024), invisible_time_ms=60_000
                    )
                    for d in ds:
                        await self.dead_letter(q, d.message, "maxlen")
                        with contextlib.suppress(ProcessorError):
                            await p.ack(ctx, d.receipt_handle)
                    if ds:
                        continue
                if q.trimming == 2:
                    q.trimming = 1
                    continue
                break
        except ProcessorError as e:
            log.warning("amqp: trimming queue %r failed: %s", q.name, e)
        finally:
            q.trimming = 0

    # ------------------------------------------------------------------ settlements
    async def settle(self, ctx: ClientContext, rec: Unacked, action: int) -> None:
        """Apply a client's settlement of a delivery: ack; requeue (dead-lettered, reason
        delivery_limit, past the queue's x-delivery-limit); reject (dead-lettered, reason rejected)."""
        p = rec.queue.feed or self.processor
        try:
            if action == ACK:
                await p.ack(ctx, rec.handle)
            elif action == REQUEUE and (
                rec.queue.delivery_limit is None or rec.attempt <= rec.queue.delivery_limit
            ):
                await p.change_invisible_time(ctx, rec.handle, 0)
            else:
                reason = "rejected" if action == REJECT else "delivery_limit"
                try:
                    await self.dead_letter(rec.queue, rec.message, reason)
                except ProcessorError as e:
                    log.warning("amqp: dead-lettering from %r failed: %s; requeued", rec.queue.name, e)
                    await p.change_invisible_time(ctx, rec.handle, 0)
                    return
                await p.ack(ctx, rec.handle)
        except ProcessorError as e:  # e.g. purged or deleted meanwhile
            log.debug("amqp: settling delivery %d failed: %s", rec.tag, e)

    async def ack_all(self, ctx: ClientContext, recs: list[Unacked]) -> None:
        """Ack several deliveries with one store call (a failed one is redelivered later); those
        of exclusive queues where they are kept (LocalFeed)."""
        stored = []
        for rec in recs:
            feed = rec.queue.feed
            if feed is None:
                stored.append(rec)
            else:
                await feed.ack_many(ctx, [rec.handle])  # (never raises: an unknown handle was settled)
        recs = stored
        if not recs:
            return
        try:
            errors = await self.processor.ack_many(ctx, [rec.handle for rec in recs])
        except ProcessorError as e:
            log.debug("amqp: settling %d deliveries failed: %s", len(recs), e)
            return
        for rec, e in zip(recs, errors, strict=True):
            if e is not None:  # e.g. purged or deleted meanwhile
                log.debug("amqp: settling delivery %d failed: %s", rec.tag, e)

    async def requeue(self, ctx: ClientContext, q: Queue, handle: str) -> None:
        """Make a message popped from `q` visible again at once."""
        with contextlib.suppress(ProcessorError):
            await (q.feed or self.processor).change_invisible_time(ctx, handle, 0)

    # ------------------------------------------------------------------ dead-lettering
    async def dead_letter(self, q: Queue, m: Message, reason: str) -> None:
        """Republish a message to the queue's x-dead-letter-exchange (nothing without one; a
        missing exchange or no route drops it, as in RabbitMQ). A message dead-lettered back to
        the same queue for a reason other than rejection is dropped (cycle)."""
        if q.dlx is None:
            return
        vh = self.vhosts.get(q.vhost)
        ex = vh.exchanges.get(q.dlx) if vh is not None else None
        if vh is None or ex is None:
            return
        exchange, rk, raw = present(m)
        new_rk = q.dlrk if q.dlrk is not None else rk
        new_raw = dead_letter_properties(raw, q.name, reason, exchange, [rk])
        queues = vh.route(ex, new_rk, new_raw)
        if reason != "rejected":
            queues = [d for d in queues if d is not q]
        if not queues:
            return
        msgs = self.copies(
            queues, ex.name, new_rk, new_raw, m.body, decode_properties(new_raw), None, now_ms()
        )
        await self.send_routed(self.ctx, msgs, queues)
        self.after_publish(set(queues))

    # ------------------------------------------------------------------ TTL expiry without consumers
    def start_sweeper(self, q: Queue) -> None:
        if q.sweeper is None and not q.deleted and not self.closed:
            q.sweeper = asyncio.get_running_loop().create_task(self._sweep(q), name=f"amqp ttl {q.name}")

    async def _sweep(self, q: Queue) -> None:
        """While a queue with expiring messages has no consumer, dead-letter (or drop) the expired
        messages at its head when they expire (consumers check expiry on delivery)."""
        while not q.deleted and not self.closed:
            due: float | None = None
            if not q.consumers:
                try:
                    due = await self._expire_head(q)
                except ProcessorError as e:
                    log.warning("amqp: expiring messages of %r failed: %s", q.name, e)
                    due = 1.0
                except Exception:  # noqa: BLE001 - keep sweeping
                    log.exception("amqp: expiring messages of %r failed", q.name)
                    due = 1.0
            q.wake.clear()
            if due == 0:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(q.wake.wait(), due)

    async def _expire_head(self, q: Queue) -> float | None:
        """Expire the leading expired messages; seconds until the next one expires (None: unknown)."""
        p, ctx = self.processor, self.ctx
        now = now_ms()
        expired = 0
        due: int | None = None
        route = await p.query_route(ctx, q.topic)
        for r in route.queues:
            if q.feed is not None:  # (what it has not read yet)
                start = q.feed.position(r.queue_id)
            else:
                start = await p.committed_offset(q.group, q.topic, r.queue_id)
            if start < 0:
                start = (await p.queue_offsets(q.topic, r.queue_id))[0]
            msgs = await p.read(ctx, q.topic, r.queue_id, start, None, 64)
            for m in msgs:
                e = expires_at(m)
                if e and e <= now:
                    expired += 1
                    continue
                if e:
                    due = e - now if due is None else min(due, e - now)
                break
        if not expired:
            return None if due is None else max(due, 1) / 1000
        src = q.feed or p
        ds = await src.pop(ctx, q.group, q.topic, max_messages=min(expired, 1024), invisible_time_ms=60_000)
        for d in ds:
            e = expires_at(d.message)
            if e and e <= now_ms():
                await self.dead_letter(q, d.message, "expired")
                with contextlib.suppress(ProcessorError):
                    await src.ack(ctx, d.receipt_handle)
            else:
                with contextlib.suppress(ProcessorError):
                    await src.change_invisible_time(ctx, d.receipt_handle, 0)
        return 0 if ds else 1.0
