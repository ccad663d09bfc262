"""`gateway store`: a store node of CLUSTER mode (docs/cluster.md).

One embedded `store.Store` served over the remoting framing with the internal codes of
messaging_processor/store_wire.py, to stateless proxies (`gateway start --mode cluster`). The node
registers with the name server(s) as a broker (REGISTER_BROKER with its topics and queues) and
renews that lease every `lease_period_s`; its lease expires after `lease_expiry_s`. Half messages
whose transaction is unresolved are handed to a connected proxy (TXN_CHECK), which asks a producer.

SIGTERM/SIGINT: unregister, stop accepting, finish in-flight requests, close (flush) the store,
exit 0."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from adapters.remoting.codec import (
    FLAG_ONEWAY,
    Decoder,
    RemotingCodecError,
    RemotingCommand,
    ResponseCode,
)
from gateway.config import Settings
from messaging_processor import store_wire as w
from messaging_processor.store_client import LocalStoreClient
from store import Filter, Message, RetryPolicy, Store, StoreConfig, StoreError

log = logging.getLogger("gateway.store")
POP = w.OPS["pop"]

Op = Callable[[LocalStoreClient, dict[str, Any], bytes], Awaitable[Any]]


def _filter(a: dict[str, Any]) -> Filter:
    return w.filter_from_json(a.get("tags"))


async def _append(c: LocalStoreClient, a: dict[str, Any], body: bytes) -> Any:
    msgs = w.decode_messages(body)
    for m in msgs:  # the node assigns what a fresh message must not carry
        m.commitlog_offset, m.queue_offset, m.store_timestamp, m.size = -1, -1, 0, 0
    if len(msgs) == 1:
        return [w.result_json(await c.append(msgs[0]))]
    return [w.result_json(r) for r in await c.append_many(msgs)]


async def _kv_put_many(c: LocalStoreClient, a: dict[str, Any], body: bytes) -> Any:
    items = {k: (None if v is None else w.unb64(v)) for k, v in a["items"].items()}
    await c.kv_put_many(a["ns"], items)


async def _kv_get(c: LocalStoreClient, a: dict[str, Any], body: bytes) -> Any:
    v = await c.kv_get(a["ns"], a["key"])
    return None if v is None else w.b64(v)


async def _kv_put_if_absent(c: LocalStoreClient, a: dict[str, Any], body: bytes) -> Any:
    v = await c.kv_put_if_absent(a["ns"], a["key"], body)
    return None if v is None else w.b64(v)


async def _kv_scan(c: LocalStoreClient, a: dict[str, Any], body: bytes) -> Any:
    return [[k, w.b64(v)] for k, v in await c.kv_scan(a["ns"], a["prefix"])]


OPS: dict[str, Op] = {
    "append": _append,
    "pop": lambda c, a, b: c.pop(
        a["group"], a["topic"], a["max"], a["invisible_ms"], _filter(a), a["wait_ms"]
    ),
    "ack": lambda c, a, b: c.ack(a["handle"]),
    "change_invisible_time": lambda c, a, b: c.change_invisible_time(a["handle"], a["invisible_ms"]),
    "nack": lambda c, a, b: c.nack(a["handle"]),
    "forward_to_dlq": lambda c, a, b: _then(c.forward_to_dlq(a["handle"], a["reason"]), w.result_json),
    "end_transaction": lambda c, a, b: _then(c.end_transaction(a["tid"], a["commit"]), w.result_json),
    "get_topic": lambda c, a, b: _then(c.get_topic(a["name"]), w.topic_json),
    "create_topic": lambda c, a, b: _then(
        c.create_topic(a["name"], a["queues"], a["retention_ms"], a["retention_bytes"]), w.topic_json
    ),
    "delete_topic": lambda c, a, b: c.delete_topic(a["name"]),
    "list_topics": lambda c, a, b: _then(c.list_topics(), lambda ts: [w.topic_json(t) for t in ts]),
    "get_group": lambda c, a, b: _then(c.get_group(a["name"]), w.group_json),
    "create_group": lambda c, a, b: _then(
        c.create_group(a["name"], a["max_attempts"], _retry(a)),
        w.group_json,
    ),
    "delete_group": lambda c, a, b: c.delete_group(a["name"]),
    "list_groups": lambda c, a, b: _then(c.list_groups(), lambda gs: [w.group_json(g) for g in gs]),
    "subscriptions": lambda c, a, b: _then(c.subscriptions(), lambda s: [list(x) for x in s]),
    "min_offset": lambda c, a, b: c.min_offset(a["topic"], a["queue_id"]),
    "max_offset": lambda c, a, b: c.max_offset(a["topic"], a["queue_id"]),
    "read": lambda c, a, b: c.read(a["topic"], a["queue_id"], a["start"], a["end"], a["max"], _filter(a)),
    "search_offset": lambda c, a, b: c.search_offset(a["topic"], a["queue_id"], a["timestamp_ms"]),
    "commit_offset": lambda c, a, b: c.commit_offset(a["group"], a["topic"], a["queue_id"], a["offset"]),
    "committed_offset": lambda c, a, b: c.committed_offset(a["group"], a["topic"], a["queue_id"]),
    "backlog": lambda c, a, b: c.backlog(a["group"], a["topic"]),
    "inflight_count": lambda c, a, b: c.inflight_count(a["group"], a["topic"]),
    "get_by_id": lambda c, a, b: c.get_by_id(a["id"]),
    "get_message": lambda c, a, b: _then(c.get_message(a["offset"]), lambda m: [m]),
    "kv_put": lambda c, a, b: c.kv_put(a["ns"], a["key"], b),
    "kv_put_many": _kv_put_many,
    "kv_put_if_absent": _kv_put_if_absent,
    "kv_get": _kv_get,
    "kv_delete": lambda c, a, b: c.kv_delete(a["ns"], a["key"]),
    "kv_scan": _kv_scan,
    "stats": lambda c, a, b: _now({k: v for k, v in c.stats().items() if k != "flush_latency_ms"}),
    "ping": lambda c, a, b: _now(True),
}


def _retry(a: dict[str, Any]) -> Any:
    r = a.get("retry")
    return None if r is None else RetryPolicy(**r)


async def _then(aw: Awaitable[Any], fn: Callable[[Any], Any]) -> Any:
    return fn(await aw)


async def _now(v: Any) -> Any:
    return v


class StoreConnection(asyncio.Protocol):
    """One proxy's connection: every request runs as a task (a long poll must not hold up others)."""

    def __init__(self, node: StoreNode) -> None:
        self.node = node
        self.decoder = Decoder(max_frame_size=node.max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.tasks: dict[int, asyncio.Task] = {}
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.node.connections.append(self)

    def data_received(self, data: bytes) -> None:
        self.decoder.feed(data)
        try:
            for cmd in self.decoder:
                if cmd.is_response:
                    continue
                if cmd.code == w.CANCEL:
                    t = self.tasks.get(int(cmd.ext_fields.get("opaque", "-1")))
                    if t is not None:
                        t.cancel()
                    continue
                t = asyncio.get_running_loop().create_task(self._serve(cmd))
                self.tasks[cmd.opaque] = t
                t.add_done_callback(lambda _t, o=cmd.opaque: self.tasks.pop(o, None))
                if cmd.code == POP:
                    self.node.polls.add(t)
                    t.add_done_callback(self.node.polls.discard)
        except RemotingCodecError as e:
            log.info("store connection: %s; closing it", e)
            if self.transport is not None:
                self.transport.close()

    async def _serve(self, cmd: RemotingCommand) -> None:
        self.node.inflight += 1
        try:
            resp = await self.node.dispatch(cmd)
        except asyncio.CancelledError:
            resp = cmd.response(ResponseCode.SUCCESS, None, {"cancelled": "true"}, w.encode_messages(()))
        finally:
            self.node.inflight -= 1
        if not cmd.is_oneway and not self.closed and self.transport is not None:
            self.transport.write(resp.encode())

    def send(self, cmd: RemotingCommand) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(cmd.encode())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        with contextlib.suppress(ValueError):
            self.node.connections.remove(self)
        for t in list(self.tasks.values()):
            t.cancel()


class StoreNode:
    """A store served to proxies; `await start()`, `address`, `await stop()`."""

    def __init__(self, settings: Settings, store: Store) -> None:
        self.settings = settings
        self.store = store
        self.client = LocalStoreClient(store)
        self.name = settings.store_name or f"store-{socket.gethostname()}-{settings.store_port}"
        self.max_frame_size = max(16 * 1024 * 1024, 2 * settings.max_body_size + 1024 * 1024)
        self.connections: list[StoreConnection] = []
        self.polls: set[asyncio.Task] = set()  # pops under way (long polls end at once on stop)
        self.inflight = 0
        self._server: asyncio.Server | None = None
        self._address = f"{settings.host}:{settings.store_port}"
        self._opaque = itertools.count(1)
        self._rr = 0
        self.namesrv: Any = None
        self._registration: asyncio.Task | None = None
        store.transaction_checker = self._check_transaction

    @property
    def address(self) -> str:
        return self._address

    @property
    def advertised(self) -> str:
        """The address proxies are told (name server registration)."""
        host = self.settings.advertise_host or self.settings.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"{host}:{self._address.rsplit(':', 1)[1]}"

    async def start(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: StoreConnection(self), s.host, s.store_port)
        sock = self._server.sockets[0].getsockname()
        self._address = f"{sock[0]}:{sock[1]}"
        if s.namesrv:
            from namesrv.client import NameServerClient

            self.namesrv = NameServerClient(s.namesrv)
            try:  # registered before it says ready (a name server that is down is retried)
                await asyncio.wait_for(self.register(), 5.0)
                log.info("store node %s registered with the name server %s", self.name, s.namesrv)
            except Exception as e:  # noqa: BLE001 - keep trying in the background
                log.warning("cannot register with the name server %s yet: %s", s.namesrv, e)
            self._registration = loop.create_task(self._keep_registered(), name="store registration")

    async def _keep_registered(self) -> None:
        """Renew the lease every `lease_period_s` (failures are logged and retried)."""
        while True:
            await asyncio.sleep(self.settings.lease_period_s)
            try:
                await self.register()
            except Exception as e:  # noqa: BLE001 - name servers come and go
                log.warning("registration with the name server failed: %s", e)

    async def register(self) -> None:
        """REGISTER_BROKER with every (non-system) topic and its queues; renews the lease."""
        from namesrv.routeinfo import TopicQueues

        topics = {
            t.name: TopicQueues(t.queues, t.queues)
            for t in self.store.topics()
            if not t.name.startswith("%") or t.name.startswith(("%RETRY%", "%DLQ%"))
        }
        await self.namesrv.register_broker(
            cluster=self.settings.cluster_name,
            name=self.name,
            addr=self.advertised,
            topics=topics,
            timeout_ms=int(self.settings.lease_expiry_s * 1000),
        )

    async def dispatch(self, cmd: RemotingCommand) -> RemotingCommand:
        name = w.OP_NAMES.get(cmd.code)
        if name is None:
            return cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code} not supported"
            )
        try:
            args = w.loads(cmd.ext_fields["a"]) if "a" in cmd.ext_fields else {}
            result = await OPS[name](self.client, args, cmd.body)
        except asyncio.CancelledError:
            raise
        except (StoreError, ValueError, KeyError, OSError) as e:
            kind, msg = w.error_fields(e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, msg, {"error": kind})
        except Exception as e:  # noqa: BLE001 - answer, keep serving
            log.exception("store request %s failed", name)
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}", {"error": "StoreError"}
            )
        if name in w.MESSAGE_REPLIES:
            return cmd.response(ResponseCode.SUCCESS, None, None, w.encode_messages(result))
        return cmd.response(ResponseCode.SUCCESS, None, None, w.reply_body(result))

    async def _check_transaction(self, msg: Message) -> None:
        """Hand an unresolved half message to one connected proxy (round robin)."""
        conns = [c for c in self.connections if not c.closed]
        if not conns:
            return
        self._rr += 1
        conn = conns[self._rr % len(conns)]
        conn.send(
            RemotingCommand(w.TXN_CHECK, next(self._opaque), FLAG_ONEWAY, body=w.encode_messages([msg]))
        )

    async def stop(self, grace: float = 5.0) -> None:
        if self._registration is not None:
            self._registration.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._registration
        if self.namesrv is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.namesrv.unregister_broker(
                        cluster=self.settings.cluster_name, name=self.name, addr=self.advertised
                    ),
                    2.0,
                )
            await self.namesrv.close()
        if self._server is not None:
            self._server.close()
        for t in list(self.polls):
            t.cancel()  # answered with no messages
        deadline = time.monotonic() + grace
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
        self.store.transaction_checker = None


