"""The declarations of one proxy: virtual hosts with their exchanges, queues and bindings, declared,
bound and deleted one at a time, in the key-value records (records.py) that every proxy of a store
reads and writes. Keeping them in step with the other proxies (start-up clean-up, adoption of
their declarations, the bindings' generations) is declaration_sync.py's.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from messaging_processor import Action, ClientContext, ProcessorError, Resource
from messaging_processor.ownership import OwnerLeases

from .codec import ReplyCode
from .declaration_sync import DeclarationSync, err, locked, stop_timers
from .lifetimes import QueueLifetimes
from .mapping import store_name
from .queue_store import QueueStore
from .queues import Queue, check_equivalent
from .records import Records, args_b64, binding_name
from .routing import EXCHANGE_TYPES, Binding, Exchange, VHost

log = logging.getLogger("adapters.amqp")


class DeclaringConnection(Protocol):
    """What the declarations use of the connection that makes them (session.py `Connection`): its
    client context, the one its exclusive queues pop with, those queues, and its vhost (named in a
    refusal)."""

    ctx: ClientContext
    pop_ctx: ClientContext
    exclusive_queues: set[Queue]
    vhost_obj: VHost | None


# 403 unless the connection's user may do the action on the resource (broker.py `Broker.authorize`)
Authorize = Callable[[DeclaringConnection, Action, Resource, int, int, str], Awaitable[None]]


class Registry:
    def __init__(
        self,
        vhosts: dict[str, VHost],
        records: Records,
        queue_store: QueueStore,
        authorize: Authorize,
        start_sweeper: Callable[[Queue], None],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task],
        leases: OwnerLeases,
    ) -> None:
        self.vhosts = vhosts
        self.records = records
        self.queue_store = queue_store
        self.authorize = authorize
        self.start_sweeper = start_sweeper
        self.spawn = spawn
        self.lifetimes = QueueLifetimes(self.drop_later)
        self.lock = asyncio.Lock()  # declarations, deletions and bindings, one at a time
        self.closed = False
        self.max_queues_per_vhost = 0  # queue.declare of a new queue past it: 406 (0: no cap)
        self.max_queues_per_user = 0  # the same, for the queues one user declared in every vhost
        self.sync = DeclarationSync(self, vhosts, records, queue_store, leases, spawn)
        # what the connections and the broker's work ask of the other proxies' declarations
        self.sync_bindings = self.sync.sync_bindings
        self.missing_topics = self.sync.missing_topics
        self.look_up_queue = self.sync.look_up_queue
        self.look_up_exchange = self.sync.look_up_exchange
        self.forget = self.sync.forget

    @property
    def sync_interval_s(self) -> float:
        """How often the bindings made through other proxies are looked for (declaration_sync.py)."""
        return self.sync.sync_interval_s

    @sync_interval_s.setter
    def sync_interval_s(self, value: float) -> None:
        self.sync.sync_interval_s = value

    @property
    def reaping(self) -> asyncio.Task | None:
        """The removal of other hosts' gone processes' records, while it runs (declaration_sync.py)."""
        return self.sync.reaping

    # ------------------------------------------------------------------ lifecycle
    def vhost(self, name: str) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            vh = self.vhosts[name] = VHost(name)
        return vh

    async def start(self) -> None:
        """Load the declarations and clean up after gone processes (declaration_sync.py)."""
        await self.sync.start()

    def close(self) -> None:
        """No deletion from now on; every queue's timers and TTL sweeper stop."""
        self.closed = True
        self.sync.close()
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                stop_timers(q)

    def activate(self, q: Queue) -> None:
        """A queue this proxy now serves: its x-expires timer and TTL sweeper run."""
        self.lifetimes.touch(q)
        if q.has_expiring:
            self.start_sweeper(q)

    # ------------------------------------------------------------------ exchanges
    async def find_exchange(self, vh: VHost, name: str, cls: int, mid: int) -> Exchange:
        """An exchange this proxy knows or another proxy declared."""
        ex = vh.exchanges.get("" if name == "amq.default" else name)
        if (
            ex is None
            and await self.sync.load_exchange(vh, name) is None
            and (vh.topic_exchange is None or await vh.topic_exchange(name) is None)
        ):
            raise err(ReplyCode.NOT_FOUND, f"no exchange '{name}' in vhost '{vh.name}'", cls, mid)
        return vh.exchange(name, cls, mid)

    async def declare_exchange(
        self,
        conn: DeclaringConnection,
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
        await self.sync_bindings()  # a publisher declares first: it then routes by every proxy's bindings
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
        await self.authorize(conn, Action.ADMIN, Resource("topic", name), 40, 10, f"exchange '{name}'")
        async with self.lock:
            ex = vh.exchanges.get(name) or await self.sync.load_exchange(vh, name)
            if ex is None and type_ == "topic" and vh.topic_exchange is not None:
                ex = await vh.topic_exchange(name)  # a store topic's exchange (bridge.py)
            if ex is not None and ex.stores and type_ == "topic":
                return  # it exists for as long as its topic: any flags are equivalent
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
            ex = Exchange(vh.name, name, type_, durable, auto_delete, internal, args)
            await self.records.put_exchange(ex)
            vh.exchanges[name] = ex

    async def delete_exchange(self, conn: DeclaringConnection, vh: VHost, name: str, if_unused: bool) -> None:
        if name in ("", "amq.default"):
            raise err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", 40, 20)
        if name.startswith("amq."):
            raise err(
                ReplyCode.ACCESS_REFUSED, f"exchange name '{name}' contains reserved prefix 'amq.*'", 40, 20
            )
        await self.authorize(conn, Action.ADMIN, Resource("topic", name), 40, 20, f"exchange '{name}'")
        async with self.lock:
            ex = vh.exchanges.get(name)
            if ex is None:
                return  # idempotent, as in RabbitMQ
            if if_unused and ex.bindings:
                raise err(
                    ReplyCode.PRECONDITION_FAILED, f"exchange '{name}' in vhost '{vh.name}' in use", 40, 20
                )
            await self.drop_exchange(vh, ex)

    async def drop_exchange(self, vh: VHost, ex: Exchange) -> None:
        ex.deleted = True
        vh.exchanges.pop(ex.name, None)
        vh.dropping.add(("e", ex.name))
        try:
            gone = list(ex.bindings.values())
            for other in vh.exchanges.values():
                gone += [b for b in other.bindings.values() if b.dest is ex]
            for b in gone:
                await self._unlink(vh, b)
            await self._delete_binding_records(
                vh, lambda src, kind, dest: src == ex.name or (kind == "e" and dest == ex.name)
            )
            await self.records.delete_exchange(vh.name, ex.name)
            await self.records.bindings_changed()  # the other proxies forget it (sync_bindings)
        finally:
            vh.dropping.discard(("e", ex.name))

    # ------------------------------------------------------------------ bindings
    def link(
        self, src: Exchange, dest: Exchange | Queue, rk: str, args: dict[str, Any], made_at: int | None = None
    ) -> Binding | None:
        kind = "q" if isinstance(dest, Queue) else "e"
        key = f"{kind}{len(dest.name)}:{dest.name}{len(rk)}:{rk}{args_b64(args)}"
        b = Binding(src, dest, rk, args, key)
        if not src.bind(b, made_at):
            return None
        if kind == "q":
            dest.bindings[binding_name(src.name, key)] = b  # type: ignore[union-attr]
        return b

    async def _unlink(self, vh: VHost, b: Binding) -> None:
        src = b.source
        src.unbind(b.key)
        if isinstance(b.dest, Queue):
            b.dest.bindings.pop(binding_name(src.name, b.key), None)
        await self.records.delete_binding(vh.name, b)
        await self.records.bindings_changed()
        if src.auto_delete and not src.bindings and not src.deleted and src.name in vh.exchanges:
            await self.drop_exchange(vh, src)

    async def bind(
        self,
        conn: DeclaringConnection,
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
            b = self.link(src, dest, rk, args)
            if b is not None:
                await self.records.put_binding(vh.name, b)
                await self.records.bindings_changed()

    async def unbind(
        self,
        conn: DeclaringConnection,
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
            b = src.bindings.get(f"{kind}{len(dest.name)}:{dest.name}{len(rk)}:{rk}{args_b64(args)}")
            if b is not None:
                await self._unlink(vh, b)

    # ------------------------------------------------------------------ queues
    def queue(self, conn: DeclaringConnection, vh: VHost, name: str, cls: int, mid: int) -> Queue:
        """A queue this proxy knows that this connection may use: 404 if missing, 405 if
        exclusive to another connection."""
        q = vh.queues.get(name)
        if q is None:
            raise err(ReplyCode.NOT_FOUND, f"no queue '{name}' in vhost '{vh.name}'", cls, mid)
        if q.exclusive and q.owner is not conn:
            raise err(ReplyCode.RESOURCE_LOCKED, locked(name, vh.name), cls, mid)
        if q.remote:  # used here from now on: its timers run here too, as for an adopted queue
            q.remote = False
            self.activate(q)
        return q

    async def find_queue(self, conn: DeclaringConnection, vh: VHost, name: str, cls: int, mid: int) -> Queue:
        """As `queue`, also for a queue another proxy declared (adopted from the shared records)."""
        if name not in vh.queues:
            await self.sync.load_queue(vh, name, cls, mid)
        return self.queue(conn, vh, name, cls, mid)

    async def declare_queue(
        self,
        conn: DeclaringConnection,
        vh: VHost,
        name: str,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        args: dict[str, Any],
    ) -> Queue:
        await self.sync_bindings()  # a queue deleted through another proxy is not declared here any more
        if passive:
            q = await self.find_queue(conn, vh, name, 50, 10)
            self.lifetimes.touch(q)
            return q
        if not name:
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode("ascii").rstrip("=")
        elif name.startswith("amq."):
            raise err(
                ReplyCode.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", 50, 10
            )
        topic = store_name(vh.name, name)
        await self.authorize(conn, Action.ADMIN, Resource("topic", topic), 50, 10, f"queue '{name}'")
        async with self.lock:
            if name in vh.queues or await self.sync.load_queue(vh, name, 50, 10) is not None:
                return self._redeclare(conn, vh, name, durable, exclusive, auto_delete, args)
            cap = self.max_queues_per_vhost
            if cap and await self.records.queue_count(vh.name) >= cap:
                raise err(
                    ReplyCode.PRECONDITION_FAILED,  # as RabbitMQ's vhost queue limit
                    f"cannot declare queue '{name}': queue limit in vhost '{vh.name}' ({cap}) is reached",
                    50,
                    10,
                )
            user = conn.ctx.identity.username
            await self._check_user_queue_limit(user, name)
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
            q.own_topic = not await self.queue_store.topic_exists(topic)
            raw = await self.records.create_queue(q, args, user)
            if raw is not None:  # another proxy created it just now
                if await self.sync.adopt_queue(vh, name, raw, 50, 10) is None:
                    raise err(ReplyCode.INTERNAL_ERROR, f"cannot declare queue '{name}'", 50, 10)
                return self._redeclare(conn, vh, name, durable, exclusive, auto_delete, args)
            try:
                await self.queue_store.create(q)
            except ProcessorError as e:
                await self.records.delete_queue(vh.name, name)
                raise err(
                    ReplyCode.INTERNAL_ERROR, f"cannot create queue '{name}': {e.message}", 50, 10
                ) from None
            if exclusive:
                q.owner = conn
                conn.exclusive_queues.add(q)
                q.feed = self.queue_store.feed(q, conn.pop_ctx)
            vh.queues[name] = q
            self.activate(q)
            return q

    async def _check_user_queue_limit(self, user: str | None, name: str) -> None:
        """406 PRECONDITION_FAILED when `user` already declared max_queues_per_user queues (RabbitMQ's
        `set_user_limits ... max-queues`); a connection without a user name is not limited."""
        cap = self.max_queues_per_user
        if cap and user is not None and await self.records.user_queue_count(user) >= cap:
            raise err(
                ReplyCode.PRECONDITION_FAILED,
                f"cannot declare queue '{name}': queue limit for user '{user}' ({cap}) is reached",
                50,
                10,
            )

    def _redeclare(
        self,
        conn: DeclaringConnection,
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
        self.lifetimes.touch(q)
        return q

    async def delete_queue(
        self, conn: DeclaringConnection, vh: VHost, name: str, if_unused: bool, if_empty: bool
    ) -> int:
        topic = store_name(vh.name, name)
        await self.authorize(conn, Action.ADMIN, Resource("topic", topic), 50, 40, f"queue '{name}'")
        async with self.lock:
            if name not in vh.queues and await self.sync.load_queue(vh, name, 50, 40) is None:
                return 0  # idempotent, as in RabbitMQ
            q = self.queue(conn, vh, name, 50, 40)
            if if_unused and q.consumers:
                raise err(
                    ReplyCode.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vh.name}' in use", 50, 40
                )
            n = await self.queue_store.ready_count(q)
            if if_empty and n:
                raise err(
                    ReplyCode.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vh.name}' is not empty", 50, 40
                )
            await self.drop_queue(q)
            return n

    async def drop_queue(self, q: Queue) -> None:
        """Delete a queue: cancel its consumers (basic.cancel to their clients), drop its bindings,
        its record, its messages and, if it created it, its store topic."""
        if q.deleted:
            return
        q.deleted = True
        vh = self.vhosts[q.vhost]
        vh.queues.pop(q.name, None)
        vh.dropping.add(("q", q.name))
        try:
            stop_timers(q)
            for c in list(q.consumers):
                c.channel.server_cancel(c)
            for b in list(q.bindings.values()):
                await self._unlink(vh, b)
            if q.owner is not None:
                q.owner.exclusive_queues.discard(q)  # type: ignore[attr-defined]
            await self._delete_binding_records(vh, lambda src, kind, dest: kind == "q" and dest == q.name)
            await self.queue_store.drop(q)  # first: a crash meanwhile leaves the record, cleaned up at start
            await self.records.delete_queue(q.vhost, q.name)
            await self.records.bindings_changed()  # the other proxies forget it (sync_bindings)
        finally:
            vh.dropping.discard(("q", q.name))

    async def _delete_binding_records(self, vh: VHost, of: Callable[[str, str, str], bool]) -> None:
        """Delete the recorded bindings of an exchange or queue being deleted that this proxy has
        not linked (made through another proxy since its last sync): none outlives its end."""
        for key, value in await self.records.bindings(vh.name):
            try:
                source, kind, dest, _, _ = Records.parse_binding(value)
            except (ValueError, KeyError, TypeError):
                continue
            if of(source, kind, dest):
                await self.records.delete_binding_key(key)

    def drop_later(self, q: Queue) -> None:
        """Delete a queue from a synchronous context (auto-delete, exclusive owner gone, x-expires)."""

        async def run() -> None:
            async with self.lock:
                await self.drop_queue(q)

        if not q.deleted and not self.closed:
            self.spawn(run())


def _text(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
