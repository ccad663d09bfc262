"""Retry and dead-letter topics: a protocol's own redelivery (`send_to_system_topic`), the
dead-letter browser and redrive, and the trace of the store's own moves to a DLQ.

`DeadLetters` is handed the `StoreClient`, the processor's `Metrics` and `Limits`, and the
`TraceRecorder` (None: no message trace). The browser and redrive are for operators (admin API,
console, CLI): no ACL check (the admin API checked the admin role) and nothing counted as delivered.
A redrive claims each DLQ record in the kv before it sends the copy (released if the send fails),
so two redrives never send one record twice."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from store import Message, MessageType

from .errors import ErrorKind, ProcessorError, StoreCall
from .metrics import Metrics
from .model import ClientContext, SendReceipt
from .ordering import order_key
from .store_client import StoreClient
from .tracing import GATEWAY_TRACEPARENT, TRACEPARENT, TraceRecorder, context_of, traceparent_of
from .transactions import INTERNAL_PROPS
from .validation import Limits, check_topic

log = logging.getLogger("messaging_processor")

# who trace events of the store's own moves (a dead letter after the last attempt) are from
_STORE_CTX = ClientContext("store", client_id="store")
# The DLQ topic prefix, the bookkeeping properties a move to the DLQ adds (store/popping.py
# `_to_dlq`, the 4.x send-back), and the kv namespace that keeps which DLQ records were redriven
# ("<group>/<queue>/<offset>" -> the new message's id).
DLQ_PREFIX = "%DLQ%"
DLQ_PROPS = (
    "ORIGIN_TOPIC",
    "ORIGIN_MESSAGE_ID",
    "ORIGIN_QUEUE_ID",
    "ORIGIN_QUEUE_OFFSET",
    "RECONSUME_TIMES",
    "DLQ_REASON",
    "RETRY_TOPIC",
    *INTERNAL_PROPS,
)
REDRIVEN_NS = "dlq.redriven"


class DeadLetters:
    """Retry and dead-letter topics over `store` (see the module docstring)."""

    def __init__(
        self, store: StoreClient, metrics: Metrics, limits: Limits, tracer: TraceRecorder | None
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.limits = limits
        self.tracer = tracer

    def traced_dead_letter(self, group: str, msg: Message, reason: str) -> None:
        """The store's listener of the moves it makes itself after a group's last attempt."""
        if self.tracer is not None:
            self.tracer.message_event(
                _STORE_CTX, "dead_lettered", msg.message_id, f"{reason}, group {group}", traceparent_of(msg)
            )

    # ------------------------------------------------------------------ protocol-managed redelivery
    # RocketMQ 4.x consumers read by offset and hand failed messages back by commit log offset
    # alone (CONSUMER_SEND_MSG_BACK); the broker then stores a copy in %RETRY%<group> (delayed)
    # or %DLQ%<group>. This call (with `get_message_at`) lets an adapter do that without reaching
    # past the processor.
    async def send_to_system_topic(self, ctx: ClientContext, msg: Message) -> SendReceipt:
        """Store `msg` in a retry (`%RETRY%<group>`) or dead-letter (`%DLQ%<group>`) topic, which
        `send` refuses to producers; the topic is created on first use. A `deliver_at` delays it."""
        topic = msg.topic
        if not topic.startswith(("%RETRY%", "%DLQ%")):
            raise ProcessorError(ErrorKind.ILLEGAL_TOPIC, f"{topic!r} is not a retry or dead-letter topic")
        check_topic(topic, self.limits)
        if len(msg.body) > self.limits.max_body_size:
            raise ProcessorError(ErrorKind.BODY_TOO_LARGE, f"body of {len(msg.body)} bytes is too large")
        with StoreCall(self.metrics, ctx.protocol, "send"):
            if await self.store.get_topic(topic) is None:
                await self.store.create_topic(topic, None, None, None)
                log.info("topic %s created on first use", topic)
            if not msg.order_key:  # (the queue choice, ordering.py)
                msg.order_key = order_key(msg)
            r = await self.store.append(msg)
        if topic.startswith("%DLQ%"):
            self.metrics.dlq[(ctx.protocol, topic)] += 1
        else:
            self.metrics.messages_in[(ctx.protocol, topic)] += 1
        origin = msg.properties.get("ORIGIN_MESSAGE_ID")
        if self.tracer is not None and origin:
            event = "dead_lettered" if topic.startswith("%DLQ%") else "retried"
            at, tp = f"{r.topic}/{r.queue_id}/{r.queue_offset}", context_of(msg.properties, origin)
            self.tracer.message_event(ctx, event, origin, at, tp)
        return SendReceipt(
            r.message_id, r.topic, r.queue_id, r.queue_offset, r.commitlog_offset, r.store_timestamp
        )

    # ------------------------------------------------------------------ browser and redrive
    async def dead_letters(
        self, group: str, count: int = 100, *, pending_only: bool = False
    ) -> list[tuple[Message, str | None]]:
        """Up to `count` records of `group`'s dead-letter topic `%DLQ%<group>`, oldest first, each
        with the id of the message a redrive sent ("" while one is sending; None: not redriven).
        `pending_only`: only those not redriven."""
        topic = DLQ_PREFIX + group
        t = await self.store.get_topic(topic)
        if t is None:
            if await self.store.get_group(group) is None:
                raise ProcessorError(ErrorKind.GROUP_NOT_FOUND, f"consumer group {group} does not exist")
            return []
        done = {k: v.decode() for k, v in await self.store.kv_scan(REDRIVEN_NS, group + "/")}
        out: list[tuple[Message, str | None]] = []
        with StoreCall(None, "", ""):
            for q in range(t.readable):
                start, end = await self.store.min_offset(topic, q), await self.store.max_offset(topic, q)
                found = 0
                while start < end and found < count:
                    page = await self.store.read(topic, q, start, end, min(count, 256))
                    if not page:
                        break
                    start = page[-1].queue_offset + 1
                    for m in page:
                        new_id = done.get(f"{group}/{q}/{m.queue_offset}")
                        if not (pending_only and new_id is not None) and found < count:
                            out.append((m, new_id))
                            found += 1
        out.sort(key=lambda r: (r[0].store_timestamp, r[0].queue_id, r[0].queue_offset))
        return out[:count]

    async def redrive(
        self, group: str, ids: Sequence[str] | None = None, ctx: ClientContext | None = None
    ) -> list[tuple[str, str]]:
        """Send dead letters of `group` (those with message id in `ids`; None: every one not yet
        redriven) back to their original topic as new messages: same body, keys, tag, message group
        and properties (`traceparent` too) without the DLQ bookkeeping. Returns (dead letter id, new
        message id) per record sent; ids not in the DLQ and records redriven before are skipped.
        `ctx`: who asked (the trace's `redriven` events)."""
        ctx = ctx or ClientContext("admin", client_id="admin-api")
        topic = DLQ_PREFIX + group
        sent: list[tuple[str, str]] = []
        await self.dead_letters(group, 1)  # GROUP_NOT_FOUND for a group with neither DLQ nor settings
        if ids is not None:
            records: dict[tuple[int, int], Message] = {}
            with StoreCall(None, "", ""):
                for mid in dict.fromkeys(ids):
                    for m in await self.store.get_by_id(mid):
                        if m.topic == topic:
                            records[(m.queue_id, m.queue_offset)] = m
            for m in records.values():
                await self._redrive_one(ctx, group, m, sent)
            return sent
        while True:  # all: page through what is still pending until nothing is
            page = await self.dead_letters(group, 500, pending_only=True)
            before = len(sent)
            for m, _ in page:
                await self._redrive_one(ctx, group, m, sent)
            if len(sent) == before:
                return sent

    async def _redrive_one(
        self, ctx: ClientContext, group: str, dead: Message, sent: list[tuple[str, str]]
    ) -> None:
        origin = dead.properties.get("ORIGIN_TOPIC") or dead.properties.get("RETRY_TOPIC")
        if not origin:
            log.warning("dead letter %s of %s has no original topic: not redriven", dead.message_id, group)
            return
        key = f"{group}/{dead.queue_id}/{dead.queue_offset}"
        if await self.store.kv_put_if_absent(REDRIVEN_NS, key, b"") is not None:
            return  # redriven before (or by a redrive running now)
        props = {k: v for k, v in dead.properties.items() if k not in DLQ_PROPS}
        if (tp := traceparent_of(dead)) is not None and tp != props.get(TRACEPARENT):
            props[GATEWAY_TRACEPARENT] = tp  # (the copy's new id: it keeps the original's trace)
        copy = Message(
            topic=origin,
            body=dead.body,
            tag=dead.tag,
            keys=dead.keys,
            properties=props,
            message_group=dead.message_group,
            born_host=dead.born_host,
            msg_type=MessageType.FIFO if dead.message_group else MessageType.NORMAL,
        )
        copy.order_key = order_key(copy)
        try:
            if await self.store.get_topic(origin) is None:
                raise ProcessorError(ErrorKind.TOPIC_NOT_FOUND, f"topic {origin} does not exist")
            with StoreCall(None, "", ""):
                r = await self.store.append(copy)
        except BaseException:
            await self.store.kv_delete(REDRIVEN_NS, key)
            raise
        await self.store.kv_put(REDRIVEN_NS, key, r.message_id.encode())
        if self.tracer is not None:
            self.tracer.stored(ctx, [copy], [r])
            self.tracer.message_event(ctx, "redriven", dead.message_id, f"to {origin} as {r.message_id}", tp)
        log.info("dead letter %s of %s redriven to %s as %s", dead.message_id, group, origin, r.message_id)
        sent.append((dead.message_id, r.message_id))
