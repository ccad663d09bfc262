"""The declarations of one proxy kept in step with the other proxies of its store, through the
key-value records (records.py); the declarations themselves (declare, bind, delete) are
registry.py's, which hands itself in as `Declarations`.

At start (`start`): the records of non-durable exchanges and of transient and exclusive queues
that a process which is gone left behind are removed (with their messages and bindings); those of
processes still running (other workers, proxies on this host or, by their leases, on others:
messaging_processor/ownership.py) are kept, their queues known here as `remote` destinations.
The records of other hosts' processes are checked in the background (`reaping`: a lease check
takes three beats).

Adoption: a declaration this proxy has not seen yet is looked up in the records before anything
is created (`load_exchange`, `load_queue`), so a second proxy declaring the same queue adopts it
(its messages and its group's position) instead of starting it again; another proxy's exclusive
queue is 405 RESOURCE_LOCKED. What was adopted stays cached.

Bindings (`sync_bindings`): every binding is recorded, each change of a binding and each deletion
of an exchange or queue writes a new generation, and a proxy re-reads the records when the
generation changed, every `sync_interval_s` and before each exchange.declare and queue.declare
(what clients do first). A publish through any proxy then routes by the bindings made through the
others, a queue another proxy serves (an exclusive one too) included; such a queue is
`Queue.remote` here until a connection here uses it. An exchange or queue deleted through another
proxy (its record gone, or declared again with other flags) is forgotten here: its consumers here
get basic.cancel, its bindings here go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from messaging_processor.ownership import OwnerLeases, alive, foreign

from .codec import AMQPError, ReplyCode
from .queue_store import QueueStore
from .queues import Queue
from .records import Records, binding_name, binding_source, parse_vkey, record_owner, vkey
from .routing import Binding, Exchange, VHost

log = logging.getLogger("adapters.amqp")

SYNC_INTERVAL_S = 0.25  # how often a proxy looks for bindings made through other proxies


class Declarations(Protocol):
    """What the synchronisation uses of this proxy's declarations (registry.py `Registry`)."""

    lock: asyncio.Lock  # declarations, deletions and bindings, one at a time
    closed: bool

    def vhost(self, name: str) -> VHost: ...

    def activate(self, q: Queue) -> None: ...

    def link(
        self, src: Exchange, dest: Exchange | Queue, rk: str, args: dict[str, Any], made_at: int | None = None
    ) -> Binding | None: ...

    async def drop_queue(self, q: Queue) -> None: ...

    async def drop_exchange(self, vh: VHost, ex: Exchange) -> None: ...


