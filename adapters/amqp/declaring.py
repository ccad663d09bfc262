"""A channel's exchange.* and queue.* methods (declare, delete, bind, unbind, purge) over the
broker's registry, and the channel's last declared queue (what the empty queue name means)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from messaging_processor import Action, Resource

from . import codec as c
from .codec import AMQPError, ReplyCode
from .mapping import store_name
from .queue_store import QueueStore
from .queues import Queue
from .registry import DeclaringConnection, Registry
from .routing import VHost
from .streams import attach, check_declare, declares_stream


class _Secured(Protocol):
    secured: bool  # authentication and the ACL are on (broker.py `Broker`)


class ChannelDeclaringConnection(DeclaringConnection, Protocol):
    """What a channel's declarations use of its connection (session.py `Connection`)."""

    @property
    def broker(self) -> _Secured: ...

    @property
    def ended(self) -> bool: ...


class Declaring:
    __slots__ = ("conn", "vhost", "registry", "queue_store", "reply", "wait_sends", "last_queue")

    def __init__(
        self,
        conn: ChannelDeclaringConnection,
        vhost: VHost,
        registry: Registry,
        queue_store: QueueStore,
        reply: Callable[[Any], None],
        wait_sends: Callable[[], Awaitable[None]],
    ) -> None:
        self.conn = conn
        self.vhost = vhost
        self.registry = registry
        self.queue_store = queue_store
        self.reply = reply  # the channel's reply (nothing once it is closed)
        self.wait_sends = wait_sends  # the channel's publishes in flight reach the store
        self.last_queue = ""

    def queue_name(self, name: str, cls: int, mid: int) -> str:
        if name:
            return name
        if not self.last_queue:
            raise AMQPError(ReplyCode.NOT_FOUND, "no previously declared queue", class_id=cls, method_id=mid)
        return self.last_queue

    async def queue(self, name: str, cls: int, mid: int) -> Queue:
        """The queue a method names (404, 405 as `Registry.find_queue`)."""
        q = await self.registry.find_queue(self.conn, self.vhost, self.queue_name(name, cls, mid), cls, mid)
        qs = self.queue_store
        return attach(q, qs.processor, qs.ctx) if q.stream else q

    async def may_bind(self, dest: str, topic: str, source: str, cls: int, mid: int) -> None:
        """(Un)binding needs `admin` on the destination (queue `topic` or exchange) and `subscribe`
        on the source exchange (RabbitMQ: write on the destination, read on the source)."""
        auth = self.registry.authorize
        await auth(self.conn, Action.ADMIN, Resource("topic", topic), cls, mid, dest)
        await auth(self.conn, Action.SUBSCRIBE, Resource("topic", source), cls, mid, f"exchange '{source}'")

    # ------------------------------------------------------------------ exchange class
    async def exchange_declare(self, m: c.ExchangeDeclare) -> None:
        await self.registry.declare_exchange(
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

    async def exchange_delete(self, m: c.ExchangeDelete) -> None:
        await self.registry.delete_exchange(self.conn, self.vhost, m.exchange, m.if_unused)
        if not m.nowait:
            self.reply(c.ExchangeDeleteOk())

    async def exchange_bind(self, m: c.ExchangeBind | c.ExchangeUnbind) -> None:
        bind = type(m) is c.ExchangeBind
        r = self.registry
        mid = 30 if bind else 40
        if self.conn.broker.secured:
            await self.may_bind(f"exchange '{m.destination}'", m.destination, m.source, 40, mid)
        if bind:
            dest = await r.find_exchange(self.vhost, m.destination, 40, mid)
        else:
            dest = await _or_none(r.find_exchange(self.vhost, m.destination, 40, mid))
            if dest is None:
                if not m.nowait:
                    self.reply(c.ExchangeUnbindOk())
                return
        if not dest.name:
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                "operation not permitted on the default exchange",
                class_id=40,
                method_id=30,
            )
        if bind:
            await r.bind(self.conn, self.vhost, dest, m.source, m.routing_key, m.arguments, 40)
        else:
            await r.unbind(self.conn, self.vhost, dest, m.source, m.routing_key, m.arguments, 40)
        if not m.nowait:
            self.reply(c.ExchangeBindOk() if bind else c.ExchangeUnbindOk())

    # ------------------------------------------------------------------ queue class
    async def queue_declare(self, m: c.QueueDeclare) -> None:
        name = m.queue if (m.queue or not m.passive) else self.queue_name("", 50, 10)
        if not m.passive and declares_stream(m.arguments):
            check_declare(self.vhost.name, name, m.arguments, m.exclusive, m.durable, m.auto_delete)
        q = await self.registry.declare_queue(
            self.conn, self.vhost, name, m.passive, m.durable, m.exclusive, m.auto_delete, m.arguments
        )
        if q.stream:
            attach(q, self.queue_store.processor, self.queue_store.ctx)
        self.last_queue = q.name
        if q.exclusive and self.conn.ended:  # its connection ended meanwhile
            self.registry.drop_later(q)
        if not m.nowait:
            await self.wait_sends()
            n = await self.queue_store.ready_count(q)
            self.reply(c.QueueDeclareOk(q.name, n, len(q.consumers)))

    async def queue_bind(self, m: c.QueueBind | c.QueueUnbind) -> None:
        bind = type(m) is c.QueueBind
        mid = 20 if bind else 50
        if self.conn.broker.secured:
            name = self.queue_name(m.queue, 50, mid)
            await self.may_bind(f"queue '{name}'", store_name(self.vhost.name, name), m.exchange, 50, mid)
        if bind:
            q = await self.queue(m.queue, 50, mid)
            await self.registry.bind(self.conn, self.vhost, q, m.exchange, m.routing_key, m.arguments, 50)
            if not m.nowait:
                self.reply(c.QueueBindOk())
            return
        q = await _or_none(self.queue(self.queue_name(m.queue, 50, mid), 50, mid))
        if q is not None:
            await self.registry.unbind(self.conn, self.vhost, q, m.exchange, m.routing_key, m.arguments, 50)
        self.reply(c.QueueUnbindOk())

    async def queue_purge(self, m: c.QueuePurge) -> None:
        if self.conn.broker.secured:  # RabbitMQ: read on the queue
            name = self.queue_name(m.queue, 50, 30)
            topic = store_name(self.vhost.name, name)
            await self.registry.authorize(
                self.conn, Action.SUBSCRIBE, Resource("topic", topic), 50, 30, f"queue '{name}'"
            )
        q = await self.queue(m.queue, 50, 30)
        await self.wait_sends()
        n = await self.queue_store.purge(q)
        if not m.nowait:
            self.reply(c.QueuePurgeOk(n))

    async def queue_delete(self, m: c.QueueDelete) -> None:
        name = self.queue_name(m.queue, 50, 40)
        await self.wait_sends()
        n = await self.registry.delete_queue(self.conn, self.vhost, name, m.if_unused, m.if_empty)
        if not m.nowait:
            self.reply(c.QueueDeleteOk(n))


async def _or_none(found: Awaitable[Any]) -> Any:
    """What `found` returns, or None where it raises 404: unbinding from a queue or exchange that
    no longer exists succeeds, as in RabbitMQ (an auto-delete queue may be gone by then, as the
    reply queue of aio-pika's RPC pattern is when it unbinds it after its last basic.cancel)."""
    try:
        return await found
    except AMQPError as e:
        if e.code != ReplyCode.NOT_FOUND:
            raise
        return None
