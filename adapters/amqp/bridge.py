"""The MQTT exchange (`amq.topic` in vhost "/" by default, RabbitMQ's `mqtt.exchange`): RabbitMQ's
MQTT-plugin convention both ways (docs/amqp.md, "Exchanges shared with MQTT and the store").

- AMQP -> store: a publish to the exchange with routing key `a.b.c` is stored (besides the copies
  for the AMQP queues it routes to, in the same send) on store topic `a` with MQTT path `a/b/c`
  (`mqtt.topic`, the MQTT adapter's own mapping: first level = store topic, sanitized), so MQTT
  subscribers of `a/b/+` and every consumer of topic `a` get it (`ExchangeBridge.bridged`).
- store -> AMQP: a message another protocol stored on topic T has the routing key `a.b.c` (its MQTT
  path with `/` -> `.`) or `T` / `T.<tag>`. For each store topic that the exchange's bindings can
  match (first word of a pattern, or every topic for a leading `*` / `#`), one routing loop pops
  the topic with its own group `amqp|x|<T>`, through a store-side filter that keeps only the
  messages some binding matches, and appends their copies into the bound queues' topics in one
  send, acking after it. Messages that entered over AMQP (`mapping.is_amqp`) were routed when they
  were published and are never routed again, so nothing reaches a queue twice.
- client events (`--client-events`, messaging_processor/client_events.py): the internal topic
  exchange `amq.rabbitmq.event` of vhost "/", as RabbitMQ's event exchange plugin: the events of
  store topic `%EVENTS%` reach the queues bound to it by routing key = the event's tag
  (`connection.created`, `consumer.deleted`, ...), through the same routing loops.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

from messaging_processor import ClientContext, ErrorKind, Filter, Message, MessagingProcessor, ProcessorError
from messaging_processor.client_events import EVENTS_TOPIC
from messaging_processor.properties import (
    P_CONTENT_TYPE,
    P_CORRELATION,
    P_EXPIRY_AT,
    P_PATH,
    P_QOS,
    P_USER_PROPERTIES,
    path_hash,
    user_property_pairs,
)

from .codec import BasicProperties, encode_properties
from .mapping import P_EXCHANGE, P_RK, base_properties, headers_of, is_amqp, now_ms, parse_expiration, tag_for
from .queue_work import QueueWork
from .routing import Exchange, VHost

log = logging.getLogger("adapters.amqp")

P_MQTT_TOPIC = P_PATH  # the MQTT-style property names (messaging_processor/properties.py)
P_MQTT_QOS = P_QOS
P_MQTT_CONTENT_TYPE = P_CONTENT_TYPE
P_MQTT_CORRELATION = P_CORRELATION
P_MQTT_EXPIRY_AT = P_EXPIRY_AT  # absolute epoch ms (MQTT 5 Message Expiry Interval)
GROUP_PREFIX = "amqp|x|"
EVENT_EXCHANGE = "amq.rabbitmq.event"  # RabbitMQ's event exchange: client events by routing key
MAX_STORE_TOPIC = 127
_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_HEADER_TYPES = (str, int, float, bool)


def store_topic_of_word(word: str) -> str:
    """The store topic of a first routing-key word: the MQTT adapter's rule for a first topic level
    (characters outside [A-Za-z0-9_.-] become `_`, empty becomes `_`, cut to 127)."""
    return "".join(c if c in _OK else "_" for c in word)[:MAX_STORE_TOPIC] or "_"


_SWAP = str.maketrans("./", "/.")


def swap(s: str) -> str:
    """MQTT path <-> routing key, as RabbitMQ's MQTT plugin: `/` and `.` swapped."""
    return s.translate(_SWAP)


def routing_key_of(m: Message) -> str:
    """A stored message's routing key through the MQTT exchange: its MQTT path with `/` and `.`
    swapped, else `<topic>.<tag>` or `<topic>`."""
    path = m.properties.get(P_MQTT_TOPIC)
    if path:
        return path.translate(_SWAP)
    return f"{m.topic}.{m.tag}" if m.tag else m.topic


