"""Shared subscriptions `$share/<name>/<filter>` within one proxy: one DeliveryLoop per (share name,
store topic, filter) pops with the share's consumer group and hands each message to the next
connected member in turn (round robin, skipping members whose Receive Maximum is used up), as
Mosquitto and EMQX do. Members on other proxies compete through the store (pop), so the load is
balanced both across proxies and across the members of one proxy.

A message whose member goes away before acknowledging it is given back at once (REQUEUE) and goes
to another member."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from messaging_processor import MessagingProcessor
from messaging_processor.delivery import DeliveryLoop, Outcome
from store import Filter

from .codec.topics import topic_matches
from .mapping import expired, path_of, qos_of, v5_properties, with_sub_ids
from .session import CONNECTED, MQTT_5, Session

MAX_INFLIGHT_PER_MEMBER = 64


class ShareMember:
    """One subscription's place in a ShareGroup; `stop()` leaves the group (the Sub.loop handle)."""

    __slots__ = ("group", "session", "qos", "sub_id")

    def __init__(self, group: ShareGroup, session: Session, qos: int, sub_id: int) -> None:
        self.group = group
        self.session = session
        self.qos = qos
        self.sub_id = sub_id

    async def stop(self, drain_timeout: float = 0) -> None:  # noqa: ARG002 - DeliveryLoop's signature
        await self.group.leave(self)


class ShareGroup:
    """The members of one shared subscription in this proxy and the loop that serves them."""

    def __init__(
        self,
        processor: MessagingProcessor,
        group: str,
        topic: str,
        filt: str,
        on_empty: Callable[[ShareGroup], None],
    ) -> None:
        self.processor = processor
        self.group = group
        self.topic = topic
        self.filter = filt
        self.members: list[ShareMember] = []
        self._next = 0
        self._loop: DeliveryLoop | None = None
        self._on_empty = on_empty

    def join(self, session: Session, qos: int, sub_id: int) -> ShareMember:
        """Add a member (starting the loop with the first one)."""
        m = ShareMember(self, session, qos, sub_id)
        self.members.append(m)
        if self._loop is None:
            filt = self.filter
            self._loop = DeliveryLoop(
                self.processor,
                session.ctx,
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

    def _pick(self) -> ShareMember | None:
        """The next connected member with room in its Receive Maximum, else the next connected one."""
        members = self.members
        n = len(members)
        fallback = None
        for i in range(n):
            m = members[(self._next + i) % n]
            s = m.session
            if s.state != CONNECTED:
                continue
            if len(s.inflight) < s.send_quota:
                self._next = (self._next + i + 1) % n
                return m
            if fallback is None:
                fallback = m
        return fallback

    async def _handle(self, d: Any) -> Outcome:
        m = self._pick()
        if m is None:
            return Outcome.REQUEUE
        s = m.session
        msg = d.message
        sp = msg.properties
        now = int(time.time() * 1000)
        if expired(sp, now):
            return Outcome.ACK
        q = min(m.qos, qos_of(msg))
        props = None
        if s.version == MQTT_5:
            props = with_sub_ids(v5_properties(sp, now), [m.sub_id] if m.sub_id else None)
        if q == 0:
            s.deliver(path_of(msg), msg.body, 0, False, props)
            return Outcome.ACK
        done = asyncio.get_running_loop().create_future()
        s.deliver(path_of(msg), msg.body, q, False, props, done)
        return Outcome.ACK if await done else Outcome.REQUEUE
