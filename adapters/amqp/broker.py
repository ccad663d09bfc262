"""What the AMQP connections of one proxy share: virtual hosts with their exchanges, queues and
bindings (durable metadata in the processor's key-value table), routing at publish time, queue
lifetimes (exclusive, auto-delete, x-expires); the store-side work of queues (dead-lettering, TTL
expiry, max-length, connection.blocked) is in queue_work.py.

Mapping (docs/amqp.md): a queue is a store topic with one queue (FIFO) plus the consumer group of
the same name (`mapping.store_name`). A publish is routed by its exchange when it arrives and
stored once per destination queue (fanout to N queues = N appends in one processor.send, so one
group commit): each queue is then an independent array with exact counts, purge, limits and
deletion, and a binding change never re-routes what was already published. A new queue starts
empty (its group is positioned at the end of its topic). Consumption pops the queue's group.

Key-value namespaces (keys `<len(vhost)>:<vhost><name>`, values JSON; arguments as base64 of the
AMQP field table): `amqp.exchanges` (durable exchanges), `amqp.queues` (every queue, so that
transient and exclusive ones are removed from the store after a crash), `amqp.bindings` (bindings
between a durable exchange and a durable queue or exchange). The records are shared by every proxy
of a cluster: a declaration this proxy does not know is looked up there before anything is
created, and a new queue's record is created with kv_put_if_absent (see "shared declarations").
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
from typing import TYPE_CHECKING, Any

from messaging_processor import (
    Action,
    ClientContext,
    Identity,
    MessagingProcessor,
    ProcessorError,
    Resource,
)

from .codec import AMQPError, ReplyCode, decode_table, encode_table
from .mapping import (
    store_name,
)
from .queue_work import QueueWork
from .queues import Queue, check_equivalent
from .routing import EXCHANGE_TYPES, Binding, Exchange

if TYPE_CHECKING:
    from .channel import Channel
    from .session import Connection

log = logging.getLogger("adapters.amqp")

EXCHANGES_NS = "amqp.exchanges"
QUEUES_NS = "amqp.queues"
BINDINGS_NS = "amqp.bindings"
PROXY_IDENTITY = Identity("$amqp-proxy", None, "internal")
MAX_ATTEMPTS = 1_000_000  # AMQP queues redeliver without limit (x-delivery-limit is ours to apply)
PREDECLARED = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


def vkey(vhost: str, name: str) -> str:
    return f"{len(vhost)}:{vhost}{name}"


def parse_vkey(key: str) -> tuple[str, str]:
    n, _, rest = key.partition(":")
    k = int(n)
    return rest[:k], rest[k:]


def _args_b64(args: dict[str, Any]) -> str:
    return base64.b64encode(encode_table(args)).decode("ascii") if args else ""


def _args_of(text: str) -> dict[str, Any]:
    if not text:
        return {}
    raw = base64.b64decode(text)
    return decode_table(raw, 0, len(raw))[0]


def err(code: int, text: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
    return AMQPError(code, text, class_id=class_id, method_id=method_id)


class VHost:
    __slots__ = ("name", "exchanges", "queues", "dropping")

    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {"": Exchange(name, "", "direct")}
        for n, t in PREDECLARED:
            self.exchanges[n] = Exchange(name, n, t)
        self.queues: dict[str, Queue] = {}
        # ("q" | "e", name) being deleted: their records must not be adopted back meanwhile
        self.dropping: set[tuple[str, str]] = set()


class Broker(QueueWork):
    def __init__(
        self,
        processor: MessagingProcessor,
        *,
        invisible_time_ms: int = 60_000,
        consumer_timeout_ms: int = 1_800_000,
        long_poll_ms: int = 20_000,
        max_inflight_publishes: int = 20_000,
    ) -> None:
        self.processor = processor
        self.invisible_time_ms = invisible_time_ms
        self.consumer_timeout_ms = consumer_timeout_ms
        self.long_poll_ms = long_poll_ms
        self.max_inflight_publishes = max_inflight_publishes
        self.max_body_size = processor.limits.max_body_size
        self.ctx = ClientContext("amqp", client_id="$amqp-broker", identity=PROXY_IDENTITY)
        self.vhosts: dict[str, VHost] = {}
        self.connections: set[Connection] = set()
        self.reply_channels: dict[str, Channel] = {}  # direct reply-to tokens
        self.lock = asyncio.Lock()  # declarations, deletions and bindings, one at a time
        self.blocked: str | None = None
        self._unblock: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.closed = False

    # ------------------------------------------------------------------ lifecycle
    def vhost(self, name: str) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            vh = self.vhosts[name] = VHost(name)
        return vh

    async def start(self) -> None:
        """Load durable declarations; remove what transient and exclusive queues left in the store."""
        p = self.processor
        for key, value in await p.kv_scan(EXCHANGES_NS):
            vh, name = parse_vkey(key)
            ex = await self._exchange_of_record(vh, name, value)
            if ex is not None:
                self.vhost(vh).exchanges[name] = ex
        for key, value in await p.kv_scan(QUEUES_NS):
            vh, name = parse_vkey(key)
            q = await self._queue_of_record(vh, name, value)
            if q is None:
                continue
            if not q.durable or q.exclusive:
                await self._drop_store(q)
                await p.kv_delete(QUEUES_NS, key)
                continue
            self.vhost(vh).queues[name] = q
        for key, value in await p.kv_scan(BINDINGS_NS):
            self._link_record(key, value, None)
        n = 0
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                n += 1
                self._touch(q)
                if q.has_expiring:
                    self._start_sweeper(q)
        if n:
            log.info("amqp: %d durable queues restored", n)

    # ------------------------------------------------------------------ shared declarations
    # Every proxy of a cluster reads and writes the same key-value records: a declaration this
    # proxy has not seen yet is looked up there before anything is created, and a new queue's
    # record is created atomically (kv_put_if_absent), so a second proxy declaring the same queue
    # adopts it (its messages and its group's position) instead of starting it again.
    async def _exchange_of_record(self, vh: str, name: str, value: bytes) -> Exchange | None:
        try:
            r = json.loads(value)
            return Exchange(vh, name, r["type"], True, r["auto_delete"], r["internal"], _args_of(r["args"]))
        except (ValueError, KeyError, TypeError):
            log.warning("amqp: unreadable exchange record %r dropped", vkey(vh, name))
            await self.processor.kv_delete(EXCHANGES_NS, vkey(vh, name))
            return None

    async def _queue_of_record(self, vh: str, name: str, value: bytes) -> Queue | None:
        try:
            r = json.loads(value)
            return Queue(
                vh,
                name,
                r["topic"],
                durable=r["durable"],
                exclusive=r["exclusive"],
                auto_delete=r["auto_delete"],
                args=_args_of(r["args"]),
                own_topic=r["own_topic"],
            )
        except (ValueError, KeyError, TypeError, AMQPError):
            log.warning("amqp: unreadable queue record %r dropped", vkey(vh, name))
            await self.processor.kv_delete(QUEUES_NS, vkey(vh, name))
            return None

    def _link_record(self, key: str, value: bytes, dest_queue: str | None) -> None:
        """Link one stored binding whose source and destination this proxy knows. At start
        (`dest_queue` None) a record that is unreadable or misses an end is deleted; when a queue
        is adopted, such a record is another proxy's business and left alone."""
        try:
            vh_name, _ = parse_vkey(key)
            r = json.loads(value)
            vh = self.vhosts.get(vh_name)
            src = vh.exchanges.get(r["source"]) if vh else None
            dest = (vh.queues if r["kind"] == "q" else vh.exchanges).get(r["dest"]) if vh else None
            args = _args_of(r["args"])
        except (ValueError, KeyError, TypeError):
            src = dest = None
        if src is None or dest is None:
            if dest_queue is None:
                self.spawn(self.processor.kv_delete(BINDINGS_NS, key))
            return
        self._link(src, dest, r["rk"], args)

    async def _load_exchange(self, vh: VHost, name: str) -> Exchange | None:
        """A durable exchange another proxy declared (None if there is none)."""
        if ("e", name) in vh.dropping:
            return None
        raw = await self.processor.kv_get(EXCHANGES_NS, vkey(vh.name, name))
        if raw is None:
            return None
        ex = await self._exchange_of_record(vh.name, name, raw)
        if ex is not None and ("e", name) not in vh.dropping:
            vh.exchanges[name] = vh.exchanges.get(name) or ex
        return vh.exchanges.get(name)

    async def _load_queue(self, vh: VHost, name: str, cls: int, mid: int) -> Queue | None:
        """A queue another proxy declared, adopted with its stored bindings (None if there is
        none). Another connection's exclusive queue is RESOURCE_LOCKED and not adopted."""
        if ("q", name) in vh.dropping:
            return None
        raw = await self.processor.kv_get(QUEUES_NS, vkey(vh.name, name))
        if raw is None:
            return None
        return await self._adopt_queue(vh, name, raw, cls, mid)

    async def _adopt_queue(self, vh: VHost, name: str, raw: bytes, cls: int, mid: int) -> Queue | None:
        q = await self._queue_of_record(vh.name, name, raw)
        if q is None:
            return None
        if q.exclusive:
            raise err(ReplyCode.RESOURCE_LOCKED, _locked(name, vh.name), cls, mid)
        if name in vh.queues or ("q", name) in vh.dropping:  # adopted or deleted meanwhile
            return vh.queues.get(name)
        vh.queues[name] = q
        for key, value in await self.processor.kv_scan(BINDINGS_NS, vkey(vh.name, "")):
            src = _binding_source(value, name)
            if src is not None:
                if src not in vh.exchanges:
                    await self._load_exchange(vh, src)
                self._link_record(key, value, name)
        self._touch(q)
        if q.has_expiring:
            self._start_sweeper(q)
        return q

    async def close(self) -> None:
        self.closed = True
        if self._unblock is not None:
            self._unblock.cancel()
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.expiry_timer is not None:
                    q.expiry_timer.cancel()
                if q.sweeper is not None:
                    q.sweeper.cancel()
        if self._tasks:  # queue deletions under way (exclusive owners gone): let them finish
            await asyncio.wait(list(self._tasks), timeout=2.0)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def spawn(self, coro: Any) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ------------------------------------------------------------------ authorization
    async def authorize(
        self, conn: Connection, action: Action, resource: Resource, cls: int, mid: int
    ) -> None:
        if self.processor.authorizer is None:
            return
        try:
            await self.processor.authorize(conn.ctx.identity, action, resource)
        except ProcessorError as e:
            raise err(ReplyCode.ACCESS_REFUSED, e.message, cls, mid) from None

    # ------------------------------------------------------------------ exchanges
    def exchange(self, vh: VHost, name: str, cls: int, mid: int) -> Exchange:
        """An exchange this proxy knows (the publish path: no store round trip)."""
        ex = vh.exchanges.get("" if name == "amq.default" else name)
        if ex is None:
            raise err(ReplyCode.NOT_FOUND, f"no exchange '{name}' in vhost '{vh.name}'", cls, mid)
        return ex

    async def find_exchange(self, vh: VHost, name: str, cls: int, mid: int) -> Exchange:
        """An exchange this proxy knows or another proxy declared durable."""
        ex = vh.exchanges.get("" if name == "amq.default" else name)
        if ex is None and await self._load_exchange(vh, name) is None:
            raise err(ReplyCode.NOT_FOUND, f"no exchange '{name}' in vhost '{vh.name}'", cls, mid)
        return self.exchange(vh, name, cls, mid)

    async def declare_exchange(
        self,
        conn: Connection,
        vh: VHost,
        name: str,
        type_: str,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        args: dict[str, Any],
    ) -> None:
        if name in ("", "amq.default"):
            raise err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 10)
        if passive:
            await self.find_exchange(vh, name, 40, 10)
            return
        if name.startswith("amq."):
            raise err(
                ReplyCode.ACCESS_REFUSED,
                f"exchange name '{name}' contains reserved prefix 'amq.*'",
                40,
                10,
            )
        if type_ not in EXCHANGE_TYPES:
            raise err(ReplyCode.COMMAND_INVALID, f"unknown exchange type '{type_}'", 40, 10)
        ae = args.get("alternate-exchange")
        if ae is not None and not isinstance(ae, str):
            raise err(ReplyCode.PRECONDITION_FAILED, "invalid arg 'alternate-exchange'", 40, 10)
        async with self.lock:
            ex = vh.exchanges.get(name) or await self._load_exchange(vh, name)
            if ex is not None:
                for what, got, cur in (
                    ("type", type_, ex.type),
                    ("durable", durable, ex.durable),
                    ("auto_delete", auto_delete, ex.auto_delete),
                    ("internal", internal, ex.internal),
                    ("alternate-exchange", ae, ex.args.get("alternate-exchange")),
                ):
                    if got != cur:
                        raise err(
                            ReplyCode.PRECONDITION_FAILED,
                            f"inequivalent arg '{what}' for exchange '{name}' in vhost '{vh.name}': "
                            f"received '{_text(got)}' but current is '{_text(cur)}'",
                            40,
                            10,
                        )
                return
            await self.authorize(conn, Action.ADMIN, Resource("exchange", f"{vh.name}/{name}"), 40, 10)
            ex = Exchange(vh.name, name, type_, durable, auto_delete, internal, args)
            if durable:
                rec = {
                    "type": type_,
                    "auto_delete": auto_delete,
                    "internal": internal,
                    "args": _args_b64(args),
                }
                await self.processor.kv_put(EXCHANGES_NS, vkey(vh.name, name), json.dumps(rec).encode())
            vh.exchanges[name] = ex

    async def delete_exchange(self, conn: Connection, vh: VHost, name: str, if_unused: bool) -> None:
        if name in ("", "amq.default"):
            raise err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 20)
        if name.startswith("amq."):
            raise err(
                ReplyCode.ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'", 40, 20
            )
        async with self.lock:
            ex = vh.exchanges.get(name)
            if ex is None:
                return  # idempotent, as in RabbitMQ
            if if_unused and ex.bindings:
                raise err(
                    ReplyCode.PRECONDITION_FAILED, f"exchange '{name}' in vhost '{vh.name}' in use", 40, 20
                )
            await self.authorize(conn, Action.ADMIN, Resource("exchange", f"{vh.name}/{name}"), 40, 20)
            await self._drop_exchange(vh, ex)

    async def _drop_exchange(self, vh: VHost, ex: Exchange) -> None:
        ex.deleted = True
        vh.exchanges.pop(ex.name, None)
        vh.dropping.add(("e", ex.name))
        try:
            gone = list(ex.bindings.values())
            for other in vh.exchanges.values():
                gone += [b for b in other.bindings.values() if b.dest is ex]
            for b in gone:
                await self._unlink(vh, b)
            if ex.durable:
                await self.processor.kv_delete(EXCHANGES_NS, vkey(vh.name, ex.name))
        finally:
            vh.dropping.discard(("e", ex.name))

    # ------------------------------------------------------------------ bindings
    def _link(self, src: Exchange, dest: Exchange | Queue, rk: str, args: dict[str, Any]) -> Binding | None:
        kind = "q" if isinstance(dest, Queue) else "e"
        key = f"{kind}{len(dest.name)}:{dest.name}{len(rk)}:{rk}{_args_b64(args)}"
        b = Binding(src, dest, rk, args, key)
        if not src.bind(b):
            return None
        if kind == "q":
            dest.bindings[f"{len(src.name)}:{src.name}{key}"] = b  # type: ignore[union-attr]
        return b

    @staticmethod
    def _durable(b: Binding) -> bool:
        return b.source.durable and b.dest.durable and not getattr(b.dest, "exclusive", False)

    async def _unlink(self, vh: VHost, b: Binding) -> None:
        src = b.source
        src.unbind(b.key)
        if isinstance(b.dest, Queue):
            b.dest.bindings.pop(f"{len(src.name)}:{src.name}{b.key}", None)
        if self._durable(b):
            await self.processor.kv_delete(BINDINGS_NS, vkey(vh.name, f"{len(src.name)}:{src.name}{b.key}"))
        if src.auto_delete and not src.bindings and not src.deleted and src.name in vh.exchanges:
            await self._drop_exchange(vh, src)

    async def bind(
        self,
        conn: Connection,
        vh: VHost,
        dest: Exchange | Queue,
        source: str,
        rk: str,
        args: dict[str, Any],
        cls: int,
    ) -> None:
        mid = 20 if cls == 50 else 30
        if source in ("", "amq.default"):
            raise err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", cls, mid)
        async with self.lock:
            src = await self.find_exchange(vh, source, cls, mid)
            if getattr(dest, "deleted", False):
                raise err(
                    ReplyCode.NOT_FOUND, f"no such destination '{dest.name}' in vhost '{vh.name}'", cls, mid
                )
            b = self._link(src, dest, rk, args)
            if b is not None and self._durable(b):
                rec = {
                    "source": source,
                    "kind": "q" if isinstance(dest, Queue) else "e",
                    "dest": dest.name,
                    "rk": rk,
                    "args": _args_b64(args),
                }
                key = vkey(vh.name, f"{len(src.name)}:{src.name}{b.key}")
                await self.processor.kv_put(BINDINGS_NS, key, json.dumps(rec).encode())

    async def unbind(
        self,
        conn: Connection,
        vh: VHost,
        dest: Exchange | Queue,
        source: str,
        rk: str,
        args: dict[str, Any],
        cls: int,
    ) -> None:
        mid = 50 if cls == 50 else 40
        if source in ("", "amq.default"):
            raise err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", cls, mid)
        async with self.lock:
            src = vh.exchanges.get(source)
            if src is None:
                return  # idempotent, as in RabbitMQ
            kind = "q" if isinstance(dest, Queue) else "e"
            b = src.bindings.get(f"{kind}{len(dest.name)}:{dest.name}{len(rk)}:{rk}{_args_b64(args)}")
            if b is not None:
                await self._unlink(vh, b)

    # ------------------------------------------------------------------ queues
    def queue(self, conn: Connection, vh: VHost, name: str, cls: int, mid: int) -> Queue:
        """A queue this proxy knows that this connection may use: 404 if missing, 405 if
        exclusive to another connection."""
        q = vh.queues.get(name)
        if q is None:
            raise err(ReplyCode.NOT_FOUND, f"no queue '{name}' in vhost '{vh.name}'", cls, mid)
        if q.exclusive and q.owner is not conn:
            raise err(ReplyCode.RESOURCE_LOCKED, _locked(name, vh.name), cls, mid)
        return q

    async def find_queue(self, conn: Connection, vh: VHost, name: str, cls: int, mid: int) -> Queue:
        """As `queue`, also for a queue another proxy declared (adopted from the shared records)."""
        if name not in vh.queues:
            await self._load_queue(vh, name, cls, mid)
        return self.queue(conn, vh, name, cls, mid)

    async def declare_queue(
        self,
        conn: Connection,
        vh: VHost,
        name: str,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        args: dict[str, Any],
    ) -> Queue:
        if passive:
            q = await self.find_queue(conn, vh, name, 50, 10)
            self._touch(q)
            return q
        if not name:
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")
        elif name.startswith("amq."):
            raise err(
                ReplyCode.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", 50, 10
            )
        async with self.lock:
            if name in vh.queues or await self._load_queue(vh, name, 50, 10) is not None:
                return self._redeclare(conn, vh, name, durable, exclusive, auto_delete, args)
            topic = store_name(vh.name, name)
            q = Queue(
                vh.name, name, topic, durable=durable, exclusive=exclusive, auto_delete=auto_delete, args=args
            )
            if q.args.get("x-queue-type") == "quorum" and (exclusive or not durable):
                raise err(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid property '{'exclusive' if exclusive else 'non-durable'}' for queue '{name}' "
                    f"in vhost '{vh.name}'",
                    50,
                    10,
                )
            await self.authorize(conn, Action.ADMIN, Resource("topic", topic), 50, 10)
            p = self.processor
            try:
                await p.get_topic(topic)
                q.own_topic = False
            except ProcessorError:
                q.own_topic = True
            rec = q.record()
            rec["args"] = _args_b64(args)
            raw = await p.kv_put_if_absent(QUEUES_NS, vkey(vh.name, name), json.dumps(rec).encode())
            if raw is not None:  # another proxy created it just now
                if await self._adopt_queue(vh, name, raw, 50, 10) is None:
                    raise err(ReplyCode.INTERNAL_ERROR, f"cannot declare queue '{name}'", 50, 10)
                return self._redeclare(conn, vh, name, durable, exclusive, auto_delete, args)
            try:
                if q.own_topic:
                    await p.create_topic(topic, queues=1)
                await p.create_group(topic, max_attempts=MAX_ATTEMPTS)
                await self._position_at_end(q)
            except ProcessorError as e:
                await p.kv_delete(QUEUES_NS, vkey(vh.name, name))
                raise err(
                    ReplyCode.INTERNAL_ERROR, f"cannot create queue '{name}': {e.message}", 50, 10
                ) from None
            if exclusive:
                q.owner = conn
                conn.exclusive_queues.add(q)
            vh.queues[name] = q
            self._touch(q)
            if q.has_expiring:
                self._start_sweeper(q)
            return q

    def _redeclare(
        self,
        conn: Connection,
        vh: VHost,
        name: str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        args: dict[str, Any],
    ) -> Queue:
        """queue.declare of an existing queue: changes nothing, or fails if inequivalent."""
        q = self.queue(conn, vh, name, 50, 10)
        check_equivalent(q, durable, exclusive, auto_delete, args)
        self._touch(q)
        return q

    async def _position_at_end(self, q: Queue) -> None:
        p = self.processor
        route = await p.query_route(self.ctx, q.topic)
        for r in route.queues:
            _, hi = await p.queue_offsets(q.topic, r.queue_id)
            await p.commit_offset(self.ctx, q.group, q.topic, r.queue_id, hi)

    async def ready_count(self, q: Queue) -> int:
        try:
            backlog, inflight = await self.processor.backlog(q.group, q.topic)
        except ProcessorError:
            return 0
        return max(backlog - inflight, 0)

    async def purge(self, q: Queue) -> int:
        n = await self.ready_count(q)
        with contextlib.suppress(ProcessorError):
            await self._position_at_end(q)
        return n

    async def delete_queue(
        self, conn: Connection, vh: VHost, name: str, if_unused: bool, if_empty: bool
    ) -> int:
        async with self.lock:
            if name not in vh.queues and await self._load_queue(vh, name, 50, 40) is None:
                return 0  # idempotent, as in RabbitMQ
            q = self.queue(conn, vh, name, 50, 40)
            if if_unused and q.consumers:
                raise err(
                    ReplyCode.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vh.name}' in use", 50, 40
                )
            n = await self.ready_count(q)
            if if_empty and n:
                raise err(
                    ReplyCode.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vh.name}' is not empty", 50, 40
                )
            await self.authorize(conn, Action.ADMIN, Resource("topic", q.topic), 50, 40)
            await self._drop_queue(q)
            return n

    async def _drop_queue(self, q: Queue) -> None:
        """Delete a queue: cancel its consumers (basic.cancel to their clients), drop its bindings,
        its record, its messages and, if it created it, its store topic."""
        if q.deleted:
            return
        q.deleted = True
        vh = self.vhosts[q.vhost]
        vh.queues.pop(q.name, None)
        vh.dropping.add(("q", q.name))
        try:
            if q.expiry_timer is not None:
                q.expiry_timer.cancel()
            if q.sweeper is not None:
                q.sweeper.cancel()
            for c in list(q.consumers):
                c.channel.server_cancel(c)
            for b in list(q.bindings.values()):
                await self._unlink(vh, b)
            if q.owner is not None:
                q.owner.exclusive_queues.discard(q)  # type: ignore[attr-defined]
            await self._drop_store(q)  # first: a crash meanwhile leaves the record, cleaned up at start
            await self.processor.kv_delete(QUEUES_NS, vkey(q.vhost, q.name))
        finally:
            vh.dropping.discard(("q", q.name))

    async def _drop_store(self, q: Queue) -> None:
        p = self.processor
        with contextlib.suppress(ProcessorError):
            await self._position_at_end(q)
        with contextlib.suppress(ProcessorError):
            await p.delete_group(q.group)
        if q.own_topic:
            with contextlib.suppress(ProcessorError):
                await p.delete_topic(q.topic)

    def drop_later(self, q: Queue) -> None:
        """Delete a queue from a synchronous context (auto-delete, exclusive owner gone, x-expires)."""

        async def run() -> None:
            async with self.lock:
                await self._drop_queue(q)

        if not q.deleted and not self.closed:
            self.spawn(run())

    def connection_closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        for q in list(conn.exclusive_queues):
            self.drop_later(q)
        conn.exclusive_queues.clear()

    # ------------------------------------------------------------------ consumers (queue side)
    def consumer_added(self, q: Queue) -> None:
        q.had_consumer = True
        if q.expiry_timer is not None:
            q.expiry_timer.cancel()
            q.expiry_timer = None
        q.wake.set()

    def consumer_removed(self, q: Queue) -> None:
        if q.deleted:
            return
        if not q.consumers:
            if q.auto_delete and q.had_consumer:
                self.drop_later(q)
                return
            self._touch(q)
            q.wake.set()

    def _touch(self, q: Queue) -> None:
        """Restart the x-expires timer of an unused queue."""
        if q.expires is None or q.deleted:
            return
        if q.expiry_timer is not None:
            q.expiry_timer.cancel()
            q.expiry_timer = None
        if not q.consumers:
            q.expiry_timer = asyncio.get_running_loop().call_later(q.expires / 1000, self._expire_queue, q)

    def _expire_queue(self, q: Queue) -> None:
        q.expiry_timer = None
        if not q.consumers and not q.deleted:
            log.info("amqp: queue %r in vhost %r expired (x-expires)", q.name, q.vhost)
            self.drop_later(q)

    def touch(self, q: Queue) -> None:
        self._touch(q)

    # ------------------------------------------------------------------ publishing
    def route(self, vh: VHost, ex: Exchange, rk: str, raw: bytes) -> tuple[Queue, ...] | list[Queue]:
        """The queues a message published to `ex` with `rk` goes to (exchange-to-exchange bindings
        and alternate exchanges followed); `raw`: its content properties (headers exchanges)."""
        if not ex.name:
            q = vh.queues.get(rk)
            return (q,) if q is not None else ()
        dests = ex.match(rk, raw)
        if ex.queues_only and (dests or ex.alternate is None):
            return dests
        out: list[Queue] = []
        seen: set[int] = {id(ex)}
        stack: list[Any] = list(dests)
        while True:
            while stack:
                d = stack.pop(0)
                if type(d) is Queue:
                    if d not in out:
                        out.append(d)
                elif id(d) not in seen:
                    seen.add(id(d))
                    stack.extend(d.match(rk, raw))
            if out or ex.alternate is None:
                return out
            alt = vh.exchanges.get(ex.alternate)
            if alt is None or id(alt) in seen:
                return out
            seen.add(id(alt))
            ex = alt
            stack = list(alt.match(rk, raw)) if alt.name else list(self.route(vh, alt, rk, raw))


def _binding_source(value: bytes, queue: str) -> str | None:
    """The source exchange of a stored binding to `queue` (None for any other record)."""
    try:
        r = json.loads(value)
        return r["source"] if r["kind"] == "q" and r["dest"] == queue else None
    except (ValueError, KeyError, TypeError):
        return None


def _locked(name: str, vhost: str) -> str:
    return (
        f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'. It could be "
        "originally declared on another connection or the exclusive property value does not match "
        "that of the original declaration."
    )


def _text(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
