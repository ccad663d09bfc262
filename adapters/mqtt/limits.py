"""MQTT's answers to the gateway's connection and publish-rate limits (adapters/limits.py).

- A connection over the listener's or its address's limit gets CONNACK 0x97 Quota exceeded (5.0) /
  3 Server unavailable (3.1.1) to its CONNECT (`Refusal`: no session is made for it).
- A user at its connection limit gets the same CONNACK after authentication (`SessionLimits.login`).
- A publisher over its rate is slowed by TCP backpressure: its socket is not read until its debt is
  repaid (`ReadThrottle`); a 5.0 client more than HARD_QUOTA_S seconds in debt gets PUBACK / PUBREC
  0x97 for what is over (the messages are not stored)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..limits import HARD_QUOTA_S, Limiter, ReadThrottle
from .codec import (
    MQTT_5,
    Connect,
    Decoder,
    Publish,
    ReasonCode,
    connack_code,
    encode_connack,
    encode_puback,
    encode_pubrec,
)

if TYPE_CHECKING:
    from .roles import Connection

log = logging.getLogger("adapters.mqtt")
PROTOCOL = "mqtt"


class Refusal:
    """A refused connection: waits for its CONNECT, answers it with CONNACK Quota exceeded (3.1.1:
    Server unavailable) and closes; anything else closes at once."""

    __slots__ = ("decoder", "write", "close", "why")

    def __init__(self, write: Callable[[bytes], Any], close: Callable[[], Any], why: str) -> None:
        self.decoder = Decoder()
        self.write = write
        self.close = close
        self.why = why

    def feed(self, data: bytes) -> None:
        pkts, error = self.decoder.receive(data)
        if pkts and type(pkts[0]) is Connect:
            v = pkts[0].protocol_level
            self.write(encode_connack(False, connack_code(ReasonCode.QUOTA_EXCEEDED, v), v))
            self.close()
        elif pkts or error is not None:
            self.close()


class SessionLimits:
    """The per-user connection count and the publish throttle of one MQTT connection."""

    __slots__ = ("limiter", "transport", "user", "logged_in")

    def __init__(self, limiter: Limiter, transport: asyncio.Transport) -> None:
        """`transport`: paused and resumed by the publish throttle (its methods are bound only
        when a throttle is made, not for every idle connection)."""
        self.limiter = limiter
        self.transport = transport
        self.user: str | None = None
        self.logged_in = False

    def login(self, session: Connection) -> bool:
        """After authentication: False when the user is at its connection limit; else the session
        gets its publish throttle (when publish rates are on)."""
        user = session.ctx.identity.username
        if not self.limiter.login(PROTOCOL, user):
            log.info(
                "mqtt %s (%s): user %s is at its connection limit", session.client_id, session.remote, user
            )
            return False
        self.user, self.logged_in = user, True
        meter = self.limiter.meter(user)
        if meter is not None:
            t = self.transport
            session.throttle = ReadThrottle(meter, self.limiter, PROTOCOL, t.pause_reading, t.resume_reading)
        return True

    def closed(self, session: Connection) -> None:
        if self.logged_in:
            self.logged_in = False
            self.limiter.logout(self.user)
        if session.throttle is not None:
            session.throttle.cancel()


def admit_publish(session: Connection, p: Publish) -> bool:
    """Bill one PUBLISH to the session's throttle. False when a 5.0 client is over its hard quota:
    it is then answered 0x97 here (at QoS 0 dropped) and must not be stored."""
    throttle = session.throttle
    assert throttle is not None
    if session.version == MQTT_5 and throttle.over_hard_quota(1, len(p.payload)):
        if p.qos == 1:
            session._reply_now(encode_puback(p.packet_id, ReasonCode.QUOTA_EXCEEDED, MQTT_5))
        elif p.qos == 2 and p.packet_id in session.awaiting_rel:
            session.awaiting_rel.discard(p.packet_id)  # type: ignore[union-attr]
            session._reply_now(encode_pubrec(p.packet_id, ReasonCode.QUOTA_EXCEEDED, MQTT_5))
        return False
    throttle.charge(1, len(p.payload))
    return True


def admit_batch(session: Connection, pkts: list[Publish]) -> bool:
    """Bill a read's plain PUBLISHes together. False (nothing billed) when a 5.0 client would go over
    its hard quota: the caller then takes them one by one (`admit_publish`), so that what fits is
    stored and the rest refused, each answered in order."""
    throttle = session.throttle
    assert throttle is not None
    nbytes = 0
    for p in pkts:
        nbytes += len(p.payload)
    if session.version == MQTT_5 and throttle.meter.debt_after(len(pkts), nbytes) > HARD_QUOTA_S:
        return False
    throttle.charge(len(pkts), nbytes)
    return True
