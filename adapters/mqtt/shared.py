"""Shared subscriptions `$share/<name>/<filter>` within one proxy: one DeliveryLoop per (share name,
store topic, filter) pops with the share's consumer group and hands each message to the next
connected member in turn (round robin, skipping members whose Receive Maximum is used up), as
Mosquitto and EMQX do. Members on other proxies compete through the store (pop), so the load is
balanced both across proxies and across the members of one proxy.

A message whose member goes away before acknowledging it is given back at once (REQUEUE) and goes
to another member. The loop pops as the proxy; each member's own rights are checked per message
(access.py): a member that may not read a path is skipped, and a message no connected member may
read is dropped. `Shares` keeps this proxy's ShareGroups and handles `$share/...` SUBSCRIBEs: a new
share group (consumer group `mqtt.share.<name>`) starts at the current end of its store topic."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from messaging_processor import (
    ClientContext,
    DeliveryLoop,
    Filter,
    MessagingProcessor,
    Outcome,
    ProcessorError,
)
from messaging_processor.security import Grant

from . import access
from .codec import ReasonCode
from .codec.topics import topic_matches
from .fanout import position_at_end
from .mapping import expired, path_of, qos_of, store_topic_of_level, v5_properties, with_sub_ids
from .session import CONNECTED, MQTT_5, Session
from .subscription import Sub

if TYPE_CHECKING:
    from .persistence import SessionState

log = logging.getLogger("adapters.mqtt")

MAX_INFLIGHT_PER_MEMBER = 64


class ShareMember:
    """One subscription's place in a ShareGroup; `stop()` leaves the group (the Sub.loop handle)."""

    __slots__ = ("group", "session", "qos", "sub_id", "sub")

    def __init__(self, group: ShareGroup, session: Session, sub: Sub) -> None:
        self.group = group
        self.session = session
        self.qos = sub.qos
        self.sub_id = sub.sub_id
        self.sub = sub  # its ACL decision (access.py)

    async def stop(self, drain_timeout: float = 0) -> None:  # noqa: ARG002 - DeliveryLoop's signature
        await self.group.leave(self)


class ShareGroup:
    """The members of one shared subscription in this proxy and the loop that serves them."""

    def __init__(
        self,
        processor: MessagingProcessor,
        ctx: ClientContext,
        group: str,
        topic: str,
        filt: str,
        on_empty: Callable[[ShareGroup], None],
    ) -> None:
        self.processor = processor
        self.ctx = ctx  # the proxy's own: members' rights are checked per delivery
        self.group = group
        self.topic = topic
        self.filter = filt
        self.members: list[ShareMember] = []
        self._next = 0
        self._loop: DeliveryLoop | None = None
        self._on_empty = on_empty

    def join(self, session: Session, sub: Sub) -> ShareMember:
        """Add a member (starting the loop with the first one)."""
        m = ShareMember(self, session, sub)
        self.members.append(m)
        if self._loop is None:
            filt = self.filter
            self._loop = DeliveryLoop(
                self.processor,
                self.ctx,
                self.group,
                self.topic,
                self._handle,
                filter=Filter(predicate=lambda msg: topic_matches(filt, path_of(msg))),
                max_inflight=self._capacity(),
                long_poll_ms=20_000,
            ).start()
        else:
            self._loop.max_inflight = self._capacity()
        return m

    async def leave(self, m: ShareMember) -> None:
        """Remove a member; the last one out stops the loop (its unfinished messages come again)."""
        if m not in self.members:
            return
        self.members.remove(m)
        if self.members:
            if self._loop is not None:
                self._loop.max_inflight = self._capacity()
            return
        loop, self._loop = self._loop, None
        self._on_empty(self)
        if loop is not None:
            await loop.stop(drain_timeout=0)

    def _capacity(self) -> int:
        return max(1, sum(max(1, min(m.session.send_quota, MAX_INFLIGHT_PER_MEMBER)) for m in self.members))

    def _pick(self, path: str) -> tuple[ShareMember | None, bool]:
        """(the next connected member that may read `path` with room in its Receive Maximum, else
        the next connected one that may read it; whether some member was connected at all)."""
        members = self.members
        n = len(members)
        fallback = None
        connected = False
        version = access.acl_version(self.processor)
        for i in range(n):
            m = members[(self._next + i) % n]
            s = m.session
            if s.state != CONNECTED:
                continue
            connected = True
            if not access.delivers(self.processor, m.sub, s.ctx.identity, path, version):
                continue
            if len(s.inflight) < s.send_quota and s.writable.is_set():
                self._next = (self._next + i + 1) % n
                return m, True
            if fallback is None:
                fallback = m
        return fallback, connected

    async def _handle(self, d: Any) -> Outcome:
        msg = d.message
        path = path_of(msg)
        m, connected = self._pick(path)
        if m is None:
            # no member may read it: dropped for this share (as Mosquitto drops a denied delivery)
            return Outcome.ACK if connected else Outcome.REQUEUE
        s = m.session
        if not s.writable.is_set():  # every member is over its outbound bound: wait for this one
            await s.writable.wait()
        sp = msg.properties
        now = int(time.time() * 1000)
        if expired(sp, now):
            return Outcome.ACK
        q = min(m.qos, qos_of(msg))
        props = None
        if s.version == MQTT_5:
            props = with_sub_ids(v5_properties(msg, now), [m.sub_id] if m.sub_id else None)
        if q == 0:
            s.deliver(path, msg.body, 0, False, props)
            return Outcome.ACK
        done = asyncio.get_running_loop().create_future()
        s.deliver(path, msg.body, q, False, props, done)
        return Outcome.ACK if await done else Outcome.REQUEUE


