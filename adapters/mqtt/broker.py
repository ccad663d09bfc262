"""What the MQTT sessions of one proxy share: the client-id registry (takeover), the subscription
index (TopicTrie), one fan-out pop loop per store topic, retained messages, shared subscriptions.

Fan-out: for clean sessions the proxy pops each store topic that has local subscribers with one
proxy-unique consumer group `%MQTT_FANOUT_<uuid>` (positioned at the current max offsets, so no
history is replayed), acks at once and dispatches each message to the matching local subscriptions
by its full path. A subscription whose first level is a wildcard covers every store topic: while
one exists, the topic list is re-read every `topic_scan_interval` seconds (and at once when an MQTT
publish creates a store topic); topics found after the first scan are read from their start.

Shared subscriptions `$share/<name>/<filter>` (shared.py): one DeliveryLoop per share in this
proxy, group `mqtt.share.<name>` over the filter's store topic with a path predicate, hands the
messages round robin to the local members; proxies compete through the store (pop).

Persistent sessions (persistence.py) do not use the fan-out: each has its own consumer group and,
while connected, one DeliveryLoop per store topic its subscriptions cover; a message is acked in the
store when the client has it (PUBACK, or PUBREC for QoS 2) and given back at once when the
connection drops first, so it comes again on the next connection, after a restart too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from messaging_processor import (
    Action,
    ClientContext,
    DeliveryLoop,
    ErrorKind,
    Filter,
    Identity,
    Message,
    MessagingProcessor,
    Outcome,
    ProcessorError,
    Resource,
)

from .codec import (
    MQTT_5,
    PropertyId,
    ReasonCode,
    Subscribe,
    TopicTrie,
    encode_pubrel,
    encode_suback,
    parse_shared,
    topic_matches,
)
from .mapping import (
    P_CLIENT,
    P_EXPIRY_AT,
    P_QOS,
    P_RETAIN,
    P_TOPIC,
    decode_retained,
    encode_retained,
    expired,
    path_of,
    qos_of,
    store_topic_of_level,
    to_message,
    v5_properties,
    with_sub_ids,
)
from .persistence import (
    QOS2_NS,
    SESSIONS_NS,
    SessionState,
    parse_record,
    qos2_prefix,
    session_group,
)
from .session import CLOSED, CONNECTED, Session
from .shared import ShareGroup, ShareMember

log = logging.getLogger("adapters.mqtt")

RETAINED_NS = "mqtt.retained"
# A persistent session's messages go back to the store when its connection drops and come again
# on the next; MQTT has no dead-letter queue, so the group's attempt limit is practically none.
PERSISTENT_MAX_ATTEMPTS = 1_000_000
PROXY_IDENTITY = Identity("$mqtt-proxy", None, "internal")
_ERROR_REASON = {
    ErrorKind.FORBIDDEN: ReasonCode.NOT_AUTHORIZED,
    ErrorKind.UNAUTHORIZED: ReasonCode.NOT_AUTHORIZED,
    ErrorKind.ILLEGAL_TOPIC: ReasonCode.TOPIC_NAME_INVALID,
    ErrorKind.BODY_TOO_LARGE: ReasonCode.PACKET_TOO_LARGE,
    ErrorKind.PROPERTIES_TOO_LARGE: ReasonCode.PACKET_TOO_LARGE,
    ErrorKind.STORE_FULL: ReasonCode.QUOTA_EXCEEDED,
    ErrorKind.TOO_MANY_REQUESTS: ReasonCode.QUOTA_EXCEEDED,
}


class Sub:
    """One subscription (hashable by identity, the TopicTrie item). `session` is the connection for
    clean sessions; persistent sessions' subscriptions are routed through their SessionState."""

    __slots__ = ("session", "filter", "qos", "rap", "nl", "rh", "sub_id", "first", "wild", "share", "loop")

    def __init__(
        self,
        session: Session | None,
        filt: str,
        qos: int,
        rap: bool,
        share: str | None,
        nl: bool = False,
        rh: int = 0,
        sub_id: int = 0,
    ) -> None:
        self.session = session
        self.filter = filt  # the inner filter for a shared subscription
        self.qos = qos
        self.rap = rap  # retain as published
        self.nl = nl  # no local
        self.rh = rh  # retain handling
        self.sub_id = sub_id  # 5.0 subscription identifier (0 = none)
        self.share = share
        first = filt.split("/", 1)[0]
        self.wild = first in ("+", "#")
        self.first = first
        self.loop: ShareMember | None = None  # a shared subscription's membership


