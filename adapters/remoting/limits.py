"""The 4.x remoting listener's limits (adapters/limits.py, docs/limits.md): connections per listener
and per source address, and publish rates per connection and per user.

Remoting has no answer to a connection it will not serve (a 4.x client simply sees its connection
closed and tries another broker address), so a refused connection is closed at once and logged.
A send over its client's or its user's rate is answered SYSTEM_BUSY (2) with a `[TOO_MANY_REQUESTS]`
remark and nothing is stored: that is what a RocketMQ broker's flow control answers, and 4.x
producers back off and retry it."""

from __future__ import annotations

import logging

from remoting import ResponseCode

from ..limits import PUBLISH_RATE, ClientMeter, Limiter, host_of

log = logging.getLogger("adapters.remoting")
PROTOCOL = "remoting"


class RemotingLimits:
    """The shared `Limiter` as the remoting adapter uses it."""

    __slots__ = ("limiter",)

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter

    def accept(self, peer: object, remote: str) -> bool:
        """A connection arrives: True and counted (call `closed`), else False (the caller closes it)."""
        refused = self.limiter.accept(PROTOCOL, host_of(peer))
        if refused is None:
            return True
        log.info("remoting connection %s refused: %s limit reached", remote, refused)
        return False

    def closed(self) -> None:
        self.limiter.closed(PROTOCOL)

    def meter(self, user: str | None) -> ClientMeter | None:
        return self.limiter.meter(user)

    def over_rate(self, meter: ClientMeter, msgs: int, nbytes: int) -> tuple[int, str] | None:
        """None and charged when a send fits, else the SYSTEM_BUSY answer (nothing charged)."""
        wait = meter.try_take(msgs, nbytes)
        if wait <= 0.0:
            return None
        self.limiter.refusals[(PROTOCOL, PUBLISH_RATE)] += 1
        return (
            ResponseCode.SYSTEM_BUSY,
            f"[TOO_MANY_REQUESTS] publish rate of this client is exceeded, retry in {wait:.2f} s",
        )


__all__ = ["RemotingLimits"]
