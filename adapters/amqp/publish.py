"""One channel's publishing (`Publisher`, owned by its Channel): routing at arrival, one store send
per read, publisher confirms in tag order, x-overflow reject-publish, the publishes deferred by a
transaction, and replies through direct reply-to (reply_to.py)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from messaging_processor import (
    Action,
    ClientContext,
    ErrorKind,
    Identity,
    Message,
    MessagingProcessor,
    ProcessorError,
    Resource,
)
from messaging_processor.properties import P_PATH

from . import codec as c
from .codec import AMQPError, ReplyCode, encode_basic_ack, encode_basic_nack, encode_properties
from .mapping import (
    FLAG_EXPIRATION,
    FLAG_USER_ID,
    READABLE_FLAGS,
    flags_of,
    now_ms,
    parse_expiration,
    tag_for,
)
from .queue_work import QueueWork
from .queues import Queue
from .reply_to import REPLY_PREFIX, REPLY_TO, DirectReplyTo
from .routing import VHost

log = logging.getLogger("adapters.amqp")


class PublishingConnection(Protocol):
    """What a publisher uses of its connection (session.Connection)."""

    ctx: ClientContext
    frame_max: int
    remote: str

    def write(self, data: bytes) -> None: ...
    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task: ...
    def publishes_started(self, n: int) -> None: ...
    def publishes_done(self, n: int) -> None: ...


class PublishAcl:
    """The paths one connection may publish to, as decided by `processor.permits` (which counts and
    logs refusals), remembered until the security directory changes: the per-message check is a set
    lookup."""

    __slots__ = ("processor", "identity", "ok", "version", "bridge_denied")

    def __init__(self, processor: MessagingProcessor, identity: Identity) -> None:
        self.processor = processor
        self.identity = identity
        self.ok: set[str] = set()
        self.version = -1
        self.bridge_denied: set[str] = set()

    def allows(self, path: str) -> bool:
        sec = self.processor.security
        assert sec is not None
        v = sec.directory.version
        if v != self.version:
            self.ok.clear()
            self.bridge_denied.clear()
            self.version = v
        elif path in self.ok:
            return True
        if not self.processor.permits(self.identity, Action.PUBLISH, Resource("topic", path)):
            return False
        if len(self.ok) >= 4096:
            self.ok.clear()
        self.ok.add(path)
        return True

    def may_bridge(self, path: str) -> bool:
        """Whether the MQTT-path copy of a publish to the MQTT exchange may be stored: an ACL
        check that is neither counted nor logged as a denial (the publish itself goes on)."""
        sec = self.processor.security
        assert sec is not None
        if sec.directory.version != self.version:
            self.ok.clear()
            self.bridge_denied.clear()
            self.version = sec.directory.version
        if path in self.ok:
            return True
        if path in self.bridge_denied:
            return False
        p = self.identity.principal
        ok = p is not None and sec.permits(p, Action.PUBLISH.value, "topic", path)[0]
        cache = self.ok if ok else self.bridge_denied
        if len(cache) >= 4096:
            cache.clear()
        cache.add(path)
        return ok


class SharedDeclarations(Protocol):
    """What a publish needs of the declarations other proxies made (registry.Registry)."""

    async def look_up_exchange(self, vh: VHost, name: str) -> Any: ...
    async def look_up_queue(self, vh: VHost, name: str) -> Any: ...


class Confirm:
    """The confirms of the publishes of one read: tags first..last, the nacked ones."""

    __slots__ = ("first", "last", "nacked", "done")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last
        self.nacked: set[int] = set()
        self.done = False


class Publisher:
    __slots__ = (
        "conn",
        "number",
        "vhost",
        "work",
        "ready_count",
        "replies",
        "max_body_size",
        "fail",
        "may_publish",
        "open",
        "confirm",
        "pub_seq",
        "confirms",
        "tx_msgs",
        "sends",
        "may_bridge",
        "shared",
    )

    def __init__(
        self,
        conn: PublishingConnection,
        number: int,
        vhost: VHost,
        work: QueueWork,
        ready_count: Callable[[Queue], Awaitable[int]],
        replies: DirectReplyTo,
        max_body_size: int,
        fail: Callable[[AMQPError], None],
        may_publish: Callable[[str], bool] | None = None,
        shared: SharedDeclarations | None = None,
    ) -> None:
        self.conn = conn
        self.number = number
        self.vhost = vhost
        self.work = work
        self.ready_count = ready_count
        self.replies = replies
        self.max_body_size = max_body_size
        self.fail = fail  # the channel's error handling (a refused publish closes the channel)
        self.may_publish = may_publish  # PublishAcl.allows with security on (None: everything allowed)
        acl = getattr(may_publish, "__self__", None)  # MQTT copies of publishes to the MQTT exchange
        self.may_bridge = acl.may_bridge if isinstance(acl, PublishAcl) else None
        self.open = True
        self.confirm = False  # confirm.select
        self.pub_seq = 0
        self.confirms: deque[Confirm] = deque()
        self.tx_msgs: list[tuple[list[Message], set[Queue]]] = []  # deferred by tx.select
        self.sends: set[asyncio.Task] = set()
        # the declarations of the other proxies (the Registry); None: only store topics' exchanges
        # (VHost.topic_exchange) are looked up
        self.shared = shared

    def release(self) -> None:
        """The channel ends: deferred publishes and pending confirms are dropped."""
        self.open = False
        self.tx_msgs.clear()
        self.confirms.clear()

    async def wait_sends(self) -> None:
        """Let the publishes in flight reach the store."""
        if self.sends:
            await asyncio.gather(*self.sends, return_exceptions=True)

    # ------------------------------------------------------------------ publishing
    def publish(self, events: list[Any], tx: bool, looked_up: bool = False) -> Awaitable[None] | None:
        """Route the publishes of one read and store them with one send (confirm tags in order);
        in a transaction (`tx`) keep them for tx.commit. Publishes to exchanges, or through the
        default exchange to queues, that this proxy does not know (declared through another proxy,
        or store topics' exchanges, bridge.py) wait for that look-up: the awaitable returned (the
        channel handles what follows after it)."""
        conn = self.conn
        vh = self.vhost
        if not looked_up and (self.shared is not None or vh.topic_exchange is not None):
            for ev in events:
                if self._unknown(ev.method):
                    return self._publish_later(events, tx)
        route = vh.route
        copies = self.work.copies
        max_body_size = self.max_body_size
        msgs: list[Message] = []
        queues: set[Queue] = set()
        first = self.pub_seq + 1
        limited: list[tuple[int, Any, int]] = []  # (tag, queues, index of the first copy)
        bridged: list[Message] = []  # the MQTT exchange's store message of the current publish
        now = now_ms()
        error: AMQPError | None = None
        try:
            for ev in events:
                m = ev.method
                if m.immediate:
                    raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "immediate=true", class_id=60, method_id=40)
                ex = vh.exchange(m.exchange, 60, 40)
                if ex.internal:
                    raise AMQPError(
                        ReplyCode.ACCESS_REFUSED,
                        f"cannot publish to internal exchange '{ex.name}' in vhost '{vh.name}'",
                        class_id=60,
                        method_id=40,
                    )
                body = ev.body
                if ev.dropped or len(body) > max_body_size:
                    raise AMQPError(
                        ReplyCode.PRECONDITION_FAILED,
                        f"message size {ev.dropped or len(body)} is larger than configured max size "
                        f"{max_body_size}",
                        class_id=60,
                        method_id=40,
                    )
                raw = ev.raw_properties
                flags = flags_of(raw)
                props = ev.properties if flags & (READABLE_FLAGS | FLAG_EXPIRATION | FLAG_USER_ID) else None
                ttl = None
                if props is not None:
                    if props.expiration is not None:
                        ttl = parse_expiration(props.expiration)
                        if ttl is None:
                            raise AMQPError(
                                ReplyCode.PRECONDITION_FAILED,
                                f"invalid expiration '{props.expiration}'",
                                class_id=60,
                                method_id=40,
                            )
                    if props.user_id is not None and props.user_id != (conn.ctx.identity.username or ""):
                        raise AMQPError(
                            ReplyCode.PRECONDITION_FAILED,
                            f"user_id property set to '{props.user_id}' but authenticated user was "
                            f"'{conn.ctx.identity.username or ''}'",
                            class_id=60,
                            method_id=40,
                        )
                rk = m.routing_key
                if props is not None and props.reply_to == REPLY_TO:
                    props.reply_to = self.replies.reply_to()
                    raw = encode_properties(props)
                if not ex.name and rk.startswith(REPLY_PREFIX):
                    dest = None if self.replies.send(rk, raw, body) else []
                else:
                    dest = route(ex, rk, raw)
                    if dest and self.may_publish is not None:
                        self._check_paths(dest, ex.name, rk)
                    if ex.bridge is not None:  # the MQTT exchange (bridge.py): also stored for MQTT
                        bm = ex.bridge(rk, raw, body, props)
                        if bm is None:
                            pass
                        elif ex.stores:  # a store topic's exchange: the message itself
                            if self.may_publish is not None:
                                self._check_stored(bm, ex.name)
                            bridged.append(bm)
                        elif self.may_bridge is None or self.may_bridge(bm.properties[P_PATH]):
                            bridged.append(bm)
                if self.confirm:
                    self.pub_seq += 1
                if dest is None:  # delivered straight to a reply consumer
                    continue
                if not dest and not bridged:
                    if m.mandatory:
                        conn.write(
                            c.encode_return(
                                self.number, 312, "NO_ROUTE", m.exchange, rk, raw, body, conn.frame_max
                            )
                        )
                    continue
                for q in dest:
                    if q.limited:
                        limited.append((self.pub_seq, dest, len(msgs)))
                        break
                cs = copies(dest, ex.name, rk, raw, body, props, ttl, now) if dest else []
                msgs.extend(_merge(bridged.pop(), cs) if bridged else cs)
                queues.update(dest)
        except AMQPError as e:
            error = e
        if tx:
            if msgs:
                self.tx_msgs.append((msgs, queues))
        elif msgs:
            pend = None
            if self.confirm:
                pend = Confirm(first, self.pub_seq)
                self.confirms.append(pend)
            n = len(events)
            conn.publishes_started(n)
            t = conn.spawn(self._send(msgs, queues, pend, limited, n))
            self.sends.add(t)
            t.add_done_callback(self.sends.discard)
        elif self.confirm and self.pub_seq >= first:
            pend = Confirm(first, self.pub_seq)
            pend.done = True
            self.confirms.append(pend)
            self._flush_confirms()
        if error is not None:
            raise error
        return None

    def _unknown(self, m: Any) -> str | None:
        """ "e" if the exchange of basic.publish `m` is unknown here, "q" if it is the default
        exchange and its queue is (only looked up with `shared`), else None."""
        vh = self.vhost
        x = m.exchange
        if x in ("", "amq.default"):
            rk = m.routing_key
            if self.shared is not None and rk not in vh.queues and not rk.startswith(REPLY_PREFIX):
                return "q"
            return None
        return "e" if x not in vh.exchanges else None

    async def _publish_later(self, events: list[Any], tx: bool) -> None:
        vh, shared = self.vhost, self.shared
        seen: set[tuple[str, str]] = set()
        for ev in events:
            m = ev.method
            kind = self._unknown(m)
            name = m.routing_key if kind == "q" else m.exchange
            if kind is None or (kind, name) in seen:
                continue
            seen.add((kind, name))
            if shared is None:
                assert vh.topic_exchange is not None
                await vh.topic_exchange(name)
            elif kind == "e":
                await shared.look_up_exchange(vh, name)
            else:
                await shared.look_up_queue(vh, name)
        self.publish(events, tx, True)

    def _check_stored(self, m: Message, exchange: str) -> None:
        """403 unless the user may publish to the path of `m`, a publish to a store topic's exchange."""
        path = m.properties.get(P_PATH) or (f"{m.topic}/{m.tag}" if m.tag else m.topic)
        allows = self.may_publish
        assert allows is not None
        if not allows(path):
            raise AMQPError(
                ReplyCode.ACCESS_REFUSED,
                f"access to topic '{path}' in exchange '{exchange}' in vhost '{self.vhost.name}' refused "
                f"for user '{self.conn.ctx.identity.username or ''}'",
                class_id=60,
                method_id=40,
            )

    def _check_paths(self, dest: Any, exchange: str, rk: str) -> None:
        """403 unless the user may publish to the path of each copy: `<queue topic>/<routing key>`
        (the store tag) through a named exchange, `<queue topic>` through the default one. Checked
        as each publish is routed, so the publishes before a refused one are stored as usual."""
        tag = tag_for(rk) if exchange else ""
        allows = self.may_publish
        assert allows is not None
        for q in dest:
            path = f"{q.topic}/{tag}" if tag else q.topic
            if not allows(path):
                raise AMQPError(
                    ReplyCode.ACCESS_REFUSED,
                    f"access to topic '{path}' in exchange '{exchange or 'amq.default'}' in vhost "
                    f"'{self.vhost.name}' refused for user '{self.conn.ctx.identity.username or ''}'",
                    class_id=60,
                    method_id=40,
                )

    async def _send(
        self,
        msgs: list[Message],
        queues: set[Queue],
        pend: Confirm | None,
        limited: list[tuple[int, Any, int]],
        n: int,
    ) -> None:
        w = self.work
        try:
            if limited:
                msgs = await self._apply_reject_publish(msgs, limited, pend)
            if msgs:
                await w.send_routed(self.conn.ctx, msgs, queues)
            w.after_publish(queues)
        except ProcessorError as e:
            if pend is not None:
                pend.nacked.update(range(pend.first, pend.last + 1))
            if e.kind in (ErrorKind.FORBIDDEN, ErrorKind.UNAUTHORIZED):
                self.fail(AMQPError(ReplyCode.ACCESS_REFUSED, e.message, class_id=60, method_id=40))
            elif pend is None:
                log.warning("amqp %s: publish failed: %s", self.conn.remote, e)
        finally:
            self.conn.publishes_done(n)
            if pend is not None:
                pend.done = True
                self._flush_confirms()

    async def _apply_reject_publish(
        self, msgs: list[Message], limited: list[tuple[int, Any, int]], pend: Confirm | None
    ) -> list[Message]:
        """x-overflow reject-publish(-dlx): a full queue does not get its copy and the publisher
        gets basic.nack (the other queues still get theirs), as in RabbitMQ."""
        room: dict[Queue, int] = {}
        drop: set[int] = set()
        for tag, dest, start in limited:
            for j, q in enumerate(dest):
                if not q.limited:
                    continue
                if q not in room:
                    room[q] = q.max_length - await self.ready_count(q)
                if room[q] <= 0:
                    drop.add(start + j)
                    if pend is not None:
                        pend.nacked.add(tag)
                else:
                    room[q] -= 1
        return [m for i, m in enumerate(msgs) if i not in drop] if drop else msgs

    def _flush_confirms(self) -> None:
        if not self.open:
            self.confirms.clear()
            return
        q = self.confirms
        write = self.conn.write
        ch = self.number
        upto = 0
        while q and q[0].done:
            pend = q.popleft()
            if not pend.nacked:
                upto = pend.last
                continue
            for tag in range(pend.first, pend.last + 1):
                if tag in pend.nacked:
                    if upto:
                        write(encode_basic_ack(ch, upto, True))
                        upto = 0
                    write(encode_basic_nack(ch, tag, False, False))
                else:
                    upto = tag
        if upto:
            write(encode_basic_ack(ch, upto, True))

    # ------------------------------------------------------------------ transactions
    def take_tx(self) -> list[tuple[list[Message], set[Queue]]]:
        """tx.commit: the publishes deferred since the last commit or rollback."""
        pubs, self.tx_msgs = self.tx_msgs, []
        return pubs

    async def commit(self, pubs: list[tuple[list[Message], set[Queue]]]) -> None:
        """Store the deferred publishes with one send (500 INTERNAL_ERROR if the store refuses)."""
        msgs = [m for batch, _ in pubs for m in batch]
        queues: set[Queue] = set()
        for _, qs in pubs:
            queues |= qs
        if msgs:
            try:
                await self.work.send_routed(self.conn.ctx, msgs, queues)
            except ProcessorError as e:
                if e.kind in (ErrorKind.FORBIDDEN, ErrorKind.UNAUTHORIZED):  # the rules changed meanwhile
                    raise AMQPError(ReplyCode.ACCESS_REFUSED, e.message, class_id=90, method_id=20) from None
                raise AMQPError(
                    ReplyCode.INTERNAL_ERROR, f"commit failed: {e.message}", class_id=90, method_id=20
                ) from None
            self.work.after_publish(queues)

    def rollback(self) -> None:
        self.tx_msgs.clear()


def _merge(bm: Message, copies: list[Message]) -> list[Message]:
    """The store messages of a publish to the MQTT exchange: the queue copies plus `bm` on its MQTT
    store topic, or, when a bound queue's topic is that store topic, that copy with bm's MQTT
    properties (stored once: the queue and MQTT read the same message)."""
    for i, m in enumerate(copies):
        if m.topic == bm.topic:
            p = dict(m.properties)
            p.update(bm.properties)
            copies[i] = Message(m.topic, m.body, m.tag, (), p)
            return copies
    copies.append(bm)
    return copies