class Fanout:
    """The pop loop of one store topic for this proxy's clean-session subscribers."""

    def __init__(self, broker: Broker, topic: str) -> None:
        self.broker = broker
        self.topic = topic
        self.ready = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def start(self, from_now: bool) -> None:
        b = self.broker
        p = b.processor
        try:
            route = await p.query_route(b.ctx, self.topic, auto_create=True)
            if from_now:
                for q in route.queues:
                    _, hi = await p.queue_offsets(self.topic, q.queue_id)
                    await p.commit_offset(b.ctx, b.group, self.topic, q.queue_id, hi)
        finally:
            self.ready.set()
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"mqtt fanout {self.topic}")

    async def _run(self) -> None:
        b = self.broker
        p = b.processor
        ctx = b.ctx
        backoff = 0.1
        while True:
            try:
                ds = await p.pop(
                    ctx, b.group, self.topic, max_messages=128, invisible_time_ms=60_000, long_poll_ms=20_000
                )
                backoff = 0.1
            except ProcessorError as e:
                if e.kind is ErrorKind.TOPIC_NOT_FOUND:
                    log.info("mqtt fan-out of %s ends: topic deleted", self.topic)
                    b.fanouts.pop(self.topic, None)
                    return
                log.warning("mqtt fan-out pop of %s failed: %s", self.topic, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            dispatch = b.dispatch
            for d in ds:
                try:
                    dispatch(d.message)
                except Exception:  # noqa: BLE001
                    log.exception("mqtt dispatch of %s failed", d.message.message_id)
            for d in ds:
                with contextlib.suppress(ProcessorError):
                    await p.ack(ctx, d.receipt_handle)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


class Broker:
    def __init__(
        self,
        processor: MessagingProcessor,
        *,
        max_packet_size: int = 1 << 20,
        topic_scan_interval: float = 1.0,
        max_keep_alive: int = 0,
    ) -> None:
        self.processor = processor
        self.max_packet_size = max_packet_size
        self.topic_scan_interval = topic_scan_interval
        self.max_keep_alive = max_keep_alive  # 0: accept what the client asks for
        self.group = f"%MQTT_FANOUT_{uuid.uuid4().hex}"
        self.ctx = ClientContext("mqtt", client_id=self.group, identity=PROXY_IDENTITY)
        self.sessions: dict[str, Session] = {}  # connected sessions by client id
        self.states: dict[str, SessionState] = {}  # persistent sessions by client id
        self.trie: TopicTrie[Sub] = TopicTrie()
        self.fanouts: dict[str, Fanout] = {}
        self.shares: dict[tuple[str, str, str], ShareGroup] = {}
        self.topic_refs: dict[str, int] = {}
        self.wild_refs = 0
        self.wild_states: set[SessionState] = set()  # attached persistent sessions with root wildcards
        self._queues: dict[str, int] = {}  # store topic -> queue count (per-path queue choice)
        self._scanner: asyncio.Task | None = None
        self._scanned = asyncio.Event()  # set once the first scan for root wildcards is done
        self._tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ persistent sessions
    async def start(self) -> None:
        """Restore the persistent sessions an earlier run saved; expire those whose time is over."""
        p = self.processor
        pids: dict[str, list[str]] = {}
        for key, _ in await p.kv_scan(QOS2_NS):
            n, _, rest = key.partition(":")
            if n.isdigit() and rest[int(n) : int(n) + 1] == ":":
                pids.setdefault(rest[: int(n)], []).append(rest[int(n) + 1 :])
        now = time.time()
        for cid, value in await p.kv_scan(SESSIONS_NS):
            st = await self._restore(cid, value, pids.get(cid, ()), now)
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
            await self.processor.kv_delete(SESSIONS_NS, cid)
            return None
        if st.disconnected_at is None:  # saved while connected: that run or proxy ended since
            st.disconnected_at = now
        for f, qos, nl, rap, rh, sid in subs:
            sub = _make_sub(None, f, qos, bool(rap), bool(nl), rh, sid)
            if sub is not None:
                st.subs[f] = sub
                if sub.wild and sub.share is None:
                    st.wild += 1
        for t in qos2:
            with contextlib.suppress(ValueError, IndexError):
                (st.awaiting_rel if t[0] == "i" else st.pubrel).add(int(t[1:]))
        self.states[cid] = st
        return st

    async def _saved_elsewhere(self, st: SessionState | None, cid: str) -> bytes | None:
        """The saved record of `cid` when it is newer than this proxy's detached copy `st` (or
        exists while this proxy has none): in CLUSTER mode the session may have lived on another
        proxy since. A stale copy is forgotten here (its timers cancelled, nothing deleted)."""
        if st is not None and st.attached is not None:
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
        for h in (st.expiry_timer, st.will_timer):
            if h is not None:
                h.cancel()
        st.expiry_timer = st.will_timer = None
        st.discarded = True
        if self.states.get(st.client_id) is st:
            del self.states[st.client_id]

    async def attach(self, s: Session, clean_start: bool, expiry: int) -> bool:
        """Bind connection `s` to its client id (taking over a connected one) and, if it has or
        wants one, to its persistent session (this proxy's copy, or the saved record when another
        proxy of the cluster had it since). True if an existing session was resumed."""
        cid = s.client_id
        self.register(s)
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
        s.awaiting_rel = st.awaiting_rel
        s.nl_count = sum(1 for x in st.subs.values() if x.nl)
        await self._save(st)
        return present

    async def resume(self, s: Session) -> None:
        """After the CONNACK of a persistent session: resend pending PUBRELs, start delivery."""
        st = s.pstate
        if st is None or st.attached is not s:
            return
        for pid in sorted(st.pubrel):
            s.inflight[pid] = [2, None, True]
            s._write(encode_pubrel(pid, 0, s.version))
        for sub in st.subs.values():
            if sub.share is not None and sub.loop is None:
                sub.loop = self._share_loop(sub, s, _share_group(sub.share), store_topic_of_level(sub.first))
        await self._sync_feeds(st)

    async def _detach(self, st: SessionState, s: Session, will: Any) -> None:
        loops = list(st.feeds.values())
        st.feeds.clear()
        self.wild_states.discard(st)
        for sub in st.subs.values():
            if sub.loop is not None:
                loops.append(sub.loop)
                sub.loop = None
        # In-flight messages were answered "not delivered" by the closed connection: the loops
        # requeue them (visible at once) while they drain.
        await asyncio.gather(*(lp.stop(drain_timeout=2.0) for lp in loops), return_exceptions=True)
        if st.expiry == 0:
            await self._discard(st)
            if will is not None:
                await self._publish_will(s.ctx, will)
            return
        await self._save(st)
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
            for h in (st.expiry_timer, st.will_timer):
                if h is not None:
                    h.cancel()
            st.expiry_timer = st.will_timer = None
            loops = list(st.feeds.values()) + [sub.loop for sub in st.subs.values() if sub.loop is not None]
            st.feeds.clear()
            self.wild_states.discard(st)
            await asyncio.gather(*(lp.stop(drain_timeout=0) for lp in loops), return_exceptions=True)
            p = self.processor
            with contextlib.suppress(Exception):
                items: dict[str, bytes | None] = {
                    k: None for k, _ in await p.kv_scan(QOS2_NS, qos2_prefix(st.client_id))
                }
                if items:
                    await p.kv_put_many(QOS2_NS, items)
                await p.kv_delete(SESSIONS_NS, st.client_id)
            with contextlib.suppress(Exception):
                await p.delete_group(st.group)
        finally:
            if self.states.get(st.client_id) is st:
                del self.states[st.client_id]
            st.discarding.set_result(None)

    async def _save(self, st: SessionState) -> None:
        if not st.discarded:
            await self.processor.kv_put(SESSIONS_NS, st.client_id, st.record())

    def qos2_mark(self, st: SessionState, direction: str, pid: int, on: bool) -> Awaitable[Any]:
        """Record (or forget) a QoS 2 packet id of a persistent session in the kv table."""
        key = f"{qos2_prefix(st.client_id)}{direction}{pid}"
        p = self.processor
        return p.kv_put(QOS2_NS, key, b"") if on else p.kv_delete(QOS2_NS, key)

    async def _sync_feeds(self, st: SessionState) -> None:
        """Run one delivery loop per store topic the attached session's subscriptions cover."""
        s = st.attached
        if s is None:
            return
        names = (
            [t.name for t in await self.processor.list_topics() if not t.name.startswith("%")]
            if st.wild
            else []
        )
        if st.attached is not s:
            return
        want = st.topics(names)
        stop = [st.feeds.pop(t) for t in list(st.feeds) if t not in want]
        for t in want:
            if t not in st.feeds:
                st.feeds[t] = self._feed(st, s, t)
        if st.wild:
            self.wild_states.add(st)
            self._ensure_scanner()
        else:
            self.wild_states.discard(st)
        for lp in stop:
            await lp.stop(drain_timeout=0)

    def _feed(self, st: SessionState, s: Session, topic: str) -> DeliveryLoop:
        loop = asyncio.get_running_loop()

        def wants(m: Message) -> bool:
            return _best_persistent(st, m)[0] is not None

        async def handler(d: Any) -> Outcome:
            conn = st.attached
            if conn is None or conn.state != CONNECTED:
                return Outcome.REQUEUE
            m = d.message
            sub, ids = _best_persistent(st, m)
            if sub is None:
                return Outcome.ACK
            sp = m.properties
            now = int(time.time() * 1000)
            if expired(sp, now):
                return Outcome.ACK
            q = min(sub.qos, qos_of(m))
            props = with_sub_ids(v5_properties(sp, now), ids) if conn.version == MQTT_5 else None
            retain = sub.rap and sp.get(P_RETAIN) == "1"
            if q == 0:
                conn.deliver(path_of(m), m.body, 0, retain, props)
                return Outcome.ACK
            done = loop.create_future()
            conn.deliver(path_of(m), m.body, q, retain, props, done)
            return Outcome.ACK if await done else Outcome.REQUEUE

        def ended(e: ProcessorError) -> None:
            if st.feeds.get(topic) is lp:
                del st.feeds[topic]

        lp = DeliveryLoop(
            self.processor,
            s.ctx,
            st.group,
            topic,
            handler,
            filter=Filter(predicate=wants),
            max_inflight=max(1, min(s.send_quota, 64)),
            long_poll_ms=20_000,
            on_error=ended,
        )
        return lp.start()

    async def _cover(self, st: SessionState, sub: Sub) -> None:
        """Position the session's group at the end of each store topic a new subscription covers
        that none of its subscriptions covered: no history is replayed (topics created later are
        read from their start)."""
        covered = st.topics([]) if not st.wild else None
        if sub.wild:
            if covered is not None:
                for t in await self.processor.list_topics():
                    if not t.name.startswith("%") and t.name not in covered:
                        await self._position(st.group, t.name)
        elif covered is not None:
            t = store_topic_of_level(sub.first)
            if t not in covered:
                await self._position(st.group, t)

    async def _position(self, group: str, topic: str) -> None:
        p = self.processor
        route = await p.query_route(self.ctx, topic, auto_create=True)
        for q in route.queues:
            _, hi = await p.queue_offsets(topic, q.queue_id)
            await p.commit_offset(self.ctx, group, topic, q.queue_id, hi)

    # ------------------------------------------------------------------ sessions
    def register(self, s: Session) -> None:
        old = self.sessions.get(s.client_id)
        self.sessions[s.client_id] = s
        if old is not None and old is not s:
            log.info("mqtt %s: session taken over by %s", s.client_id, s.remote)
            old.close(ReasonCode.SESSION_TAKEN_OVER)

    def session_closed(self, s: Session, will: Any) -> None:
        if self.sessions.get(s.client_id) is s:
            del self.sessions[s.client_id]
        st = s.pstate
        if st is not None:
            if st.attached is s:
                st.attached = None
                st.disconnected_at = time.time()
                st.detaching = self._spawn(self._detach(st, s, will))
            return
        for sub in list(s.subs.values()):
            self._spawn(self._drop(sub))
        s.subs.clear()
        if will is not None:  # the session ends now, so a Will Delay Interval ends now too
            self._spawn(self._publish_will(s.ctx, will))

    async def _publish_will(self, ctx: ClientContext, will: Any) -> None:
        msg = to_message(will.topic, will.payload, will.qos, will.retain, will.properties or None)
        await self.publish(ctx, msg, will.retain)

    def _spawn(self, coro: Any) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ------------------------------------------------------------------ publish
    async def publish(self, ctx: ClientContext, msg: Message, retain: bool) -> int:
        """Store one message (and the retained value); the MQTT reason code (0 = stored)."""
        topic = msg.topic
        if self.wild_refs and topic not in self.fanouts:
            await self._ensure_fanout(topic, from_now=False)
        try:
            await self._place(ctx, msg)
            await self.processor.send(ctx, [msg], auto_create=True, receipts=False)
            if retain:
                path = msg.properties[P_TOPIC]
                if msg.body:
                    await self.processor.kv_put(RETAINED_NS, path, encode_retained(msg))
                else:
                    await self.processor.kv_delete(RETAINED_NS, path)
        except ProcessorError as e:
            self._queues.pop(topic, None)
            log.info("mqtt %s: publish to %s refused: %s", ctx.client_id, topic, e)
            return _ERROR_REASON.get(e.kind, ReasonCode.UNSPECIFIED_ERROR)
        except Exception:  # noqa: BLE001
            log.exception("mqtt %s: publish to %s failed", ctx.client_id, topic)
            return ReasonCode.UNSPECIFIED_ERROR
        return 0

    async def _place(self, ctx: ClientContext, msg: Message) -> None:
        """Choose the message's queue: one queue per path, so a path's messages stay in publish
        order in the store and on delivery."""
        topic = msg.topic
        n = self._queues.get(topic)
        if n is None:
            route = await self.processor.query_route(ctx, topic, auto_create=True)
            n = self._queues[topic] = len(route.queues)
        msg.queue_id = zlib.crc32(msg.properties[P_TOPIC].encode()) % n

    async def publish_many(self, ctx: ClientContext, msgs: list[Message]) -> list[int]:
        """Store non-retained messages with as few processor sends as possible; a reason code per
        message (a refused batch is retried one by one to find which message was refused)."""
        p = self.processor
        queues = self._queues
        crc32 = zlib.crc32
        try:
            for m in msgs:
                topic = m.topic
                if self.wild_refs and topic not in self.fanouts:
                    await self._ensure_fanout(topic, from_now=False)
                n = queues.get(topic)
                if n is None:
                    await self._place(ctx, m)
                else:  # _place without a coroutine per message (hot path)
                    m.queue_id = crc32(m.properties[P_TOPIC].encode()) % n
            step = p.limits.max_batch
            for i in range(0, len(msgs), step):
                await p.send(ctx, msgs[i : i + step], auto_create=True, receipts=False)
        except Exception:  # noqa: BLE001 - answered per message below
            return [await self.publish(ctx, m, False) for m in msgs]
        return [0] * len(msgs)

    # ------------------------------------------------------------------ dispatch (fan-out)
    def dispatch(self, msg: Message) -> None:
        """Hand a popped message to every matching clean-session subscription of this proxy."""
        path = path_of(msg)
        subs = self.trie.match(path)
        if not subs:
            return
        sp = msg.properties
        now = 0
        if P_EXPIRY_AT in sp:
            now = int(time.time() * 1000)
            if expired(sp, now):
                return
        pub_qos = qos_of(msg)
        retained = sp.get(P_RETAIN) == "1"
        publisher = sp.get(P_CLIENT)
        best: dict[Session, Sub] = {}
        ids: dict[Session, list[int]] | None = None
        for sub in subs:
            s = sub.session
            if publisher is not None and sub.nl and s.client_id == publisher:
                continue
            cur = best.get(s)
            if cur is None or sub.qos > cur.qos:
                best[s] = sub
            if sub.sub_id:
                if ids is None:
                    ids = {}
                ids.setdefault(s, []).append(sub.sub_id)
        props: Any = False
        body = msg.body
        for s, sub in best.items():
            if s.version == MQTT_5 and props is False:
                props = v5_properties(sp, now or None)
            pp = with_sub_ids(props or None, ids.get(s)) if ids is not None else props or None
            q = sub.qos if sub.qos < pub_qos else pub_qos
            s.deliver(path, body, q, retained and sub.rap, pp)

    # ------------------------------------------------------------------ subscribe
    async def subscribe(self, s: Session, pkt: Subscribe) -> tuple[bytes, Callable[[], None] | None]:
        codes: list[int] = []
        to_send: list[tuple[Sub, Message, str]] = []
        v = s.version
        st = s.pstate
        holder = st.subs if st is not None else s.subs
        sid = pkt.properties.get(PropertyId.SUBSCRIPTION_IDENTIFIER)
        sub_id = sid[0] if sid else 0
        changed = False
        for so in pkt.subscriptions:
            filt = so.topic_filter
            qos = min(so.qos, 2)
            try:
                shared = parse_shared(filt)
            except ValueError:
                codes.append(ReasonCode.TOPIC_FILTER_INVALID)
                continue
            inner = shared[1] if shared else filt
            first = inner.split("/", 1)[0]
            wild = first in ("+", "#")
            if self.processor.authorizer is not None:
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
                codes.append(await self._subscribe_shared(s, holder, filt, shared[0], inner, qos, sub_id))
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
                if st is not None:
                    await self._cover(st, sub)
                    if sub.wild:
                        st.wild += 1
                else:
                    await self._acquire(sub)
                    if s.state != CONNECTED:
                        await self._release(sub)
                        return b"", None
                    self.trie.add(filt, sub)
                holder[filt] = sub
            else:
                sub.qos = qos
                sub.rap = so.retain_as_published
                sub.nl = so.no_local
                sub.rh = so.retain_handling
                sub.sub_id = sub_id
            changed = True
            codes.append(qos)
            rh = so.retain_handling
            if rh == 0 or (rh == 1 and new):
                for path, m in await self._retained(filt):
                    to_send.append((sub, m, path))
        if changed:
            s.nl_count = sum(1 for x in holder.values() if x.nl)
            if st is not None:
                await self._save(st)
                await self._sync_feeds(st)
        suback = encode_suback(pkt.packet_id, codes, v)

        def after() -> None:
            for sub, m, path in to_send:
                q = min(sub.qos, qos_of(m))
                props = None
                if s.version == MQTT_5:
                    props = with_sub_ids(v5_properties(m.properties), [sub.sub_id] if sub.sub_id else None)
                s.deliver(path, m.body, q, True, props)

        return suback, after if to_send else None

    async def _retained(self, filt: str) -> list[tuple[str, Message]]:
        levels = filt.split("/")
        prefix_levels = []
        for lv in levels:
            if lv in ("+", "#"):
                break
            prefix_levels.append(lv)
        p = self.processor
        now = int(time.time() * 1000)
        if len(prefix_levels) == len(levels):
            value = await p.kv_get(RETAINED_NS, filt)
            if value is None:
                return []
            m = decode_retained(filt, value)
            return [] if expired(m.properties, now) else [(filt, m)]
        prefix = "/".join(prefix_levels) + "/" if prefix_levels else ""
        if levels[len(prefix_levels)] == "#" and prefix:
            prefix = prefix[:-1]  # "a/#" also matches "a"
        out = []
        for key, value in await p.kv_scan(RETAINED_NS, prefix):
            if topic_matches(filt, key):
                m = decode_retained(key, value)
                if not expired(m.properties, now):
                    out.append((key, m))
        return out

    async def unsubscribe(self, s: Session, filt: str) -> bool:
        st = s.pstate
        if st is None:
            sub = s.subs.pop(filt, None)
            if sub is None:
                return False
            s.nl_count = sum(1 for x in s.subs.values() if x.nl)
            await self._drop(sub)
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
        await self._save(st)
        await self._sync_feeds(st)
        return True

    async def _drop(self, sub: Sub) -> None:
        if sub.share is not None:
            if sub.loop is not None:
                await sub.loop.stop(drain_timeout=0)
            return
        self.trie.discard(sub.filter, sub)
        await self._release(sub)

    # ------------------------------------------------------------------ fan-out bookkeeping
    async def _acquire(self, sub: Sub) -> None:
        if sub.wild:
            self.wild_refs += 1
            if self.wild_refs == 1:
                self._scanned.clear()
                try:
                    await self._scan(from_now=True)
                finally:
                    self._scanned.set()
                self._ensure_scanner()
            else:
                await self._scanned.wait()
            return
        t = store_topic_of_level(sub.first)
        self.topic_refs[t] = self.topic_refs.get(t, 0) + 1
        await self._ensure_fanout(t, from_now=True)

    async def _release(self, sub: Sub) -> None:
        if sub.wild:
            self.wild_refs -= 1
            if self.wild_refs == 0:
                for t in [t for t in self.fanouts if not self.topic_refs.get(t)]:
                    await self._stop_fanout(t)
            return
        t = store_topic_of_level(sub.first)
        n = self.topic_refs.get(t, 0) - 1
        if n > 0:
            self.topic_refs[t] = n
            return
        self.topic_refs.pop(t, None)
        if not self.wild_refs:
            await self._stop_fanout(t)

    async def _ensure_fanout(self, topic: str, from_now: bool) -> None:
        f = self.fanouts.get(topic)
        if f is None:
            f = self.fanouts[topic] = Fanout(self, topic)
            try:
                await f.start(from_now)
            except ProcessorError as e:
                log.warning("mqtt fan-out of %s cannot start: %s", topic, e)
                if self.fanouts.get(topic) is f:
                    del self.fanouts[topic]
        else:
            await f.ready.wait()

    async def _stop_fanout(self, topic: str) -> None:
        f = self.fanouts.pop(topic, None)
        if f is not None:
            await f.stop()

    async def _scan(self, from_now: bool) -> None:
        for t in await self.processor.list_topics():
            if not t.name.startswith("%") and t.name not in self.fanouts:
                await self._ensure_fanout(t.name, from_now)

    def _ensure_scanner(self) -> None:
        if self._scanner is None or self._scanner.done():
            self._scanner = asyncio.get_running_loop().create_task(self._scan_loop())

    async def _scan_loop(self) -> None:
        """While root-wildcard subscriptions exist, look for new store topics periodically."""
        while self.wild_refs or self.wild_states:
            await asyncio.sleep(self.topic_scan_interval)
            try:
                if self.wild_refs:
                    await self._scan(from_now=False)
                for st in list(self.wild_states):
                    await self._sync_feeds(st)
            except Exception:  # noqa: BLE001
                log.exception("mqtt topic scan failed")
        self._scanner = None

    # ------------------------------------------------------------------ shared subscriptions
    async def _subscribe_shared(
        self, s: Session, holder: dict[str, Sub], filt: str, name: str, inner: str, qos: int, sub_id: int
    ) -> int:
        old = holder.pop(filt, None)
        if old is not None and old.loop is not None:
            await old.loop.stop(drain_timeout=0)
        topic = store_topic_of_level(inner.split("/", 1)[0])
        group = _share_group(name)
        p = self.processor
        try:
            route = await p.query_route(self.ctx, topic, auto_create=True)
            fresh = True
            for q in route.queues:
                if await p.committed_offset(group, topic, q.queue_id) >= 0:
                    fresh = False
            if fresh:  # a new share group starts at the current end, not at the oldest message
                await self._position(group, topic)
        except ProcessorError as e:
            log.warning("mqtt shared subscription %s: %s", filt, e)
            return ReasonCode.UNSPECIFIED_ERROR
        sub = Sub(s if s.pstate is None else None, inner, qos, False, name, sub_id=sub_id)
        sub.loop = self._share_loop(sub, s, group, topic)
        holder[filt] = sub
        return qos

    def _share_loop(self, sub: Sub, s: Session, group: str, topic: str) -> ShareMember:
        """Join `s` to this proxy's ShareGroup for (group, topic, filter)."""
        key = (group, topic, sub.filter)
        sg = self.shares.get(key)
        if sg is None:
            sg = self.shares[key] = ShareGroup(
                self.processor, group, topic, sub.filter, lambda g: self.shares.pop(key, None)
            )
        return sg.join(s, sub.qos, sub.sub_id)

    # ------------------------------------------------------------------ shutdown
    async def close(self) -> None:
        """Close every connection (persistent sessions are saved with their disconnect time, their
        in-flight messages made visible again), stop the fan-out loops."""
        if self._scanner is not None:
            self._scanner.cancel()
        for s in list(self.sessions.values()):
            s.close(ReasonCode.SERVER_SHUTTING_DOWN)
        for t in list(self.fanouts):
            await self._stop_fanout(t)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for st in self.states.values():
            for h in (st.expiry_timer, st.will_timer):
                if h is not None:
                    h.cancel()
        with contextlib.suppress(Exception):
            await self.processor.delete_group(self.group)


def _make_sub(
    session: Session | None, filt: str, qos: int, rap: bool, nl: bool = False, rh: int = 0, sub_id: int = 0
) -> Sub | None:
    try:
        shared = parse_shared(filt)
    except ValueError:
        return None
    if shared:
        return Sub(session, shared[1], qos, False, shared[0], nl, rh, sub_id)
    return Sub(session, filt, qos, rap, None, nl, rh, sub_id)


def _share_group(name: str) -> str:
    return "mqtt.share." + "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)


def _best_persistent(st: SessionState, m: Message) -> tuple[Sub | None, list[int]]:
    """The matching subscription with the highest QoS of a persistent session and all matching
    subscription identifiers (no-local subscriptions skip the session's own messages)."""
    path = path_of(m)
    publisher = m.properties.get(P_CLIENT)
    best: Sub | None = None
    ids: list[int] = []
    for sub in st.subs.values():
        if sub.share is not None or (sub.nl and publisher == st.client_id):
            continue
        if topic_matches(sub.filter, path):
            if best is None or sub.qos > best.qos:
                best = sub
            if sub.sub_id:
                ids.append(sub.sub_id)
    return best, ids


__all__ = ["Broker", "Fanout", "Sub", "P_QOS"]
