"""Which worker holds each session that must be unique across the workers of `gateway start
--workers N` (MQTT client ids), kept by the supervisor (`ClaimsBroker`) and asked by each worker
(`ClaimsClient`) over a Unix socket in the supervisor's private directory.

A worker claims a key (``mqtt:<client id>``) when a client connects. The broker makes it the owner
and, when another worker owned it, first asks that one to evict it (close the connection with the
protocol's "taken over" reason and finish detaching its session), so the new owner reads the
session as the old one left it. A worker releases a key once its connection ended and its session
is detached (and no newer connection of it came meanwhile): the broker forgets the key unless
another worker owns it by then, so it keeps one entry per connected client id, not one per id
ever seen. A worker that is gone owns nothing. Workers also report `ready` on
this channel: the supervisor logs ``gateway ready`` once all of them are.

The wire is one JSON object per line: ``{"claim": key, "id": n}`` is answered ``{"id": n}``;
``{"evict": key, "id": n}`` (broker to worker) is answered ``{"evicted": n}``; ``{"release": key}``
and ``{"ready": index}`` are not answered. One worker's lines are handled in the order sent, so a
release sent before a new claim of the same key never undoes that claim.
Written by hand: a few lines of asyncio streams; no library adds anything here."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable

import orjson

from runtime.tasks import cancel_and_wait

log = logging.getLogger("gateway.workers")

EVICT_TIMEOUT_S = 10.0  # an owner that does not evict in time is passed over (its connection is left)
CLAIM_TIMEOUT_S = EVICT_TIMEOUT_S + 5.0


class _Peer:
    """One worker's connection to the broker."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.index: int | None = None
        self.evictions: dict[int, asyncio.Future[None]] = {}
        self.closed = False

    def send(self, obj: dict) -> None:
        if not self.closed:
            self.writer.write(orjson.dumps(obj) + b"\n")


