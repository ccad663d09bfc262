"""How a session ends: a DISCONNECT packet (its Session Expiry Interval and reason code) and the
end of the transport (keep-alive slot and token expiry cancelled, waiting deliveries told they
were not acknowledged, the registry told, with the will unless the client said goodbye). Split
from session.py; `s` is the connection's `Session`, seen here as an `EndingSession`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from runtime.deadlines import wheel_of

from .codec import PropertyId, ReasonCode
from .roles import Connection
from .states import CLOSED, CONNECTED

if TYPE_CHECKING:
    from runtime.events import LazyEvent

    from .codec import Disconnect
    from .roles import SessionHost


class EndingSession(Connection, Protocol):
    """What ending a session reads and clears of it (session.Session) besides `Connection`."""

    broker: SessionHost
    expiry: int
    will: Any
    queue: Any  # outbound messages waiting for send quota: (path, body, qos, retain, props, done, t)
    _replies: Any
    _ka_slot: int | None
    _normal_disconnect: bool
    _closed_event: LazyEvent | None


def on_disconnect(s: EndingSession, d: Disconnect) -> None:
    """DISCONNECT from the client: 5.0 may change the Session Expiry Interval (not from 0); a
    reason other than 0x04 (with will) means the will is not published."""
    new = d.properties.get(PropertyId.SESSION_EXPIRY_INTERVAL)
    if new is not None:
        if s.expiry == 0 and new:  # 5.0 3.14.2.2.2: a session that ends cannot be extended
            s.close(ReasonCode.PROTOCOL_ERROR)
            return
        s.expiry = new
        if s.pstate is not None:
            s.pstate.expiry = new
    if d.reason_code != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
        s._normal_disconnect = True
    s.close()


def connection_lost(s: EndingSession) -> None:
    """The transport is gone (idempotent): publish the will unless the client said goodbye,
    drop subscriptions and in-flight state."""
    if s.state == CLOSED:
        return
    was_connected = s.state == CONNECTED
    s.state = CLOSED
    if s._ka_slot is not None:
        wheel_of(s.loop).cancel(s, s._ka_slot)
        s._ka_slot = None
    if s._token_expiry is not None:
        s._token_expiry.cancel()
        s._token_expiry = None
    for e in s.inflight.values():
        if e[1] is not None and not e[1].done():
            e[1].set_result(False)
    for q in s.queue:
        if q[5] is not None and not q[5].done():
            q[5].set_result(False)
    s.inflight.clear()
    s.queue = ()
    s._replies = ()
    if was_connected or s.pstate is not None or s.broker.registry.sessions.get(s.client_id) is s:
        will = s.will if was_connected and not s._normal_disconnect else None
        s.broker.registry.session_closed(s, will)
    if s._closed_event is not None:
        s._closed_event.set()
