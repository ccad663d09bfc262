"""MessagingProcessor: the one protocol-neutral API every adapter calls.

A façade over parts, the way the RocketMQ proxy splits its processor into services: this module
keeps the lifecycle and the hot path (send, pop, ack and the other settlements of a delivery);
each part is handed what it uses and never imports this module:

- `access.py` `Access`: authentication, the ACL check, the authorization hook;
- `admin.py` `Admin`: routes, topics, groups, the key-value table;
- `reads.py` `Reads`: offset reads and tails, raw ranges, lookups, the message browser;
- `dead_letters.py` `DeadLetters`: retry and DLQ topics, the DLQ browser and redrive;
- `transactions.py` `Transactions`: ending and checking half messages;
- `trace_context.py` `ensure_traceparents` (the send path's) and `tracing.py` (the trace record).

The parts' public methods are the processor's own (bound in `__init__`: no extra frame per call).
Storage is reached only through a `StoreClient`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from time import time_ns

from store import ALL, AppendResult, Filter, Message, MessageType

from .access import CERTIFICATE_MECHANISM, PASSWORD_MECHANISMS, Access, Authorizer, allow_all
from .admin import Admin
from .dead_letters import DLQ_PREFIX, DLQ_PROPS, REDRIVEN_NS, DeadLetters
from .dispatch import Dispatcher, Dispatchers
from .errors import ErrorKind, ProcessorError, StoreCall, store_error, store_failed
from .metrics import Metrics
from .model import Action, ClientContext, Delivery, Resource, SendReceipt
from .ordering import order_key, set_order_keys
from .properties import P_PATH
from .reads import Reads
from .registry import ClientRegistry
from .security import Security
from .store_client import StoreClient, stored_despite
from .trace_context import ensure_traceparents
from .tracing import DELIVERED, DELIVERED_FIELDS, HANDLED, STORED, TraceRecorder
from .transactions import Transactions
from .validation import Limits, check_group, check_invisible_time, check_message, check_topic

__all__ = [
    "CERTIFICATE_MECHANISM",
    "DLQ_PREFIX",
    "DLQ_PROPS",
    "PASSWORD_MECHANISMS",
    "REDRIVEN_NS",
    "Authorizer",
    "MessagingProcessor",
    "allow_all",
    "ensure_traceparents",
]

log = logging.getLogger("messaging_processor")


class MessagingProcessor:
    """Protocol-neutral send / pop / ack / route / admin over a StoreClient.

    `auto_create_topics`: whether sending to (or routing) an unknown topic creates it. Adapters
    whose protocol has no topic declaration (MQTT) pass `auto_create=True` per call."""

    def __init__(
        self,
        store: StoreClient,
        *,
        limits: Limits | None = None,
        auto_create_topics: bool = False,
        authorizer: Authorizer | None = None,
        security: Security | None = None,
        client_idle_expiry_s: float = 120.0,
        tracer: TraceRecorder | None = None,
    ) -> None:
        self.store = store
        self.tracer = tracer  # None: no message trace (and no traceparent made for messages without one)
        self.limits = limits = limits or Limits()
        self.auto_create_topics = auto_create_topics
        self.security = security  # None: no authentication (every identity may do everything)
        self.clients = ClientRegistry()
        self.metrics = metrics = Metrics()
        self.client_idle_expiry_s = client_idle_expiry_s
        self._known_topics: set[str] = set()
        self._tasks: list[asyncio.Task] = []
        self._closing = False
        self.dispatchers = Dispatchers()  # extra queues a sent message also goes to (dispatch.py)
        # the parts, each handed what it uses
        self._access = access = Access(security, metrics, authorizer)
        self._admin = admin = Admin(store, limits, self._known_topics, self._ensure_topic)
        self._reads = reads = Reads(store, metrics, limits, access, tracer)
        self._dead_letters = dlq = DeadLetters(store, metrics, limits, tracer)
        self._transactions = tx = Transactions(store, metrics, self.dispatchers, self.clients)
        # access control (access.py)
        self.authenticate = access.authenticate
        self.permits = access.permits
        self._may_publish = access.may_publish
        self.grant_subscription = access.grant_subscription
        self.may_open_vhost = access.may_open_vhost
        self.authorize = access.authorize
        # routes, topics, groups, key-value table (admin.py)
        self.query_route = admin.query_route
        self.create_topic = admin.create_topic
        self.resize_topic = admin.resize_topic
        self.delete_topic = admin.delete_topic
        self.get_topic = admin.get_topic
        self.topic_consumers = admin.topic_consumers
        self.list_topics = admin.list_topics
        self.compact = admin.compact
        self.create_group = admin.create_group
        self.delete_group = admin.delete_group
        self.get_group = admin.get_group
        self.list_groups = admin.list_groups
        self.group_names = admin.group_names
        self.backlog = admin.backlog
        self.get_max_attempts = admin.get_max_attempts
        self.kv_put = admin.kv_put
        self.kv_put_many = admin.kv_put_many
        self.kv_put_if_absent = admin.kv_put_if_absent
        self.kv_get = admin.kv_get
        self.kv_delete = admin.kv_delete
        self.kv_scan = admin.kv_scan
        self.store_stats = admin.store_stats
        # reads (reads.py)
        self.read = reads.read
        self.tail = reads.tail
        self.watch = reads.watch
        self.tail_now = reads.tail_now
        self.read_raw = reads.read_raw
        self.latest = reads.latest
        self.latest_items = reads.latest_items
        self.queue_offsets = reads.queue_offsets
        self.search_offset = reads.search_offset
        self.commit_offset = reads.commit_offset
        self.committed_offset = reads.committed_offset
        self.get_message_by_id = reads.get_message_by_id
        self.get_message_at = reads.get_message_at
        self.browse = reads.browse
        self.find_by_key = reads.find_by_key
        # retry and dead-letter topics (dead_letters.py)
        self.send_to_system_topic = dlq.send_to_system_topic
        self.dead_letters = dlq.dead_letters
        self.redrive = dlq.redrive
        # transactions (transactions.py)
        self.end_transaction = tx.end_transaction

    @property
    def authorizer(self) -> Authorizer | None:
        """The authorization hook (None: none; with `security` on, the ACL). Settable."""
        return self._access.authorizer

    @authorizer.setter
    def authorizer(self, fn: Authorizer | None) -> None:
        self._access.authorizer = fn

    def add_dispatcher(self, fn: Dispatcher) -> None:
        """Have every send also store each message in the topics `fn(message)` names (dispatch.py)."""
        self.dispatchers.add(fn)

    def remove_dispatcher(self, fn: Dispatcher) -> None:
        self.dispatchers.remove(fn)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Hook into the store (transaction checks) and start housekeeping."""
        self.store.set_transaction_checker(self._transactions.check_transaction)
        if self.security is not None:
            await self.security.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._expire_clients()))
        if self.tracer is not None:
            await self.tracer.start()
            listen = getattr(self.store, "set_dead_letter_listener", None)
            if listen is not None:  # moves the store makes itself after a group's last attempt
                listen(self._dead_letters.traced_dead_letter)

    async def close(self) -> None:
        """Stop housekeeping. The store is closed by whoever opened it."""
        self._closing = True
        self.store.set_transaction_checker(None)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        if self.tracer is not None:
            with contextlib.suppress(Exception):
                await self.tracer.close()
        if self.security is not None:
            await self.security.close()

    async def _expire_clients(self) -> None:
        while True:
            await asyncio.sleep(max(self.client_idle_expiry_s / 4, 1))
            for c in self.clients.expire(self.client_idle_expiry_s):
                log.info(
                    "client %s (%s) expired after %.0f s idle",
                    c.client_id,
                    c.protocol,
                    self.client_idle_expiry_s,
                )

    # ------------------------------------------------------------------ topics
    async def _ensure_topic(self, topic: str, auto_create: bool | AbstractSet[str] | None) -> None:
        if topic in self._known_topics:
            return
        if await self.store.get_topic(topic) is None:
            if auto_create is None:
                auto_create = self.auto_create_topics
            elif not isinstance(auto_create, bool):
                auto_create = topic in auto_create
            if not auto_create:
                raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {topic} does not exist")
            with StoreCall(None, "", ""):
                await self.store.create_topic(topic, None, None, None)
            log.info("topic %s created on first use", topic)
        self._known_topics.add(topic)

    # ------------------------------------------------------------------ send
    async def send(
        self,
        ctx: ClientContext,
        messages: Sequence[Message],
        *,
        auto_create: bool | AbstractSet[str] | None = None,
        receipts: bool = True,
    ) -> list[SendReceipt]:
        """Store messages; returns once every one is durable per the store's flush policy.
        With `receipts=False` it returns [] (callers that only need "stored" skip building them).
        `auto_create`: whether a missing topic is created (None: `auto_create_topics`; a set: only
        those topics are).

        All messages are validated before any is stored. A store failure raises ProcessorError;
        messages of the batch stored before it stay stored (producers retry, as in RocketMQ), and
        its `stored` says which they are when the store client tells (store_client.stored_despite)."""
        limits = self.limits
        now = time_ns() // 1_000_000  # (now_ms inlined: one call less per send)
        topics: set[str] = set()
        max_body = limits.body_sizes.get(ctx.protocol, limits.max_body_size)
        for m in messages:
            check_message(m, limits, now, max_body)
            if m.msg_type == MessageType.FIFO and not m.message_group:
                raise ProcessorError(ErrorKind.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
            if not m.order_key:  # (the queue choice, ordering.py)
                m.order_key = order_key(m)
            topics.add(m.topic)
        if not messages:
            raise ProcessorError(ErrorKind.BAD_REQUEST, "no messages to send")
        if len(messages) > limits.max_batch:
            raise ProcessorError(ErrorKind.BAD_REQUEST, f"more than {limits.max_batch} messages in one send")
        if self.security is not None:
            allowed: set[str] = set()  # a batch's messages mostly share a path: check each path once
            for m in messages:  # the ACL path: the MQTT topic, else <topic> or <topic>/<tag>
                path = m.properties.get(P_PATH) or (f"{m.topic}/{m.tag}" if m.tag else m.topic)
                if path in allowed:
                    continue
                if not self._may_publish(ctx.identity, path):
                    raise ProcessorError(ErrorKind.FORBIDDEN, f"may not publish to {path}")
                allowed.add(path)
        elif self._access.authorizer is not None:
            for t in topics:
                await self.authorize(ctx.identity, Action.PUBLISH, Resource("topic", t))
        for t in topics:
            await self._ensure_topic(t, auto_create)
        tracer = self.tracer
        if tracer is not None:
            tps = ensure_traceparents(messages)  # (kept, not the messages: nothing big outlives the send)
        copies = self.dispatchers.copies(messages) if self.dispatchers else None
        try:
            if copies:  # (in the same write: durable together, dispatch.py)
                results = (await self.store.append_many([*messages, *copies]))[: len(messages)]
            elif len(messages) == 1:
                results: list[AppendResult] = [await self.store.append(messages[0])]
            else:
                results = await self.store.append_many(list(messages))
        except Exception as e:  # noqa: BLE001
            err = store_error(e)
            stored = stored_despite(e, [*messages, *copies] if copies else messages)
            err.stored = stored if stored is None else frozenset(i for i in stored if i < len(messages))
            self.metrics.errors[(ctx.protocol, "send", err.kind.value)] += 1
            if err.kind is ErrorKind.TOPIC_NOT_FOUND:
                self._known_topics.difference_update(topics)
            raise err from e
        if tracer is not None:  # (a list append: the recorder builds the rows when it writes)
            tracer.pending.append((STORED, now, ctx, tps, results))
            if len(tracer.pending) >= tracer.max_buffered:
                tracer.wake()
        counts, nbytes = self.metrics.messages_in, self.metrics.bytes_in
        if len(topics) == 1:
            key = (ctx.protocol, messages[0].topic)
            counts[key] += len(messages)
            nbytes[key] += len(messages[0].body) if len(messages) == 1 else sum(len(m.body) for m in messages)
        else:
            for m in messages:
                counts[(ctx.protocol, m.topic)] += 1
                nbytes[(ctx.protocol, m.topic)] += len(m.body)
        if not receipts:
            return []
        out = []
        for m, r in zip(messages, results, strict=True):
            out.append(
                SendReceipt(
                    r.message_id,
                    r.topic,
                    r.queue_id,
                    r.queue_offset,
                    r.commitlog_offset,
                    r.store_timestamp,
                    str(r.commitlog_offset) if m.msg_type == MessageType.TRANSACTION else "",
                )
            )
        return out

    def send_nowait(
        self, ctx: ClientContext, m: Message, on_done: Callable[[ProcessorError | None], None]
    ) -> bool:
        """`send` of one message without a task or coroutine: when nothing but the store has to be
        awaited (its topic known, no asynchronous authorizer), validate and append it now and call
        `on_done(None)` once it is durable, or `on_done(error)`, straight from the append's
        completion (no hop more). False when the send must take `send` (nothing done); a message
        that fails validation calls `on_done` at once with its error."""
        if self._access.authorizer is not None and self.security is None:
            return False
        topic = m.topic
        if topic not in self._known_topics:
            return False
        limits = self.limits
        now = time_ns() // 1_000_000
        try:
            check_message(m, limits, now, limits.body_sizes.get(ctx.protocol, limits.max_body_size))
            if m.msg_type == MessageType.FIFO and not m.message_group:
                raise ProcessorError(ErrorKind.ILLEGAL_MESSAGE_GROUP, "a FIFO message needs a message group")
            if self.security is not None:
                path = m.properties.get(P_PATH) or (f"{topic}/{m.tag}" if m.tag else topic)
                if not self._may_publish(ctx.identity, path):
                    raise ProcessorError(ErrorKind.FORBIDDEN, f"may not publish to {path}")
        except ProcessorError as e:
            on_done(e)
            return True
        if not m.order_key:  # (the queue choice, ordering.py)
            m.order_key = order_key(m)
        tracer = self.tracer
        tps = ensure_traceparents([m]) if tracer is not None else None
        copies = self.dispatchers.copies([m]) if self.dispatchers else None
        store = self.store
        try:
            fut = store.append_many([m, *copies]) if copies else store.append(m)
        except Exception as e:  # noqa: BLE001
            on_done(self._send_failed(ctx, topic, e))
            return True
        metrics = self.metrics

        def stored(f: asyncio.Future) -> None:
            if f.cancelled():
                on_done(ProcessorError(ErrorKind.INTERNAL, "send cancelled"))
                return
            e = f.exception()
            if e is not None:
                on_done(self._send_failed(ctx, topic, e))
                return
            r = f.result()
            if tracer is not None:
                tracer.pending.append((STORED, now, ctx, tps, r[:1] if copies else [r]))
                if len(tracer.pending) >= tracer.max_buffered:
                    tracer.wake()
            key = (ctx.protocol, topic)
            metrics.messages_in[key] += 1
            metrics.bytes_in[key] += len(m.body)
            on_done(None)

        asyncio.ensure_future(fut).add_done_callback(stored)
        return True

    def _send_failed(self, ctx: ClientContext, topic: str, e: BaseException) -> ProcessorError:
        err = store_error(e)
        self.metrics.errors[(ctx.protocol, "send", err.kind.value)] += 1
        if err.kind is ErrorKind.TOPIC_NOT_FOUND:
            self._known_topics.discard(topic)
        return err

    async def send_internal(
        self, topic: str, messages: Sequence[Message], *, compacted: bool = False, queues: int | None = None
    ) -> None:
        """Store `messages` in `topic`, a `%` topic of the gateway's own that `send` refuses to
        producers (e.g. MQTT's retained messages); no producer, ACL or size checks: the caller
        checked what it stores. `topic` is created first if missing (with `queues`, `compacted` if
        asked; an existing one made compacted if asked); with no messages only that is done. Durable
        on return."""
        if not topic.startswith("%") or any(m.topic != topic for m in messages):
            raise ProcessorError(ErrorKind.ILLEGAL_TOPIC, f"internal sends go to one % topic, not {topic!r}")
        with StoreCall(None, "", ""):
            if topic not in self._known_topics:
                t = await self.store.get_topic(topic)
                if t is None or (compacted and not t.compacted):
                    await self.store.create_topic(topic, t.queues if t else queues, None, None, compacted)
                    log.info("topic %s created (compacted: %s)", topic, compacted)
                self._known_topics.add(topic)
            if messages:
                set_order_keys(messages)
                await self.store.append_many(list(messages))

    # ------------------------------------------------------------------ consume
    async def pop(
        self,
        ctx: ClientContext,
        group: str,
        topic: str,
        *,
        filter: Filter = ALL,
        max_messages: int = 32,
        invisible_time_ms: int = 30_000,
        long_poll_ms: int = 0,
    ) -> list[Delivery]:
        """Pop up to `max_messages` visible messages of `topic` for `group` (any queue), each
        invisible until acked or `invisible_time_ms` passes. `long_poll_ms` waits for arrivals."""
        limits = self.limits
        check_group(group, limits)
        check_topic(topic, limits)
        check_invisible_time(invisible_time_ms, limits)
        if not 1 <= max_messages <= limits.max_batch:
            raise ProcessorError(ErrorKind.BAD_REQUEST, f"max messages must be 1 to {limits.max_batch}")
        if long_poll_ms < 0:
            raise ProcessorError(ErrorKind.ILLEGAL_POLLING_TIME, "long polling time must not be negative")
        long_poll_ms = min(long_poll_ms, limits.max_long_poll_ms)
        if self._access.authorizer is not None:
            await self.authorize(ctx.identity, Action.SUBSCRIBE, Resource("topic", topic))
            await self.authorize(ctx.identity, Action.SUBSCRIBE, Resource("group", group))
        try:  # (not `with StoreCall`: no exit call on the hot path)
            popped = await self.store.pop(group, topic, max_messages, invisible_time_ms, filter, long_poll_ms)
        except Exception as e:  # noqa: BLE001 - mapped and counted
            store_failed(self.metrics, ctx.protocol, "pop", e)
        if not popped:
            return []
        tracer = self.tracer
        if tracer is not None:
            tracer.pending.append(
                (DELIVERED, time_ns() // 1_000_000, ctx, group, list(map(DELIVERED_FIELDS, popped)))
            )
            if len(tracer.pending) >= tracer.max_buffered:
                tracer.wake()
        m = self.metrics
        m.pops[ctx.protocol] += 1
        m.messages_out[(ctx.protocol, topic)] += len(popped)
        m.deliveries[(group, topic, ctx.protocol)] += len(popped)
        out = []
        for p in popped:
            d = Delivery(p.message, p.receipt_handle, p.invisible_until, p.message.reconsume_times + 1)
            if d.delivery_attempt > 1:
                m.redeliveries[(ctx.protocol, topic)] += 1
                m.group_redeliveries[(group, topic, ctx.protocol)] += 1
            out.append(d)
        return out

    async def ack(self, ctx: ClientContext, handle: str) -> None:
        """Acknowledge a delivery: it is done for its group."""
        try:
            await self.store.ack(handle)
        except Exception as e:  # noqa: BLE001 - mapped and counted
            store_failed(self.metrics, ctx.protocol, "ack", e)
        self.metrics.acks[ctx.protocol] += 1
        tracer = self.tracer
        if tracer is not None:
            tracer.pending.append((HANDLED, time_ns() // 1_000_000, ctx, "acked", handle, None, None))
            if len(tracer.pending) >= tracer.max_buffered:
                tracer.wake()

    async def ack_many(self, ctx: ClientContext, handles: Sequence[str]) -> list[ProcessorError | None]:
        """Acknowledge several deliveries with one store call (one per store node in CLUSTER mode);
        per handle None (acked) or the ProcessorError it failed with (the others are acked all the
        same). An error of the whole call (the store is closing, a node is down) is raised."""
        if not handles:
            return []
        try:
            errors = await self.store.ack_many(handles)
        except Exception as e:  # noqa: BLE001 - mapped and counted
            store_failed(self.metrics, ctx.protocol, "ack", e)
        out: list[ProcessorError | None] = []
        tracer = self.tracer
        ms = time_ns() // 1_000_000
        for handle, e in zip(handles, errors, strict=True):
            if e is None:
                out.append(None)
                if tracer is not None:
                    tracer.pending.append((HANDLED, ms, ctx, "acked", handle, None, None))
                continue
            out.append(StoreCall.failure(self.metrics, ctx.protocol, "ack", e))
        self.metrics.acks[ctx.protocol] += out.count(None)
        if tracer is not None and len(tracer.pending) >= tracer.max_buffered:
            tracer.wake()
        return out

    async def change_invisible_time(self, ctx: ClientContext, handle: str, invisible_time_ms: int) -> str:
        """Make a delivery visible again `invisible_time_ms` from now; returns the new handle
        (the old one stops working)."""
        check_invisible_time(invisible_time_ms, self.limits)
        with StoreCall(self.metrics, ctx.protocol, "change_invisible_time"):
            new = await self.store.change_invisible_time(handle, invisible_time_ms)
        self.metrics.nacks[ctx.protocol] += 1
        if self.tracer is not None:
            self.tracer.handled(ctx, "invisible_time_changed", handle, new, f"{invisible_time_ms} ms")
        return new

    async def nack(self, ctx: ClientContext, handle: str) -> str:
        """Give a delivery back for a retry after its group's back-off; returns the new handle."""
        with StoreCall(self.metrics, ctx.protocol, "nack"):
            new = await self.store.nack(handle)
        self.metrics.nacks[ctx.protocol] += 1
        if self.tracer is not None:
            self.tracer.handled(ctx, "nacked", handle, new)
        return new

    async def forward_to_dlq(self, ctx: ClientContext, handle: str, reason: str = "forwarded") -> SendReceipt:
        """Move a delivery to its group's dead-letter topic `%DLQ%<group>` now, and ack it."""
        with StoreCall(self.metrics, ctx.protocol, "forward_to_dlq"):
            r = await self.store.forward_to_dlq(handle, reason)
        self.metrics.dlq[(ctx.protocol, r.topic)] += 1
        if self.tracer is not None:
            detail = f"{reason}: {r.topic}/{r.queue_id}/{r.queue_offset}"
            self.tracer.handled(ctx, "dead_lettered", handle, None, detail)
        return SendReceipt(
            r.message_id, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset, r.store_timestamp
        )
