"""A store node of CLUSTER mode (docs/cluster.md): one embedded `store.Store` served to stateless
proxies over remoting frames with the internal codes of store_wire.py (the frame server of
remoting/server.py, with `StoreNode.dispatch` as its handler).

The node registers with the name server(s) as a broker (REGISTER_BROKER with its topics and queues)
and renews that lease every `lease_period_s`; its lease expires after `lease_expiry_s`. Half
messages whose transaction is unresolved are handed to a connected proxy (TXN_CHECK), which asks a
producer. The process around it (`gateway store`: signals, opening the store) is
gateway/store_process.py.

With the cluster secret (`StoreNodeConfig.auth`) every connection to the node proves it before
any request is served, and the node's own name server connections prove it too (docs/security.md,
"Closed cluster"); transaction checks go to authenticated connections only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from messaging_processor import LocalStoreClient
from namesrv.client import NameServerClient
from namesrv.routeinfo import TopicQueues
from remoting import RemotingCommand, ResponseCode
from remoting.cluster_auth import ClusterAuth
from remoting.server import FrameConnection, FrameServer, close_tcp, serve_tcp, serve_unix
from runtime.tasks import cancel_and_wait
from store import Message, Store, StoreError

from . import store_wire as w
from .chains import CHAINS_NS
from .fence import NodeFence
from .ids import replica_broker_id
from .replication import CODES as REPLICATION_CODES
from .replication import Primary
from .state_replication import REPL_META, StateFeed

log = logging.getLogger("cluster.store_node")
POP = w.OPS["pop"]
LONG_POLLS = frozenset({POP, w.OPS["tail"]})  # may wait for messages: answered at once on stop
APPEND = w.OPS["append"]
FENCED = frozenset({APPEND, POP, w.OPS["tail"]})  # checked against seals and draining (fence.py)
KV_WRITES = frozenset({"kv_put", "kv_put_many", "kv_delete", "kv_put_if_absent"})
CATALOG_WRITES = frozenset({"create_topic", "resize_topic", "delete_topic", "create_group", "delete_group"})


@dataclass(frozen=True)
class StoreNodeConfig:
    """How a node is named, listens and registers (the `gateway store` settings it uses)."""

    name: str
    host: str = "127.0.0.1"
    port: int = 10911
    advertise_host: str | None = None  # the host proxies are told to connect to
    namesrv: str | None = None  # name server address(es), "host:port;host:port"
    cluster_name: str = "DefaultCluster"
    lease_period_s: float = 30.0
    lease_expiry_s: float = 120.0
    max_body_size: int = 4 * 1024 * 1024
    group: str | None = None  # replica group (cluster/group.py): registered under this name
    # a primary's acknowledgement policy (cluster/replication.py): "sync" acknowledges a send once
    # `min_insync` nodes (itself included) hold it durably, else refuses it; "async" after itself
    replication: str = "async"
    min_insync: int = 1
    replication_timeout_s: float = 3.0
    auth: ClusterAuth | None = field(default=None, repr=False)  # the cluster secret, if any
    # TLS: `tls` a server context for the node's port (TLS only), `cluster_tls` a client context
    # for its own connections (name server, a replica's primary); None: in clear
    tls: ssl.SSLContext | None = field(default=None, repr=False)
    cluster_tls: ssl.SSLContext | None = field(default=None, repr=False)
    # listen on this Unix socket instead of host:port (the store process of `gateway start --workers`)
    unix_path: str | None = None


def default_node_name(port: int) -> str:
    return f"store-{socket.gethostname()}-{port}"


class StoreNode:
    """A store served to proxies; `await start()`, `address`, `await stop()`."""

    def __init__(self, config: StoreNodeConfig, store: Store) -> None:
        self.config = config
        self.store = store
        self.client = LocalStoreClient(store)
        self.name = config.name
        max_frame = max(16 * 1024 * 1024, 2 * config.max_body_size + 1024 * 1024)
        self.frames = FrameServer(self, name="store", log=log, max_frame_size=max_frame, auth=config.auth)
        self.polls: set[asyncio.Task] = set()  # pops and tail reads under way (end at once on stop)
        # per connection, per topic: the end of its WATCH (w.WATCH) on the store
        self._watches: dict[FrameConnection, dict[str, Callable[[], None]]] = {}
        self._server: asyncio.Server | None = None
        self._address = f"{config.host}:{config.port}"
        self._rr = 0
        self.namesrv: NameServerClient | None = None
        self._registration: asyncio.Task | None = None
        # the primary's side of replication: replicas pull this node's log (cluster/replication.py)
        self.replication: Primary | None = None
        # ... and of its consumer progress, key-value data and catalog (cluster/state_replication.py)
        self.state_feed: StateFeed | None = None
        self.accepts_writes = True  # False on a replica: only reads are served
        self.fence = NodeFence(store)  # logic queue seals and draining (cluster/fence.py)
        store.transaction_checker = self._check_transaction

    @property
    def address(self) -> str:
        return self._address

    @property
    def advertised(self) -> str:
        """The address proxies are told (name server registration)."""
        host = self.config.advertise_host or self.config.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        return f"{host}:{self._address.rsplit(':', 1)[1]}"

    async def start(self) -> None:
        c = self.config
        if c.unix_path is not None:
            self._server, self._address = await serve_unix(self.frames, c.unix_path)
        else:
            self._server, self._address = await serve_tcp(self.frames, c.host, c.port, ssl=c.tls)
        if c.namesrv:
            self.namesrv = NameServerClient(c.namesrv, auth=c.auth, tls=c.cluster_tls)
            try:  # registered before it says ready (a name server that is down is retried)
                await asyncio.wait_for(self.register(), 5.0)
                log.info("store node %s registered with the name server %s", self.name, c.namesrv)
            except Exception as e:  # noqa: BLE001 - keep trying in the background
                log.warning("cannot register with the name server %s yet: %s", c.namesrv, e)
            self._registration = asyncio.get_running_loop().create_task(
                self._keep_registered(), name="store registration"
            )

    async def _keep_registered(self) -> None:
        """Renew the lease every `lease_period_s` (failures are logged once and retried within a
        second, and a name server that restarted is registered with at once: `renewal_due`)."""
        assert self.namesrv is not None
        failing = False
        while True:
            await self.namesrv.renewal_due(self.config.lease_period_s)
            try:
                await self.register()
                if failing:
                    log.info("store node %s registered with the name server again", self.name)
                failing = False
            except Exception as e:  # noqa: BLE001 - name servers come and go
                (log.debug if failing else log.warning)("registration with the name server failed: %s", e)
                failing = True

    async def register(self) -> None:
        """REGISTER_BROKER with every (non-system) topic and its queues; renews the lease. A member
        of a replica group registers under the group's name: as its master (broker id 0) while it
        is the primary, else as a replica (`ids.replica_broker_id`, >= 1) that proxies read from
        while the group has no primary (the name server takes topic routes from the master)."""
        if self.namesrv is None:
            return
        # a group member is the primary once it replicates (not at start, before it has a role)
        master = self.accepts_writes and (self.config.group is None or self.replication is not None)
        topics = {
            t.name: TopicQueues(t.queues, t.queues)
            for t in self.store.topics()
            if not t.name.startswith("%") or t.name.startswith(("%RETRY%", "%DLQ%"))
        }
        tables = None
        if master:  # its logic queue tables (cluster/chains.py) are listed in the routes too
            rows = await self.store.kv.scan(CHAINS_NS, "")
            tables = {t: orjson.loads(raw) for t, raw in rows if t in topics} or None
        await self.namesrv.register_broker(
            cluster=self.config.cluster_name,
            name=self.config.group or self.name,
            addr=self.advertised,
            topics=topics,
            broker_id=0 if master else replica_broker_id(self.name),
            timeout_ms=int(self.config.lease_expiry_s * 1000),
            logic_queues=tables,
        )

    # ------------------------------------------------------------------ FrameHandler
    def opened(self, conn: FrameConnection) -> None:
        pass

    def closed(self, conn: FrameConnection) -> None:
        for unwatch in self._watches.pop(conn, {}).values():
            unwatch()

    def _watch(self, conn: FrameConnection, cmd: RemotingCommand) -> None:
        """A proxy's reader caught up (w.WATCH): answer WATCHED once the topic has a record past its
        offsets; at once when it has one already (appended since the reader's empty read) or the
        topic cannot be watched (the reader reads again and meets the error). One per topic and
        connection: a newer one replaces it."""
        topic = cmd.ext_fields.get("topic", "")
        regs = self._watches.setdefault(conn, {})

        def fire() -> None:
            regs.pop(topic, None)
            if not conn.closed:
                conn.oneway(w.WATCHED, {"topic": topic})

        old = regs.pop(topic, None)
        if old is not None:
            old()
        try:
            positions = {int(q): int(off) for q, off in w.loads(cmd.ext_fields.get("a", "{}")).items()}
            store = self.store
            for q in range(
                store.queue_count(topic)
            ):  # (a queue the reader has no offset for: from its start)
                if store.max_offset(topic, q) > positions.get(q, store.min_offset(topic, q)):
                    fire()
                    return
            regs[topic] = self.store.watch(topic, fire)
        except (StoreError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            fire()  # (malformed arguments too: the proxy reads again, nothing is held for it)

    async def dispatch(self, conn: FrameConnection, cmd: RemotingCommand) -> RemotingCommand | None:
        if cmd.code == w.CANCEL:  # a proxy abandons one of its pending requests (a losing poll)
            conn.cancel(int(cmd.ext_fields.get("opaque", "-1")))
            return None
        if cmd.code in REPLICATION_CODES and self.replication is not None:
            return await self.replication.handle(cmd)
        if cmd.code == REPL_META and self.state_feed is not None:
            return await self.state_feed.handle(cmd)
        if cmd.code == w.WATCH:
            self._watch(conn, cmd)
            return None
        if cmd.code == w.HELLO:  # the proxy's version and features; answered with ours
            log.debug("proxy %s speaks store protocol version %s", conn.remote, cmd.ext_fields.get("version"))
            return cmd.response(ResponseCode.SUCCESS, None, None, w.hello_reply(self.name, self.config.group))
        name = w.OP_NAMES.get(cmd.code)
        if name is None:
            return cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code} not supported"
            )
        if not self.accepts_writes and cmd.code not in w.READ_CODES:
            return cmd.response(
                ResponseCode.SYSTEM_ERROR,
                f"store node {self.name} is a replica of group {self.config.group}: it serves reads only",
                {"error": "StoreError"},
            )
        if name in w.NODE_OPS:
            return await self._node_op(cmd, name)
        if cmd.code in FENCED:
            if not self.fence.loaded(self.accepts_writes):
                await self.fence.load(self.accepts_writes)
            refused = self._fenced(cmd)
            if refused is not None:
                return refused
        if cmd.code == APPEND and self._sync_policy():
            refused = self._refuse_unreplicated(cmd)
            if refused is not None:
                return refused
        if cmd.code in LONG_POLLS:
            task = asyncio.current_task()
            assert task is not None
            self.polls.add(task)
            task.add_done_callback(self.polls.discard)
        try:
            args = w.loads(cmd.ext_fields["a"]) if "a" in cmd.ext_fields else {}
            result = await w.SERVE[name](self.client, args, cmd.body)
        except asyncio.CancelledError:  # cancelled by the proxy or at stop: no messages
            return cmd.response(ResponseCode.SUCCESS, None, {"cancelled": "true"}, w.encode_messages(()))
        except (StoreError, ValueError, KeyError, OSError) as e:
            kind, msg = w.error_fields(e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, msg, {"error": kind})
        except Exception as e:  # noqa: BLE001 - answer, keep serving
            log.exception("store request %s failed", name)
            return cmd.response(
                ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}", {"error": "StoreError"}
            )
        if cmd.code == POP and result and self.fence.epochs:
            refused = await self._stale_after_wait(cmd, args, result)
            if refused is not None:
                return refused
        if self.replication is not None and name in w.WRITES:
            self.replication.appended()
            if name == "append" and self._sync_policy():
                end = max(r[4] + r[5] for r in result)  # commit log offset + size of each record
                c = self.config
                if not await self.replication.wait_replicated(end, c.replication_timeout_s):
                    return self._not_replicated(cmd)
        if self.state_feed is not None and (name in KV_WRITES or name in CATALOG_WRITES):
            refused = await self._replicate_state(cmd, name)
            if refused is not None:
                return refused
        if name in w.MESSAGE_REPLIES:
            body = result if type(result) is w.EncodedMessages else w.encode_messages(result)
            return cmd.response(ResponseCode.SUCCESS, None, None, body)
        return cmd.response(ResponseCode.SUCCESS, None, None, w.reply_body(result))

    async def _node_op(self, cmd: RemotingCommand, name: str) -> RemotingCommand:
        """The node's own operations of logic queues and draining (cluster/fence.py)."""
        await self.fence.load(self.accepts_writes)
        args = w.loads(cmd.ext_fields["a"]) if "a" in cmd.ext_fields else {}
        state = {"name": self.name, "group": self.config.group, "role": self._role()}
        try:
            result = await self.fence.serve(name, args, state)
        except StoreError as e:
            kind, msg = w.error_fields(e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, msg, {"error": kind})
        return cmd.response(ResponseCode.SUCCESS, None, None, w.reply_body(result))

    def _fenced(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """An append to a sealed queue (any while draining) and a pop or tail read with an older
        chain table are refused (cluster/fence.py); an append let through is counted until it is
        answered (a seal waits for it)."""
        fence = self.fence
        try:
            if cmd.code == APPEND:
                if fence.active:
                    fence.check_append(cmd.body)
                task = asyncio.current_task()
                assert task is not None
                fence.appending.add(task)
                task.add_done_callback(fence.appending.discard)
            elif fence.epochs and "a" in cmd.ext_fields:
                fence.check_read(w.loads(cmd.ext_fields["a"]))
        except StoreError as e:
            kind, msg = w.error_fields(e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, msg, {"error": kind})
        return None

    async def _stale_after_wait(
        self, cmd: RemotingCommand, args: dict, popped: list
    ) -> RemotingCommand | None:
        """A pop that waited (a long poll) while this node took part in a newer chain table: what
        it took may be a new segment's messages that older ones must come before, so they are made
        visible again and the pop is refused (StaleChain) as if it had come after the switch."""
        try:
            self.fence.check_read(args)
        except StoreError as e:
            for p in popped:
                with contextlib.suppress(StoreError, ValueError, KeyError):
                    await self.client.change_invisible_time(p.receipt_handle, 0)
            kind, msg = w.error_fields(e)
            return cmd.response(ResponseCode.SYSTEM_ERROR, msg, {"error": kind})
        return None

    def _role(self) -> str:
        if self.config.group is None:
            return "standalone"
        return "primary" if self.accepts_writes and self.replication is not None else "replica"

    def _sync_policy(self) -> bool:
        """Whether this primary acknowledges a send only once its SyncStateSet holds it (with
        min-insync 1 too: any member the controller may elect must hold every acknowledged send)."""
        return self.replication is not None and self.config.replication == "sync"

    async def _replicate_state(self, cmd: RemotingCommand, name: str) -> RemotingCommand | None:
        """After a key-value or catalog write: under the sync policy, answer once the replicas the
        sends wait for applied it too (else an error: the write is done here but not yet safe)."""
        feed = self.state_feed
        assert feed is not None
        if name in CATALOG_WRITES:
            feed.catalog_changed()
        if not self._sync_policy():
            return None
        primary, c, seq = self.replication, self.config, feed.kv_seq
        assert primary is not None
        with primary.waiting(lambda: feed.missing(seq, primary.required)):
            if await feed.wait_replicated(seq, primary.required, c.replication_timeout_s, c.min_insync):
                return None
        return self._not_replicated(cmd)

    def _not_replicated(self, cmd: RemotingCommand) -> RemotingCommand:
        """The answer to a write done here that the SyncStateSet did not acknowledge in time."""
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            f"stored on the primary but not replicated to the SyncStateSet within"
            f" {self.config.replication_timeout_s:g} s",
            {"error": "NotReplicated"},
        )

    def _refuse_unreplicated(self, cmd: RemotingCommand) -> RemotingCommand | None:
        """Refuse a send at once (before writing it) when the SyncStateSet has fewer nodes than
        the sync policy needs."""
        assert self.replication is not None
        members = len(self.replication.required) + 1
        if members >= self.config.min_insync:
            return None
        return cmd.response(
            ResponseCode.SYSTEM_ERROR,
            f"{members} of the {self.config.min_insync} nodes the sync policy needs are in sync",
            {"error": "StoreError"},
        )

    async def _check_transaction(self, msg: Message) -> None:
        """Hand an unresolved half message to one connected proxy (round robin)."""
        conns = [c for c in self.frames.connections if not c.closed and c.authenticated]
        if not conns:
            return
        self._rr += 1
        conns[self._rr % len(conns)].oneway(w.TXN_CHECK, None, w.encode_messages([msg]))

    async def stop(self, grace: float = 5.0) -> None:
        """Unregister, stop accepting, answer long polls at once (no messages), let other
        requests finish for up to `grace` s, close every connection."""
        await cancel_and_wait(self._registration)
        if self.namesrv is not None:
            c = self.config
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.namesrv.unregister_broker(
                        cluster=c.cluster_name,
                        name=c.group or self.name,
                        addr=self.advertised,
                        broker_id=0 if self.accepts_writes else replica_broker_id(self.name),
                    ),
                    2.0,
                )
            await self.namesrv.close()
        if self._server is not None:
            self._server.close()
        for t in list(self.polls):
            t.cancel()  # answered with no messages
        deadline = time.monotonic() + grace
        while self.frames.running() and time.monotonic() < deadline:
            await self.frames.drain(max(deadline - time.monotonic(), 0))
        self.frames.abort()
        await close_tcp(self._server, 0.5)
        self.store.transaction_checker = None


__all__ = ["StoreNode", "StoreNodeConfig", "default_node_name"]
