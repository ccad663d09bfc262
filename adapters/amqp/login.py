"""A connection's login (connection.start-ok): the SASL mechanisms offered, the credentials of a
PLAIN or AMQPLAIN response, and their check by the processor (processor.authenticate with security
on, else its authorizer). Every refusal has one text (RabbitMQ's): the client learns nothing about
which part was wrong. The connection's state machine stays session.py's."""

from __future__ import annotations

import logging
import struct
from typing import Protocol

from messaging_processor import (
    CERTIFICATE_MECHANISM,
    Action,
    ClientContext,
    Identity,
    MessagingProcessor,
    ProcessorError,
    Resource,
)

from . import codec as c
from .publish import PublishAcl

log = logging.getLogger("adapters.amqp")


class Refused(Exception):
    """The login is refused (connection.close 403 `text`); `user`: the name it tried, if any."""

    def __init__(self, text: str, user: str | None) -> None:
        super().__init__(text)
        self.text = text
        self.user = user


class LoggingIn(Protocol):
    """What a login sets on its connection (session.py `Connection`)."""

    remote: str
    ctx: ClientContext
    pop_ctx: ClientContext
    publish_acl: PublishAcl | None


def credentials(mechanism: str, response: bytes) -> tuple[str, str] | None:
    """(username, password) of a PLAIN or AMQPLAIN start-ok response; None if malformed."""
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            return None
        return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
    try:  # AMQPLAIN: a field table without its length prefix (some clients send one)
        if len(response) >= 4 and struct.unpack(">I", response[:4])[0] == len(response) - 4:
            table = c.decode_table(response, 0, len(response))[0]
        else:
            table = c.decode_table(struct.pack(">I", len(response)) + response, 0, len(response) + 4)[0]
    except (ValueError, IndexError, struct.error):
        return None
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if login is None or password is None:
        return None
    as_str = lambda v: v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)  # noqa: E731
    return as_str(login), as_str(password)


def mechanisms(p: MessagingProcessor, cert_user: str | None) -> list[bytes]:
    """The SASL mechanisms offered: EXTERNAL with a verified client certificate (`cert_user`),
    PLAIN and AMQPLAIN, and ANONYMOUS (RFC 4505, as RabbitMQ 4) when `allow_anonymous` admits
    clients without credentials under the ACL rules of `anonymous`."""
    mechs = [b"EXTERNAL"] if cert_user is not None else []
    mechs += [b"PLAIN", b"AMQPLAIN"]
    sec = p.security
    if sec is not None and sec.allow_anonymous:
        mechs.append(b"ANONYMOUS")
    return mechs


def offered(p: MessagingProcessor, cert_user: str | None, mech: str) -> bool:
    """Whether `mech` is one of the mechanisms this connection was offered."""
    return mech.encode("utf-8", "replace") in mechanisms(p, cert_user)


async def log_in(
    conn: LoggingIn, p: MessagingProcessor, mech: str, response: bytes, cert_user: str | None
) -> None:
    """Check the credentials of an offered mechanism: `conn.ctx` becomes the client's context (set
    before the check, which may run argon2 in a thread), `pop_ctx` what its consumers pop with,
    `publish_acl` what it may publish to; Refused if the processor refuses them."""
    external = mech == "EXTERNAL" and cert_user is not None
    anonymous = mech == "ANONYMOUS"
    # ANONYMOUS: the response is optional trace information (RFC 4505), not a credential
    cred = (cert_user or "", "") if external else None if anonymous else credentials(mech, response)
    refused = f"Login was refused using authentication mechanism {mech}. For details see the broker logfile."
    if cred is None and p.security is None:
        raise Refused(refused, None)
    if external:
        identity = Identity(cert_user, None, CERTIFICATE_MECHANISM)
    elif anonymous:
        identity = Identity()  # no credentials: processor.authenticate admits it as anonymous
    else:
        # malformed credentials are refused as wrong ones (never taken as anonymous)
        identity = Identity(*cred, mech.lower()) if cred is not None else Identity(mechanism=mech.lower())
    remote = conn.remote
    conn.ctx = ClientContext("amqp", client_id=f"amqp-{remote}", identity=identity, remote=remote)
    try:
        if p.security is not None:
            await p.authenticate(conn.ctx)
            conn.publish_acl = PublishAcl(p, conn.ctx.identity)
            conn.pop_ctx = ClientContext(
                "amqp",
                client_id=conn.ctx.client_id,
                identity=Identity(conn.ctx.identity.username, None, "internal"),
                remote=remote,
            )
        else:
            await p.authorize(identity, Action.CONNECT, Resource("cluster", "amqp"))
            conn.pop_ctx = conn.ctx
    except ProcessorError:
        log.info("amqp %s: login refused (mechanism %s)", remote, mech)
        raise Refused(refused, identity.username) from None
