"""The narrow interfaces the MQTT adapter's modules are handed, so that none imports a module above it.

A session (session.py) is used by its helpers (limits, token expiry, connect, fan-out, shared
subscriptions, persistence, subscriptions) only through `Connection`: what they read and call of
a connected client. The session in turn uses its broker (broker.py) only through `SessionHost`:
the caps, the publisher, the registry's attach/resume/evict/close, the subscriptions' subscribe and
unsubscribe, the event sink and the processor; the TCP adapter uses its WebSocket listeners
through `WebSocketListeners`. A shared subscription's member is seen by a
subscription only as something to `stop`. These are `typing.Protocol` classes: annotations, not
base classes, so they cost nothing at run time; the concrete classes satisfy them structurally.

Dependency order inside the adapter, from the bottom: codec, states, caps, mapping, roles;
subscription, persistence, offline_queue, access; limits, token_expiry, connect; session; fanout,
shared, session_routing, session_feed, subscriptions, registry, publish; broker; server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from messaging_processor import ClientContext, Message, MessagingProcessor
    from runtime.events import LazyEvent

    from ..limits import ReadThrottle
    from .caps import MqttCaps
    from .codec import Subscribe


class Connection(Protocol):
    """What the session's helpers use of one connected MQTT client (session.Session)."""

    client_id: str
    version: int  # the MQTT protocol level of its CONNECT
    state: int  # states.py: CONNECTING, AUTHORIZING, CONNECTED, CLOSED
    ctx: ClientContext
    remote: str
    loop: asyncio.AbstractEventLoop
    pstate: Any  # its persistence.SessionState, when the session is persistent
    send_quota: int  # outbound QoS 1/2 messages it may have in flight (5.0 Receive Maximum)
    inflight: dict[int, Any]  # outbound packet id -> [qos, done future, pubrec seen]
    awaiting_rel: Collection[int]
    throttle: ReadThrottle | None
    _token_expiry: Any  # its token_expiry.TokenExpiry, when its token expires

    @property
    def writable(self) -> LazyEvent: ...

    def deliver(
        self,
        path: str,
        body: bytes,
        qos: int,
        retain: bool,
        props: dict | None,
        done: asyncio.Future | None = None,
    ) -> None: ...

    def close(self, reason: int | None = None) -> None: ...

    def _reply_now(self, data: bytes) -> None: ...


class WebSocketListeners(Protocol):
    """websocket.MqttWebSockets, as the TCP adapter (server.MqttAdapter) starts and stops it."""

    async def start(self, adapter: Any) -> None: ...

    @property
    def extra_listeners(self) -> dict[str, str]: ...

    def close(self) -> None: ...

    async def wait_closed(self, timeout: float = 2.0) -> None: ...


class Stoppable(Protocol):
    """A shared subscription's membership (shared.ShareMember), as its subscription sees it."""

    async def stop(self, drain_timeout: float = 0) -> None: ...


class SessionPublisher(Protocol):
    """publish.Publisher, as a session uses it."""

    async def publish(self, ctx: ClientContext, msg: Message, retain: bool) -> int: ...

    async def publish_many(self, ctx: ClientContext, msgs: list[Message]) -> list[int]: ...

    def publish_nowait(self, ctx: ClientContext, msg: Message, on_done: Callable[[int], None]) -> bool: ...


class SessionRegistry(Protocol):
    """registry.Registry, as a session and its CONNECT use it."""

    sessions: Mapping[str, Any]  # client id -> its connected session
    claims: Any

    async def attach(self, s: Any, clean_start: bool, expiry: int) -> bool: ...

    async def resume(self, s: Any) -> None: ...

    async def evict(self, cid: str) -> None: ...

    def session_closed(self, s: Any, will: Any) -> None: ...


class SessionSubscriptions(Protocol):
    """subscriptions.Subscriptions, as a session uses it."""

    async def subscribe(self, s: Any, pkt: Subscribe) -> tuple[bytes, Callable[[], None] | None]: ...

    async def unsubscribe(self, s: Any, filt: str) -> bool: ...


class SessionEvents(Protocol):
    """events.MqttEvents (client events), as a session and its CONNECT use it."""

    def connected(self, s: Any, clean_start: bool) -> None: ...

    def ended(self, s: Any, exc: Exception | None, kicked: bool) -> None: ...

    def auth_failed(self, s: Any, reason_code: int) -> None: ...


class SessionHost(Protocol):
    """What a session uses of its broker (broker.Broker)."""

    caps: MqttCaps
    events: SessionEvents | None
    max_keep_alive: int
    max_packet_size: int
    processor: MessagingProcessor
    publisher: SessionPublisher
    registry: SessionRegistry
    subscriptions: SessionSubscriptions