def share_group_name(name: str) -> str:
    """The consumer group of share name `name` (sanitized like store topics)."""
    return "mqtt.share." + "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)


class Shares:
    """This proxy's ShareGroups, by (consumer group, store topic, filter)."""

    def __init__(self, processor: MessagingProcessor, ctx: ClientContext) -> None:
        self.processor = processor
        self.ctx = ctx  # the proxy's own, for routes and offsets
        self.groups: dict[tuple[str, str, str], ShareGroup] = {}

    async def subscribe(
        self,
        s: Session,
        holder: dict[str, Sub],
        filt: str,
        name: str,
        inner: str,
        qos: int,
        sub_id: int,
        grant: Grant = Grant.ALLOW,
    ) -> int:
        """Subscribe `s` to `$share/<name>/<inner>` (`filt`), replacing a membership of the same
        filter in `holder`; the SUBACK reason code. `grant`: the ACL's decision on `inner`."""
        old = holder.pop(filt, None)
        if old is not None and old.loop is not None:
            await old.loop.stop(drain_timeout=0)
        topic = store_topic_of_level(inner.split("/", 1)[0])
        group = share_group_name(name)
        p = self.processor
        try:
            route = await p.query_route(self.ctx, topic, auto_create=True)
            fresh = True
            for q in route.queues:
                if await p.committed_offset(group, topic, q.queue_id) >= 0:
                    fresh = False
            if fresh:  # a new share group starts at the current end, not at the oldest message
                await position_at_end(p, self.ctx, group, topic)
        except ProcessorError as e:
            log.warning("mqtt shared subscription %s: %s", filt, e)
            return ReasonCode.UNSPECIFIED_ERROR
        sub = Sub(s if s.pstate is None else None, inner, qos, False, name, sub_id=sub_id)
        access.apply(p, sub, grant)
        sub.loop = self.join(sub, s, group, topic)
        holder[filt] = sub
        return qos

    def rejoin(self, st: SessionState, s: Session) -> None:
        """Make the resumed connection `s` the member of its persistent session's shares."""
        for sub in st.subs.values():
            if sub.share is not None and sub.loop is None:
                sub.loop = self.join(sub, s, share_group_name(sub.share), store_topic_of_level(sub.first))

    def join(self, sub: Sub, s: Session, group: str, topic: str) -> ShareMember:
        """Join `s` to this proxy's ShareGroup for (group, topic, filter)."""
        key = (group, topic, sub.filter)
        sg = self.groups.get(key)
        if sg is None:
            sg = self.groups[key] = ShareGroup(
                self.processor, self.ctx, group, topic, sub.filter, lambda g: self.groups.pop(key, None)
            )
        return sg.join(s, sub)
