"""The declarations of one proxy: virtual hosts with their exchanges, queues and bindings, declared,
bound and deleted one at a time, and shared with the other proxies of a cluster through the
key-value records (records.py).

Every proxy reads and writes the same records: a declaration this proxy has not seen yet is looked
up there before anything is created (declare, passive declare, bind, consume, get, purge, delete),
and a new queue's record is created atomically (kv_put_if_absent), so a second proxy declaring the
same queue adopts it (its messages and its group's position) instead of starting it again; another
proxy's exclusive queue is 405 RESOURCE_LOCKED. What was adopted stays cached.

Bindings are kept in step (`sync_bindings`): every binding is recorded, each change of a binding
and each deletion of an exchange or queue writes a new generation, and a proxy re-reads the
records when the generation changed, every `sync_interval_s` and before each exchange.declare and
queue.declare (what clients do first). A publish through any proxy then routes by the bindings made
through the others, a queue another proxy serves (an exclusive one too) included; such a queue is
`Queue.remote` here until a connection here uses it. An exchange or queue deleted through another
proxy (its record gone, or declared again with other flags) is forgotten here: its consumers here
get basic.cancel, its bindings here go.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from messaging_processor import Action, ProcessorError, Resource

from .codec import AMQPError, ReplyCode
from .lifetimes import QueueLifetimes
from .mapping import store_name
from .owners import OwnerLeases, alive, foreign
from .queue_store import QueueStore
from .queues import Queue, check_equivalent
from .records import Records, args_b64, binding_name, binding_source, parse_vkey, record_owner, vkey
from .routing import EXCHANGE_TYPES, Binding, Exchange, VHost

if TYPE_CHECKING:
    from .session import Connection

    Authorize = Callable[[Connection, Action, Resource, int, int, str], Awaitable[None]]

log = logging.getLogger("adapters.amqp")

SYNC_INTERVAL_S = 0.25  # how often a proxy looks for bindings made through other proxies


def err(code: int, text: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
    return AMQPError(code, text, class_id=class_id, method_id=method_id)


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
        self.leases = leases
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
        self.sync_interval_s = SYNC_INTERVAL_S
        self._generation: tuple[tuple[str, bytes], ...] | None = None  # the others', when last read
        self._sync_task: asyncio.Task | None = None
        self.reaping: asyncio.Task | None = None  # the removal of other hosts' gone processes' records

    # ------------------------------------------------------------------ lifecycle
    def vhost(self, name: str) -> VHost:
        vh = self.vhosts.get(name)
        if vh is None:
            vh = self.vhosts[name] = VHost(name)
        return vh

    async def start(self) -> None:
        """Load the declarations. Remove the records of non-durable exchanges and of transient and
        exclusive queues (with their messages) that a process which is gone left behind; those of
        processes still running (other workers, proxies on this host or, by their leases, on
        others: owners.py) are kept, their queues known here as `remote` destinations. Then the
        bindings whose ends are gone. The records of other hosts' processes are checked in the
        background (`reaping`: a lease check takes three beats)."""
        rs = self.records
        elsewhere: set[str] = set()  # owners on other hosts: their leases decide
        for key, owner in await rs.generation_owners():
            if not self._running(owner, elsewhere):
                await rs.delete_generation(key)  # a gone proxy's: nobody polls for it any more
        self._generation = await rs.bindings_generation()  # before the reads: a later change re-syncs
        removed = False
        for key, value in await rs.exchanges():
            vh, name = parse_vkey(key)
            ex = await rs.exchange_of(vh, name, value)
            if ex is not None and not ex.durable and not self._running(record_owner(value), elsewhere):
                await rs.delete_exchange(vh, name)
                removed = True
            elif ex is not None:
                self.vhost(vh).exchanges[name] = ex
        for key, value in await rs.queues():
            vh, name = parse_vkey(key)
            q = await rs.queue_of(vh, name, value)
            if q is None:
                continue
            if not q.durable or q.exclusive:
                if self._running(record_owner(value), elsewhere):
                    q.remote = True  # another running process's
                    self.vhost(vh).queues[name] = q
                    continue
                await self.queue_store.drop(q)
                await rs.delete_queue(vh, name)
                removed = True
                continue
            self.vhost(vh).queues[name] = q
        for key, value in await rs.bindings():
            await self._store_topic_source(key, value)
            if not self._link_record(key, value):
                await rs.delete_binding_key(key)  # an end is gone (or the record is unreadable)
                removed = True
        if removed:
            await rs.bindings_changed()  # the running proxies unlink what went (sync_bindings)
        n = 0
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                if q.remote:
                    continue
                n += 1
                self._activate(q)
        if n:
            log.info("amqp: %d durable queues restored", n)
        self._sync_task = asyncio.get_running_loop().create_task(self._poll_bindings())
        if elsewhere:
            self.reaping = self.spawn(self._reap(elsewhere))

    @staticmethod
    def _running(owner: str | None, elsewhere: set[str]) -> bool:
        """Whether the process that recorded a transient declaration may run: on this host, /proc
        tells; one on another host counts as running until its lease says otherwise (`_reap`)."""
        if foreign(owner):
            assert owner is not None
            elsewhere.add(owner)
            return True
        return alive(owner)

    async def _reap(self, owners: set[str]) -> None:
        """Remove the transient exchanges and queues (with their messages and bindings) recorded by
        those of `owners`, processes on other hosts, whose leases show them gone."""
        try:
            gone = await self.leases.gone(owners)
        except Exception as e:  # noqa: BLE001 - keep them: the next proxy to start checks again
            log.warning("amqp: checking other hosts' proxies failed: %s", e)
            return
        if not gone:
            return
        log.info("amqp: removing the transient declarations of %d gone proxies: %s", len(gone), sorted(gone))
        rs = self.records
        async with self.lock:
            if self.closed:
                return
            for key, owner in await rs.generation_owners():
                if owner in gone:
                    await rs.delete_generation(key)
            for key, value in await rs.queues():
                if record_owner(value) not in gone:
                    continue
                vh_name, name = parse_vkey(key)
                q = self.vhost(vh_name).queues.get(name)
                if q is None or q.stored != value:
                    q = await rs.queue_of(vh_name, name, value)
                if q is not None and (not q.durable or q.exclusive):
                    await self._drop_queue(q)
            for key, value in await rs.exchanges():
                if record_owner(value) not in gone:
                    continue
                vh_name, name = parse_vkey(key)
                vh = self.vhost(vh_name)
                ex = vh.exchanges.get(name)
                if ex is not None and ex.stored == value and not ex.durable:
                    await self._drop_exchange(vh, ex)

    async def forget(self) -> None:
        """Delete this proxy's generation of the bindings (at stop: nobody need poll it)."""
        await self.records.delete_generation()

    def close(self) -> None:
        """No deletion from now on; every queue's timers and TTL sweeper stop."""
        self.closed = True
        if self._sync_task is not None:
            self._sync_task.cancel()
        if self.reaping is not None:
            self.reaping.cancel()  # (it waits out other hosts' leases first: not worth waiting for)
        for vh in self.vhosts.values():
            for q in vh.queues.values():
                _stop_timers(q)

    def _activate(self, q: Queue) -> None:
        """A queue this proxy now serves: its x-expires timer and TTL sweeper run."""
        self.lifetimes.touch(q)
        if q.has_expiring:
            self.start_sweeper(q)

    # ------------------------------------------------------------------ shared declarations
    def _link_record(self, key: str, value: bytes) -> bool:
        """Link one stored binding whose source and destination this proxy knows; False if the
        record is unreadable or an end is unknown (at start: deleted; when a queue is adopted,
        another proxy's business and left alone)."""
        try:
            vh_name, _ = parse_vkey(key)
            source, kind, dest_name, rk, args = Records.parse_binding(value)
            vh = self.vhosts.get(vh_name)
            src = vh.exchanges.get(source) if vh else None
            dest = (vh.queues if kind == "q" else vh.exchanges).get(dest_name) if vh else None
        except (ValueError, KeyError, TypeError):
            src = dest = None
        if src is None or dest is None:
            return False
        self._link(src, dest, rk, args)
        return True

    async def _store_topic_source(self, key: str, value: bytes) -> None:
        """Make the exchange of a store topic that a stored binding has as its source (those are
        made on first use, bridge.py), so that the binding is linked rather than dropped."""
        try:
            vh = self.vhosts.get(parse_vkey(key)[0])
            source = Records.parse_binding(value)[0]
        except (ValueError, KeyError, TypeError):
            return
        if vh is not None and vh.topic_exchange is not None and source not in vh.exchanges:
            await vh.topic_exchange(source)

    async def _load_exchange(self, vh: VHost, name: str) -> Exchange | None:
        """An exchange another proxy declared (None if there is none)."""
        if ("e", name) in vh.dropping:
            return None
        raw = await self.records.exchange_value(vh.name, name)
        if raw is None:
            return None
        ex = await self.records.exchange_of(vh.name, name, raw)
        if ex is not None and ("e", name) not in vh.dropping:
            vh.exchanges[name] = vh.exchanges.get(name) or ex
        return vh.exchanges.get(name)

    async def _load_queue(self, vh: VHost, name: str, cls: int, mid: int) -> Queue | None:
        """A queue another proxy declared, adopted with its stored bindings (None if there is
        none). Another connection's exclusive queue is RESOURCE_LOCKED and not adopted."""
        if ("q", name) in vh.dropping:
            return None
        raw = await self.records.queue_value(vh.name, name)
        if raw is None:
            return None
        return await self._adopt_queue(vh, name, raw, cls, mid)

    async def _adopt_queue(self, vh: VHost, name: str, raw: bytes, cls: int, mid: int) -> Queue | None:
        q = await self.records.queue_of(vh.name, name, raw)
        if q is None:
            return None
        if q.exclusive:
            raise err(ReplyCode.RESOURCE_LOCKED, _locked(name, vh.name), cls, mid)
        if name in vh.queues or ("q", name) in vh.dropping:  # adopted or deleted meanwhile
            return vh.queues.get(name)
        vh.queues[name] = q
        for key, value in await self.records.bindings(vh.name):
            src = binding_source(value, name)
            if src is not None:
                if src not in vh.exchanges:
                    await self._load_exchange(vh, src)
                self._link_record(key, value)
        self._activate(q)
        return q

    # ------------------------------------------------------------------ bindings of other proxies
    async def _poll_bindings(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync_bindings()
            except Exception as e:  # noqa: BLE001 - keep what is linked; try again next time
                log.warning("amqp: reading the shared bindings failed: %s", e)

    async def sync_bindings(self) -> bool:
        """Link the recorded bindings this proxy lacks (with their exchanges and queues) and unlink
        those whose records are gone, when the bindings' generation changed; True if it did.
        A binding to a transient queue this proxy serves stays linked while the queue lives here:
        a proxy that starts removes such records, other proxies' included (see `start`)."""
        gen = await self.records.bindings_generation()
        if gen == self._generation:
            return False
        async with self.lock:
            gen = await self.records.bindings_generation()  # before the read: a later change re-syncs
            await self._forget_deleted()
            recs = dict(await self.records.bindings())
            linked: set[str] = set()
            for vh in list(self.vhosts.values()):
                for ex in list(vh.exchanges.values()):
                    for b in list(ex.bindings.values()):
                        key = vkey(vh.name, binding_name(ex.name, b.key))
                        if key in recs:
                            linked.add(key)
                        elif not _served_transient(b.dest):
                            _unlink_here(b)
            for key, value in recs.items():
                if key not in linked:
                    await self._link_shared(key, value)
            for vh in self.vhosts.values():
                for name in [n for n, q in vh.queues.items() if q.remote and not q.bindings]:
                    del vh.queues[name]  # routed to by no binding any more
            self._generation = gen
        return True

    async def _forget_deleted(self) -> None:
        """Forget the exchanges and queues known here that were deleted through another proxy: their
        record is gone or is another one (deleted and declared again). Records are compared as
        bytes, with the one each was declared or loaded with (`stored`). A candidate is read again
        alone before it goes (one looked up meanwhile, unlocked, is kept)."""
        rs = self.records
        queues = dict(await rs.queues())
        exchanges = dict(await rs.exchanges())
        for vh in list(self.vhosts.values()):
            for name, q in list(vh.queues.items()):
                if q.stored is None or queues.get(vkey(vh.name, name)) == q.stored:
                    continue
                raw = await rs.queue_value(vh.name, name)
                if vh.queues.get(name) is q and raw != q.stored:
                    self._forget_queue(vh, q)
            for name, ex in list(vh.exchanges.items()):
                if ex.stored is None or exchanges.get(vkey(vh.name, name)) == ex.stored:
                    continue  # (None: a pre-declared or store topic's exchange, not recorded)
                raw = await rs.exchange_value(vh.name, name)
                if vh.exchanges.get(name) is ex and raw != ex.stored:
                    self._forget_exchange(vh, ex)

    def _forget_queue(self, vh: VHost, q: Queue) -> None:
        """A queue deleted through another proxy (which dropped its messages and records): its
        consumers here are cancelled (basic.cancel), its bindings here unlinked."""
        q.deleted = True
        vh.queues.pop(q.name, None)
        _stop_timers(q)
        for c in list(q.consumers):
            c.channel.server_cancel(c)
        for b in list(q.bindings.values()):
            _unlink_here(b)
        if q.owner is not None:
            q.owner.exclusive_queues.discard(q)  # type: ignore[attr-defined]

    def _forget_exchange(self, vh: VHost, ex: Exchange) -> None:
        """An exchange deleted through another proxy: its bindings here, both ways, unlinked."""
        ex.deleted = True
        vh.exchanges.pop(ex.name, None)
        gone = list(ex.bindings.values())
        for other in vh.exchanges.values():
            gone += [b for b in other.bindings.values() if b.dest is ex]
        for b in gone:
            _unlink_here(b)

    async def _link_shared(self, key: str, value: bytes) -> None:
        """Link one binding another proxy recorded, finding or loading both of its ends."""
        try:
            vh_name, _ = parse_vkey(key)
            source, kind, dest_name, rk, args = Records.parse_binding(value)
        except (ValueError, KeyError, TypeError):
            return
        vh = self.vhost(vh_name)
        src = vh.exchanges.get(source) or await self._load_exchange(vh, source)
        if src is None and vh.topic_exchange is not None:
            src = await vh.topic_exchange(source)  # a store topic's exchange (bridge.py)
        dest: Exchange | Queue | None
        if kind == "q":
            dest = vh.queues.get(dest_name) or await self._load_remote_queue(vh, dest_name)
        else:
            dest = vh.exchanges.get(dest_name) or await self._load_exchange(vh, dest_name)
        if src is not None and dest is not None and not src.deleted and not dest.deleted:
            self._link(src, dest, rk, args, Records.binding_made_at(value))

    async def _load_remote_queue(self, vh: VHost, name: str) -> Queue | None:
        """A queue another proxy declared, known here as a destination only (`Queue.remote`)."""
        if ("q", name) in vh.dropping:
            return None
        raw = await self.records.queue_value(vh.name, name)
        q = None if raw is None else await self.records.queue_of(vh.name, name, raw)
        if q is None or ("q", name) in vh.dropping:
            return None
        known = vh.queues.get(name)  # declared or looked up here meanwhile (a publish looks up unlocked)
        if known is not None:
            return known
        q.remote = True
        vh.queues[name] = q
        return q

    async def missing_topics(self, topics: set[str]) -> set[str]:
        """Of these queue topics, those that no longer exist, once the bindings are in step: a
        publish routed to a queue deleted through another proxy before this proxy saw it. Such a
        queue known here as `remote` is forgotten."""
        await self.sync_bindings()
        gone = {t for t in topics if not await self.queue_store.topic_exists(t)}
        for vh in self.vhosts.values():
            for name in [n for n, q in vh.queues.items() if q.remote and q.topic in gone]:
                for b in list(vh.queues.pop(name).bindings.values()):
                    _unlink_here(b)
        return gone

    async def look_up_queue(self, vh: VHost, name: str) -> Queue | None:
        """A queue a publish through the default exchange names that this proxy does not know: one
        declared through another proxy (`remote` here), or None."""
        return vh.queues.get(name) or await self._load_remote_queue(vh, name)

    async def look_up_exchange(self, vh: VHost, name: str) -> Exchange | None:
        """An exchange a publish names that this proxy does not know: one declared through another
        proxy (with every binding made up to now), or a store topic's (bridge.py); None if none."""
        await self.sync_bindings()
        ex = vh.exchanges.get(name) or await self._load_exchange(vh, name)
        if ex is None and vh.topic_exchange is not None:
            ex = await vh.topic_exchange(name)
        return ex

    # ------------------------------------------------------------------ exchanges
    async def find_exchange(self, vh: VHost, name: str, cls: int, mid: int) -> Exchange:
        """An exchange this proxy knows or another proxy declared."""
        ex = vh.exchanges.get("" if name == "amq.default" else name)
        if (
            ex is None
            and await self._load_exchange(vh, name) is None
            and (vh.topic_exchange is None or await vh.topic_exchange(name) is None)
        ):
            raise err(ReplyCode.NOT_FOUND, f"no exchange '{name}' in vhost '{vh.name}'", cls, mid)
        return vh.exchange(name, cls, mid)

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
            ex = vh.exchanges.get(name) or await self._load_exchange(vh, name)
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

    async def delete_exchange(self, conn: Connection, vh: VHost, name: str, if_unused: bool) -> None:
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
            await self._delete_binding_records(
                vh, lambda src, kind, dest: src == ex.name or (kind == "e" and dest == ex.name)
            )
            await self.records.delete_exchange(vh.name, ex.name)
            await self.records.bindings_changed()  # the other proxies forget it (sync_bindings)
        finally:
            vh.dropping.discard(("e", ex.name))

    # ------------------------------------------------------------------ bindings
    def _link(
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
            if b is not None:
                await self.records.put_binding(vh.name, b)
                await self.records.bindings_changed()

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
            b = src.bindings.get(f"{kind}{len(dest.name)}:{dest.name}{len(rk)}:{rk}{args_b64(args)}")
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
        if q.remote:  # used here from now on: its timers run here too, as for an adopted queue
            q.remote = False
            self._activate(q)
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
            if name in vh.queues or await self._load_queue(vh, name, 50, 10) is not None:
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
                if await self._adopt_queue(vh, name, raw, 50, 10) is None:
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
            self._activate(q)
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
        self.lifetimes.touch(q)
        return q

    async def delete_queue(
        self, conn: Connection, vh: VHost, name: str, if_unused: bool, if_empty: bool
    ) -> int:
        topic = store_name(vh.name, name)
        await self.authorize(conn, Action.ADMIN, Resource("topic", topic), 50, 40, f"queue '{name}'")
        async with self.lock:
            if name not in vh.queues and await self._load_queue(vh, name, 50, 40) is None:
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
            _stop_timers(q)
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
                await self._drop_queue(q)

        if not q.deleted and not self.closed:
            self.spawn(run())


def _served_transient(dest: Exchange | Queue) -> bool:
    """A non-durable or exclusive queue that this proxy serves (not `remote`)."""
    return isinstance(dest, Queue) and not dest.remote and (dest.exclusive or not dest.durable)


def _unlink_here(b: Binding) -> None:
    """Unlink a binding in this proxy only (another proxy removed it and its record)."""
    b.source.unbind(b.key)
    if isinstance(b.dest, Queue):
        b.dest.bindings.pop(binding_name(b.source.name, b.key), None)


def _stop_timers(q: Queue) -> None:
    if q.expiry_timer is not None:
        q.expiry_timer.cancel()
    if q.sweeper is not None:
        q.sweeper.cancel()


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
