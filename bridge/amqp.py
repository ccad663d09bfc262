"""AMQP 0-9-1 ends of a link, over aio-pika.

Source: consumes a queue with manual acks and `basic.qos(prefetch = inflight)`, and `basic.ack`s
a delivery only when the link calls `ack` (after the destination confirmed it); the queue's depth
(`message_count` of a passive `queue.declare` on a channel of its own, every `BACKLOG_EVERY_S`) is
the link's source backlog. `declare = true` declares the queue durable first.

Sink: publishes on a channel in confirm mode as persistent messages (delivery mode 2), to
`exchange` (the default exchange when empty; checked passively) with `routing_key` (else the
message's topic as a routing key), `mandatory` unless turned off; `send` returns on basic.ack and
raises on basic.nack, basic.return (unroutable) or a lost connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractIncomingMessage

from .config import BridgeConfig, Endpoint
from .endpoints import Item, tls_context
from .topics import from_routing_key, to_routing_key

BACKLOG_EVERY_S = 2.0
_PROPS = (
    "content_encoding",
    "message_id",
    "correlation_id",
    "type",
    "app_id",
    "reply_to",
    "priority",
    "timestamp",
)


async def connect(ep: Endpoint, name: str) -> AbstractConnection:
    ctx = tls_context(ep)
    return await aio_pika.connect(
        host=ep.host,
        port=ep.port,
        login=ep.username or "guest",
        password=ep.password() or "guest",
        virtualhost=ep.vhost,
        ssl=ctx is not None,
        ssl_context=ctx,
        timeout=10,
        client_properties={"connection_name": name},
    )


class AmqpSource:
    def __init__(self, cfg: BridgeConfig) -> None:
        self.cfg = cfg
        self.backlog: int | None = None
        self.conn: AbstractConnection | None = None
        self._poll: asyncio.Task[None] | None = None

    async def open(self) -> None:
        cfg, ep = self.cfg, self.cfg.source
        self.conn = await connect(ep, f"bridge {cfg.name} (from)")
        self.channel = await self.conn.channel(publisher_confirms=False)
        await self.channel.set_qos(prefetch_count=cfg.inflight)
        assert ep.queue is not None
        if ep.declare:
            self.queue = await self.channel.declare_queue(ep.queue, durable=True)
        else:
            self.queue = await self.channel.declare_queue(ep.queue, passive=True)
        self.backlog = self.queue.declaration_result.message_count
        self._poll = asyncio.create_task(self._poll_backlog(await self.conn.channel()))

    async def _poll_backlog(self, channel: AbstractChannel) -> None:
        assert self.cfg.source.queue is not None
        while True:
            await asyncio.sleep(BACKLOG_EVERY_S)
            with contextlib.suppress(Exception):
                q = await channel.declare_queue(self.cfg.source.queue, passive=True)
                self.backlog = q.declaration_result.message_count

    async def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)

    async def items(self) -> AsyncIterator[Item]:
        m: AbstractIncomingMessage
        async with self.queue.iterator() as it:
            async for m in it:
                props = {k: getattr(m, k) for k in _PROPS if getattr(m, k, None) is not None}
                yield Item(
                    from_routing_key(m.routing_key or ""),
                    m.body,
                    bool(m.redelivered),
                    m.content_type,
                    dict(m.headers or {}),
                    props,
                    token=m,
                )
        raise ConnectionError(f"{self.cfg.source.address()}: the consumer was cancelled")

    async def ack(self, item: Item) -> None:
        await item.token.ack()


class AmqpSink:
    def __init__(self, cfg: BridgeConfig) -> None:
        self.cfg = cfg
        self.conn: AbstractConnection | None = None
        self.exchange: AbstractExchange | None = None

    async def open(self) -> None:
        cfg, ep = self.cfg, self.cfg.sink
        self.conn = await connect(ep, f"bridge {cfg.name} (to)")
        channel = await self.conn.channel(publisher_confirms=True, on_return_raises=ep.mandatory)
        if ep.exchange:
            self.exchange = await channel.get_exchange(ep.exchange, ensure=True)
        else:
            self.exchange = channel.default_exchange

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)

    async def send(self, topic: str, item: Item) -> None:
        assert self.exchange is not None
        ep = self.cfg.sink
        props: dict[str, Any] = dict(item.properties)
        message = aio_pika.Message(
            item.body,
            headers=item.headers or None,
            content_type=item.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            **props,
        )
        key = ep.routing_key if ep.routing_key is not None else to_routing_key(topic)
        await self.exchange.publish(message, key, mandatory=ep.mandatory, timeout=self.cfg.confirm_timeout_s)
