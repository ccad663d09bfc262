"""AMQP's answers to the gateway's connection and publish-rate limits (adapters/limits.py).

- A connection over the listener's or its address's limit, or whose user is at its connection
  limit, gets connection.close 530 NOT_ALLOWED in answer to its start-ok (the listener and address
  limits are checked before the credentials: a reconnect storm costs no password hashing).
- A publisher over its rate gets connection.blocked (when its client-properties announced the
  `connection.blocked` capability) and its socket is not read until its debt is repaid; then
  connection.unblocked (unless the store itself still refuses writes) and reading resumes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..limits import Limiter, ReadThrottle

if TYPE_CHECKING:
    from messaging_processor import ClientContext

log = logging.getLogger("adapters.amqp")
PROTOCOL = "amqp"
BLOCKED_REASON = "publish rate limit"


class _Blocking(Protocol):
    reason: str | None  # why the store refuses writes now (blocking.py `Blocking`), or None


class _Broker(Protocol):
    blocking: _Blocking


class LimitedConnection(Protocol):
    """What the limits use of a connection (session.py `Connection`)."""

    ctx: ClientContext
    throttle: ReadThrottle | None

    @property
    def broker(self) -> _Broker: ...

    def set_blocked(self, reason: str | None) -> None: ...


class ConnectionLimits:
    """One AMQP connection's place in the limiter: `refusal` (set at accept: the limit it is over,
    or None), the per-user count once logged in, and its publish throttle."""

    __slots__ = ("limiter", "refusal", "counted", "user", "logged_in", "pause", "resume", "blocked")

    def __init__(
        self, limiter: Limiter, address: str, pause: Callable[[], Any], resume: Callable[[], Any]
    ) -> None:
        self.limiter = limiter
        self.refusal = limiter.accept(PROTOCOL, address)
        self.counted = self.refusal is None
        self.user: str | None = None
        self.logged_in = False
        self.pause = pause
        self.resume = resume
        self.blocked = False

    def refused(self) -> str | None:
        """Before authentication: why this connection is refused (None: go on)."""
        if self.refusal is None:
            return None
        return f"connection refused: {self.refusal.replace('_', ' ')} reached"

    def login(self, conn: LimitedConnection) -> str | None:
        """After authentication: why the user is refused (None: counted, and the connection gets its
        publish throttle when publish rates are on)."""
        user = conn.ctx.identity.username
        if not self.limiter.login(PROTOCOL, user):
            return f"connection refused: user '{user}' is at its connection limit"
        self.user, self.logged_in = user, True
        meter = self.limiter.meter(user)
        if meter is not None:

            def pause() -> None:
                if not self.blocked:
                    self.blocked = True
                    conn.set_blocked(BLOCKED_REASON)
                self.pause()

            def resume() -> None:
                self.blocked = False
                if conn.broker.blocking.reason is None:
                    conn.set_blocked(None)
                self.resume()

            conn.throttle = ReadThrottle(meter, self.limiter, PROTOCOL, pause, resume)
        return None

    def closed(self, conn: LimitedConnection) -> None:
        """The connection is gone (idempotent)."""
        if self.counted:
            self.counted = False
            self.limiter.closed(PROTOCOL)
        if self.logged_in:
            self.logged_in = False
            self.limiter.logout(self.user)
        if conn.throttle is not None:
            conn.throttle.cancel()
