"""The publishing side of a channel: routing at arrival, one processor send per read, publisher
confirms in tag order, x-overflow reject-publish, transactions and direct reply-to. A mixin of
Channel (channel.py), kept apart to keep modules small."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

from messaging_processor import ErrorKind, ProcessorError

from . import codec as c
from .codec import (
    AMQPError,
    ReplyCode,
    encode_basic_ack,
    encode_basic_nack,
    encode_deliver,
    encode_properties,
)
from .consumer import ACK, OPEN, REJECT, REQUEUE
from .mapping import FLAG_EXPIRATION, FLAG_USER_ID, READABLE_FLAGS, flags_of, now_ms, parse_expiration

if TYPE_CHECKING:
    from .broker import Broker, VHost
    from .queues import Queue
    from .session import Connection

log = logging.getLogger("adapters.amqp")

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_TO + "."


class Confirm:
    __slots__ = ("first", "last", "nacked", "done")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last
        self.nacked: set[int] = set()
        self.done = False


class Publishing:
    """Channel methods for basic.publish, confirm.select, tx.* and direct reply-to."""

    conn: Connection
    number: int
    broker: Broker
    vhost: VHost
    state: int
    confirm: bool
    pub_seq: int
    confirms: Any
    tx: bool
    tx_msgs: list[Any]
    tx_acks: list[Any]
    consumers: dict[str, Any]
    delivery_tag: int
    sends: set[asyncio.Task]
    reply_token: str
    reply_tag: str

    if TYPE_CHECKING:  # provided by Channel

        def reply(self, method: Any) -> None: ...
        def fail(self, e: AMQPError) -> None: ...
        def _take(self, m: Any) -> list[Any]: ...
        def _settle(self, rec: Any, action: int) -> None: ...

    # ------------------------------------------------------------------ direct reply-to
    def _reply_consume(self, m: c.BasicConsume) -> None:
        """basic.consume on amq.rabbitmq.reply-to: replies to this channel's requests are delivered
        straight to it (no queue, no store), as RabbitMQ's direct reply-to."""
        if not m.no_ack:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, "reply consumer cannot acknowledge", class_id=60, method_id=20
            )
        if self.reply_token:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, "reply consumer already set", class_id=60, method_id=20
            )
        tag = m.consumer_tag or "amq.ctag-" + os.urandom(16).hex()
        if tag in self.consumers:
            raise AMQPError(
                ReplyCode.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", class_id=60, method_id=20
            )
        self.reply_token = os.urandom(16).hex()
        self.reply_tag = tag
        self.broker.reply_channels[self.reply_token] = self
        if not m.nowait:
            self.reply(c.BasicConsumeOk(tag))

    def _reply_release(self) -> None:
        if self.reply_token:
            self.broker.reply_channels.pop(self.reply_token, None)
            self.reply_token = ""

    def deliver_reply(self, rk: str, raw: bytes, body: bytes) -> bool:
        """A publish to amq.rabbitmq.reply-to.<token> of this channel (False: no such consumer)."""
        if self.state != OPEN or not self.reply_token:
            return False
        tag = self.delivery_tag = self.delivery_tag + 1
        self.conn.write(
            encode_deliver(self.number, self.reply_tag, tag, False, "", rk, raw, body, self.conn.frame_max)
        )
        return True

    # ------------------------------------------------------------------ publishing
    def publish(self, events: list[Any]) -> None:
        """Route the publishes of one read and store them with one send (confirm tags in order)."""
        b = self.broker
        conn = self.conn
        vh = self.vhost
        msgs: list[Any] = []
        queues: set[Queue] = set()
        first = self.pub_seq + 1
        limited: list[tuple[int, Any, int]] = []  # (tag, queues, index of the first copy)
        now = now_ms()
        error: AMQPError | None = None
        try:
            for ev in events:
                m = ev.method
                if m.immediate:
                    raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "immediate=true", class_id=60, method_id=40)
                ex = b.exchange(vh, m.exchange, 60, 40)
                if ex.internal:
                    raise AMQPError(
                        ReplyCode.ACCESS_REFUSED,
                        f"cannot publish to internal exchange '{ex.name}' in vhost '{vh.name}'",
                        class_id=60,
                        method_id=40,
                    )
                body = ev.body
                if ev.dropped or len(body) > b.max_body_size:
                    raise AMQPError(
                        ReplyCode.PRECONDITION_FAILED,
                        f"message size {ev.dropped or len(body)} is larger than configured max size "
                        f"{b.max_body_size}",
                        class_id=60,
                        method_id=40,
                    )
                raw = ev.raw_properties
                flags = flags_of(raw)
                props = ev.properties if flags & (READABLE_FLAGS | FLAG_EXPIRATION | FLAG_USER_ID) else None
                ttl = None
                if props is not None:
                    if props.expiration is not None:
                        ttl = parse_expiration(props.expiration)
                        if ttl is None:
                            raise AMQPError(
                                ReplyCode.PRECONDITION_FAILED,
                                f"invalid expiration '{props.expiration}'",
                                class_id=60,
                                method_id=40,
                            )
                    if props.user_id is not None and props.user_id != (conn.ctx.identity.username or ""):
                        raise AMQPError(
                            ReplyCode.PRECONDITION_FAILED,
                            f"user_id property set to '{props.user_id}' but authenticated user was "
                            f"'{conn.ctx.identity.username or ''}'",
                            class_id=60,
                            method_id=40,
                        )
                rk = m.routing_key
                if props is not None and props.reply_to == REPLY_TO:
                    if not self.reply_token:
                        raise AMQPError(
                            ReplyCode.PRECONDITION_FAILED,
                            "fast reply consumer does not exist",
                            class_id=60,
                            method_id=40,
                        )
                    props.reply_to = f"{REPLY_TO}.{self.reply_token}"
                    raw = encode_properties(props)
                if not ex.name and rk.startswith(REPLY_PREFIX):
                    target = b.reply_channels.get(rk[len(REPLY_PREFIX) :])
                    dest = [] if target is None or not target.deliver_reply(rk, raw, body) else None
                else:
                    dest = b.route(vh, ex, rk, raw)
                if self.confirm:
                    self.pub_seq += 1
                if dest is None:  # delivered straight to a reply consumer
                    continue
                if not dest:
                    if m.mandatory:
                        conn.write(
                            c.encode_return(
                                self.number, 312, "NO_ROUTE", m.exchange, rk, raw, body, conn.frame_max
                            )
                        )
                    continue
                for q in dest:
                    if q.limited:
                        limited.append((self.pub_seq, dest, len(msgs)))
                        break
                msgs.extend(b.copies(dest, ex.name, rk, raw, body, props, ttl, now))
                queues.update(dest)
        except AMQPError as e:
            error = e
        if self.tx:
            if msgs:
                self.tx_msgs.append((msgs, queues))
        elif msgs:
            pend = None
            if self.confirm:
                pend = Confirm(first, self.pub_seq)
                self.confirms.append(pend)
            n = len(events)
            conn.publishes_started(n)
            t = conn.spawn(self._send(msgs, queues, pend, limited, n))
            self.sends.add(t)
            t.add_done_callback(self.sends.discard)
        elif self.confirm and self.pub_seq >= first:
            pend = Confirm(first, self.pub_seq)
            pend.done = True
            self.confirms.append(pend)
            self._flush_confirms()
        if error is not None:
            raise error

    async def _send(
        self,
        msgs: list[Any],
        queues: set[Queue],
        pend: Confirm | None,
        limited: list[tuple[int, Any, int]],
        n: int,
    ) -> None:
        b = self.broker
        try:
            if limited:
                msgs = await self._apply_reject_publish(msgs, limited, pend)
            if msgs:
                await b.send(self.conn.ctx, msgs)
            b.after_publish(queues)
        except ProcessorError as e:
            if pend is not None:
                pend.nacked.update(range(pend.first, pend.last + 1))
            if e.kind in (ErrorKind.FORBIDDEN, ErrorKind.UNAUTHORIZED):
                self.fail(AMQPError(ReplyCode.ACCESS_REFUSED, e.message, class_id=60, method_id=40))
            elif pend is None:
                log.warning("amqp %s: publish failed: %s", self.conn.remote, e)
        finally:
            self.conn.publishes_done(n)
            if pend is not None:
                pend.done = True
                self._flush_confirms()

    async def _apply_reject_publish(
        self, msgs: list[Any], limited: list[tuple[int, Any, int]], pend: Confirm | None
    ) -> list[Any]:
        """x-overflow reject-publish(-dlx): a full queue does not get its copy and the publisher
        gets basic.nack (the other queues still get theirs), as in RabbitMQ."""
        b = self.broker
        room: dict[Queue, int] = {}
        drop: set[int] = set()
        for tag, dest, start in limited:
            for j, q in enumerate(dest):
                if not q.limited:
                    continue
                if q not in room:
                    room[q] = q.max_length - await b.ready_count(q)
                if room[q] <= 0:
                    drop.add(start + j)
                    if pend is not None:
                        pend.nacked.add(tag)
                else:
                    room[q] -= 1
        return [m for i, m in enumerate(msgs) if i not in drop] if drop else msgs

    def _flush_confirms(self) -> None:
        if self.state != OPEN:
            self.confirms.clear()
            return
        q = self.confirms
        write = self.conn.write
        ch = self.number
        upto = 0
        while q and q[0].done:
            pend = q.popleft()
            if not pend.nacked:
                upto = pend.last
                continue
            for tag in range(pend.first, pend.last + 1):
                if tag in pend.nacked:
                    if upto:
                        write(encode_basic_ack(ch, upto, True))
                        upto = 0
                    write(encode_basic_nack(ch, tag, False, False))
                else:
                    upto = tag
        if upto:
            write(encode_basic_ack(ch, upto, True))

    # ------------------------------------------------------------------ confirm and tx
    def _confirm_select(self, m: c.ConfirmSelect) -> None:
        if self.tx:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                "cannot switch from tx to confirm mode",
                class_id=85,
                method_id=10,
            )
        self.confirm = True
        if not m.nowait:
            self.reply(c.ConfirmSelectOk())

    def _tx_select(self, m: c.TxSelect) -> None:
        if self.confirm:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                "cannot switch from confirm to tx mode",
                class_id=90,
                method_id=10,
            )
        self.tx = True
        self.reply(c.TxSelectOk())

    def _tx_commit(self, m: c.TxCommit) -> Any:
        if not self.tx:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, "channel is not transactional", class_id=90, method_id=20
            )
        pubs, self.tx_msgs = self.tx_msgs, []
        acks, self.tx_acks = self.tx_acks, []

        async def run() -> None:
            msgs = [m for batch, _ in pubs for m in batch]
            queues: set[Queue] = set()
            for _, qs in pubs:
                queues |= qs
            if msgs:
                try:
                    await self.broker.send(self.conn.ctx, msgs)
                except ProcessorError as e:
                    raise AMQPError(
                        ReplyCode.INTERNAL_ERROR, f"commit failed: {e.message}", class_id=90, method_id=20
                    ) from None
                self.broker.after_publish(queues)
            self.tx = False  # settle for real, then back to transactional
            try:
                for a in acks:
                    t = type(a)
                    action = ACK if t is c.BasicAck else REQUEUE if a.requeue else REJECT
                    with contextlib.suppress(AMQPError):  # settled meanwhile (e.g. recover)
                        for rec in self._take(a):
                            self._settle(rec, action)
            finally:
                self.tx = True
            self.reply(c.TxCommitOk())

        return run()

    def _tx_rollback(self, m: c.TxRollback) -> None:
        if not self.tx:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, "channel is not transactional", class_id=90, method_id=30
            )
        self.tx_msgs.clear()
        self.tx_acks.clear()
        self.reply(c.TxRollbackOk())
