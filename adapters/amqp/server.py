"""The AMQP 0-9-1 listener: thin asyncio.Protocol glue around `Connection` (session.py) and
`Broker` (broker.py). See docs/amqp.md for what is supported."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_mod

from messaging_processor import MessagingProcessor

from .broker import Broker
from .codec import DEFAULT_FRAME_MAX, AMQPError, ReplyCode
from .session import CLOSING, Connection

log = logging.getLogger("adapters.amqp")


class AmqpProtocol(asyncio.Protocol):
    __slots__ = ("adapter", "transport", "conn", "feed")

    def __init__(self, adapter: AmqpAdapter) -> None:
        self.adapter = adapter
        self.transport: asyncio.Transport | None = None
        self.conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass: no isinstance check here.
        self.transport = t = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        a = self.adapter
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
        )
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


class AmqpAdapter:
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
    ) -> None:
        self.processor = processor
        self.host = host
        self.port = port
        self.heartbeat = heartbeat
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.broker = Broker(
            processor, invisible_time_ms=invisible_time_ms, consumer_timeout_ms=consumer_timeout_ms
        )
        self.connections: set[AmqpProtocol] = set()
        self.ssl = ssl
        self.tls_port = tls_port
        self._server: asyncio.Server | None = None
        self._tls_server: asyncio.Server | None = None
        self._address = f"{host}:{port}"
        self._tls_address: str | None = None

    async def start(self) -> None:
        await self.broker.start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: AmqpProtocol(self), self.host, self.port)
        sock = self._server.sockets[0].getsockname()
        self._address = f"{sock[0]}:{sock[1]}"
        if self.ssl is not None:
            self._tls_server = await loop.create_server(
                lambda: AmqpProtocol(self), self.host, self.tls_port, ssl=self.ssl
            )
            sock = self._tls_server.sockets[0].getsockname()
            self._tls_address = f"{sock[0]}:{sock[1]}"

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    @property
    def address(self) -> str:
        return self._address

    @property
    def extra_listeners(self) -> dict[str, str]:
        """Listeners besides `address` (the TLS one when a certificate is configured)."""
        return {"amqps": self._tls_address} if self._tls_address else {}

    @property
    def bound_port(self) -> int:
        return int(self._address.rsplit(":", 1)[1])

    async def stop(self, grace: float) -> None:
        """Stop accepting, let publishes in flight reach the store for up to `grace` s, then close
        every connection with connection.close 320 CONNECTION_FORCED."""
        for srv in (self._server, self._tls_server):
            if srv is not None:
                srv.close()
        sends = [
            t
            for p in self.connections
            if p.conn is not None
            for ch in p.conn.channels.values()
            for t in ch.sends
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
        for srv in (self._server, self._tls_server):
            if srv is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(srv.wait_closed(), 2.0)
        self._server = self._tls_server = None
