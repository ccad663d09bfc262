"""What the MQTT sessions of one proxy share: the client-id registry (takeover), the subscription
index (TopicTrie), one fan-out pop loop per store topic, retained messages, shared subscriptions.

Fan-out: for clean sessions the proxy pops each store topic that has local subscribers with one
proxy-unique consumer group `%MQTT_FANOUT_<uuid>` (positioned at the current max offsets, so no
history is replayed), acks at once and dispatches each message to the matching local subscriptions
by its full path. A subscription whose first level is a wildcard covers every store topic: while
one exists, the topic list is re-read every `topic_scan_interval` seconds (and at once when an MQTT
publish creates a store topic); topics found after the first scan are read from their start.

Shared subscriptions `$share/<name>/<filter>`: each member runs its own DeliveryLoop with group
`mqtt.share.<name>` over the filter's store topic with a path predicate; members compete (pop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
import zlib
from collections.abc import Callable
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

from .codec import MQTT_5, ReasonCode, Subscribe, TopicTrie, encode_suback, parse_shared, topic_matches
from .mapping import (
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
    v5_properties,
)
from .session import CONNECTED, Session

log = logging.getLogger("adapters.mqtt")

RETAINED_NS = "mqtt.retained"
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
    """One subscription of one session (hashable by identity, the TopicTrie item)."""

    __slots__ = ("session", "filter", "qos", "rap", "first", "wild", "share", "loop")

    def __init__(self, session: Session, filt: str, qos: int, rap: bool, share: str | None) -> None:
        self.session = session
        self.filter = filt  # the inner filter for a shared subscription
        self.qos = qos
        self.rap = rap  # retain as published
        self.share = share
        first = filt.split("/", 1)[0]
        self.wild = first in ("+", "#")
        self.first = first
        self.loop: DeliveryLoop | None = None


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
    ) -> None:
        self.processor = processor
        self.max_packet_size = max_packet_size
        self.topic_scan_interval = topic_scan_interval
        self.group = f"%MQTT_FANOUT_{uuid.uuid4().hex}"
        self.ctx = ClientContext("mqtt", client_id=self.group, identity=PROXY_IDENTITY)
        self.sessions: dict[str, Session] = {}
        self.trie: TopicTrie[Sub] = TopicTrie()
        self.fanouts: dict[str, Fanout] = {}
        self.topic_refs: dict[str, int] = {}
        self.wild_refs = 0
        self._queues: dict[str, int] = {}  # store topic -> queue count (per-path queue choice)
        self._scanner: asyncio.Task | None = None
        self._scanned = asyncio.Event()  # set once the first scan for root wildcards is done
        self._tasks: set[asyncio.Task] = set()

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
        for sub in list(s.subs.values()):
            self._spawn(self._drop(sub))
        s.subs.clear()
        if will is not None:
            from .mapping import to_message

            msg = to_message(will.topic, will.payload, will.qos, will.retain, will.properties or None)
            self._spawn(self.publish(s.ctx, msg, will.retain))

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ publish
    async def publish(self, ctx: ClientContext, msg: Message, retain: bool) -> int:
        """Store one message (and the retained value); the MQTT reason code (0 = stored)."""
        topic = msg.topic
        if self.wild_refs and topic not in self.fanouts:
            await self._ensure_fanout(topic, from_now=False)
        try:
            n = self._queues.get(topic)
            if n is None:
                n = self._queues[topic] = len(
                    (await self.processor.query_route(ctx, topic, auto_create=True)).queues
                )
            # One queue per path: a path's messages stay in publish order in the store and on delivery.
            msg.queue_id = zlib.crc32(msg.properties[P_TOPIC].encode()) % n
            await self.processor.send(ctx, [msg], auto_create=True)
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

    # ------------------------------------------------------------------ dispatch (fan-out)
    def dispatch(self, msg: Message) -> None:
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
        best: dict[Session, Sub] = {}
        for sub in subs:
            cur = best.get(sub.session)
            if cur is None or sub.qos > cur.qos:
                best[sub.session] = sub
        props: Any = False
        body = msg.body
        for s, sub in best.items():
            if s.version == MQTT_5 and props is False:
                props = v5_properties(sp, now or None)
            q = sub.qos if sub.qos < pub_qos else pub_qos
            s.deliver(path, body, q, retained and sub.rap, props or None)

    # ------------------------------------------------------------------ subscribe
    async def subscribe(self, s: Session, pkt: Subscribe) -> tuple[bytes, Callable[[], None] | None]:
        codes: list[int] = []
        to_send: list[tuple[Sub, Message, str]] = []
        v = s.version
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
                codes.append(await self._subscribe_shared(s, filt, shared[0], inner, qos))
                continue
            sub = s.subs.get(filt)
            new = sub is None
            if sub is None:
                sub = Sub(s, filt, qos, so.retain_as_published, None)
                await self._acquire(sub)
                if s.state != CONNECTED:
                    await self._release(sub)
                    return b"", None
                s.subs[filt] = sub
                self.trie.add(filt, sub)
            else:
                sub.qos = qos
                sub.rap = so.retain_as_published
            codes.append(qos)
            rh = so.retain_handling
            if rh == 0 or (rh == 1 and new):
                for path, m in await self._retained(filt):
                    to_send.append((sub, m, path))
        suback = encode_suback(pkt.packet_id, codes, v)

        def after() -> None:
            for sub, m, path in to_send:
                q = min(sub.qos, qos_of(m))
                props = v5_properties(m.properties) if s.version == MQTT_5 else None
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
        if len(prefix_levels) == len(levels):
            value = await p.kv_get(RETAINED_NS, filt)
            return [] if value is None else [(filt, decode_retained(filt, value))]
        prefix = "/".join(prefix_levels) + "/" if prefix_levels else ""
        if levels[len(prefix_levels)] == "#" and prefix:
            prefix = prefix[:-1]  # "a/#" also matches "a"
        now = int(time.time() * 1000)
        out = []
        for key, value in await p.kv_scan(RETAINED_NS, prefix):
            if topic_matches(filt, key):
                m = decode_retained(key, value)
                if not expired(m.properties, now):
                    out.append((key, m))
        return out

    async def unsubscribe(self, s: Session, filt: str) -> bool:
        sub = s.subs.pop(filt, None)
        if sub is None:
            return False
        await self._drop(sub)
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
                self._scanner = asyncio.get_running_loop().create_task(self._scan_loop())
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
                if self._scanner is not None:
                    self._scanner.cancel()
                    self._scanner = None
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

    async def _scan_loop(self) -> None:
        while True:
            await asyncio.sleep(self.topic_scan_interval)
            try:
                await self._scan(from_now=False)
            except Exception:  # noqa: BLE001
                log.exception("mqtt topic scan failed")

    # ------------------------------------------------------------------ shared subscriptions
    async def _subscribe_shared(self, s: Session, filt: str, name: str, inner: str, qos: int) -> int:
        old = s.subs.pop(filt, None)
        if old is not None:
            await self._drop(old)
        topic = store_topic_of_level(inner.split("/", 1)[0])
        group = "mqtt.share." + "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)
        p = self.processor
        try:
            route = await p.query_route(self.ctx, topic, auto_create=True)
            fresh = True
            for q in route.queues:
                if await p.committed_offset(group, topic, q.queue_id) >= 0:
                    fresh = False
            if fresh:  # a new share group starts at the current end, not at the oldest message
                for q in route.queues:
                    _, hi = await p.queue_offsets(topic, q.queue_id)
                    await p.commit_offset(self.ctx, group, topic, q.queue_id, hi)
        except ProcessorError as e:
            log.warning("mqtt shared subscription %s: %s", filt, e)
            return ReasonCode.UNSPECIFIED_ERROR
        sub = Sub(s, inner, qos, False, name)
        loop = asyncio.get_running_loop()

        async def handler(d: Any) -> Outcome:
            m = d.message
            q = min(sub.qos, qos_of(m))
            sp = m.properties
            props = v5_properties(sp) if s.version == MQTT_5 else None
            if q == 0:
                s.deliver(path_of(m), m.body, 0, False, props)
                return Outcome.ACK
            done = loop.create_future()
            s.deliver(path_of(m), m.body, q, False, props, done)
            return Outcome.ACK if await done else Outcome.REQUEUE

        sub.loop = DeliveryLoop(
            p,
            s.ctx,
            group,
            topic,
            handler,
            filter=Filter(predicate=lambda m: topic_matches(inner, path_of(m))),
            max_inflight=max(1, min(s.send_quota, 64)),
            long_poll_ms=20_000,
        ).start()
        s.subs[filt] = sub
        return qos

    # ------------------------------------------------------------------ shutdown
    async def close(self) -> None:
        if self._scanner is not None:
            self._scanner.cancel()
        for s in list(self.sessions.values()):
            s.close(ReasonCode.SERVER_SHUTTING_DOWN)
        for t in list(self.fanouts):
            await self._stop_fanout(t)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self.processor.delete_group(self.group)


__all__ = ["Broker", "Fanout", "Sub", "P_QOS"]
