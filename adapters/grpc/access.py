"""Who may call what over gRPC: each RPC's signature verified and its ACL checks run, as RocketMQ's
ACL 2.0 does (docs/security.md).

`RequestAccess` is handed the processor (its `security`, None: nothing is checked; `authenticate`
and `permits`, looked up per call). A verified identity is remembered per presented identity and
client id, so a request costs a dict lookup, and per client id and user, so a new date-time signed
by the same user keeps its principal (and the ACL decision cache on it)."""

from __future__ import annotations

import time

from adapters.grpc import codes
from adapters.grpc.codes import Code, status_of
from adapters.grpc.generated import definition_pb2 as d
from messaging_processor import Action, ClientContext, Identity, MessagingProcessor, ProcessorError, Resource

# Verified identities remembered (by presented identity and client id; by client id and user).
MAX_VERIFIED = 4096
Check = tuple[Action, Resource]


def token_expired(ident: Identity) -> bool:
    """A verified identity of a device token whose `exp` has passed (docs/security.md)."""
    p = ident.principal
    return p is not None and p.expires_at is not None and p.expires_at <= time.time()


def topic_resource(name: str) -> Resource:
    return Resource("topic", name)


def group_resource(name: str) -> Resource:
    return Resource("group", name)


def subscribe_checks(group: str, topic: str) -> tuple[Check, Check]:
    """Subscribe on the consumer group and on the topic."""
    return (Action.SUBSCRIBE, group_resource(group)), (Action.SUBSCRIBE, topic_resource(topic))


def settings_checks(settings: d.Settings) -> list[Check]:
    """What a client's Settings need (ACL 2.0): publish on each publishing topic, or subscribe on
    the group and each subscribed topic."""
    which = settings.WhichOneof("pub_sub")
    if which == "publishing":
        return [(Action.PUBLISH, topic_resource(t.name)) for t in settings.publishing.topics]
    if which == "subscription":
        sub = settings.subscription
        return [(Action.SUBSCRIBE, group_resource(sub.group.name))] + [
            (Action.SUBSCRIBE, topic_resource(e.topic.name)) for e in sub.subscriptions
        ]
    return []


class RequestAccess:
    """The signature and ACL checks of the servicer's RPCs (see the module docstring)."""

    def __init__(self, processor: MessagingProcessor) -> None:
        self.processor = processor
        # (presented identity, client id) -> verified identity, and (client id, user) -> the verified
        # identity whose principal (and its ACL decision cache) later signatures reuse.
        self.verified: dict[tuple[Identity, str], Identity] = {}
        self.principals: dict[tuple[str, str], Identity] = {}

    async def refused(self, ctx: ClientContext, *checks: Check) -> d.Status | None:
        """With security on: verify `ctx`'s signature (remembered per presented identity and client id,
        so a request costs a dict lookup) and replace its identity with the verified one, then run the
        ACL `checks`. The Status to answer with (UNAUTHORIZED / FORBIDDEN), or None to go on."""
        proc = self.processor
        if proc.security is None:
            return None
        key = (ctx.identity, ctx.client_id)
        verified = ctx.identity if ctx.identity.principal is not None else self.verified.get(key)
        if verified is not None and token_expired(verified):
            self.verified.pop(key, None)  # a device token past its exp: verified again, and refused
            verified = None
        if verified is None:
            try:
                await proc.authenticate(ctx)
            except ProcessorError as e:
                return status_of(e)
            verified = ctx.identity
            p = verified.principal
            pkey = (ctx.client_id, p.user if p is not None else "")
            prev = self.principals.get(pkey)
            if (
                prev is not None
                and prev.principal is not None
                and not prev.principal.revoked
                and (p is None or prev.principal.expires_at == p.expires_at)
            ):
                verified = prev  # a new date-time signed by the same user: keep its decision cache
            else:
                if len(self.principals) >= MAX_VERIFIED:
                    self.principals.clear()
                self.principals[pkey] = verified
            if len(self.verified) >= MAX_VERIFIED:
                self.verified.clear()
            self.verified[key] = verified
        ctx.identity = verified
        for action, resource in checks:
            if not proc.permits(verified, action, resource):
                return codes.status(Code.FORBIDDEN, f"may not {action.value} {resource}")
        return None

    def may_route(self, ident: Identity, topic: str) -> bool:
        """QueryRoute needs publish or subscribe on the topic (ACL 2.0's [PUB, SUB])."""
        sec, p = self.processor.security, ident.principal
        if sec is not None and p is not None and sec.permits(p, Action.PUBLISH.value, "topic", topic)[0]:
            return True  # (asked quietly: only a refusal of both is counted and logged)
        return self.processor.permits(ident, Action.SUBSCRIBE, topic_resource(topic))