def remaining_ttl(m: Message, now: int) -> int | None:
    """The ms an MQTT 5 message has left before its Message Expiry (None: it does not expire;
    <= 0: expired)."""
    v = m.properties.get(P_MQTT_EXPIRY_AT)
    if not v:
        return None
    try:
        return int(v) - now
    except ValueError:
        return None


def foreign_properties(m: Message, ttl_ms: int | None = None) -> bytes:
    """Raw AMQP properties for a message from another protocol: content_type (MQTT content type or
    CloudEvents datacontenttype), correlation_id (MQTT correlation data when it is UTF-8),
    delivery_mode 2, message_id, timestamp, expiration (the ms left of an MQTT 5 Message Expiry, as
    RabbitMQ's MQTT plugin maps it to a per-message TTL), and headers: every store property as a
    string plus each MQTT 5 user property as its own header."""
    p = m.properties
    headers: dict[str, Any] = {k: v for k, v in p.items() if not k.startswith("__")}
    corr = None
    if P_MQTT_CORRELATION in p:
        with contextlib.suppress(binascii.Error, ValueError):
            corr = base64.b64decode(p[P_MQTT_CORRELATION]).decode("utf-8")
    for k, v in user_property_pairs(p):
        headers.setdefault(k, v)
    props = BasicProperties(
        content_type=p.get(P_MQTT_CONTENT_TYPE) or p.get("ce_datacontenttype"),
        headers=headers or None,
        delivery_mode=2,
        correlation_id=corr if corr and len(corr) <= 255 else None,
        message_id=m.message_id or None,
        timestamp=(m.born_timestamp or m.store_timestamp) // 1000 or None,
        expiration=str(ttl_ms) if ttl_ms is not None else None,
    )
    return encode_properties(props)


def mqtt_properties(
    path: str, props: BasicProperties | None, headers: dict[str, Any]
) -> dict[str, str] | None:
    """The MQTT properties of an AMQP publish stored for MQTT under `path` (None if `path` is no
    MQTT topic name): path, QoS 1, content type, correlation data, headers as user properties, and
    an `expiration` (per-message TTL) as the Message Expiry."""
    if not path or "+" in path or "#" in path or "\x00" in path:
        return None
    p = {P_MQTT_TOPIC: path, P_MQTT_QOS: "1"}
    if props is not None:
        if props.content_type is not None:
            p[P_MQTT_CONTENT_TYPE] = props.content_type
        if props.correlation_id is not None:
            p[P_MQTT_CORRELATION] = base64.b64encode(props.correlation_id.encode()).decode("ascii")
        if props.expiration is not None and (ttl := parse_expiration(props.expiration)) is not None:
            p[P_MQTT_EXPIRY_AT] = str(now_ms() + ttl)
    user = [
        [k, v if isinstance(v, str) else str(v)] for k, v in headers.items() if isinstance(v, _HEADER_TYPES)
    ]
    if user:
        p[P_USER_PROPERTIES] = json.dumps(user, separators=(",", ":"))
    return p


def relative_key(m: Message) -> str:
    """A stored message's routing key through its own topic's exchange: its MQTT path below the
    first level with `/` and `.` swapped, else its tag, else ""."""
    path = m.properties.get(P_MQTT_TOPIC)
    if path:
        i = path.find("/")
        return path[i + 1 :].translate(_SWAP) if i >= 0 else ""
    return m.tag


def is_store_topic_name(name: str) -> bool:
    return 0 < len(name) <= MAX_STORE_TOPIC and all(c in _OK for c in name)


