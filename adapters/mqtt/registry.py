"""The session registry of one proxy: which connection holds each client id (a second CONNECT with
the same id takes over: the first is closed, 5.0 DISCONNECT 0x8E) and the persistent sessions
(persistence.py): attach and resume on CONNECT, detach when the connection ends, expiry timers,
delayed wills (5.0 Will Delay Interval), Clean Start, and restoring saved sessions at start.

In CLUSTER mode a persistent session may have lived on another proxy since this one last had it:
attach and expiry compare this proxy's copy with the saved record and defer to the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from messaging_processor import ClientContext, Message, MessagingProcessor
from messaging_processor.ownership import Claims

from . import access
from .caps import DEFAULT_CAPS, MqttCaps
from .codec import MQTT_5, PropertyId, ReasonCode, encode_pubrel
from .mapping import to_message
from .persistence import (
    QOS2_NS,
    SESSIONS_NS,
    SessionState,
    delete_record,
    parse_record,
    qos2_prefix,
    save,
    session_group,
    split_qos2_key,
)
from .session import CLOSED, Session
from .session_routing import session_queue
from .subscription import make_sub

if TYPE_CHECKING:
    from .session_routing import SessionRoutes
    from .subscriptions import Subscriptions

log = logging.getLogger("adapters.mqtt")

# A persistent session's messages go back to the store when its connection drops and come again
# on the next; MQTT has no dead-letter queue, so the group's attempt limit is practically none.
PERSISTENT_MAX_ATTEMPTS = 1_000_000


# Client ids unique across the processes serving one listener (`gateway start --workers`): the
# names of ownership claims (messaging_processor/ownership.py). `claim` returns once no other
# process holds the client id (it was asked to evict it: `evict`); `release` once this process
# holds it no more (its connection ended, its session is detached).
ClientIdClaims = Claims


EVICT_WAIT_S = 5.0  # how long an eviction waits for the evicted connection to end


class SessionRegistry:
    """Connected sessions by client id and this proxy's copies of persistent sessions."""

    def __init__(
        self,
        processor: MessagingProcessor,
        subscriptions: Subscriptions,
        publish: Callable[[ClientContext, Message, bool], Awaitable[int]],
        caps: MqttCaps = DEFAULT_CAPS,
        routes: SessionRoutes | None = None,
    ) -> None:
        self.processor = processor
        self.subscriptions = subscriptions
        self.routes = routes  # None: sessions get no queue (CLUSTER mode, --workers: session_routing.py)
        self.publish = publish  # for wills
        self.caps = caps  # the offline queue caps apply when a session is resumed
        self.sessions: dict[str, Session] = {}  # connected sessions by client id
        self.states: dict[str, SessionState] = {}  # persistent sessions by client id
        self.claims: ClientIdClaims | None = None  # with --workers: client ids across the workers
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ start
    async def start(self) -> None:
        """Restore the persistent sessions an earlier run saved; expire those whose time is over."""
        p = self.processor
        marks: dict[str, list[str]] = {}
        for key, _ in await p.kv_scan(QOS2_NS):
            parts = split_qos2_key(key)
            if parts is not None:
                marks.setdefault(parts[0], []).append(parts[1])
        now = time.time()
        for cid, value in await p.kv_scan(SESSIONS_NS):
            st = await self._restore(cid, value, marks.get(cid, ()), now)
            if st is None:
                continue
            rem = st.remaining(now)
            if rem is not None and rem <= 0:
                await self._discard(st)
            else:
                self._schedule_expiry(st)
        if self.states:
            log.info("mqtt: %d persistent sessions restored", len(self.states))

    async def _restore(self, cid: str, value: bytes, qos2: Iterable[str], now: float) -> SessionState | None:
        """A saved session record made a SessionState of this proxy (None if unreadable: dropped)."""
        try:
            st, subs = parse_record(cid, value)
        except (ValueError, KeyError, TypeError):
            log.warning("mqtt: unreadable saved session %r dropped", cid)
            await delete_record(self.processor, cid)
            return None
        if st.disconnected_at is None:  # saved while connected: that run or proxy ended since
            st.disconnected_at = now
        for f, qos, nl, rap, rh, sid in subs:
            sub = make_sub(None, f, qos, bool(rap), bool(nl), rh, sid)
            if sub is not None:
                st.subs[f] = sub
                if sub.wild and sub.share is None:
                    st.wild += 1
        st.restore_qos2(qos2)
        if st.queue is not None:
            st.queue_made = any(x.share is None for x in st.subs.values())  # (made with the first)
            if self.routes is None:  # saved by a run that had queues, resumed by one without
                log.warning("mqtt %s: session queue %s not read in this mode", cid, st.queue)
            else:
                self.routes.update(st)
        self.states[cid] = st
        return st

    async def _saved_elsewhere(self, st: SessionState | None, cid: str) -> bytes | None:
        """The saved record of `cid` when it is newer than this proxy's detached copy `st` (or
        exists while this proxy has none): in CLUSTER mode the session may have lived on another
        proxy since. A stale copy is forgotten here (its timers cancelled, nothing deleted). A
        proxy that is the sessions' only owner (one LOCAL process: queues, no feed, no claims) has
        every record in memory since `start`: nothing to read, no store round trip per connect."""
        if st is not None and st.attached is not None:
            return None
        routes = self.routes
        if routes is not None and routes.feed is None and self.claims is None:
            return None
        value = await self.processor.kv_get(SESSIONS_NS, cid)
        if st is None:
            return value
        try:
            same = value is not None and parse_record(cid, value)[0].disconnected_at == st.disconnected_at
        except (ValueError, KeyError, TypeError):
            same = False
        if same:
            return None
        self._forget(st)
        return value

    def _forget(self, st: SessionState) -> None:
        # (the index keeps the session: it lives on with the proxy that has it, session_feed.py)
        for h in (st.expiry_timer, st.will_timer):
            if h is not None:
                h.cancel()
        st.expiry_timer = st.will_timer = None
        st.discarded = True
        if self.states.get(st.client_id) is st:
            del self.states[st.client_id]

    # ------------------------------------------------------------------ connect
    def register(self, s: Session) -> None:
        """Make `s` the connection of its client id, closing the one it takes over."""
        old = self.sessions.get(s.client_id)
        self.sessions[s.client_id] = s
        if old is not None and old is not s:
            log.info("mqtt %s: session taken over by %s", s.client_id, s.remote)
            old.close(ReasonCode.SESSION_TAKEN_OVER)

    async def attach(self, s: Session, clean_start: bool, expiry: int) -> bool:
        """Bind connection `s` to its client id (taking over a connected one) and, if it has or
        wants one, to its persistent session (this proxy's copy, or the saved record when another
        proxy of the cluster had it since), whose offline backlog is then capped (offline_queue.py).
        True if an existing session was resumed."""
        cid = s.client_id
        self.register(s)
        if self.claims is not None:  # another worker's connection of this id ends (and saves) first
            await self.claims.claim(cid)
        st = self.states.get(cid)
        if st is not None:
            self._cancel_will(st)  # a new connection came before the Will Delay Interval ended
            if st.detaching is not None:
                await st.detaching
            if st.discarding is not None:  # its records are being deleted: wait, then start anew
                await st.discarding
            st = self.states.get(cid)
        value = await self._saved_elsewhere(st, cid)
        if value is not None:
            prefix = qos2_prefix(cid)
            qos2 = [k[len(prefix) :] for k, _ in await self.processor.kv_scan(QOS2_NS, prefix)]
            st = await self._restore(cid, value, qos2, time.time())
        elif st is not None and st.discarded:
            st = None  # forgotten: the session ended elsewhere
        if s.state == CLOSED or self.sessions.get(cid) is not s:
            return False
        present = False
        if st is not None and clean_start:
            await self._discard(st)
            st = None
        if st is not None:
            present = True
            st.expiry = expiry
            st.version = s.version
        elif expiry > 0:
            st = SessionState(cid, session_group(cid), s.version, expiry)
            if self.routes is not None:
                st.queue = session_queue(st.group)  # (made in the store with its first subscription)
            await self.processor.create_group(st.group, max_attempts=PERSISTENT_MAX_ATTEMPTS)
            self.states[cid] = st
        if st is None:
            return False
        if st.expiry_timer is not None:
            st.expiry_timer.cancel()
            st.expiry_timer = None
        st.attached = s
        st.disconnected_at = None
        s.pstate = st
        access.regrant(self.processor, s.ctx.identity, st.subs.values())  # this connection's user
        s.awaiting_rel = st.awaiting_rel
        s.nl_count = sum(1 for x in st.subs.values() if x.nl)
        if present:  # before the CONNACK: no delivery loop runs yet (a SUBSCRIBE waits for it too)
            await self.subscriptions.fanout.cap_queue(st, self.caps)
        await save(self.processor, st)
        return present

    async def evict(self, cid: str) -> None:
        """Another process took `cid` over: close its connection here (5.0 DISCONNECT 0x8E) and
        wait until its persistent session, if any, is detached and saved."""
        s = self.sessions.get(cid)
        if s is not None:
            log.info("mqtt %s: session taken over by another worker", cid)
            s.close(ReasonCode.SESSION_TAKEN_OVER)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(s.closed_event.wait(), EVICT_WAIT_S)
        st = self.states.get(cid)
        if st is not None and st.detaching is not None:
            await asyncio.wait_for(asyncio.shield(st.detaching), EVICT_WAIT_S)

    async def resume(self, s: Session) -> None:
        """After the CONNACK of a persistent session: resend pending PUBRELs, start delivery."""
        st = s.pstate
        if st is None or st.attached is not s:
            return
        for pid in sorted(st.pubrel):
            s.inflight[pid] = [2, None, True]
            s._write(encode_pubrel(pid, 0, s.version))
        await self.subscriptions.resume(st, s)

    # ------------------------------------------------------------------ disconnect
    def session_closed(self, s: Session, will: Any) -> None:
        """Connection `s` ended (`will`: the will to publish, if any): detach its persistent
        session, or end its clean one."""
        if self.sessions.get(s.client_id) is s:
            del self.sessions[s.client_id]
        st = s.pstate
        if st is not None:
            if st.attached is s:
                st.attached = None
                st.disconnected_at = time.time()
                st.detaching = self._spawn(self._detach(st, s, will))
                st.detaching.add_done_callback(lambda _: self._release(s.client_id))
            return
        self._release(s.client_id)
        for sub in list(s.subs.values()):
            self._spawn(self.subscriptions.drop(sub))
        s.subs.clear()
        if will is not None:  # the session ends now, so a Will Delay Interval ends now too
            self._spawn(self._publish_will(s.ctx, will))

    def _release(self, cid: str) -> None:
        """Release the claim of `cid` across the workers, unless a newer connection of it is here:
        its claim (sent before this release, if it came first) stays, and it releases on its end."""
        if self.claims is not None and cid not in self.sessions:
            self.claims.release(cid)

    async def _detach(self, st: SessionState, s: Session, will: Any) -> None:
        loops = self.subscriptions.detach(st)
        # In-flight messages were answered "not delivered" by the closed connection: the loops
        # requeue them (visible at once) while they drain.
        await asyncio.gather(*(lp.stop(drain_timeout=2.0) for lp in loops), return_exceptions=True)
        if st.expiry == 0:
            await self._discard(st)
            if will is not None:
                await self._publish_will(s.ctx, will)
            return
        await save(self.processor, st)
        if will is not None:
            wp = will.properties or {}
            delay = wp.get(PropertyId.WILL_DELAY_INTERVAL, 0) if s.version == MQTT_5 else 0
            rem = st.remaining()
            if rem is not None:
                delay = min(delay, max(rem, 0))
            if delay <= 0:
                await self._publish_will(s.ctx, will)
            else:
                st.pending_will = (s.ctx, will)
                st.will_timer = asyncio.get_running_loop().call_later(
                    delay, lambda: self._spawn(self._fire_will(st))
                )
        self._schedule_expiry(st)

    # ------------------------------------------------------------------ wills and expiry
    async def _publish_will(self, ctx: ClientContext, will: Any) -> None:
        msg = to_message(will.topic, will.payload, will.qos, will.retain, will.properties or None)
        await self.publish(ctx, msg, will.retain)

    async def _fire_will(self, st: SessionState) -> None:
        pending, st.pending_will = st.pending_will, None
        st.will_timer = None
        if pending is not None and st.attached is None:
            await self._publish_will(*pending)

    def _cancel_will(self, st: SessionState) -> None:
        if st.will_timer is not None:
            st.will_timer.cancel()
            st.will_timer = None
        st.pending_will = None

    def _schedule_expiry(self, st: SessionState) -> None:
        if st.expiry_timer is not None:
            st.expiry_timer.cancel()
            st.expiry_timer = None
        rem = st.remaining()
        if rem is not None:
            st.expiry_timer = asyncio.get_running_loop().call_later(
                max(rem, 0), lambda: self._spawn(self._expire(st))
            )

    async def _expire(self, st: SessionState) -> None:
        if st.attached is not None or st.discarded:
            return
        if await self._saved_elsewhere(st, st.client_id) is not None or st.discarded:
            return  # another proxy has had the session since: it is no longer ours to end
        log.info("mqtt %s: session expired", st.client_id)
        pending, st.pending_will = st.pending_will, None
        await self._discard(st)
        if pending is not None:
            await self._publish_will(*pending)

    async def _discard(self, st: SessionState) -> None:
        """End a persistent session: its loops, its group, its saved records. It leaves
        `states` only once those are gone (a connection for the same client id waits for that,
        so that it neither resumes the saved record nor has its new group deleted)."""
        if st.discarding is not None:
            await st.discarding
            return
        st.discarding = asyncio.get_running_loop().create_future()
        st.discarded = True
        try:
            if self.routes is not None:
                with contextlib.suppress(Exception):
                    await self.routes.changed(st, ended=True)  # (first: nothing more is stored for it)
            for h in (st.expiry_timer, st.will_timer):
                if h is not None:
                    h.cancel()
            st.expiry_timer = st.will_timer = None
            loops = self.subscriptions.detach(st)
            await asyncio.gather(*(lp.stop(drain_timeout=0) for lp in loops), return_exceptions=True)
            p = self.processor
            with contextlib.suppress(Exception):
                items: dict[str, bytes | None] = {
                    k: None for k, _ in await p.kv_scan(QOS2_NS, qos2_prefix(st.client_id))
                }
                if items:
                    await p.kv_put_many(QOS2_NS, items)
                await delete_record(p, st.client_id)
            with contextlib.suppress(Exception):
                await p.delete_group(st.group)
            if st.queue is not None and st.queue_made:
                with contextlib.suppress(Exception):
                    await p.delete_topic(st.queue)
        finally:
            if self.states.get(st.client_id) is st:
                del self.states[st.client_id]
            st.discarding.set_result(None)

    def _spawn(self, coro: Any) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ------------------------------------------------------------------ shutdown
    def close_connections(self) -> None:
        """Close every connection (5.0: DISCONNECT 0x8B); their sessions are detached in tasks."""
        for s in list(self.sessions.values()):
            s.close(ReasonCode.SERVER_SHUTTING_DOWN)

    async def close(self) -> None:
        """Wait for the detach / will tasks (persistent sessions are saved with their disconnect
        time, their in-flight messages made visible again), then cancel the timers."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for st in self.states.values():
            for h in (st.expiry_timer, st.will_timer):
                if h is not None:
                    h.cancel()
