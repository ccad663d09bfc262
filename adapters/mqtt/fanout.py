"""Fan-out: delivery of stored messages to this proxy's subscribers.

Clean sessions: one `TopicLoop` per store topic that has local subscribers reads it by offset
(`MessagingProcessor.tail`: no pop state, nothing to ack; positions kept in memory, starting at the
current max offsets, so no history is replayed; traced as deliveries to the proxy-unique group
`%MQTT_FANOUT_<uuid>`) and hands each message to `Fanout.dispatch`, which finds the matching
subscriptions by full path in the subscription index (TopicTrie). A clean session keeps nothing
across a restart, so positions that die with the proxy lose nothing it was promised. A subscription whose
first level is a wildcard covers every store topic: while one exists the topic list is re-read
every `scan_interval` seconds (and at once when an MQTT publish goes to a store topic without a
loop, see publish.py); topics found after the first scan are read from their start.

Persistent sessions (persistence.py) do not use the shared loops: each has its own consumer group
and, while connected, one loop on its own queue (the store topic every send that matches its
filters also stores the message in: session_routing.py), or, for a session without a queue
(CLUSTER mode), one loop per store topic its subscriptions cover (`sync`). Without a QoS 2
subscription it reads by offset (OffsetDeliveryLoop): the group's progress, the first message the
client has not acked, is committed periodically and when the connection ends, so a message not
acked comes again on the next connection, after a crash too (at least once). With one, a
DeliveryLoop pops: a message is acked in the store when the client has it (PUBACK, or PUBREC for
QoS 2: exactly once) and given back at once when the connection drops first.
The same scan re-syncs attached persistent sessions that have root-wildcard subscriptions. Before
a reattached session's loops start, its offline backlog is brought within the queue caps
(`cap_queue`, offline_queue.py).

Shared subscriptions have their own loops (shared.py).

Every loop pops as the proxy (PROXY_IDENTITY); with security on, what reaches a session is checked
against that session's own rights (access.py) before it is delivered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from messaging_processor import (
    ClientContext,
    DeliveryLoop,
    ErrorKind,
    Filter,
    Message,
    MessagingProcessor,
    OffsetDeliveryLoop,
    Outcome,
    ProcessorError,
)
from runtime.tasks import cancel_and_wait

from . import access
from .codec import MQTT_5, TopicTrie, topic_matches
from .mapping import (
    P_CLIENT,
    P_EXPIRY_AT,
    P_RETAIN,
    expired,
    path_of,
    qos_of,
    store_topic_of_level,
    v5_properties,
    with_sub_ids,
)
from .offline_queue import cap_backlog, skipped
from .session import CONNECTED

if TYPE_CHECKING:
    from .caps import MqttCaps
    from .persistence import SessionState
    from .session import Session
    from .subscription import Sub

log = logging.getLogger("adapters.mqtt")
Feed = DeliveryLoop | OffsetDeliveryLoop  # a persistent session's delivery of one store topic
TAIL_BATCH = 128  # messages a clean-session fan-out reads at a time when it has caught up
MAX_TAIL_BATCH = 2048  # ... and at most, when it is behind (the batch doubles per full read)
# messages a persistent session's offset loop hands out before the client acks them (per store
# topic; a pop loop takes 64): 64 made p99 at 10,000 msg/s ~150 ms, 256 30-60 ms (bench fixed phase)
OFFSET_WINDOW = 256


async def position_at_end(processor: MessagingProcessor, ctx: ClientContext, group: str, topic: str) -> None:
    """Commit `group`'s offsets on `topic` at the current end (creating the topic if needed)."""
    route = await processor.query_route(ctx, topic, auto_create=True)
    for q in route.queues:
        _, hi = await processor.queue_offsets(topic, q.queue_id)
        await processor.commit_offset(ctx, group, topic, q.queue_id, hi)


