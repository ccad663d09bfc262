"""SUBSCRIBE and UNSUBSCRIBE for every session of this proxy, and which deliveries a session's
subscriptions need.

With security on, a SUBSCRIBE filter is decided by the ACL (access.py: refused in the SUBACK, or
granted with or without a check of each delivered path, retained messages included); with only an
authorizer, it is authorized as `Action.SUBSCRIBE` on its store topic (`*` for a root wildcard).
Then: a shared one (`$share/...`) joins a share (shared.py); a clean session's is
indexed for the fan-out (fanout.py), whose loop is positioned before the SUBACK; a persistent
session's is indexed for dispatch to its queue (session_routing.py; one without a queue has its
group positioned at the end of each store topic it newly covers instead) and saved. The
retained messages matching a filter (per its retain handling) go out right after the SUBACK.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from messaging_processor import Action, DeliveryLoop, Message, MessagingProcessor, ProcessorError, Resource
from messaging_processor.security import Grant

from . import access
from .codec import MQTT_5, PropertyId, ReasonCode, Subscribe, encode_suback, parse_shared
from .mapping import qos_of, store_topic_of_level, v5_properties, with_sub_ids
from .persistence import save
from .session import CONNECTED
from .subscription import Sub

if TYPE_CHECKING:
    from .fanout import Fanout
    from .persistence import SessionState
    from .retained import Retained
    from .session import Session
    from .session_routing import SessionRoutes
    from .shared import ShareMember, Shares


class Subscriptions:
    """The subscriptions of clean sessions (`Session.subs`) and persistent ones (`SessionState.subs`)."""

    def __init__(
        self,
        processor: MessagingProcessor,
        fanout: Fanout,
        retained: Retained,
        shares: Shares,
        routes: SessionRoutes | None = None,
    ) -> None:
        self.processor = processor
        self.fanout = fanout
        self.retained = retained
        self.shares = shares
        self.routes = routes  # persistent sessions' queues (session_routing.py); None: no queues

    async def subscribe(self, s: Session, pkt: Subscribe) -> tuple[bytes, Callable[[], None] | None]:
        """The SUBACK, and what to run after it is written (the retained messages), if anything;
        (b"", None) when the connection closed meanwhile."""
        codes: list[int] = []
        to_send: list[tuple[Sub, Message, str]] = []
        v = s.version
        st = s.pstate
        holder = st.subs if st is not None else s.subs
        sid = pkt.properties.get(PropertyId.SUBSCRIPTION_IDENTIFIER)
        sub_id = sid[0] if sid else 0
        changed = False
        fanout = self.fanout
        for so in pkt.subscriptions:
            filt = so.topic_filter
            qos = min(so.qos, 2)
            try:
                shared = parse_shared(filt)
            except ValueError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            inner = shared[1] if shared else filt
            if not s.broker.caps.topic_ok(inner):  # over --mqtt-max-topic-length / -levels
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            first = inner.split("/", 1)[0]
            wild = first in ("+", "#")
            grant = access.decide(self.processor, s.ctx.identity, inner)
            if grant is Grant.DENY:
                codes.append(ReasonCode.NOT_AUTHORIZED)  # 3.1.1: 0x80 Failure
                continue
            if self.processor.security is None and self.processor.authorizer is not None:
                try:
                    await self.processor.authorize(
                        s.ctx.identity,
                        Action.SUBSCRIBE,
                        Resource("topic", "*" if wild else store_topic_of_level(first)),
                    )
                except ProcessorError:
                    codes.append(ReasonCode.NOT_AUTHORIZED)
                    continue
            if shared:
                if wild:
                    codes.append(ReasonCode.SHARED_SUBSCRIPTIONS_NOT_SUPPORTED)
                    continue
                codes.append(
                    await self.shares.subscribe(s, holder, filt, shared[0], inner, qos, sub_id, grant)
                )
                changed = True
                continue
            sub = holder.get(filt)
            new = sub is None
            if sub is None:
                sub = Sub(
                    None if st is not None else s,
                    filt,
                    qos,
                    so.retain_as_published,
                    None,
                    so.no_local,
                    so.retain_handling,
                    sub_id,
                )
                access.apply(self.processor, sub, grant)
                if st is not None:
                    if st.queue is None:
                        await fanout.cover(st, sub)
                    elif not st.queue_made:
                        await self.processor.send_internal(st.queue, [], queues=1)
                        st.queue_made = True
                    if sub.wild:
                        st.wild += 1
                else:
                    await fanout.acquire(sub)
                    if s.state != CONNECTED:
                        await fanout.release(sub)
                        return b"", None
                    fanout.add(sub)
                holder[filt] = sub
            else:
                sub.qos = qos
                sub.rap = so.retain_as_published
                sub.nl = so.no_local
                sub.rh = so.retain_handling
                sub.sub_id = sub_id
                access.apply(self.processor, sub, grant)
            changed = True
            codes.append(qos)
            rh = so.retain_handling
            if rh == 0 or (rh == 1 and new):
                version = access.acl_version(self.processor)
                for path, m in await self.retained.matching(filt):
                    if access.delivers(self.processor, sub, s.ctx.identity, path, version):
                        to_send.append((sub, m, path))
        if changed:
            s.nl_count = sum(1 for x in holder.values() if x.nl)
            if st is not None:
                if self.routes is not None:  # (before the SUBACK: what is sent from now on is queued)
                    await self.routes.changed(st)
                await save(self.processor, st)
                await fanout.sync(st)
        suback = encode_suback(pkt.packet_id, codes, v)

        def after() -> None:
            for sub, m, path in to_send:
                q = min(sub.qos, qos_of(m))
                props = None
                if s.version == MQTT_5:
                    props = with_sub_ids(v5_properties(m), [sub.sub_id] if sub.sub_id else None)
                s.deliver(path, m.body, q, True, props)

        return suback, after if to_send else None

    async def unsubscribe(self, s: Session, filt: str) -> bool:
        """Remove the subscription `filt` (as subscribed) of `s`; False if it had none."""
        st = s.pstate
        if st is None:
            sub = s.subs.pop(filt, None)
            if sub is None:
                return False
            s.nl_count = sum(1 for x in s.subs.values() if x.nl)
            await self.drop(sub)
            return True
        sub = st.subs.pop(filt, None)
        if sub is None:
            return False
        s.nl_count = sum(1 for x in st.subs.values() if x.nl)
        if sub.loop is not None:
            await sub.loop.stop(drain_timeout=0)
            sub.loop = None
        if sub.wild and sub.share is None:
            st.wild -= 1
        if self.routes is not None:
            await self.routes.changed(st)
        await save(self.processor, st)
        await self.fanout.sync(st)
        return True

    async def drop(self, sub: Sub) -> None:
        """End a clean session's subscription (its connection closed or it unsubscribed)."""
        if sub.share is not None:
            if sub.loop is not None:
                await sub.loop.stop(drain_timeout=0)
            return
        await self.fanout.remove(sub)

    async def resume(self, st: SessionState, s: Session) -> None:
        """Start the deliveries of a persistent session now attached to `s`."""
        self.shares.rejoin(st, s)
        await self.fanout.sync(st)

    def detach(self, st: SessionState) -> list[DeliveryLoop | ShareMember]:
        """Take every delivery of a persistent session (its loops and share memberships) for the
        caller to stop."""
        loops: list[DeliveryLoop | ShareMember] = [*self.fanout.detach(st)]
        for sub in st.subs.values():
            if sub.loop is not None:
                loops.append(sub.loop)
                sub.loop = None
        return loops
