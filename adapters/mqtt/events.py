"""Client events of MQTT sessions (messaging_processor/client_events.py, docs/system-topics.md):
connected after the CONNACK, disconnected with the reason when the connection ends, subscribed /
unsubscribed per filter, auth_failed for a refused CONNECT. Only built with `--client-events`:
without it the broker holds no `MqttEvents` and the hooks cost one attribute test per CONNECT.

Disconnect reasons (EMQX's words where it has them):

    normal              the client sent DISCONNECT (5.0: a reason code other than 0x04)
    keepalive_timeout   nothing received for 1.5 x the keep-alive
    takenover           another connection took the client id over
    kicked              closed from the console (adapter's close_connection)
    server_shutdown     the gateway stops
    sock_error          the socket failed (reset, ...)
    closed              the connection ended without DISCONNECT otherwise: the client closed its
                        socket, or the gateway closed it after a protocol error
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from messaging_processor.client_events import ClientEvents

from .codec import Subscribe

# a Session (session.py), typed Any: importing session.py or subscriptions.py here, even for
# annotations, would put this module into the adapter's import cycle (tests/architecture)
Session = Any

_AUTH_REASONS = {
    0x86: "bad_username_or_password",
    0x87: "not_authorized",
    0x8C: "bad_authentication_method",
}


def _user(s: Session) -> str | None:
    return s.ctx.identity.username


class MqttEvents:
    """The MQTT side of the client events: which sessions were announced, and why they ended."""

    def __init__(self, events: ClientEvents) -> None:
        self.events = events
        self.live: set[Session] = set()  # announced as connected, not yet as disconnected
        self.stopping = False  # the adapter stops: reason server_shutdown

    def connected(self, s: Session, clean_start: bool) -> None:
        self.live.add(s)
        self.events.connected(
            "mqtt",
            s.client_id,
            _user(s),
            s.remote,
            proto_ver=s.version,
            keep_alive=s.keep_alive,
            clean_start=clean_start,
            expiry_interval=s.expiry if s.expiry < 0xFFFFFFFF else 0xFFFFFFFF,
        )

    def auth_failed(self, s: Session, reason_code: int) -> None:
        self.events.auth_failed(
            "mqtt",
            s.client_id,
            _user(s),
            s.remote,
            _AUTH_REASONS.get(reason_code, "not_authorized"),
            proto_ver=s.version,
        )

    def ended(self, s: Session, exc: Exception | None, kicked: bool) -> None:
        """The connection of `s` is gone (server.py `connection_lost`)."""
        if s not in self.live:
            return
        self.live.discard(s)
        self.events.disconnected("mqtt", s.client_id, _user(s), s.remote, self.reason(s, exc, kicked))

    def reason(self, s: Session, exc: Exception | None, kicked: bool) -> str:
        if s._normal_disconnect:
            return "normal"
        if kicked:
            return "kicked"
        if self.stopping:
            return "server_shutdown"
        other = s.broker.sessions.get(s.client_id)
        if other is not None and other is not s:
            return "takenover"
        if s.keep_alive and s.loop.time() - s.last_rx >= s.keep_alive * 1.5:
            return "keepalive_timeout"
        if exc is not None:
            return "sock_error"
        return "closed"


def with_events(base: type, events: ClientEvents) -> type:
    """A subclass of `base` (subscriptions.py `Subscriptions`) that also emits subscribed /
    unsubscribed events (what the broker builds with client events on)."""

    class EventSubscriptions(base):  # type: ignore[valid-type, misc]
        async def subscribe(self, s: Session, pkt: Subscribe) -> tuple[bytes, Callable[[], None] | None]:
            suback, after = await super().subscribe(s, pkt)
            if suback:
                n = len(pkt.subscriptions)
                codes = suback[-n:]  # (a SUBACK ends with one reason code per filter, 3.1.1 and 5.0)
                for so, code in zip(pkt.subscriptions, codes, strict=True):
                    if code < 0x80:
                        events.subscribed("mqtt", s.client_id, _user(s), s.remote, so.topic_filter, qos=code)
            return suback, after

        async def unsubscribe(self, s: Session, filt: str) -> bool:
            done = await super().unsubscribe(s, filt)
            if done:
                events.unsubscribed("mqtt", s.client_id, _user(s), s.remote, filt)
            return done

    return EventSubscriptions