class TopicLoop:
    """The pop loop of one store topic for this proxy's clean-session subscribers."""

    def __init__(
        self,
        processor: MessagingProcessor,
        ctx: ClientContext,
        group: str,
        topic: str,
        dispatch: Callable[[Message], None],
        on_deleted: Callable[[TopicLoop], None],
    ) -> None:
        self.processor = processor
        self.ctx = ctx
        self.group = group
        self.topic = topic
        self.dispatch = dispatch
        self.on_deleted = on_deleted
        self.ready = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.positions: dict[int, int] = {}  # queue id -> next offset to read (a queue missing: its start)
        self._unwatch: Callable[[], None] | None = None  # parked: ends the store's watch
        self._stopped = False

    async def start(self, from_now: bool) -> None:
        p = self.processor
        try:
            route = await p.query_route(self.ctx, self.topic, auto_create=True)
            if from_now:
                for q in route.queues:
                    _, self.positions[q.queue_id] = await p.queue_offsets(self.topic, q.queue_id)
        finally:
            self.ready.set()
        self._start_task()

    def _start_task(self) -> None:
        if not self._stopped:
            self.task = asyncio.get_running_loop().create_task(self._run(), name=f"mqtt fanout {self.topic}")

    def _park(self) -> bool:
        """Caught up (right after a read, no await since): wait on the store's watch, no task."""
        unwatch = self.processor.watch(self.topic, self._wake, self.positions)
        if unwatch is None:
            return False
        self._unwatch = unwatch
        return True

    def _wake(self) -> None:
        """The watch fired: read and dispatch now, in this callback (run to completion); park
        again when caught up, or leave the rest to a task (behind, an error, a read to await)."""
        self._unwatch = None
        if self._stopped:
            return
        try:
            msgs = self.processor.tail_now(self.ctx, self.topic, self.positions, TAIL_BATCH, group=self.group)
        except ProcessorError:
            msgs = None  # (the task meets it again and handles it)
        if msgs is None:
            self._start_task()
            return
        self._deliver(msgs)
        if len(msgs) >= TAIL_BATCH or not self._park():
            self._start_task()

    def _deliver(self, msgs: list[Message]) -> None:
        positions = self.positions
        dispatch = self.dispatch
        for m in msgs:
            positions[m.queue_id] = m.queue_offset + 1
            try:
                dispatch(m)
            except Exception:  # noqa: BLE001
                log.exception("mqtt dispatch of %s failed", m.message_id)

    async def _run(self) -> None:
        p = self.processor
        ctx = self.ctx
        group = self.group
        positions = self.positions
        backoff = 0.1
        batch = TAIL_BATCH
        watches = True
        while True:
            try:
                msgs = await p.tail(ctx, self.topic, positions, batch, 0 if watches else 20_000, group=group)
                if not msgs and watches:  # (no await since the read: nothing appended unseen)
                    if self._park():
                        self.task = None
                        return
                    watches = False
                    continue
                backoff = 0.1
                # behind (a full batch): read more at a time, so a store a round trip away
                # (CLUSTER mode, --workers) costs fewer round trips; caught up: back to the start
                batch = min(batch * 2, MAX_TAIL_BATCH) if len(msgs) >= batch else TAIL_BATCH
            except ProcessorError as e:
                if e.kind is ErrorKind.TOPIC_NOT_FOUND:
                    log.info("mqtt fan-out of %s ends: topic deleted", self.topic)
                    self.on_deleted(self)
                    return
                log.warning("mqtt fan-out read of %s failed: %s", self.topic, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            dispatch = self.dispatch
            for m in msgs:
                positions[m.queue_id] = m.queue_offset + 1
                try:
                    dispatch(m)
                except Exception:  # noqa: BLE001
                    log.exception("mqtt dispatch of %s failed", m.message_id)

    async def stop(self) -> None:
        self._stopped = True
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        await cancel_and_wait(self.task, errors=True)


class Fanout:
    """The subscription index of clean sessions with its TopicLoops, and the delivery loops of
    attached persistent sessions."""

    def __init__(
        self, processor: MessagingProcessor, ctx: ClientContext, group: str, scan_interval: float
    ) -> None:
        self.processor = processor
        self.ctx = ctx  # the proxy's own (PROXY_IDENTITY)
        self.group = group
        self.scan_interval = scan_interval
        self.max_outbound_bytes = 0  # --max-outbound-bytes-per-connection (MqttAdapter sets it)
        self.trie: TopicTrie[Sub] = TopicTrie()
        self.loops: dict[str, TopicLoop] = {}  # store topic -> its TopicLoop
        self.topic_refs: dict[str, int] = {}  # clean subscriptions per literal first level
        self.wild_refs = 0  # clean subscriptions whose first level is a wildcard
        self.wild_states: set[SessionState] = set()  # attached persistent sessions with root wildcards
        self._scanner: asyncio.Task | None = None
        self._scanned = asyncio.Event()  # set once the first scan for root wildcards is done

    # ------------------------------------------------------------------ clean sessions
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
        p = self.processor
        version = access.acl_version(p)
        for sub in subs:
            s = sub.session
            if publisher is not None and sub.nl and s.client_id == publisher:
                continue
            if (sub.check or sub.acl_version != version) and not access.may_read(p, s.ctx.identity, path):
                continue  # the subscriber may not read this path (the ACL: access.py)
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
            if not s.writable.is_set():
                continue  # over its outbound bound: a clean session's delivery is dropped (docs/limits.md)
            if s.version == MQTT_5 and props is False:
                props = v5_properties(msg, now or None)
            pp = with_sub_ids(props or None, ids.get(s)) if ids is not None else props or None
            q = sub.qos if sub.qos < pub_qos else pub_qos
            s.deliver(path, body, q, retained and sub.rap, pp)

    def add(self, sub: Sub) -> None:
        """Index an acquired clean-session subscription: dispatch now reaches it."""
        self.trie.add(sub.filter, sub)

    async def remove(self, sub: Sub) -> None:
        """Unindex a clean-session subscription and release what it acquired."""
        self.trie.discard(sub.filter, sub)
        await self.release(sub)

    async def acquire(self, sub: Sub) -> None:
        """Make sure the TopicLoops `sub` needs run (every store topic for a root wildcard)."""
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
        await self.ensure(t, from_now=True)

    async def release(self, sub: Sub) -> None:
        """Undo `acquire`: stop the TopicLoops no clean subscription needs any more."""
        if sub.wild:
            self.wild_refs -= 1
            if self.wild_refs == 0:
                for t in [t for t in self.loops if not self.topic_refs.get(t)]:
                    await self._stop_loop(t)
            return
        t = store_topic_of_level(sub.first)
        n = self.topic_refs.get(t, 0) - 1
        if n > 0:
            self.topic_refs[t] = n
            return
        self.topic_refs.pop(t, None)
        if not self.wild_refs:
            await self._stop_loop(t)

    async def ensure(self, topic: str, from_now: bool) -> None:
        """Start the TopicLoop of `topic` unless it runs (then wait until it is positioned)."""
        f = self.loops.get(topic)
        if f is None:
            f = self.loops[topic] = TopicLoop(
                self.processor, self.ctx, self.group, topic, self.dispatch, self._deleted
            )
            try:
                await f.start(from_now)
            except ProcessorError as e:
                log.warning("mqtt fan-out of %s cannot start: %s", topic, e)
                if self.loops.get(topic) is f:
                    del self.loops[topic]
        else:
            await f.ready.wait()

    def _deleted(self, f: TopicLoop) -> None:
        self.loops.pop(f.topic, None)

    async def _stop_loop(self, topic: str) -> None:
        f = self.loops.pop(topic, None)
        if f is not None:
            await f.stop()

    async def _scan(self, from_now: bool) -> None:
        for t in await self.processor.list_topics():
            if not t.name.startswith("%") and t.name not in self.loops:
                await self.ensure(t.name, from_now)

    def _ensure_scanner(self) -> None:
        if self._scanner is None or self._scanner.done():
            self._scanner = asyncio.get_running_loop().create_task(self._scan_loop())

    async def _scan_loop(self) -> None:
        """While root-wildcard subscriptions exist, look for new store topics periodically."""
        while self.wild_refs or self.wild_states:
            await asyncio.sleep(self.scan_interval)
            try:
                if self.wild_refs:
                    await self._scan(from_now=False)
                for st in list(self.wild_states):
                    await self.sync(st)
            except Exception:  # noqa: BLE001
                log.exception("mqtt topic scan failed")
        self._scanner = None

    # ------------------------------------------------------------------ persistent sessions
    async def sync(self, st: SessionState) -> None:
        """Run one delivery loop per store topic the attached session's subscriptions cover."""
        s = st.attached
        if s is None:
            return
        scans = st.wild and st.queue is None  # (a session with a queue reads only its queue)
        names = (
            [t.name for t in await self.processor.list_topics() if not t.name.startswith("%")]
            if scans
            else []
        )
        if st.attached is not s:
            return
        want = st.topics(names)
        by_offset = not _has_qos2(st)  # (a QoS 2 subscription added or gone: the feeds change kind)
        stop = [
            st.feeds.pop(t)
            for t in list(st.feeds)
            if t not in want or isinstance(st.feeds[t], OffsetDeliveryLoop) != by_offset
        ]
        for lp in stop:  # (stopped first: a feed's successor starts from its final commit)
            await lp.stop(drain_timeout=0)
        if st.attached is not s:
            return
        for t in want:
            if t not in st.feeds:
                st.feeds[t] = self._feed(st, s, t)
        if scans:
            self.wild_states.add(st)
            self._ensure_scanner()
        else:
            self.wild_states.discard(st)

    def detach(self, st: SessionState) -> list[Feed]:
        """Take the session's delivery loops (for the caller to stop) and stop rescanning for it."""
        loops = list(st.feeds.values())
        st.feeds.clear()
        self.wild_states.discard(st)
        return loops

    def _feed(self, st: SessionState, s: Session, topic: str) -> Feed:
        """The session's delivery of `topic`: read by offset (OffsetDeliveryLoop) unless one of its
        subscriptions is QoS 2, whose exactly-once needs each message acked in the store when the
        client has it (pop/ack, DeliveryLoop)."""
        d = SessionDelivery(self.processor, st, topic)
        # both kinds: read as the proxy (the connection's rights are checked per message, deliver);
        # over the outbound bound the backlog waits in the store; bytes held until the client has them
        common: dict[str, Any] = {
            "long_poll_ms": 20_000,
            "on_error": d.ended,
            "gate": s.writable,
            "max_inflight_bytes": self.max_outbound_bytes,
        }
        lp: Feed
        if not _has_qos2(st):
            window = max(1, min(s.send_quota, OFFSET_WINDOW))
            lp = d.loop = OffsetDeliveryLoop(
                self.processor,
                self.ctx,
                st.group,
                topic,
                d.deliver,
                wants=d.wants,
                max_inflight=window,
                **common,
            )
            return lp.start()

        async def handler(x: Any) -> Outcome:
            r = d.deliver(x.message)
            if not isinstance(r, bool):
                r = await r
            return Outcome.ACK if r else Outcome.REQUEUE

        window = max(1, min(s.send_quota, 64))
        lp = d.loop = DeliveryLoop(
            self.processor,
            self.ctx,
            st.group,
            topic,
            handler,
            filter=Filter(predicate=d.wants),
            max_inflight=window,
            **common,
        )
        return lp.start()

    async def cap_queue(self, st: SessionState, caps: MqttCaps) -> None:
        """Before a reattached session's loops start (before its CONNACK): bring its offline
        backlog within the caps (offline_queue.py)."""
        if not caps.max_queued_messages and not caps.max_queued_bytes or not st.subs:
            return
        names = (
            [t.name for t in await self.processor.list_topics() if not t.name.startswith("%")]
            if st.wild and st.queue is None
            else []
        )
        try:
            await cap_backlog(
                self.processor,
                self.ctx,
                st,
                sorted(st.topics(names)),
                lambda m: _best_persistent(st, m)[0] is not None,
                caps.max_queued_messages,
                caps.max_queued_bytes,
                caps.queue_full_policy,
            )
        except ProcessorError as e:  # the session still resumes, with its whole backlog
            log.warning("mqtt %s: offline queue cap not applied: %s", st.client_id, e)

    async def cover(self, st: SessionState, sub: Sub) -> None:
        """Position the session's group at the end of each store topic a new subscription covers
        that none of its subscriptions covered: no history is replayed (topics created later are
        read from their start)."""
        covered = st.topics([]) if not st.wild else None
        if sub.wild:
            if covered is not None:
                for t in await self.processor.list_topics():
                    if not t.name.startswith("%") and t.name not in covered:
                        await position_at_end(self.processor, self.ctx, st.group, t.name)
        elif covered is not None:
            t = store_topic_of_level(sub.first)
            if t not in covered:
                await position_at_end(self.processor, self.ctx, st.group, t)

    # ------------------------------------------------------------------ shutdown
    async def close(self) -> None:
        """Stop the topic scan and every TopicLoop."""
        if self._scanner is not None:
            self._scanner.cancel()
        for t in list(self.loops):
            await self._stop_loop(t)


class SessionDelivery:
    """What a persistent session's delivery loop of one store topic calls (a small object rather
    than three closures: one is held per attached device)."""

    __slots__ = ("processor", "st", "topic", "loop")

    def __init__(self, processor: MessagingProcessor, st: SessionState, topic: str) -> None:
        self.processor = processor
        self.st = st
        self.topic = topic
        self.loop: Feed | None = None

    def wants(self, m: Message) -> bool:
        st = self.st
        if st.skip and skipped(st.skip, m):
            return False  # beyond the offline queue cap (refuse-new)
        return _best_persistent(st, m)[0] is not None

    def deliver(self, m: Message) -> bool | asyncio.Future[bool]:
        """Whether the client has `m` (or need not get it; False: its connection went away), or the
        future of it (QoS 1 and 2: when the client acknowledges)."""
        st = self.st
        conn = st.attached
        if conn is None or conn.state != CONNECTED:
            return False
        sub, ids = _best_persistent(st, m)
        if sub is None:
            return True
        path = path_of(m)
        p = self.processor
        if not access.delivers(p, sub, conn.ctx.identity, path, access.acl_version(p)):
            return True  # the connection's user may not read this path
        sp = m.properties
        now = int(time.time() * 1000)
        if expired(sp, now):
            return True
        q = min(sub.qos, qos_of(m))
        props = with_sub_ids(v5_properties(m, now), ids) if conn.version == MQTT_5 else None
        retain = sub.rap and sp.get(P_RETAIN) == "1"
        if q == 0:
            conn.deliver(path, m.body, 0, retain, props)
            return True
        done = asyncio.get_running_loop().create_future()
        conn.deliver(path, m.body, q, retain, props, done)
        return done

    def ended(self, e: ProcessorError) -> None:
        feeds = self.st.feeds
        if feeds.get(self.topic) is self.loop:
            del feeds[self.topic]


def _has_qos2(st: SessionState) -> bool:
    """Whether a (non-shared) subscription of the session is QoS 2."""
    return any(sub.qos == 2 and sub.share is None for sub in st.subs.values())


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
