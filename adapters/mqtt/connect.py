"""CONNECT: check the client identifier, credentials and will, take or resume the session
(registry.py), answer CONNACK and arm keep-alive (a slot of the loop's deadline wheel,
runtime/deadlines.py). Split from session.py; `s` is the connection's `Session`, seen here as a
`ConnectingSession`: the parts of it a CONNECT reads and sets."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol

from messaging_processor import (
    CERTIFICATE_MECHANISM,
    Action,
    ClientContext,
    Identity,
    ProcessorError,
    Resource,
)
from runtime.deadlines import wheel_of

from .codec import MQTT_5, Connect, OutboundAliases, PropertyId, ReasonCode, connack_code, encode_connack
from .persistence import NEVER
from .roles import Connection
from .states import CLOSED, CONNECTED, TOPIC_ALIAS_MAXIMUM
from .token_expiry import arm as arm_token_expiry

if TYPE_CHECKING:
    import asyncio

    from .codec import Decoder
    from .limits import SessionLimits
    from .roles import SessionHost

log = logging.getLogger("adapters.mqtt")


class ConnectingSession(Connection, Protocol):
    """What handle_connect reads and sets of the session (session.Session) besides `Connection`."""

    broker: SessionHost
    cert_user: str | None
    decoder: Decoder
    limits: SessionLimits | None
    will: Any
    keep_alive: int
    expiry: int
    max_out: int
    aliases_out: OutboundAliases | None
    _backlog: list[Any] | None
    _ka_slot: int | None

    def handle(self, pkt: Any) -> None: ...

    def _write(self, data: bytes) -> None: ...

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task: ...


async def handle_connect(s: ConnectingSession, c: Connect) -> None:
    v = s.version = c.protocol_level
    props: dict = {}
    cid = c.client_id
    if not cid:
        cid = "auto-" + uuid.uuid4().hex
        if v == MQTT_5:
            props[PropertyId.ASSIGNED_CLIENT_IDENTIFIER] = cid
    s.client_id = cid
    if not s.broker.caps.client_id_ok(cid):
        refuse(s, ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, "client identifier too long")
        return
    if s.cert_user is not None:
        identity = Identity(s.cert_user, None, CERTIFICATE_MECHANISM)
    else:
        identity = Identity(
            c.username,
            c.password.decode("utf-8", "replace") if c.password is not None else None,
            "mqtt-password" if c.username is not None or c.password is not None else "none",
        )
    s.ctx = ClientContext("mqtt", cid, identity, s.remote)
    refusal = await authenticate(s, c)
    if s.state == CLOSED:
        return
    if refusal is not None:
        if s.broker.events is not None:
            s.broker.events.auth_failed(s, refusal)
        s._write(encode_connack(False, connack_code(refusal, v), v))
        s._backlog = None
        s.close()
        return
    if s.limits is not None and not s.limits.login(s):
        refuse(s, ReasonCode.QUOTA_EXCEEDED, "too many connections for this user")
        return
    s.will = c.will
    keep_alive = c.keep_alive
    if v == MQTT_5:
        cp = c.properties
        if PropertyId.AUTHENTICATION_METHOD in cp:  # no enhanced authentication (AUTH) methods
            refuse(s, ReasonCode.BAD_AUTHENTICATION_METHOD, "no authentication methods are supported")
            return
        s.send_quota = cp.get(PropertyId.RECEIVE_MAXIMUM, 65535)
        s.max_out = cp.get(PropertyId.MAXIMUM_PACKET_SIZE, 0)
        if cp.get(PropertyId.TOPIC_ALIAS_MAXIMUM, 0):
            s.aliases_out = OutboundAliases(cp[PropertyId.TOPIC_ALIAS_MAXIMUM])
        s.expiry = cp.get(PropertyId.SESSION_EXPIRY_INTERVAL, 0)
        s.decoder.topic_alias_maximum = TOPIC_ALIAS_MAXIMUM
        props[PropertyId.TOPIC_ALIAS_MAXIMUM] = TOPIC_ALIAS_MAXIMUM
        props[PropertyId.SUBSCRIPTION_IDENTIFIER_AVAILABLE] = 1
        props[PropertyId.WILDCARD_SUBSCRIPTION_AVAILABLE] = 1
        props[PropertyId.SHARED_SUBSCRIPTION_AVAILABLE] = 1
        props[PropertyId.RETAIN_AVAILABLE] = 1
        props[PropertyId.MAXIMUM_PACKET_SIZE] = s.broker.max_packet_size
        mk = s.broker.max_keep_alive
        if mk and (keep_alive == 0 or keep_alive > mk):
            keep_alive = mk
            props[PropertyId.SERVER_KEEP_ALIVE] = mk
    else:
        s.expiry = 0 if c.clean_start else NEVER
    try:
        present = await s.broker.registry.attach(s, c.clean_start, s.expiry)
    except Exception as e:  # noqa: BLE001 - the store could not take the session
        log.warning("mqtt %s: session setup failed: %s", cid, e)
        refuse(s, ReasonCode.SERVER_UNAVAILABLE, "session store unavailable")
        return
    if s.state == CLOSED:
        return
    s.state = CONNECTED
    s._write(encode_connack(present, 0, v, props or None))
    s.keep_alive = keep_alive
    if keep_alive:
        s._ka_slot = wheel_of(s.loop).schedule(s, s.loop.time() + keep_alive * 1.5)
    arm_token_expiry(s)
    if s.broker.events is not None:
        s.broker.events.connected(s, c.clean_start)
    if s.pstate is not None:
        s._spawn(s.broker.registry.resume(s))
    backlog, s._backlog = s._backlog, None
    for pkt in backlog or ():
        if s.state == CLOSED:
            break
        s.handle(pkt)


async def authenticate(s: ConnectingSession, c: Connect) -> int | None:
    """Check the CONNECT's credentials and will: None when accepted (`s.ctx.identity` then the
    verified one), else the 5.0 reason code to refuse it with. As Mosquitto with
    `allow_anonymous false`, a CONNECT without credentials gets Not authorized (3.1.1: 5), and with
    `allow_anonymous` it is the anonymous principal, which the ACL rules of `anonymous` govern; bad
    credentials, whichever part was wrong, Bad User Name or Password (3.1.1: 4); a will whose
    topic the user may not publish to, Not authorized."""
    p = s.broker.processor
    ctx = s.ctx
    try:
        if p.security is not None:
            anonymous = ctx.identity.mechanism == "none"
            try:
                await p.authenticate(ctx)
            except ProcessorError:
                return ReasonCode.NOT_AUTHORIZED if anonymous else ReasonCode.BAD_USER_NAME_OR_PASSWORD
        await p.authorize(ctx.identity, Action.CONNECT, Resource("cluster", "mqtt"))
    except ProcessorError as e:
        log.info("mqtt %s (%s) refused: %s", ctx.client_id, s.remote, e)
        return ReasonCode.NOT_AUTHORIZED
    w = c.will
    if (
        w is not None
        and p.security is not None
        and not p.permits(ctx.identity, Action.PUBLISH, Resource("topic", w.topic))
    ):
        log.info(
            "mqtt %s (%s) refused: may not publish its will to %s",
            ctx.client_id,
            s.remote,
            w.topic,
        )
        return ReasonCode.NOT_AUTHORIZED
    return None


def refuse(s: ConnectingSession, reason: int, text: str) -> None:
    v = s.version
    props = {PropertyId.REASON_STRING: text} if v == MQTT_5 else None
    s._write(encode_connack(False, connack_code(reason, v), v, props))
    s._backlog = None
    s.close()
