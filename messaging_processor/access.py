"""Who may do what: authentication, the ACL check and the authorization hook of the processor.

`Access` is handed the `Security` service (None: no authentication, every identity may do
everything), the processor's `Metrics` (refusals are counted) and a pluggable `Authorizer` (used
when security is off). Adapters reach it through `MessagingProcessor.authenticate`, `permits`,
`grant_subscription`, `may_open_vhost` and `authorize` (docs/security.md)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable

from .errors import ErrorKind, ProcessorError
from .metrics import Metrics
from .model import Action, ClientContext, Identity, Resource
from .security import AuthFailure, Grant, Security

audit = logging.getLogger("messaging_processor.audit")

# Identity mechanisms that present a user name and password.
PASSWORD_MECHANISMS = frozenset({"password", "plain", "amqplain", "mqtt-password", "http-basic"})
# An identity taken from a client certificate the adapter's TLS layer verified (the CN is the user).
CERTIFICATE_MECHANISM = "tls-client-cert"

Authorizer = Callable[[Identity, Action, Resource], bool | Awaitable[bool]]


def allow_all(identity: Identity, action: Action, resource: Resource) -> bool:
    """The default authorizer: every identity may do everything."""
    return True


class Access:
    """Authentication and authorization over `security` (or the `authorizer` hook without it)."""

    def __init__(self, security: Security | None, metrics: Metrics, authorizer: Authorizer | None) -> None:
        self.security = security
        self.metrics = metrics
        # None: nothing to check. With security on, the ACL (the processor's `authorizer` property).
        self.authorizer: Authorizer | None = self.acl_allows if security is not None else authorizer

    async def authenticate(self, ctx: ClientContext, content: bytes = b"") -> None:
        """With `security` on, verify `ctx.identity`'s credentials and replace it with the verified
        identity (its `principal` set, the secret dropped); ProcessorError(UNAUTHORIZED) otherwise,
        saying nothing about which part was wrong. `content`: what a remoting signature signs.
        No credentials at all (mechanism "none"): the anonymous principal when `allow_anonymous`
        (user name None). Without security every identity is let in as it is."""
        sec = self.security
        if sec is None:
            return
        ident = ctx.identity
        attrs = dict(ident.attributes)
        mech = ident.mechanism
        try:
            if mech in PASSWORD_MECHANISMS and ident.username and ident.secret is not None:
                p = await sec.login_password(ident.username, ident.secret, ctx.protocol, ctx.client_id)
            elif mech == "bearer" and ident.secret:
                p = sec.login_token(ident.secret, ctx.protocol, ctx.client_id)
            elif mech == "mqv2-hmac-sha1" and ident.username:
                p = await sec.login_grpc(
                    ident.username,
                    attrs.get("signature", ""),
                    attrs.get("x-mq-date-time", ""),
                    ctx.protocol,
                    ctx.client_id,
                )
            elif mech == "remoting-acl" and ident.username:
                p = await sec.login_remoting(
                    ident.username, attrs.get("signature", ""), content, ctx.protocol, ctx.client_id
                )
            elif mech == CERTIFICATE_MECHANISM and ident.username:
                p = await sec.login_certificate(ident.username, ctx.protocol, ctx.client_id)
            elif mech == "internal":
                return
            elif mech == "none":  # no credentials at all: the anonymous principal, if allowed
                p = sec.login_anonymous(ctx.protocol, ctx.client_id)
            elif mech in PASSWORD_MECHANISMS:  # no whole user name and password: never anonymous
                raise AuthFailure("missing_credentials")
            else:
                raise AuthFailure("unsupported_mechanism")
        except AuthFailure as e:
            self.metrics.auth_failures[(ctx.protocol, e.reason)] += 1
            audit.warning(
                "login refused: protocol=%s remote=%s user=%r reason=%s",
                ctx.protocol,
                ctx.remote or "-",
                ident.username or "",
                e.reason,
            )
            raise ProcessorError(ErrorKind.UNAUTHORIZED, "authentication failed") from None
        ctx.identity = Identity(None if p.anonymous else p.user, None, mech, (), p)

    def permits(self, identity: Identity, action: Action, resource: Resource) -> bool:
        """Whether `identity` may `action` `resource`: the one ACL check (cached per connection).
        A refusal is counted each time and logged once per connection and resource."""
        sec = self.security
        if sec is None:
            return True
        p = identity.principal
        if p is None:
            if identity.mechanism == "internal":  # the proxy's own loops (never a client's identity)
                return True
            self.metrics.acl_denials[("", action.value)] += 1
            return False
        ok, first = sec.permits(p, action.value, resource.kind, resource.name)
        if not ok:
            self.metrics.acl_denials[(p.protocol, action.value)] += 1
            if first:
                audit.warning(
                    "denied: protocol=%s client=%s user=%r action=%s resource=%s",
                    p.protocol,
                    p.client_id or "-",
                    p.user,
                    action.value,
                    resource,
                )
        return ok

    def may_publish(self, identity: Identity, path: str) -> bool:
        """`permits(PUBLISH, topic path)` with the cached allow answered first (the send path)."""
        p = identity.principal
        sec = self.security
        if (
            p is not None
            and sec is not None
            and p.version == sec.directory.version
            and p.decisions.get(("publish", "topic", path))
        ):
            return True
        return self.permits(identity, Action.PUBLISH, Resource("topic", path))

    def grant_subscription(self, identity: Identity, topic_filter: str) -> Grant:
        """An MQTT-style subscription filter's decision: DENY, ALLOW, or CHECK (then each delivered
        path must pass `permits(SUBSCRIBE)`)."""
        sec = self.security
        if sec is None or identity.mechanism == "internal":
            return Grant.ALLOW
        p = identity.principal
        g = Grant.DENY if p is None else sec.grant(p, topic_filter)
        if g is Grant.DENY:
            self.permits(identity, Action.SUBSCRIBE, Resource("topic", topic_filter))  # count and log
        return g

    def may_open_vhost(self, identity: Identity, vhost: str) -> bool:
        """Whether `identity` may open the AMQP virtual host `vhost`."""
        sec = self.security
        if sec is None:
            return True
        p = identity.principal
        return p is not None and sec.may_open_vhost(p, vhost)

    def acl_allows(self, identity: Identity, action: Action, resource: Resource) -> bool:
        """The authorizer with security on: CONNECT needs a verified identity, the rest the ACL."""
        if action is Action.CONNECT:
            return identity.principal is not None or identity.mechanism == "internal"
        return self.permits(identity, action, resource)

    async def authorize(self, identity: Identity, action: Action, resource: Resource) -> None:
        """Raise ProcessorError(FORBIDDEN) unless `action` on `resource` is allowed (UNAUTHORIZED
        for CONNECT without a verified identity when security is on)."""
        fn = self.authorizer
        if fn is None:
            return
        ok = fn(identity, action, resource)
        if inspect.isawaitable(ok):
            ok = await ok
        if not ok:
            kind = (
                ErrorKind.UNAUTHORIZED
                if action is Action.CONNECT and self.security is not None
                else ErrorKind.FORBIDDEN
            )
            raise ProcessorError(
                kind, f"{identity.username or 'anonymous'} may not {action.value} {resource}"
            )
