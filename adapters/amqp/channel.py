"""One AMQP channel: methods are handled in arrival order (a method that needs the store or the
key-value table holds the ones after it in a backlog until it is done). A channel owns its
Publisher (publish.py: basic.publish, confirms), its Declaring (declaring.py: exchange.* and
queue.* methods) and its DirectReplyTo (reply_to.py); consumers are DeliveryLoops (consumer.py);
basic.get / ack / nack / reject / recover, unacked deliveries and transactions are handled here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from messaging_processor import Action, ProcessorError, Resource

from . import codec as c
from . import events
from .codec import AMQPError, ReplyCode, encode_method
from .consumer import (
    ACK,
    CLOSED,
    CLOSING,
    OPEN,
    REJECT,
    REQUEUE,
    Consumer,
    ConsumerBroker,
    ConsumerConnection,
    Unacked,
)
from .declaring import ChannelDeclaringConnection, Declaring
from .mapping import expires_at, now_ms, present, store_name
from .publish import PublishAcl, Publisher, PublishingConnection
from .reply_to import REPLY_TO, DirectReplyTo
from .streams import check_consume, refuse_get

if TYPE_CHECKING:
    from messaging_processor.client_events import ClientEvents

    from .lifetimes import QueueLifetimes
    from .queue_store import QueueStore
    from .queue_work import QueueWork
    from .registry import DeclaringConnection, Registry
    from .routing import VHost

__all__ = ["CLOSED", "CLOSING", "OPEN", "Channel", "Consumer"]

log = logging.getLogger("adapters.amqp")


class ChannelBroker(ConsumerBroker, Protocol):
    """What a channel and its consumers use of the broker (broker.py `Broker`), not imported."""

    work: QueueWork
    lifetimes: QueueLifetimes
    queue_store: QueueStore
    registry: Registry
    reply_channels: dict[str, DirectReplyTo]  # direct reply-to tokens
    max_body_size: int
    consumer_timeout_ms: int
    events: ClientEvents | None

    async def authorize(
        self,
        conn: DeclaringConnection,
        action: Action,
        resource: Resource,
        cls: int,
        mid: int,
        what: str = "",
    ) -> None: ...


class ChannelConnection(ConsumerConnection, PublishingConnection, ChannelDeclaringConnection, Protocol):
    """What a channel and its parts use of its connection (session.py `Connection`), not imported."""

    broker: ChannelBroker  # type: ignore[assignment]  (the declarations' view of it is narrower)
    vhost_obj: VHost | None
    publish_acl: PublishAcl | None
    cancel_notify: bool  # the client takes basic.cancel from the server
    messages_in: int

    def fail(self, e: AMQPError) -> None: ...
    def channel_closed(self, ch: Channel) -> None: ...


class Channel:
    def __init__(self, conn: ChannelConnection, number: int) -> None:
        b = conn.broker
        vh = conn.vhost_obj
        assert vh is not None  # channels are opened on open connections
        self.conn = conn
        self.number = number
        self.broker = b
        self.work = b.work
        self.lifetimes = b.lifetimes
        self.state = OPEN
        self.backlog: deque[Any] | None = None
        self.tx = False  # tx.select: publishes (in the publisher) and settlements wait for tx.commit
        self.tx_acks: list[Any] = []
        self.consumers: dict[str, Consumer] = {}
        self.unacked: dict[int, Unacked] = {}
        self.delivery_tag = 0
        self.prefetch = 0
        self.global_prefetch = 0
        self.room = asyncio.Event()
        self.replies = DirectReplyTo(b.reply_channels, self._deliver_reply)
        acl = conn.publish_acl.allows if conn.publish_acl is not None else None
        ready = b.queue_store.ready_count
        self.publisher = Publisher(
            conn, number, vh, b.work, ready, self.replies, b.max_body_size, self.fail, acl, b.registry
        )
        self.declaring = Declaring(conn, vh, b.registry, b.queue_store, self.reply, self.publisher.wait_sends)
        self._publish = self.publisher.publish

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
            self.conn.messages_in += len(item)
            return self._publish(item, self.tx)
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
        self.publisher.release()
        self.tx_acks.clear()
        self.room.set()
        self.replies.release()

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
            tag = self.replies.consume(m, self.consumers)
            if not m.nowait:
                self.reply(c.BasicConsumeOk(tag))
            return None

        async def run() -> None:
            b = self.broker
            await self._may_read(m.queue, 20)
            q = await self.declaring.queue(m.queue, 60, 20)
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
            if not b.secured:  # (with security on: checked above, by name, before the queue is looked up)
                await b.authorize(self.conn, Action.SUBSCRIBE, Resource("topic", q.topic), 60, 20)
                await b.authorize(self.conn, Action.SUBSCRIBE, Resource("group", q.group), 60, 20)
            if q.deleted or self.state != OPEN:
                raise AMQPError(
                    ReplyCode.NOT_FOUND,
                    f"no queue '{q.name}' in vhost '{q.vhost}'",
                    class_id=60,
                    method_id=20,
                )
            cursor = None
            if q.stream:  # each consumer reads the stream from its x-stream-offset (streams.py)
                check_consume(q, m.no_ack, self.prefetch)
                cursor = q.feed.cursor(self.conn.pop_ctx, m.arguments)  # type: ignore[union-attr]
                await cursor.begin()
                if q.deleted or self.state != OPEN:
                    q.feed.forget(cursor)  # type: ignore[union-attr]
                    raise AMQPError(
                        ReplyCode.NOT_FOUND,
                        f"no queue '{q.name}' in vhost '{q.vhost}'",
                        class_id=60,
                        method_id=20,
                    )
            cons = Consumer(self, tag, q, m.no_ack, m.exclusive, self.prefetch, cursor)
            self.consumers[tag] = cons
            q.consumers.append(cons)
            self.lifetimes.consumer_added(q)
            if b.events is not None:
                events.consumer_created(self.conn, cons)
            if not m.nowait:
                self.reply(c.BasicConsumeOk(tag))
            if not q.single_active or q.consumers[0] is cons:
                cons.start()

        return run()

    async def _may_read(self, queue: str, mid: int) -> None:
        """With security on, basic.consume / basic.get need `subscribe` on the queue's topic, checked
        before the queue is looked up (a refused user does not learn whether it exists). The queue's
        store group is the mapping's own (one per queue, named like it), so no group rule is needed:
        consumers pop with the connection's `pop_ctx`."""
        b = self.broker
        if b.secured:
            name = self.declaring.queue_name(queue, 60, mid)
            topic = store_name(self.declaring.vhost.name, name)
            await b.authorize(
                self.conn, Action.SUBSCRIBE, Resource("topic", topic), 60, mid, f"queue '{name}'"
            )

    def _remove_consumer(self, cons: Consumer) -> None:
        q = cons.queue
        active = bool(q.consumers) and q.consumers[0] is cons
        if cons in q.consumers:
            q.consumers.remove(cons)
        self.consumers.pop(cons.tag, None)
        self.conn.spawn(cons.stop())
        if q.single_active and active and q.consumers:
            q.consumers[0].start()
        self.lifetimes.consumer_removed(q)
        if self.broker.events is not None:
            events.consumer_deleted(self.conn, cons)

    def _cancel(self, m: c.BasicCancel) -> None:
        self.replies.cancel(m.consumer_tag)
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
            ctx = self.conn.pop_ctx
            await self._may_read(m.queue, 70)
            q = await self.declaring.queue(m.queue, 60, 70)
            if q.stream:
                refuse_get(q)
            p = q.feed or b.processor
            if not b.secured:
                await b.authorize(self.conn, Action.SUBSCRIBE, Resource("topic", q.topic), 60, 70)
            await self.publisher.wait_sends()
            self.lifetimes.touch(q)
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
                await self.work.dead_letter(q, d.message, reason)
                await p.ack(ctx, d.receipt_handle)
            n = await b.queue_store.ready_count(q)
            if self.state != OPEN:
                await self.work.requeue(ctx, q, d.receipt_handle)
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
            self._take(m, False)  # validate now, settle at commit
            self.tx_acks.append(m)
            return
        t = type(m)
        action = ACK if t is c.BasicAck else REQUEUE if m.requeue else REJECT
        self._settle_all(self._take(m, True), action)

    def _take(self, m: Any, remove: bool) -> list[Unacked]:
        """The unacked deliveries a basic.ack / nack / reject names (removed from the unacked ones
        if `remove`); 406 for an unknown tag."""
        un = self.unacked
        tag = m.delivery_tag
        multiple = getattr(m, "multiple", False)
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

    def _settle_all(self, recs: list[Unacked], action: int) -> None:
        """Settle what one basic.ack / nack / reject named; basic.get's deliveries acked here go to
        the store with one ack_many (a consumer's go back to its delivery loop, which does the same)."""
        got: list[Unacked] = []
        for rec in recs:
            fut = rec.fut
            if fut is not None and not fut.done():
                fut.set_result(action)  # its consumer's handler settles it
            elif action == ACK:
                got.append(rec)
            else:
                self.conn.spawn(self.work.settle(self.conn.ctx, rec, action))
        if got:
            self.conn.spawn(self.work.ack_all(self.conn.ctx, got))

    def _settle(self, rec: Unacked, action: int) -> None:
        fut = rec.fut
        if fut is not None and not fut.done():
            fut.set_result(action)  # its consumer's handler settles it
        else:
            self.conn.spawn(self.work.settle(self.conn.ctx, rec, action))

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
            if rec.deadline - now < b.invisible_time_ms // 2 and rec.queue.feed is None:
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

    # ------------------------------------------------------------------ direct reply-to
    def _deliver_reply(self, consumer_tag: str, rk: str, raw: bytes, body: bytes) -> bool:
        """A reply to this channel's reply consumer (False when the channel is not open)."""
        if self.state != OPEN:
            return False
        tag = self.delivery_tag = self.delivery_tag + 1
        self.conn.write(
            c.encode_deliver(self.number, consumer_tag, tag, False, "", rk, raw, body, self.conn.frame_max)
        )
        return True

    # ------------------------------------------------------------------ confirm and tx
    def _confirm_select(self, m: c.ConfirmSelect) -> None:
        if self.tx:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                "cannot switch from tx to confirm mode",
                class_id=85,
                method_id=10,
            )
        self.publisher.confirm = True
        if not m.nowait:
            self.reply(c.ConfirmSelectOk())

    def _tx_select(self, m: c.TxSelect) -> None:
        if self.publisher.confirm:
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
        pubs = self.publisher.take_tx()
        acks, self.tx_acks = self.tx_acks, []

        async def run() -> None:
            await self.publisher.commit(pubs)
            for a in acks:  # settled for real now
                action = ACK if type(a) is c.BasicAck else REQUEUE if a.requeue else REJECT
                with contextlib.suppress(AMQPError):  # settled meanwhile (e.g. recover)
                    self._settle_all(self._take(a, True), action)
            self.reply(c.TxCommitOk())

        return run()

    def _tx_rollback(self, m: c.TxRollback) -> None:
        if not self.tx:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED, "channel is not transactional", class_id=90, method_id=30
            )
        self.publisher.rollback()
        self.tx_acks.clear()
        self.reply(c.TxRollbackOk())

    def _access_request(self, m: c.AccessRequest) -> None:
        self.reply(c.AccessRequestOk(1))

    def _unexpected_close_ok(self, m: c.ChannelCloseOk) -> None:
        pass


def _declaring(f: Callable[[Declaring, Any], Any]) -> Callable[[Channel, Any], Any]:
    return lambda ch, m: f(ch.declaring, m)


_HANDLERS: dict[type, Any] = {
    c.ChannelClose: Channel._close,
    c.ChannelCloseOk: Channel._unexpected_close_ok,
    c.ChannelFlow: Channel._flow,
    c.ChannelFlowOk: lambda self, m: None,
    c.AccessRequest: Channel._access_request,
    c.ExchangeDeclare: _declaring(Declaring.exchange_declare),
    c.ExchangeDelete: _declaring(Declaring.exchange_delete),
    c.ExchangeBind: _declaring(Declaring.exchange_bind),
    c.ExchangeUnbind: _declaring(Declaring.exchange_bind),
    c.QueueDeclare: _declaring(Declaring.queue_declare),
    c.QueueBind: _declaring(Declaring.queue_bind),
    c.QueueUnbind: _declaring(Declaring.queue_bind),
    c.QueuePurge: _declaring(Declaring.queue_purge),
    c.QueueDelete: _declaring(Declaring.queue_delete),
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