class ClaimsBroker:
    """The supervisor's side: `await start(path)`, `ready` (worker indexes that reported ready),
    `await close()`."""

    def __init__(self, on_ready: Callable[[int], None] | None = None) -> None:
        self.owners: dict[str, _Peer] = {}
        self.peers: set[_Peer] = set()
        self.on_ready = on_ready
        self.takeovers = 0  # evictions asked of another worker
        self._server: asyncio.Server | None = None
        self._ids = itertools.count(1)
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # per key: lock, claims using it

    async def start(self, path: str) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _Peer(writer)
        self.peers.add(peer)
        tasks: set[asyncio.Task] = set()
        try:
            while line := await reader.readline():
                msg = orjson.loads(line)
                if "claim" in msg:
                    t = asyncio.ensure_future(self._claim(peer, str(msg["claim"]), msg["id"]))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                elif "release" in msg:
                    key = str(msg["release"])
                    if self.owners.get(key) is peer:  # (not when another worker took it over since)
                        del self.owners[key]
                elif "evicted" in msg:
                    fut = peer.evictions.pop(msg["evicted"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(None)
                elif "ready" in msg:
                    peer.index = int(msg["ready"])
                    if self.on_ready is not None:
                        self.on_ready(peer.index)
        except (ConnectionError, ValueError, KeyError) as e:
            log.warning("worker %s: claims channel broken: %s", peer.index, e)
        finally:
            peer.closed = True
            self.peers.discard(peer)
            for key in [k for k, p in self.owners.items() if p is peer]:
                del self.owners[key]
            for fut in peer.evictions.values():
                if not fut.done():
                    fut.set_result(None)  # a worker that is gone holds nothing any more
            for t in tasks:
                t.cancel()
            writer.close()

    async def _claim(self, peer: _Peer, key: str, rid: int) -> None:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:  # claims of one key one after the other: each evicts the one before
                prev = self.owners.get(key)
                self.owners[key] = peer
                if prev is not None and prev is not peer and not prev.closed:
                    await self._evict(prev, key)
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
        peer.send({"id": rid})

    async def _evict(self, owner: _Peer, key: str) -> None:
        eid = next(self._ids)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        owner.evictions[eid] = fut
        owner.send({"evict": key, "id": eid})
        self.takeovers += 1
        try:
            await asyncio.wait_for(fut, EVICT_TIMEOUT_S)
        except TimeoutError:
            log.warning("worker %s did not evict %s within %.0f s", owner.index, key, EVICT_TIMEOUT_S)
        finally:
            owner.evictions.pop(eid, None)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for p in list(self.peers):
            p.closed = True
            p.writer.close()
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)


Evictor = Callable[[str], Awaitable[None]]


class ClaimsClient:
    """A worker's side: `await connect(path)`, `evictors[namespace] = async fn(key)`, `await
    claim(namespace, key)`, `ready(index)`, `await close()`."""

    def __init__(self) -> None:
        self.evictors: dict[str, Evictor] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._ids = itertools.count(1)
        self._task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self.lost = asyncio.Event()  # the channel ended: the supervisor is gone

    async def connect(self, path: str) -> None:
        self._reader, self._writer = await asyncio.open_unix_connection(path)
        self._task = asyncio.get_running_loop().create_task(self._read(), name="claims")

    def _send(self, obj: dict) -> None:
        if self._writer is None or self._writer.is_closing():
            raise ConnectionError("the supervisor's claims channel is closed")
        self._writer.write(orjson.dumps(obj) + b"\n")

    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                msg = orjson.loads(line)
                if "evict" in msg:
                    t = asyncio.ensure_future(self._evict(str(msg["evict"]), msg["id"]))
                    self._tasks.add(t)
                    t.add_done_callback(self._tasks.discard)
                else:
                    fut = self._pending.pop(msg["id"], None)
                    if fut is not None and not fut.done():
                        fut.set_result(None)
        except (ConnectionError, ValueError, KeyError) as e:
            log.warning("claims channel to the supervisor broken: %s", e)
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("the supervisor's claims channel closed"))
            self._pending.clear()
            self.lost.set()

    async def _evict(self, key: str, eid: int) -> None:
        ns, _, name = key.partition(":")
        fn = self.evictors.get(ns)
        try:
            if fn is not None:
                await asyncio.wait_for(fn(name), EVICT_TIMEOUT_S)
        except Exception as e:  # noqa: BLE001 - answered all the same: the claimant must go on
            log.warning("evicting %s failed: %r", key, e)
        with contextlib.suppress(ConnectionError):
            self._send({"evicted": eid})

    async def claim(self, ns: str, name: str) -> None:
        """Make this worker the owner of `ns:name`, once any other owner evicted it; ConnectionError
        when the supervisor does not answer."""
        rid = next(self._ids)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._send({"claim": f"{ns}:{name}", "id": rid})
            await asyncio.wait_for(fut, CLAIM_TIMEOUT_S)
        except TimeoutError:
            raise ConnectionError(f"the supervisor did not answer the claim of {ns}:{name}") from None
        finally:
            self._pending.pop(rid, None)

    def release(self, ns: str, name: str) -> None:
        """This worker holds `ns:name` no more (its connection ended, its session is detached)."""
        with contextlib.suppress(ConnectionError):  # (a supervisor that is gone keeps nothing)
            self._send({"release": f"{ns}:{name}"})

    def namespace(self, ns: str) -> NamespaceClaims:
        """Claims of one namespace: `await claim(name)` (what adapters are given)."""
        return NamespaceClaims(self, ns)

    def ready(self, index: int) -> None:
        self._send({"ready": index})

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        if self._writer is not None:
            self._writer.close()
        await cancel_and_wait(self._task)


class NamespaceClaims:
    """`claim(name)` and `release(name)` of one namespace of a ClaimsClient (adapters/mqtt/registry.py
    ClientIdClaims)."""

    def __init__(self, client: ClaimsClient, ns: str) -> None:
        self.client = client
        self.ns = ns

    async def claim(self, name: str) -> None:
        await self.client.claim(self.ns, name)

    def release(self, name: str) -> None:
        self.client.release(self.ns, name)
