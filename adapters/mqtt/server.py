"""The MQTT listener: thin asyncio.Protocol glue around `Session` (session.py) and `Broker`
(broker.py). See docs/mqtt.md for what is supported."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl as ssl_mod
from typing import TYPE_CHECKING

from messaging_processor import MessagingProcessor
from messaging_processor.client_events import ClientEvents
from messaging_processor.registry import ConsumerRow
from runtime.tls import peer_common_name

from ..limits import Limiter, host_of
from ..listener import TcpAdapter, TcpListeners
from .broker import Broker
from .caps import DEFAULT_CAPS, MqttCaps
from .codec import ReasonCode
from .limits import Refusal, SessionLimits
from .mapping import store_topic_of_level
from .registry import ClientIdClaims
from .session import Session
from .shared import share_group_name

if TYPE_CHECKING:
    from .roles import WebSocketListeners

log = logging.getLogger("adapters.mqtt")
REFUSED_WAIT_S = 5.0  # a refused connection is closed after this if its CONNECT does not come


class MqttProtocol(asyncio.Protocol):
    __slots__ = ("adapter", "transport", "session", "refusal", "counted", "kicked", "_no")

    def __init__(self, adapter: MqttAdapter) -> None:
        self.adapter = adapter
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.refusal: Refusal | None = None  # over a connection limit: no session, CONNACK refused
        self.counted = False  # holds one of the limiter's connection places
        self.kicked = False  # closed from the console (client events: reason "kicked")
        self._no = next(adapter.conn_ids)

    @property
    def conn_id(self) -> str:
        """The console's handle on this connection."""
        return f"mqtt-{self._no}"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass: no isinstance check here.
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        remote = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        limiter = self.adapter.limiter
        if limiter is not None:
            if limiter.in_fd_reserve("mqtt", transport):
                return
            why = limiter.accept("mqtt", host_of(peer))
            if why is not None:
                log.debug("mqtt %s refused: %s", remote, why)
                self.refusal = Refusal(transport.write, transport.close, why)  # type: ignore[attr-defined]
                asyncio.get_running_loop().call_later(REFUSED_WAIT_S, transport.close)  # no CONNECT came
                return
            self.counted = True
        cert_user = None
        if self.adapter.cert_identity:
            cert_user = peer_common_name(transport.get_extra_info("peercert"))
        self.session = Session(self.adapter.broker, transport, remote, cert_user)
        if limiter is not None:
            self.session.limits = SessionLimits(limiter, transport)  # type: ignore[arg-type]
        if self.adapter.max_outbound_bytes:
            # pause_writing above the bound (docs/limits.md "Memory per connection")
            transport.set_write_buffer_limits(high=self.adapter.max_outbound_bytes)  # type: ignore[attr-defined]
        self.adapter.connections.add(self)

    def data_received(self, data: bytes) -> None:
        s = self.session
        if s is not None:
            s.feed(data)
        elif self.refusal is not None:
            self.refusal.feed(data)

    def pause_writing(self) -> None:
        if self.session is not None and self.adapter.max_outbound_bytes:
            self.session.writable.clear()

    def resume_writing(self) -> None:
        if self.session is not None:
            self.session.set_writable()

    def connection_lost(self, exc: Exception | None) -> None:
        self.adapter.connections.discard(self)
        if self.counted:
            self.counted = False
            self.adapter.limiter.closed("mqtt")  # type: ignore[union-attr]
        if self.session is not None:
            self.session.set_writable()  # releases deliveries waiting for room (they see it closed)
            self.session.connection_lost()
            if self.session.limits is not None:
                self.session.limits.closed(self.session)
            if self.adapter.broker.events is not None:
                self.adapter.broker.events.ended(self.session, exc, self.kicked)


def describe(session: Session) -> dict[str, object]:
    """One connection as the console's connections page lists it (adapters/connections.py)."""
    ident = session.ctx.identity
    return {
        "protocol": "mqtt",
        "client_id": session.client_id,
        "user": ident.username if ident.principal is not None or ident.username else None,
        "remote": session.remote,
        "since": session.since,
        "messages_in": session.messages_in,
        "messages_out": session.messages_out,
    }


