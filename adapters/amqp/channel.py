"""One AMQP channel: methods are handled in arrival order (a method that needs the store or the
key-value table holds the ones after it in a backlog until it is done). Declarations go to the
broker, consumers are DeliveryLoops (consumer.py), basic.get / ack / nack / reject / recover are
settled here; publishing, confirms, transactions and direct reply-to are in publish.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from typing import TYPE_CHECKING, Any

from messaging_processor import Action, ProcessorError, Resource

from . import codec as c
from .codec import AMQPError, ReplyCode, encode_method
from .consumer import ACK, CLOSED, CLOSING, OPEN, REJECT, REQUEUE, Consumer, Unacked
from .mapping import expires_at, now_ms, present
from .publish import REPLY_TO, Confirm, Publishing

if TYPE_CHECKING:
    from .broker import Broker
    from .queues import Queue
    from .session import Connection

__all__ = ["CLOSED", "CLOSING", "OPEN", "Channel", "Consumer"]

log = logging.getLogger("adapters.amqp")


class Channel(Publishing):
    def __init__(self, conn: Connection, number: int) -> None:
        self.conn = conn
        self.number = number
        self.broker: Broker = conn.broker
        self.vhost = conn.vhost_obj
        self.state = OPEN
        self.backlog: deque[Any] | None = None
        self.confirm = False
        self.pub_seq = 0
        self.confirms: deque[Confirm] = deque()
        self.tx = False
        self.tx_msgs: list[tuple[Any, list, set]] = []  # (messages, queues)
        self.tx_acks: list[Any] = []
        self.consumers: dict[str, Consumer] = {}
        self.unacked: dict[int, Unacked] = {}
        self.delivery_tag = 0
        self.prefetch = 0
        self.global_prefetch = 0
        self.room = asyncio.Event()
        self.last_queue = ""
        self.sends: set[asyncio.Task] = set()
        self.reply_token = ""  # direct reply-to: the token of this channel's reply consumer
        self.reply_tag = ""

    # ------------------------------------------------------------------ ordered processing
    def handle(self, item: Any) -> None:
        """A Method event, or a list of basic.publish Message events of one read."""
        if self.state != OPEN:
            return
        if self.backlog is not None:
            self.backlog.append(item)
            return
        try:
            r = self._dispatch(item)
        except AMQPError as e:
            self.fail(e)
            return
        if r is not None:
            self.backlog = deque()
            self.conn.spawn(self._drain(r))

    async def _drain(self, first: Any) -> None:
        r = first
        while True:
            try:
                if r is not None:
                    await r
            except AMQPError as e:
                self.fail(e)
                return
            except ProcessorError as e:
                self.fail(AMQPError(ReplyCode.INTERNAL_ERROR, e.message))
                return
            except Exception as e:  # noqa: BLE001 - a bug must not leave the channel stuck
                log.exception("amqp %s channel %d: request failed", self.conn.remote, self.number)
                self.fail(AMQPError(ReplyCode.INTERNAL_ERROR, f"{type(e).__name__}: {e}"))
                return
            bl = self.backlog
            if not bl or self.state != OPEN:
                self.backlog = None
                return
            try:
                r = self._dispatch(bl.popleft())
            except AMQPError as e:
                self.fail(e)
                return

    def fail(self, e: AMQPError) -> None:
        """A channel error closes this channel (channel.close); others the connection."""
        e.channel = self.number
        if not e.soft:
            self.conn.fail(e)
            return
        if self.state != OPEN:
            return
        log.info("amqp %s channel %d: %s", self.conn.remote, self.number, e)
        self.conn.write(e.response())
        self.state = CLOSING
        self.backlog = None
        self.release()

    def _dispatch(self, item: Any) -> Any:
        if type(item) is list:
            return self.publish(item)
        m = item.method
        h = _HANDLERS.get(type(m))
        if h is None:
            raise AMQPError(
                ReplyCode.COMMAND_INVALID,
                f"{m.NAME} is not expected here",
                class_id=m.CLASS_ID,
                method_id=m.METHOD_ID,
            )
        return h(self, m)

    def reply(self, method: Any) -> None:
        if self.state == OPEN:  # an operation that finished after the channel closed says nothing
            self.conn.write(encode_method(self.number, method))

    # ------------------------------------------------------------------ channel class
    def _close(self, m: c.ChannelClose) -> None:
        self.release()
        self.state = CLOSED
        self.conn.write(encode_method(self.number, c.ChannelCloseOk()))
        self.conn.channel_closed(self)

    def _flow(self, m: c.ChannelFlow) -> None:
        if not m.active:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "active=false", class_id=20, method_id=20)
        self.reply(c.ChannelFlowOk(True))

    def release(self) -> None:
        """The channel ends: its consumers stop, unacked deliveries go back to their queues."""
        for cons in list(self.consumers.values()):
            self._remove_consumer(cons)
        self.consumers.clear()
        for rec in self.unacked.values():
            self._settle(rec, REQUEUE)
        self.unacked.clear()
        self.tx_msgs.clear()
        self.tx_acks.clear()
        self.confirms.clear()
        self.room.set()
        self._reply_release()

    # ------------------------------------------------------------------ exchange class
    def _exchange_declare(self, m: c.ExchangeDeclare) -> Any:
        async def run() -> None:
            await self.broker.declare_exchange(
                self.conn,
                self.vhost,
                m.exchange,
                m.type,
                m.passive,
                m.durable,
                m.auto_delete,
                m.internal,
                m.arguments,
            )
            if not m.nowait:
                self.reply(c.ExchangeDeclareOk())

        return run()

    def _exchange_delete(self, m: c.ExchangeDelete) -> Any:
        async def run() -> None:
            await self.broker.delete_exchange(self.conn, self.vhost, m.exchange, m.if_unused)
            if not m.nowait:
                self.reply(c.ExchangeDeleteOk())

        return run()

    def _exchange_bind(self, m: c.ExchangeBind | c.ExchangeUnbind) -> Any:
        bind = type(m) is c.ExchangeBind

        async def run() -> None:
            dest = await self.broker.find_exchange(self.vhost, m.destination, 40, 30 if bind else 40)
            if not dest.name:
                raise AMQPError(
                    ReplyCode.ACCESS_REFUSED,
                    "operation not permitted on the default exchange",
                    class_id=40,
                    method_id=30,
                )
            if bind:
                await self.broker.bind(self.conn, self.vhost, dest, m.source, m.routing_key, m.arguments, 40)
            else:
                await self.broker.unbind(
                    self.conn, self.vhost, dest, m.source, m.routing_key, m.arguments, 40
                )
            if not m.nowait:
                self.reply(c.ExchangeBindOk() if bind else c.ExchangeUnbindOk())

        return run()

    # ------------------------------------------------------------------ queue class
    def _queue_name(self, name: str, cls: int, mid: int) -> str:
        if name:
            return name
        if not self.last_queue:
            raise AMQPError(ReplyCode.NOT_FOUND, "no previously declared queue", class_id=cls, method_id=mid)
        return self.last_queue

    async def _queue(self, name: str, cls: int, mid: int) -> Queue:
        return await self.broker.find_queue(self.conn, self.vhost, self._queue_name(name, cls, mid), cls, mid)

    async def _wait_sends(self) -> None:
        """Let this channel's publishes in flight reach the store (they were published before)."""
        if self.sends:
            await asyncio.gather(*self.sends, return_exceptions=True)

    def _queue_declare(self, m: c.QueueDeclare) -> Any:
        async def run() -> None:
            name = m.queue if (m.queue or not m.passive) else self._queue_name("", 50, 10)
            q = await self.broker.declare_queue(
                self.conn, self.vhost, name, m.passive, m.durable, m.exclusive, m.auto_delete, m.arguments
            )
            self.last_queue = q.name
            if q.exclusive and self.conn.ended:  # its connection ended meanwhile
                self.broker.drop_later(q)
            if not m.nowait:
                await self._wait_sends()
                n = await self.broker.ready_count(q)
                self.reply(c.QueueDeclareOk(q.name, n, len(q.consumers)))

        return run()

    def _queue_bind(self, m: c.QueueBind | c.QueueUnbind) -> Any:
        bind = type(m) is c.QueueBind

        async def run() -> None:
            q = await self._queue(m.queue, 50, 20 if bind else 50)
            if bind:
                await self.broker.bind(self.conn, self.vhost, q, m.exchange, m.routing_key, m.arguments, 50)
                if not m.nowait:
                    self.reply(c.QueueBindOk())
            else:
                await self.broker.unbind(self.conn, self.vhost, q, m.exchange, m.routing_key, m.arguments, 50)
                self.reply(c.QueueUnbindOk())

        return run()

    def _queue_purge(self, m: c.QueuePurge) -> Any:
        async def run() -> None:
            q = await self._queue(m.queue, 50, 30)
            await self._wait_sends()
            n = await self.broker.purge(q)
            if not m.nowait:
                self.reply(c.QueuePurgeOk(n))

        return run()

    def _queue_delete(self, m: c.QueueDelete) -> Any:
        async def run() -> None:
            name = self._queue_name(m.queue, 50, 40)
            await self._wait_sends()
            n = await self.broker.delete_queue(self.conn, self.vhost, name, m.if_unused, m.if_empty)
            if not m.nowait:
                self.reply(c.QueueDeleteOk(n))

        return run()

    # ------------------------------------------------------------------ basic: qos, consume, cancel
    def _qos(self, m: c.BasicQos) -> None:
        if m.prefetch_size:
            raise AMQPError(
                ReplyCode.NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", class_id=60, method_id=10
            )
        if m.global_:
            self.global_prefetch = m.prefetch_count
            for cons in self.consumers.values():
                if cons.loop is not None:
                    cons.loop.max_inflight = cons.max_inflight()
            self.room.set()
        else:
            self.prefetch = m.prefetch_count
        self.reply(c.BasicQosOk())

    def _consume(self, m: c.BasicConsume) -> Any:
        if m.queue == REPLY_TO:
            return self._reply_consume(m)

        async def run() -> None:
            b = self.broker
            q = await self._queue(m.queue, 60, 20)
            tag = m.consumer_tag or "amq.ctag-" + os.urandom(16).hex()
            if tag in self.consumers:
                raise AMQPError(
                    ReplyCode.NOT_ALLOWED,
                    f"attempt to reuse consumer tag '{tag}'",
                    class_id=60,
                    method_id=20,
                )
            if q.consumers and (m.exclusive or any(x.exclusive for x in q.consumers)):
                raise AMQPError(
                    ReplyCode.ACCESS_REFUSED,
                    f"queue '{q.name}' in vhost '{q.vhost}' in exclusive use",
                    class_id=60,
                    method_id=20,
                )
            await b.authorize(self.conn, Action.SUBSCRIBE, Resource("topic", q.topic), 60, 20)
            await b.authorize(self.conn, Action.SUBSCRIBE, Resource("group", q.group), 60, 20)
            if q.deleted or self.state != OPEN:
                raise AMQPError(
                    ReplyCode.NOT_FOUND,
                    f"no queue '{q.name}' in vhost '{q.vhost}'",
                    class_id=60,
                    method_id=20,
                )
            cons = Consumer(self, tag, q, m.no_ack, m.exclusive, self.prefetch)
            self.consumers[tag] = cons
            q.consumers.append(cons)
            b.consumer_added(q)
            if not m.nowait:
                self.reply(c.BasicConsumeOk(tag))
            if not q.single_active or q.consumers[0] is cons:
                cons.start()

        return run()

    def _remove_consumer(self, cons: Consumer) -> None:
        q = cons.queue
        active = bool(q.consumers) and q.consumers[0] is cons
        if cons in q.consumers:
            q.consumers.remove(cons)
        self.consumers.pop(cons.tag, None)
        self.conn.spawn(cons.stop())
        if q.single_active and active and q.consumers:
            q.consumers[0].start()
        self.broker.consumer_removed(q)

    def _cancel(self, m: c.BasicCancel) -> None:
        if self.reply_token and m.consumer_tag == self.reply_tag:
            self._reply_release()
        cons = self.consumers.get(m.consumer_tag)
        if cons is not None:
            self._remove_consumer(cons)
        if not m.nowait:
            self.reply(c.BasicCancelOk(m.consumer_tag))

    def server_cancel(self, cons: Consumer) -> None:
        """The queue went away: basic.cancel to the client (consumer_cancel_notify)."""
        if self.consumers.get(cons.tag) is not cons:
            return
        self._remove_consumer(cons)
        if self.state == OPEN and self.conn.cancel_notify:
            self.reply(c.BasicCancel(cons.tag, True))

    # ------------------------------------------------------------------ basic.get
    def _get(self, m: c.BasicGet) -> Any:
        async def run() -> None:
            b = self.broker
            p = b.processor
            ctx = self.conn.ctx
            q = await self._queue(m.queue, 60, 70)
            await b.authorize(self.conn, Action.SUBSCRIBE, Resource("topic", q.topic), 60, 70)
            await self._wait_sends()
            b.touch(q)
            while True:
                ds = await p.pop(ctx, q.group, q.topic, max_messages=1, invisible_time_ms=b.invisible_time_ms)
                if not ds:
                    self.reply(c.BasicGetEmpty())
                    return
                d = ds[0]
                exp = expires_at(d.message)
                reason = "expired" if exp and exp <= now_ms() else ""
                if q.delivery_limit is not None and d.delivery_attempt - 1 > q.delivery_limit:
                    reason = "delivery_limit"
                if not reason:
                    break
                await b.dead_letter(q, d.message, reason)
                await p.ack(ctx, d.receipt_handle)
            n = await b.ready_count(q)
            if self.state != OPEN:
                await self.requeue_handle(d.receipt_handle)
                return
            tag = self.delivery_tag = self.delivery_tag + 1
            ex, rk, raw = present(d.message)
            self.conn.write(
                c.encode_get_ok(
                    self.number,
                    tag,
                    d.delivery_attempt > 1,
                    ex,
                    rk,
                    n,
                    raw,
                    d.message.body,
                    self.conn.frame_max,
                )
            )
            if m.no_ack:
                await p.ack(ctx, d.receipt_handle)
            else:
                self.unacked[tag] = Unacked(tag, d, q, None, now_ms())

        return run()

    # ------------------------------------------------------------------ settlement
    def _ack(self, m: Any) -> None:
        if self.tx:
            self._take(m)  # validate now, settle at commit
            self.tx_acks.append(m)
            return
        t = type(m)
        action = ACK if t is c.BasicAck else REQUEUE if m.requeue else REJECT
        for rec in self._take(m):
            self._settle(rec, action)

    def _take(self, m: Any) -> list[Unacked]:
        """The unacked deliveries a basic.ack / nack / reject names (removed unless in a tx);
        406 for an unknown tag."""
        un = self.unacked
        tag = m.delivery_tag
        multiple = getattr(m, "multiple", False)
        remove = not self.tx
        if multiple:
            if tag and tag not in un:
                raise self._unknown_tag(m, tag)
            recs = []
            for t, rec in un.items():
                if tag and t > tag:
                    break
                recs.append(rec)
            if remove:
                for rec in recs:
                    del un[rec.tag]
        else:
            rec = un.pop(tag, None) if remove else un.get(tag)
            if rec is None:
                raise self._unknown_tag(m, tag)
            recs = [rec]
        if remove and self.global_prefetch:
            self.room.set()
        return recs

    def _unknown_tag(self, m: Any, tag: int) -> AMQPError:
        return AMQPError(
            ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {tag}", class_id=60, method_id=m.METHOD_ID
        )

    def _settle(self, rec: Unacked, action: int) -> None:
        fut = rec.fut
        if fut is not None and not fut.done():
            fut.set_result(action)
        else:
            self.conn.spawn(self.perform(rec, action))

    async def perform(self, rec: Unacked, action: int) -> None:
        b = self.broker
        p = b.processor
        ctx = self.conn.ctx
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
                    await b.dead_letter(rec.queue, rec.message, reason)
                except ProcessorError as e:
                    log.warning("amqp: dead-lettering from %r failed: %s; requeued", rec.queue.name, e)
                    await p.change_invisible_time(ctx, rec.handle, 0)
                    return
                await p.ack(ctx, rec.handle)
        except ProcessorError as e:  # e.g. purged or deleted meanwhile
            log.debug("amqp: settling delivery %d failed: %s", rec.tag, e)

    async def requeue_handle(self, handle: str) -> None:
        with contextlib.suppress(ProcessorError):
            await self.broker.processor.change_invisible_time(self.conn.ctx, handle, 0)

    def _recover(self, m: c.BasicRecover | c.BasicRecoverAsync) -> None:
        if not m.requeue:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "requeue=false", class_id=60, method_id=m.METHOD_ID)
        for rec in self.unacked.values():
            self._settle(rec, REQUEUE)
        self.unacked.clear()
        self.room.set()
        if type(m) is c.BasicRecover:
            self.reply(c.BasicRecoverOk())

    def renew(self, now: int) -> None:
        """Keep unacked deliveries invisible while the client holds them; close the channel when
        one is held longer than the consumer timeout (RabbitMQ's consumer_timeout)."""
        b = self.broker
        for rec in list(self.unacked.values()):
            if now - rec.delivered > b.consumer_timeout_ms:
                self.fail(
                    AMQPError(
                        ReplyCode.PRECONDITION_FAILED,
                        f"delivery acknowledgement on channel {self.number} timed out. "
                        f"Timeout value used: {b.consumer_timeout_ms} ms",
                    )
                )
                return
            if rec.deadline - now < b.invisible_time_ms // 2:
                self.conn.spawn(self._renew(rec))

    async def _renew(self, rec: Unacked) -> None:
        b = self.broker
        try:
            rec.handle = await b.processor.change_invisible_time(
                self.conn.ctx, rec.handle, b.invisible_time_ms
            )
            rec.deadline = now_ms() + b.invisible_time_ms
        except ProcessorError:
            pass

    def _access_request(self, m: c.AccessRequest) -> None:
        self.reply(c.AccessRequestOk(1))

    def _unexpected_close_ok(self, m: c.ChannelCloseOk) -> None:
        pass


