"""The MQTT listener: thin asyncio.Protocol glue around `Session` (session.py) and `Broker`
(broker.py). See docs/mqtt.md for what is supported."""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_mod

from messaging_processor import MessagingProcessor
from runtime.tls import peer_common_name

from ..listener import TcpListeners
from .broker import Broker
from .session import Session

log = logging.getLogger("adapters.mqtt")


class MqttProtocol(asyncio.Protocol):
    __slots__ = ("adapter", "transport", "session", "feed")

    def __init__(self, adapter: MqttAdapter) -> None:
        self.adapter = adapter
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass: no isinstance check here.
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        cert_user = None
        if self.adapter.cert_identity:
            cert_user = peer_common_name(transport.get_extra_info("peercert"))
        self.session = Session(self.adapter.broker, transport.write, transport.close, remote, cert_user)
        self.feed = self.session.feed
        self.adapter.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.adapter.connections.discard(self)
        if self.session is not None:
            self.session.connection_lost()


class MqttAdapter:
    """MQTT 3.1 / 3.1.1 / 5.0 listener (the Adapter protocol of adapters/base.py)."""

    name = "mqtt"

    def __init__(
        self,
        processor: MessagingProcessor,
        host: str = "127.0.0.1",
        port: int = 1883,
        *,
        max_packet_size: int = 1 << 20,
        topic_scan_interval: float = 1.0,
        max_keep_alive: int = 0,
        ssl: ssl_mod.SSLContext | None = None,
        tls_port: int = 8883,
        cert_identity: bool = False,
    ) -> None:
        """`cert_identity`: a verified client certificate's CN is the user (its CONNECT's user name and
        password are then ignored)."""
        self.processor = processor
        self.cert_identity = cert_identity
        self.host = host
        self.port = port
        self.broker = Broker(
            processor,
            max_packet_size=max_packet_size,
            topic_scan_interval=topic_scan_interval,
            max_keep_alive=max_keep_alive,
        )
        self.connections: set[MqttProtocol] = set()
        self.net = TcpListeners(host, port, ssl=ssl, tls_port=tls_port, tls_name="mqtts")

    async def start(self) -> None:
        await self.broker.start()
        await self.net.start(lambda: MqttProtocol(self))

    @property
    def listening(self) -> bool:
        return self.net.listening

    @property
    def address(self) -> str:
        return self.net.address

    @property
    def extra_listeners(self) -> dict[str, str]:
        """Listeners besides `address` (the TLS one when a certificate is configured)."""
        return self.net.extra_listeners

    @property
    def bound_port(self) -> int:
        return self.net.bound_port

    async def stop(self, grace: float) -> None:
        """Stop accepting, let in-flight stores finish for up to `grace` s, then close sessions
        (5.0 clients get DISCONNECT 0x8B Server shutting down)."""
        self.net.close()
        tasks = [t for c in self.connections if c.session is not None for t in c.session._tasks]
        if tasks and grace > 0:
            await asyncio.wait(tasks, timeout=grace)
        await self.broker.close()
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
        await self.net.wait_closed()