class MqttAdapter(TcpAdapter):
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
        limiter: Limiter | None = None,
        caps: MqttCaps = DEFAULT_CAPS,
        max_outbound_bytes: int = 0,
        reuse_port: bool = False,
        claims: ClientIdClaims | None = None,
        session_queues: bool = True,
        shared_sessions: bool = False,
        websockets: WebSocketListeners | None = None,
        events: ClientEvents | None = None,
        sys_interval: float = 0,
    ) -> None:
        """`cert_identity`: a verified client certificate's CN is the user (its CONNECT's user name and
        password are then ignored). `limiter`: connection and publish-rate limits (docs/limits.md).
        `max_outbound_bytes`: a connection whose write buffer is above it gets no more deliveries until
        it drains (0: not bounded). `session_queues`: a queue per persistent session (Broker; off in
        CLUSTER mode); `shared_sessions`: other processes serve the same sessions (--workers).
        `websockets`: the MQTT over WebSocket listeners (websocket.py), started and stopped with this one.
        `events`: client events (events.py; None: none); `sys_interval`: seconds between `$SYS`
        updates (sys_topics.py; 0: none)."""
        super().__init__(
            processor,
            host,
            port,
            TcpListeners(host, port, ssl=ssl, tls_port=tls_port, tls_name="mqtts", reuse_port=reuse_port),
        )
        self.max_outbound_bytes = max_outbound_bytes
        self.limiter = limiter
        self.cert_identity = cert_identity
        self.broker = Broker(
            processor,
            max_packet_size=max_packet_size,
            topic_scan_interval=topic_scan_interval,
            max_keep_alive=max_keep_alive,
            caps=caps,
            session_queues=session_queues,
            shared_sessions=shared_sessions,
            events=events,
            sys_interval=sys_interval,
            limiter=limiter,
        )
        self.broker.fanout.max_outbound_bytes = max_outbound_bytes
        self.broker.registry.claims = claims  # `reuse_port` workers: client-id takeover across them
        self.connections: set[MqttProtocol] = set()
        self.conn_ids = itertools.count(1)
        self.websockets = websockets

    async def evict(self, client_id: str) -> None:
        """Another worker took `client_id` over (registry.py `evict`)."""
        await self.broker.registry.evict(client_id)

    async def start(self) -> None:
        await self.broker.start()
        self.processor.clients.add_consumer_report(self.consumers_info)
        await self.net.start(lambda: MqttProtocol(self))
        if self.websockets is not None:
            try:
                await self.websockets.start(self)
            except BaseException:
                self.net.close()
                raise

    @property
    def extra_listeners(self) -> dict[str, str]:
        """Listeners besides `address` (the TLS one when a certificate is configured, WebSocket)."""
        ws = self.websockets.extra_listeners if self.websockets is not None else {}
        return {**self.net.extra_listeners, **ws}

    def connections_info(self) -> list[dict[str, object]]:
        """The open connections that sent CONNECT, for the console (adapters/base.py)."""
        return [
            {"id": c.conn_id, **describe(c.session)}
            for c in list(self.connections)
            if c.session is not None and c.session.client_id
        ]

    def connections_by_transport(self) -> dict[str, int]:
        """Open connections by transport (tcp, tls, ws, wss), for /metrics."""
        out: dict[str, int] = {}
        for c in list(self.connections):
            t = c.transport
            if t is None:
                continue
            kind = getattr(t, "kind", None) or (
                "tls" if t.get_extra_info("sslcontext") is not None else "tcp"
            )
            out[kind] = out.get(kind, 0) + 1
        return out

    def consumers_info(self) -> list[ConsumerRow]:
        """Every subscription of a connected client, for the registry's consumer list (the console's
        group and topic pages): filter, QoS and, for `$share/<name>/...`, the share's group."""
        rows = []
        for c in list(self.connections):
            s = c.session
            if s is None or not s.client_id:
                continue
            st = s.pstate
            subs = st.subs if st is not None else s.subs
            for sub in list(subs.values()):
                details: dict[str, str | int | bool] = {
                    "filter": sub.filter if sub.share is None else f"$share/{sub.share}/{sub.filter}",
                    "qos": sub.qos,
                    "session": "persistent" if st is not None else "clean",
                }
                if sub.share is not None:
                    details["share"] = sub.share
                    group = share_group_name(sub.share)
                else:
                    group = st.group if st is not None else ""
                if sub.sub_id:
                    details["subscription_id"] = sub.sub_id
                topics = frozenset({"*" if sub.wild else store_topic_of_level(sub.first)})
                rows.append(
                    ConsumerRow("mqtt", s.client_id, group, topics, s.remote, s.since, c.conn_id, details)
                )
        return rows

    def close_connection(self, conn_id: str) -> bool:
        """Close one connection (5.0: DISCONNECT 0x98 Administrative action first)."""
        for c in list(self.connections):
            if c.conn_id == conn_id and c.session is not None:
                c.kicked = True
                c.session.close(ReasonCode.ADMINISTRATIVE_ACTION)
                return True
        return False

    async def stop(self, grace: float) -> None:
        """Stop accepting, let in-flight stores finish for up to `grace` s, then close sessions
        (5.0 clients get DISCONNECT 0x8B Server shutting down)."""
        self.processor.clients.remove_consumer_report(self.consumers_info)
        self.net.close()
        if self.websockets is not None:
            self.websockets.close()
        tasks = [t for c in self.connections if c.session is not None for t in list(c.session._tasks)]
        if tasks and grace > 0:
            await asyncio.wait(tasks, timeout=grace)
        await self.broker.close()
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
        await self.net.wait_closed()
        if self.websockets is not None:
            await self.websockets.wait_closed()