_HANDLERS: dict[type, Any] = {
    c.ChannelClose: Channel._close,
    c.ChannelCloseOk: Channel._unexpected_close_ok,
    c.ChannelFlow: Channel._flow,
    c.ChannelFlowOk: lambda self, m: None,
    c.AccessRequest: Channel._access_request,
    c.ExchangeDeclare: Channel._exchange_declare,
    c.ExchangeDelete: Channel._exchange_delete,
    c.ExchangeBind: Channel._exchange_bind,
    c.ExchangeUnbind: Channel._exchange_bind,
    c.QueueDeclare: Channel._queue_declare,
    c.QueueBind: Channel._queue_bind,
    c.QueueUnbind: Channel._queue_bind,
    c.QueuePurge: Channel._queue_purge,
    c.QueueDelete: Channel._queue_delete,
    c.BasicQos: Channel._qos,
    c.BasicConsume: Channel._consume,
    c.BasicCancel: Channel._cancel,
    c.BasicGet: Channel._get,
    c.BasicAck: Channel._ack,
    c.BasicNack: Channel._ack,
    c.BasicReject: Channel._ack,
    c.BasicRecover: Channel._recover,
    c.BasicRecoverAsync: Channel._recover,
    c.ConfirmSelect: Channel._confirm_select,
    c.TxSelect: Channel._tx_select,
    c.TxCommit: Channel._tx_commit,
    c.TxRollback: Channel._tx_rollback,
}