async def serve(settings: Settings) -> int:
    """Run a store node until SIGTERM/SIGINT; the exit code (0 clean, 1 cannot start)."""
    from gateway import collector as gc_collector
    from gateway.server import SHUTDOWN_SIGNALS, shutdown_signals_blocked

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in SHUTDOWN_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    config = StoreConfig(
        data_dir=settings.data_dir,
        flush=settings.flush,
        default_queues=settings.default_queues,
        auto_create_topics=False,
        max_message_size=max(settings.max_body_size, StoreConfig().max_message_size),
        transaction_timeout_ms=settings.transaction_timeout_ms,
        transaction_check_interval_ms=settings.transaction_check_interval_ms,
    )
    try:
        with shutdown_signals_blocked():
            store = await Store.open(config)
    except (StoreError, OSError) as e:
        log.error("cannot open the store at %s: %s", settings.data_dir, e)
        return 1
    store.preallocate()  # a fresh store's first append need not wait for its segment
    node = StoreNode(settings, store)
    try:
        await node.start()
    except OSError as e:
        log.error("store node cannot listen on %s: %s", node.address, e.strerror or e)
        await store.close()
        return 1
    log.info("store node %s listening on %s (data %s)", node.name, node.address, settings.data_dir)
    collector = gc_collector.take_over()
    log.info("store node ready")
    await stop.wait()
    log.info("store node stopping")
    t0 = time.monotonic()
    collector.stop()
    await node.stop(settings.drain_timeout_s)
    await store.close()
    log.info("store closed; store node stopped in %.2f s", time.monotonic() - t0)
    for sig in SHUTDOWN_SIGNALS:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(sig)
    return 0


__all__ = ["StoreNode", "serve"]
