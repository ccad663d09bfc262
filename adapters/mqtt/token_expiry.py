"""A device token's expiry on a live connection (docs/security.md, "Device tokens (JWT)"): when the
`exp` of the JWT a client logged in with passes, an MQTT 5.0 client gets DISCONNECT 0xA0 (Maximum
connect time) and the connection closes; a 3.1.1 client's connection is closed (3.1.1 has no server
DISCONNECT). One slot of the loop's deadline wheel (runtime/deadlines.py) per such connection, not a
timer or a task; the session cancels it when it closes."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from runtime.deadlines import wheel_of

from .codec import ReasonCode

if TYPE_CHECKING:
    from .roles import Connection

log = logging.getLogger("adapters.mqtt")


class TokenExpiry:
    __slots__ = ("session", "slot")

    def __init__(self, session: Connection, expires_at: float) -> None:
        self.session = session
        loop = session.loop
        self.slot: int | None = wheel_of(loop).schedule(self, loop.time() + (expires_at - time.time()))

    def deadline(self) -> None:
        self.slot = None
        s = self.session
        log.info("mqtt %s: device token expired, disconnecting", s.client_id)
        s.close(ReasonCode.MAXIMUM_CONNECT_TIME)

    def cancel(self) -> None:
        if self.slot is not None:
            wheel_of(self.session.loop).cancel(self, self.slot)
            self.slot = None


def arm(s: Connection) -> None:
    """After CONNACK: watch the expiry of the token `s` logged in with, if it has one."""
    p = s.ctx.identity.principal
    if p is not None and p.expires_at is not None:
        s._token_expiry = TokenExpiry(s, p.expires_at)
