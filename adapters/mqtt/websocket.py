"""MQTT over WebSocket (MQTT 5.0 section 6, 3.1.1 section 6): the asyncio glue between a TCP (or
TLS) connection, the sans-IO WebSocket protocol of the `websockets` library, and the same
`MqttProtocol` (server.py) a TCP connection gets.

The opening handshake must ask for `path` and offer the `mqtt` subprotocol (or `mqttv3.1`, as
Mosquitto accepts); anything else is answered with an HTTP error and closed. After it, the payload
of every binary frame goes to the session as TCP bytes would (a packet may span frames, a frame may
hold several packets) and each write of the session becomes one binary frame. A text frame closes
the connection (1003), as the specification asks. See docs/mqtt.md "MQTT over WebSocket"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_mod
from typing import TYPE_CHECKING, Any

from websockets.frames import CloseCode, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from .server import MqttProtocol

if TYPE_CHECKING:
    from .server import MqttAdapter

log = logging.getLogger("adapters.mqtt.websocket")
# the websockets library logs every connection opened or refused at INFO: kept to warnings
_wire_log = logging.getLogger("adapters.mqtt.websocket.wire")
_wire_log.setLevel(logging.WARNING)
SUBPROTOCOLS = [Subprotocol("mqtt"), Subprotocol("mqttv3.1")]
HANDSHAKE_TIMEOUT_S = 10.0  # a connection without a complete opening handshake by then is closed
CLOSE_TIMEOUT_S = 2.0  # after our close frame, the TCP connection is closed by then at the latest


class WsTransport:
    """What `MqttProtocol` and its session use of a transport, over one WebSocket: `write` sends a
    binary frame, `close` the closing handshake; the rest is the TCP transport's."""

    __slots__ = ("conn", "kind")

    def __init__(self, conn: MqttWsProtocol, kind: str) -> None:
        self.conn = conn
        self.kind = (
            kind  # "ws" or "wss": the transport label of /metrics (MqttAdapter.connections_by_transport)
        )

    def write(self, data: bytes) -> None:
        self.conn.send_binary(data)

    def close(self) -> None:
        self.conn.close(CloseCode.NORMAL_CLOSURE)

    def abort(self) -> None:
        self.conn.raw.abort()  # type: ignore[union-attr]

    def is_closing(self) -> bool:
        return self.conn.closing or self.conn.raw.is_closing()  # type: ignore[union-attr]

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.conn.raw.get_extra_info(name, default)  # type: ignore[union-attr]

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.conn.raw.set_write_buffer_limits(high, low)  # type: ignore[union-attr]

    def pause_reading(self) -> None:
        self.conn.raw.pause_reading()  # type: ignore[union-attr]

    def resume_reading(self) -> None:
        self.conn.raw.resume_reading()  # type: ignore[union-attr]


