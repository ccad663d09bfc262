"""MQTT over WebSocket on the gateway's HTTP port: `/mqtt` (the `mqtt_ws_path` setting) beside the
HTTP API, for deployments that expose one port only (behind a reverse proxy, a browser dashboard on
the console's origin). The same `MqttProtocol` (server.py) a TCP connection gets, fed with the
payloads of an ASGI WebSocket's binary messages; each write of the session is one binary message.

The dedicated listeners (websocket.py, ports 8083/8084) are the efficient path: sans-IO framing in
the protocol's own callbacks. Here the HTTP server (uvicorn) owns the socket, so the glue is one
receive loop per connection and a sender task while writes are pending, and the outbound bytes
waiting for the client are bounded like a TCP transport's write buffer (`pause_writing` above
HIGH_WATER) and `pause_reading` (the publish throttle) holds the receive loop. The handshake must
offer the `mqtt` (or `mqttv3.1`) subprotocol: otherwise it is refused (HTTP 403) and nothing
reaches MQTT. A text message closes the connection (1003), as the specification asks. See
docs/mqtt.md "MQTT over WebSocket"."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

if TYPE_CHECKING:
    from .server import MqttAdapter

log = logging.getLogger("adapters.mqtt.websocket")
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
HIGH_WATER = 1 << 20  # outbound bytes not yet handed to the HTTP server: pause the session's writes
UNSUPPORTED_DATA = 1003


class AsgiWsTransport:
    """What `MqttProtocol` and its session use of a transport, over an ASGI WebSocket."""

    __slots__ = (
        "ws", "kind", "protocol", "peer", "queue", "queued", "closing", "sender", "paused", "reading",
    )  # fmt: skip

    def __init__(self, ws: WebSocket, kind: str, protocol: Any) -> None:
        self.ws = ws
        self.kind = kind  # "ws" or "wss": the transport label of /metrics
        self.protocol = protocol
        self.peer = (ws.client.host, ws.client.port) if ws.client is not None else None
        self.queue: list[bytes] = []
        self.queued = 0
        self.closing = False
        self.sender: asyncio.Task | None = None
        self.paused = False
        self.reading = asyncio.Event()  # cleared by pause_reading (the publish throttle)
        self.reading.set()

    def write(self, data: bytes) -> None:
        if self.closing or not data:
            return
        self.queue.append(data)
        self.queued += len(data)
        if self.sender is None:
            self.sender = asyncio.get_running_loop().create_task(self._send())
        if not self.paused and self.queued > HIGH_WATER:
            self.paused = True
            self.protocol.pause_writing()

    async def _send(self) -> None:
        try:
            while self.queue:
                chunk = b"".join(self.queue)
                self.queue.clear()
                await self.ws.send_bytes(chunk)
                self.queued -= len(chunk)
                if self.paused and self.queued <= HIGH_WATER // 2:
                    self.paused = False
                    self.protocol.resume_writing()
            if self.closing:
                await self.ws.close()
        except Exception:  # noqa: BLE001 - the connection went away: the receive loop ends it
            self.queue.clear()
        finally:
            self.sender = None

    def close(self) -> None:
        """Close after what is queued has been sent."""
        if self.closing:
            return
        self.closing = True
        if self.sender is None:
            self.sender = asyncio.get_running_loop().create_task(self._send())

    def abort(self) -> None:
        self.queue.clear()
        self.close()

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return self.peer
        return default  # (no sslcontext or peercert here: TLS ends in the HTTP server)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None  # (HIGH_WATER bounds what waits here)

    def pause_reading(self) -> None:
        self.reading.clear()  # (the receive loop waits before its next message)

    def resume_reading(self) -> None:
        self.reading.set()


def router(adapter_of: Callable[[], MqttAdapter | None], path: str, secure: bool = False) -> APIRouter:
    """The WebSocket route `path` of the HTTP app; `adapter_of()` is the gateway's MQTT adapter
    (None while it is not running: the handshake is refused)."""
    from .server import MqttProtocol

    r = APIRouter()

    @r.websocket(path)
    async def mqtt_over_websocket(ws: WebSocket) -> None:
        adapter = adapter_of()
        offered = ws.scope.get("subprotocols") or []
        sub = next((p for p in SUBPROTOCOLS if p in offered), None)
        if adapter is None or sub is None:
            log.info("mqtt websocket handshake on the HTTP port refused: subprotocols %s", offered)
            await ws.close()  # (before accept: HTTP 403)
            return
        await ws.accept(subprotocol=sub)
        proto = MqttProtocol(adapter)
        kind = "wss" if secure or ws.url.scheme == "wss" else "ws"
        transport = AsgiWsTransport(ws, kind, proto)
        proto.connection_made(transport)  # type: ignore[arg-type]
        exc: Exception | None = None
        try:
            while not transport.closing:
                if not transport.reading.is_set():
                    await transport.reading.wait()
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                data = msg.get("bytes")
                if data is None:  # a text message
                    transport.closing = True
                    await ws.close(UNSUPPORTED_DATA)
                    break
                proto.data_received(data)
        except (WebSocketDisconnect, RuntimeError) as e:
            exc = e
        finally:
            proto.connection_lost(exc)
            if transport.sender is not None:
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(asyncio.shield(transport.sender), 2.0)

    return r