class ExchangeBridge:
    """The MQTT exchange of vhost "/", the exchanges of store topics (made on first use) and the
    routing loops of foreign messages (one per store topic that some binding can match)."""

    def __init__(
        self,
        processor: MessagingProcessor,
        ctx: ClientContext,
        vhost: Callable[[str], VHost],
        work: QueueWork,
        exchange: str = "amq.topic",
        *,
        refresh_s: float = 1.0,
        long_poll_ms: int = 1_000,
        events: bool = False,
    ) -> None:
        """`events`: declare the event exchange `amq.rabbitmq.event` over `%EVENTS%`."""
        self.processor = processor
        self.ctx = ctx
        self.work = work
        self.name = exchange
        self.refresh_s = refresh_s
        self.long_poll_ms = long_poll_ms
        self.vh = vhost("/")
        self.ex: Exchange | None = None
        if exchange and exchange not in self.vh.exchanges:  # before durable bindings are loaded
            self.vh.exchanges[exchange] = Exchange("/", exchange, "topic", durable=True)
        self.vh.topic_exchange = self.topic_exchange  # durable bindings to store topics load too
        self.events_ex: Exchange | None = None
        if events:  # (internal: clients bind to it, never publish to it, as RabbitMQ's)
            ex = self.vh.exchanges.get(EVENT_EXCHANGE)
            if ex is None:
                ex = self.vh.exchanges[EVENT_EXCHANGE] = Exchange("/", EVENT_EXCHANGE, "topic", internal=True)
            ex.watch = self._bindings_changed
            self.events_ex = ex
        self.loops: dict[str, asyncio.Task] = {}  # store topic -> its routing loop
        self.missing: set[str] = set()  # wanted topics that did not exist yet: start at their start
        self.changed = asyncio.Event()
        self.changed_at: int | None = None  # the first binding change not reconciled yet (epoch ms)
        self.task: asyncio.Task | None = None
        self.decisions: dict[str, bool] = {}  # topic + MQTT path or tag -> some binding matches
        # per store topic: path hashes of untagged foreign messages no binding matches, which
        # the store then passes over unread (cleared, in place, when the bindings change)
        self.passed: dict[str, set[int]] = {}
        self.routed = 0  # copies appended (for tests and measurements)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Hook the MQTT exchange and the store topics' exchanges into vhost "/", start the loops
        the bindings need; leftover groups of topics no binding wants any more are deleted."""
        vh = self.vh
        ex = vh.exchanges.get(self.name) if self.name else None
        if ex is not None and ex.type != "topic":
            log.warning("amqp: exchange %r is not a topic exchange: no MQTT mapping", self.name)
            ex = None
        if ex is not None:
            self.ex = ex
            ex.bridge = self.bridged
            ex.watch = self._bindings_changed
        vh.topic_exchange = self.topic_exchange
        wanted = await self._wanted_topics()
        for name in await self.processor.group_names():
            if name.startswith(GROUP_PREFIX) and name[len(GROUP_PREFIX) :] not in wanted:
                with contextlib.suppress(ProcessorError):
                    await self.processor.delete_group(name)
        self.changed.set()
        self.task = asyncio.get_running_loop().create_task(self._reconcile_forever())

    async def close(self) -> None:
        tasks = [t for t in (self.task, *self.loops.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.loops.clear()

    # ------------------------------------------------------------------ AMQP -> store
    def bridged(self, rk: str, raw: bytes, body: bytes, props: BasicProperties | None) -> Message | None:
        """The store message for MQTT of a publish to the MQTT exchange (None: `rk` is no MQTT
        topic): on the store topic of its first word, MQTT path = `rk` with `.` and `/` swapped."""
        mp = mqtt_properties(rk.translate(_SWAP), props, headers_of(raw))
        if mp is None:
            return None
        p = base_properties(self.name, rk, raw, props)
        p.update(mp)
        return Message(store_topic_of_word(rk.split(".", 1)[0].replace("/", ".")), body, tag_for(rk), (), p)

    async def topic_exchange(self, name: str) -> Exchange | None:
        """The exchange of store topic `name` (made when first used: publish, bind, passive
        declare); None if there is no such topic."""
        vh = self.vh
        ex = vh.exchanges.get(name)
        if ex is not None:
            return ex
        if not is_store_topic_name(name) or name.startswith("amq."):
            return None
        try:
            await self.processor.get_topic(name)
        except ProcessorError:
            return None
        ex = vh.exchanges.get(name)
        if ex is None:
            # durable: it lasts as long as its topic, and so do durable queues' bindings to it
            ex = vh.exchanges[name] = Exchange("/", name, "topic", durable=True)
            ex.stores = True
            ex.bridge = functools.partial(self.stored_on, name)
            ex.watch = self._bindings_changed
        return ex

    @staticmethod
    def stored_on(topic: str, rk: str, raw: bytes, body: bytes, props: BasicProperties | None) -> Message:
        """The store message of a publish to store topic `topic`'s exchange: tag = routing key, MQTT
        path `<topic>/<routing key with . and / swapped>`."""
        p = base_properties(topic, rk, raw, props)
        mp = mqtt_properties(f"{topic}/{rk.translate(_SWAP)}" if rk else topic, props, headers_of(raw))
        if mp is not None:
            p.update(mp)
        return Message(topic, body, tag_for(rk), (), p)

    # ------------------------------------------------------------------ store -> AMQP
    def _wanted(self, m: Message) -> bool:
        """The store-side filter of the routing loops: foreign messages some binding matches
        (decisions cached per topic and MQTT path / tag until the bindings change)."""
        p = m.properties
        if P_EXCHANGE in p or P_RK in p:  # entered over AMQP: routed when published
            return False
        path = p.get(P_MQTT_TOPIC)
        key = f"{m.topic}\x00{path or m.tag}"
        ok = self.decisions.get(key)
        if ok is None:
            ok = bool(self._destinations(m))
            if len(self.decisions) >= 65536:
                self.decisions.clear()
            self.decisions[key] = ok
        if not ok and path and not m.tag:  # its entry hash is its path's: pass such entries over
            passed = self.passed.get(m.topic)
            if passed is not None:
                if len(passed) >= 65536:
                    passed.clear()
                passed.add(path_hash(path))
        return ok

    def _destinations(self, m: Message) -> list[tuple[Exchange, str, Any]]:
        """(exchange, routing key, queues) of a foreign message: through the MQTT exchange, then
        through its topic's exchange (the queues the first did not take)."""
        vh = self.vh
        out: list[tuple[Exchange, str, Any]] = []
        if m.topic == EVENTS_TOPIC:
            ev = self.events_ex
            if ev is not None and ev.bindings and (dest := vh.route(ev, m.tag, b"")):
                out.append((ev, m.tag, dest))
            return out
        ex = self.ex
        taken: Any = ()
        if ex is not None and ex.bindings:
            rk = routing_key_of(m)[:255]
            taken = vh.route(ex, rk, b"")
            if taken:
                out.append((ex, rk, taken))
        tex = vh.exchanges.get(m.topic)
        if tex is not None and tex.stores and tex.bindings:
            rk = relative_key(m)[:255]
            dest = [q for q in vh.route(tex, rk, b"") if q not in taken]
            if dest:
                out.append((tex, rk, dest))
        return out

    def _bindings_changed(self, made_at: int | None = None) -> None:
        """A binding changed now, or one made through another proxy at `made_at` (epoch ms) reached
        this one: a loop it starts takes the messages stored since then."""
        self.decisions.clear()
        for passed in self.passed.values():
            passed.clear()
        at = now_ms() if made_at is None else made_at
        if self.changed_at is None or at < self.changed_at:
            self.changed_at = at
        self.changed.set()

    async def _wanted_topics(self) -> set[str]:
        """The store topics some binding can match: of the MQTT exchange by a pattern's first word
        (every topic for a leading `*` / `#`), of a store topic's exchange that topic."""
        topics = {n for n, e in self.vh.exchanges.items() if e.stores and e.bindings}
        if self.events_ex is not None and self.events_ex.bindings:
            topics.add(EVENTS_TOPIC)
        ex = self.ex
        if ex is None or not ex.bindings:
            return topics
        words = {b.routing_key.split(".", 1)[0] for b in ex.bindings.values()}
        topics |= {store_topic_of_word(w.replace("/", ".")) for w in words - {"*", "#"}}
        if words & {"*", "#"}:
            topics |= {
                t.name
                for t in await self.processor.list_topics()
                if not t.name.startswith(("%", "amqp|", "rmq_sys_"))
            }
        return topics

    def _wild(self) -> bool:
        ex = self.ex
        return ex is not None and any(
            b.routing_key.split(".", 1)[0] in ("*", "#") for b in ex.bindings.values()
        )

    async def _reconcile_forever(self) -> None:
        while True:
            self.changed.clear()
            since, self.changed_at = self.changed_at, None
            try:
                await self._reconcile(since)
            except ProcessorError as e:
                log.warning("amqp: exchange routing: %s", e)
            with contextlib.suppress(TimeoutError):
                # while bindings wait for topics (or match every topic), look for new topics
                await asyncio.wait_for(
                    self.changed.wait(), self.refresh_s if self.missing or self._wild() else None
                )

    async def _reconcile(self, since: int | None) -> None:
        """Start the loops of wanted topics, stop (and forget the position of) the others. A new
        loop starts with the messages stored since the binding change (`since`, epoch ms), or
        with the topic's first message when the topic did not exist yet."""
        wanted = await self._wanted_topics()
        p = self.processor
        for t in list(self.loops):
            if t not in wanted:
                task = self.loops.pop(t)
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                with contextlib.suppress(ProcessorError):
                    await p.delete_group(GROUP_PREFIX + t)
        self.missing &= wanted
        for t in wanted:
            if t in self.loops and not self.loops[t].done():
                continue
            try:
                await p.get_topic(t)
            except ProcessorError:
                self.missing.add(t)  # created later: every message of it postdates the binding
                continue
            group = GROUP_PREFIX + t
            try:
                await p.get_group(group)
            except ProcessorError:
                await p.create_group(group, max_attempts=1_000_000)
                await self._position(group, t, None if t in self.missing else since)
            self.missing.discard(t)
            self.loops[t] = asyncio.get_running_loop().create_task(self._route_loop(group, t))

    async def _position(self, group: str, topic: str, since: int | None) -> None:
        """Start `group` on `topic` at its first message (`since` None) or the first one stored at
        or after `since`."""
        p = self.processor
        route = await p.query_route(self.ctx, topic)
        for r in route.queues:
            lo, _ = await p.queue_offsets(topic, r.queue_id)
            at = lo if since is None else max(lo, await p.search_offset(topic, r.queue_id, since))
            await p.commit_offset(self.ctx, group, topic, r.queue_id, at)

    async def _route_loop(self, group: str, topic: str) -> None:
        """Pop the matching foreign messages of `topic`, append their queue copies in one send, ack."""
        p, ctx, work = self.processor, self.ctx, self.work
        passed = self.passed.setdefault(topic, set())
        f = Filter(predicate=self._wanted, skip=passed.__contains__)
        backoff = 0.1
        while True:
            try:
                ds = await p.pop(
                    ctx,
                    group,
                    topic,
                    filter=f,
                    max_messages=min(32, p.limits.max_batch),
                    invisible_time_ms=60_000,
                    long_poll_ms=self.long_poll_ms,
                )
                msgs: list[Message] = []
                queues: set[Any] = set()
                now = now_ms()
                for d in ds:
                    m = d.message
                    if is_amqp(m):  # (a remote store may not apply the filter)
                        continue
                    ttl = remaining_ttl(m, now)
                    if ttl is not None and ttl <= 0:
                        continue  # MQTT 5 expiry passed: not delivered, as to MQTT subscribers
                    raw = None
                    for ex, rk, dest in self._destinations(m):
                        raw = raw or foreign_properties(m, ttl)
                        msgs.extend(work.copies(dest, ex.name, rk, raw, m.body, None, ttl, now))
                        queues.update(dest)
                if msgs:
                    await work.send_routed(ctx, msgs, queues)
                    work.after_publish(queues)
                    self.routed += len(msgs)
                for d in ds:
                    with contextlib.suppress(ProcessorError):
                        await p.ack(ctx, d.receipt_handle)
                backoff = 0.1
            except ProcessorError as e:
                if e.kind in (ErrorKind.TOPIC_NOT_FOUND, ErrorKind.GROUP_NOT_FOUND):
                    self.changed.set()  # re-planned: started again once the topic exists
                    return
                log.warning("amqp: routing the messages of %s failed: %s", topic, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