class MqttWsProtocol(asyncio.Protocol):
    """One WebSocket connection: the handshake, then an `MqttProtocol` fed with binary payloads."""

    __slots__ = ("listeners", "adapter", "raw", "ws", "mqtt", "closing", "_timer")

    def __init__(self, listeners: MqttWebSockets, adapter: MqttAdapter) -> None:
        self.listeners = listeners
        self.adapter = adapter
        self.raw: asyncio.Transport | None = None
        # max_size None: the MQTT decoder bounds packets (--max-body-size), not the frame layer
        self.ws = ServerProtocol(subprotocols=SUBPROTOCOLS, max_size=None, logger=_wire_log)
        self.mqtt: MqttProtocol | None = None
        self.closing = False
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]
        self.listeners.pending.add(self)
        self._timer = asyncio.get_running_loop().call_later(HANDSHAKE_TIMEOUT_S, self._abort_handshake)

    def _abort_handshake(self) -> None:
        if self.mqtt is None and self.raw is not None:
            self.raw.close()

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        ws.receive_data(data)
        for event in ws.events_received():
            if isinstance(event, Request):
                self._handshake(event)
            elif event.opcode is Opcode.BINARY or event.opcode is Opcode.CONT:
                if self.mqtt is not None and not self.closing and event.data:
                    self.mqtt.data_received(bytes(event.data))
            elif event.opcode is Opcode.TEXT:
                self.close(CloseCode.UNSUPPORTED_DATA, "MQTT is carried in binary frames")
        self._flush()

    def _handshake(self, request: Request) -> None:
        ws = self.ws
        path = request.path.split("?", 1)[0]
        if path != self.listeners.path:
            response = ws.reject(404, f"no MQTT WebSocket endpoint at {path}\n")
        else:
            response = ws.accept(request)
        ws.send_response(response)
        self.listeners.pending.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if response.status_code != 101:
            log.info(
                "mqtt websocket handshake refused (%d): %s", response.status_code, ws.handshake_exc or path
            )
            return
        self._flush()  # the 101 response before the first MQTT byte
        self.mqtt = MqttProtocol(self.adapter)
        kind = "wss" if self.raw.get_extra_info("sslcontext") is not None else "ws"  # type: ignore[union-attr]
        self.mqtt.connection_made(WsTransport(self, kind))  # type: ignore[arg-type]

    def send_binary(self, data: bytes) -> None:
        if self.closing:
            return
        self.ws.send_binary(data)
        self._flush()

    def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """Start the closing handshake (idempotent); the TCP connection goes within CLOSE_TIMEOUT_S."""
        if self.closing:
            return
        self.closing = True
        with contextlib.suppress(Exception):  # already closed by the peer: nothing to send
            self.ws.send_close(code, reason)
        self._flush()
        raw = self.raw
        if raw is not None and not raw.is_closing():
            asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, raw.close)

    def _flush(self) -> None:
        raw = self.raw
        if raw is None:
            return
        for chunk in self.ws.data_to_send():
            if chunk:
                raw.write(chunk)
            else:  # SEND_EOF: the WebSocket is done, so is the TCP connection
                raw.close()
        if self.ws.close_expected() and not self.closing and self.mqtt is not None:
            self.closing = True  # the peer closed, or a protocol error: the session stops writing

    def pause_writing(self) -> None:
        if self.mqtt is not None:
            self.mqtt.pause_writing()

    def resume_writing(self) -> None:
        if self.mqtt is not None:
            self.mqtt.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.listeners.pending.discard(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.closing = True
        self.ws.receive_eof()
        if self.mqtt is not None:
            self.mqtt.connection_lost(exc)


def _address(server: asyncio.Server) -> str:
    host, port = server.sockets[0].getsockname()[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


class MqttWebSockets:
    """The WebSocket listeners of the MQTT adapter: ws on `port`, wss on `tls_port` when `ssl` is
    given. `optional`: a port that cannot be bound is logged and skipped (the default ports)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        path: str = "/mqtt",
        ssl: ssl_mod.SSLContext | None = None,
        tls_port: int = 8084,
        optional: bool = False,
        reuse_port: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.path = path
        self.ssl = ssl
        self.tls_port = tls_port
        self.optional = optional
        self.reuse_port = reuse_port
        self.pending: set[MqttWsProtocol] = set()  # connections still in their opening handshake
        self._servers: dict[str, asyncio.Server] = {}

    async def start(self, adapter: MqttAdapter) -> None:
        loop = asyncio.get_running_loop()
        wanted: list[tuple[str, int, ssl_mod.SSLContext | None]] = [("mqtt_ws", self.port, None)]
        if self.ssl is not None:
            wanted.append(("mqtt_wss", self.tls_port, self.ssl))
        else:
            log.info("mqtt_wss (MQTT over secure WebSocket) not started: no --tls-cert")
        for name, port, ctx in wanted:
            try:
                self._servers[name] = await loop.create_server(
                    lambda: MqttWsProtocol(self, adapter),
                    self.host,
                    port,
                    ssl=ctx,
                    reuse_port=self.reuse_port,
                )
            except OSError as e:
                if not self.optional:
                    self.close()
                    raise
                log.warning(
                    "%s not started: cannot listen on %s:%d: %s", name, self.host, port, e.strerror or e
                )

    @property
    def extra_listeners(self) -> dict[str, str]:
        return {name: _address(srv) for name, srv in self._servers.items() if srv.sockets}

    def close(self) -> None:
        """Stop accepting; connections still in their handshake are closed."""
        for srv in self._servers.values():
            srv.close()
        for conn in list(self.pending):
            if conn.raw is not None:
                conn.raw.abort()

    async def wait_closed(self, timeout: float = 2.0) -> None:
        for srv in self._servers.values():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(srv.wait_closed(), timeout)
        self._servers = {}