class DeclarationSync:
    """Start-up clean-up, adoption of other proxies' declarations and the bindings kept in step."""

    def __init__(
        self,
        decl: Declarations,
        vhosts: dict[str, VHost],
        records: Records,
        queue_store: QueueStore,
        leases: OwnerLeases,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task],
    ) -> None:
        self.decl = decl
        self.vhosts = vhosts
        self.records = records
        self.queue_store = queue_store
        self.leases = leases
        self.spawn = spawn
        self.sync_interval_s = SYNC_INTERVAL_S
        self._generation: tuple[tuple[str, bytes], ...] | None = None  # the others', when last read
        self._sync_task: asyncio.Task | None = None
        self.reaping: asyncio.Task | None = None  # the removal of other hosts' gone processes' records

    async def start(self) -> None:
        """Load the declarations. Remove the records of non-durable exchanges and of transient and
        exclusive queues (with their messages) that a process which is gone left behind; those of
        processes still running (other workers, proxies on this host or, by their leases, on
        others: messaging_processor/ownership.py) are kept, their queues known here as `remote`
        destinations. Then the bindings whose ends are gone. The records of other hosts' processes
        are checked in the background (`reaping`: a lease check takes three beats)."""
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
                self.decl.vhost(vh).exchanges[name] = ex
        for key, value in await rs.queues():
            vh, name = parse_vkey(key)
            q = await rs.queue_of(vh, name, value)
            if q is None:
                continue
            if not q.durable or q.exclusive:
                if self._running(record_owner(value), elsewhere):
                    q.remote = True  # another running process's
                    self.decl.vhost(vh).queues[name] = q
                    continue
                await self.queue_store.drop(q)
                await rs.delete_queue(vh, name)
                removed = True
                continue
            self.decl.vhost(vh).queues[name] = q
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
                self.decl.activate(q)
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
        async with self.decl.lock:
            if self.decl.closed:
                return
            for key, owner in await rs.generation_owners():
                if owner in gone:
                    await rs.delete_generation(key)
            for key, value in await rs.queues():
                if record_owner(value) not in gone:
                    continue
                vh_name, name = parse_vkey(key)
                q = self.decl.vhost(vh_name).queues.get(name)
                if q is None or q.stored != value:
                    q = await rs.queue_of(vh_name, name, value)
                if q is not None and (not q.durable or q.exclusive):
                    await self.decl.drop_queue(q)
            for key, value in await rs.exchanges():
                if record_owner(value) not in gone:
                    continue
                vh_name, name = parse_vkey(key)
                vh = self.decl.vhost(vh_name)
                ex = vh.exchanges.get(name)
                if ex is not None and ex.stored == value and not ex.durable:
                    await self.decl.drop_exchange(vh, ex)

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
        self.decl.link(src, dest, rk, args)
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

    async def load_exchange(self, vh: VHost, name: str) -> Exchange | None:
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

    async def load_queue(self, vh: VHost, name: str, cls: int, mid: int) -> Queue | None:
        """A queue another proxy declared, adopted with its stored bindings (None if there is
        none). Another connection's exclusive queue is RESOURCE_LOCKED and not adopted."""
        if ("q", name) in vh.dropping:
            return None
        raw = await self.records.queue_value(vh.name, name)
        if raw is None:
            return None
        return await self.adopt_queue(vh, name, raw, cls, mid)

    async def adopt_queue(self, vh: VHost, name: str, raw: bytes, cls: int, mid: int) -> Queue | None:
        q = await self.records.queue_of(vh.name, name, raw)
        if q is None:
            return None
        if q.exclusive:
            raise err(ReplyCode.RESOURCE_LOCKED, locked(name, vh.name), cls, mid)
        if name in vh.queues or ("q", name) in vh.dropping:  # adopted or deleted meanwhile
            return vh.queues.get(name)
        vh.queues[name] = q
        for key, value in await self.records.bindings(vh.name):
            src = binding_source(value, name)
            if src is not None:
                if src not in vh.exchanges:
                    await self.load_exchange(vh, src)
                self._link_record(key, value)
        self.decl.activate(q)
        return q

    # ------------------------------------------------------------------ bindings of other proxies
    async def _poll_bindings(self) -> None:
        while not self.decl.closed:
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
        async with self.decl.lock:
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
                        elif not served_transient(b.dest):
                            unlink_here(b)
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
        stop_timers(q)
        for c in list(q.consumers):
            c.channel.server_cancel(c)
        for b in list(q.bindings.values()):
            unlink_here(b)
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
            unlink_here(b)

    async def _link_shared(self, key: str, value: bytes) -> None:
        """Link one binding another proxy recorded, finding or loading both of its ends."""
        try:
            vh_name, _ = parse_vkey(key)
            source, kind, dest_name, rk, args = Records.parse_binding(value)
        except (ValueError, KeyError, TypeError):
            return
        vh = self.decl.vhost(vh_name)
        src = vh.exchanges.get(source) or await self.load_exchange(vh, source)
        if src is None and vh.topic_exchange is not None:
            src = await vh.topic_exchange(source)  # a store topic's exchange (bridge.py)
        dest: Exchange | Queue | None
        if kind == "q":
            dest = vh.queues.get(dest_name) or await self._load_remote_queue(vh, dest_name)
        else:
            dest = vh.exchanges.get(dest_name) or await self.load_exchange(vh, dest_name)
        if src is not None and dest is not None and not src.deleted and not dest.deleted:
            self.decl.link(src, dest, rk, args, Records.binding_made_at(value))

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
                    unlink_here(b)
        return gone

    async def look_up_queue(self, vh: VHost, name: str) -> Queue | None:
        """A queue a publish through the default exchange names that this proxy does not know: one
        declared through another proxy (`remote` here), or None."""
        return vh.queues.get(name) or await self._load_remote_queue(vh, name)

    async def look_up_exchange(self, vh: VHost, name: str) -> Exchange | None:
        """An exchange a publish names that this proxy does not know: one declared through another
        proxy (with every binding made up to now), or a store topic's (bridge.py); None if none."""
        await self.sync_bindings()
        ex = vh.exchanges.get(name) or await self.load_exchange(vh, name)
        if ex is None and vh.topic_exchange is not None:
            ex = await vh.topic_exchange(name)
        return ex

    async def forget(self) -> None:
        """Delete this proxy's generation of the bindings (at stop: nobody need poll it)."""
        await self.records.delete_generation()

    def close(self) -> None:
        if self._sync_task is not None:
            self._sync_task.cancel()
        if self.reaping is not None:
            self.reaping.cancel()  # (it waits out other hosts' leases first: not worth waiting for)


def err(code: int, text: str, class_id: int = 0, method_id: int = 0) -> AMQPError:
    return AMQPError(code, text, class_id=class_id, method_id=method_id)


def locked(name: str, vhost: str) -> str:
    return (
        f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'. It could be "
        "originally declared on another connection or the exclusive property value does not match "
        "that of the original declaration."
    )


def served_transient(dest: Exchange | Queue) -> bool:
    """A non-durable or exclusive queue that this proxy serves (not `remote`)."""
    return isinstance(dest, Queue) and not dest.remote and (dest.exclusive or not dest.durable)


def unlink_here(b: Binding) -> None:
    """Unlink a binding in this proxy only (another proxy removed it and its record)."""
    b.source.unbind(b.key)
    if isinstance(b.dest, Queue):
        b.dest.bindings.pop(binding_name(b.source.name, b.key), None)


def stop_timers(q: Queue) -> None:
    if q.expiry_timer is not None:
        q.expiry_timer.cancel()
    if q.sweeper is not None:
        q.sweeper.cancel()
