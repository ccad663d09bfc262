"""The AMQP 0-9-1 listener: thin asyncio.Protocol glue around `Connection` (session.py) and
`Broker` (broker.py). See docs/amqp.md for what is supported."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl as ssl_mod

from messaging_processor import MessagingProcessor
from messaging_processor.client_events import ClientEvents
from messaging_processor.registry import ConsumerRow
from runtime.tls import peer_common_name

from ..limits import Limiter, host_of
from ..listener import TcpAdapter, TcpListeners
from .broker import Broker
from .codec import DEFAULT_FRAME_MAX, AMQPError, ReplyCode
from .limits import PROTOCOL, ConnectionLimits
from .session import CLOSING, OPEN, Connection

log = logging.getLogger("adapters.amqp")


class AmqpProtocol(asyncio.Protocol):
    __slots__ = ("adapter", "transport", "conn", "feed", "conn_id")

    def __init__(self, adapter: AmqpAdapter) -> None:
        self.adapter = adapter
        self.transport: asyncio.Transport | None = None
        self.conn: Connection | None = None
        self.conn_id = f"amqp-{next(adapter.conn_ids)}"  # the console's handle on it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass: no isinstance check here.
        self.transport = t = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        a = self.adapter
        if a.limiter is not None and a.limiter.in_fd_reserve(PROTOCOL, transport):
            return
        self.conn = Connection(
            a.broker,
            t.write,  # type: ignore[attr-defined]
            t.close,
            remote,
            t.pause_reading,  # type: ignore[attr-defined]
            t.resume_reading,  # type: ignore[attr-defined]
            heartbeat=a.heartbeat,
            frame_max=a.frame_max,
            channel_max=a.channel_max,
            cert_user=peer_common_name(transport.get_extra_info("peercert")),
        )
        if a.limiter is not None:
            self.conn.limits = ConnectionLimits(
                a.limiter,
                host_of(peer),
                t.pause_reading,  # type: ignore[attr-defined]
                t.resume_reading,  # type: ignore[attr-defined]
            )
        if a.max_outbound_bytes:
            # pause_writing above the bound: consumers stop popping (docs/limits.md "Memory per connection")
            t.set_write_buffer_limits(high=a.max_outbound_bytes)  # type: ignore[attr-defined]
            self.conn.max_outbound_bytes = a.max_outbound_bytes
        self.feed = self.conn.feed
        a.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.pause_writing()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.adapter.connections.discard(self)
        if self.conn is not None:
            self.conn.connection_lost()
            if self.conn.limits is not None:
                self.conn.limits.closed(self.conn)


class AmqpAdapter(TcpAdapter):
    """AMQP 0-9-1 listener (the Adapter protocol of adapters/base.py), RabbitMQ-compatible."""

    name = "amqp"

    def __init__(
        self,
        processor: MessagingProcessor,
        host: str = "127.0.0.1",
        port: int = 5672,
        *,
        heartbeat: int = 60,
        frame_max: int = DEFAULT_FRAME_MAX,
        channel_max: int = 2047,
        invisible_time_ms: int = 60_000,
        consumer_timeout_ms: int = 1_800_000,
        ssl: ssl_mod.SSLContext | None = None,
        tls_port: int = 5671,
        mqtt_exchange: str = "amq.topic",
        limiter: Limiter | None = None,
        max_queues_per_vhost: int = 0,
        max_queues_per_user: int = 0,
        max_outbound_bytes: int = 0,
        reuse_port: bool = False,
        events: ClientEvents | None = None,
    ) -> None:
        """`limiter`: connection and publish-rate limits (docs/limits.md). `max_outbound_bytes`: a
        connection's write buffer above it stops its consumers' pops (0: not bounded). `events`:
        client events and the event exchange `amq.rabbitmq.event` (events.py; None: none)."""
        super().__init__(
            processor,
            host,
            port,
            TcpListeners(host, port, ssl=ssl, tls_port=tls_port, tls_name="amqps", reuse_port=reuse_port),
        )
        self.limiter = limiter
        self.max_outbound_bytes = max_outbound_bytes
        self.heartbeat = heartbeat
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.broker = Broker(
            processor,
            invisible_time_ms=invisible_time_ms,
            consumer_timeout_ms=consumer_timeout_ms,
            mqtt_exchange=mqtt_exchange,
            max_queues_per_vhost=max_queues_per_vhost,
            max_queues_per_user=max_queues_per_user,
            events=events,
        )
        self.connections: set[AmqpProtocol] = set()
        self.conn_ids = itertools.count(1)

    async def start(self) -> None:
        await self.broker.start()
        await self.net.start(lambda: AmqpProtocol(self))
        self.processor.clients.add_consumer_report(self.consumers_info)

    def connections_info(self) -> list[dict[str, object]]:
        """The open connections that logged in, for the console (adapters/base.py)."""
        out = []
        for p in list(self.connections):
            conn = p.conn
            if conn is None or conn.state != OPEN:
                continue
            out.append(
                {
                    "id": p.conn_id,
                    "protocol": "amqp",
                    "client_id": conn.ctx.client_id,
                    "user": conn.ctx.identity.username,
                    "remote": conn.remote,
                    "since": conn.since,
                    "messages_in": conn.messages_in,
                    "messages_out": conn.messages_out,
                }
            )
        return out

    def consumers_info(self) -> list[ConsumerRow]:
        """Every live basic.consume consumer, for the registry's consumer list (the console's group
        and topic pages): its queue, channel, prefetch and the deliveries it holds unacked."""
        rows = []
        for p in list(self.connections):
            conn = p.conn
            if conn is None or conn.state != OPEN:
                continue
            for ch in list(conn.channels.values()):
                for cons in list(ch.consumers.values()):
                    q = cons.queue
                    held = sum(1 for u in ch.unacked.values() if u.queue is q and u.fut is not None)
                    details: dict[str, str | int | bool] = {
                        "queue": q.name,
                        "vhost": q.vhost,
                        "channel": ch.number,
                        "consumer_tag": cons.tag,
                        "ack": "auto" if cons.no_ack else "manual",
                        "prefetch": cons.prefetch,
                        "unacked": held,
                    }
                    if ch.global_prefetch:
                        details["channel_prefetch"] = ch.global_prefetch
                    if cons.exclusive:
                        details["exclusive"] = True
                    rows.append(
                        ConsumerRow(
                            "amqp",
                            conn.ctx.client_id,
                            q.group,
                            frozenset({q.topic}),
                            conn.remote,
                            conn.since,
                            p.conn_id,
                            details,
                        )
                    )
        return rows

    def close_connection(self, conn_id: str) -> bool:
        """Close one connection: connection.close 320 CONNECTION_FORCED, as RabbitMQ's management UI."""
        for p in list(self.connections):
            if p.conn_id == conn_id and p.conn is not None:
                p.conn.close_by_admin()
                return True
        return False

    async def stop(self, grace: float) -> None:
        """Stop accepting, let publishes in flight reach the store for up to `grace` s, then close
        every connection with connection.close 320 CONNECTION_FORCED."""
        self.processor.clients.remove_consumer_report(self.consumers_info)
        self.net.close()
        sends = [
            t
            for p in self.connections
            if p.conn is not None
            for ch in p.conn.channels.values()
            for t in ch.publisher.sends
        ]
        if sends and grace > 0:
            await asyncio.wait(sends, timeout=grace)
        for p in list(self.connections):
            conn = p.conn
            if conn is not None and conn.state < CLOSING:
                conn.write(
                    AMQPError(ReplyCode.CONNECTION_FORCED, "broker forced connection closure").response()
                )
                conn.close()
        tasks = [t for p in self.connections if p.conn is not None for t in p.conn._tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=max(grace, 0.5))
        await self.broker.close()
        for p in list(self.connections):
            if p.transport is not None:
                p.transport.abort()
        await self.net.wait_closed()
