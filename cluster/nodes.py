"""One store node as a proxy sees it: a remoting connection with request/reply by store
operation (`NodeClient.call`), and the ordered coalescing of concurrent sends to one node and topic into
batches (`AppendBatcher`).

A "node" is a replica group when the name server lists replicas beside its primary (broker ids
>= 1): reads (`store_wire.READS`) then fall back to a replica, first listed first, while the
primary cannot be reached or none is registered ("reads while degraded", docs/cluster.md).

Each connection to a primary starts with HELLO (store_wire.py): `info` is the node's protocol
version and features, and `call` refuses an operation the node does not offer (NodeTooOld) instead
of sending it; a node that answers under another name than the one listed is not used. With the
cluster secret (`auth`) every connection to a node authenticates first (docs/security.md)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ssl
from collections.abc import Callable
from typing import Any

from remoting import RemotingCommand, ResponseCode, parse_host_port
from remoting.client import UNIX_PREFIX, RemotingClient, RemotingClientError
from remoting.cluster_auth import ClusterAuth
from store import Message, NotReplicated, StoreError

from . import store_wire as w


class NodeUnavailable(StoreError):
    """A store node could not be reached (connection refused, closed or timed out)."""


class NodeTooOld(StoreError):
    """The store node's protocol version does not offer this operation (upgrade it)."""


class NodeClient:
    """One store node: `call(op, args, body)` over a remoting connection."""

    def __init__(
        self,
        name: str,
        addr: str,
        tag: int,
        on_txn_check: Callable[[NodeClient, Message], None],
        *,
        auth: ClusterAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.name = name
        self.addr = addr  # the primary's address; "" while the group has none registered
        self.replica_addrs: list[str] = []  # its replicas', by broker id
        self.tag = tag  # the node's commit log offset tag (ids.node_tag)
        self.listed = False  # the name server lists it (lease alive)
        self.conn: RemotingClient | None = None
        self.connect_timeout_s = 2.0  # of a replica connection, opened on the first read it serves
        self._replicas: dict[str, RemotingClient] = {}  # open replica connections by address
        self._on_txn_check = on_txn_check
        self.auth = auth
        self.tls = tls  # a client context: the node is spoken to over TLS
        self._connecting: asyncio.Lock = asyncio.Lock()
        self.info: w.NodeInfo = w.BASE  # what the node said at HELLO on its last connection
        # the node's WATCHED (topic), and a connection's end: set by the store client (watches.py)
        self.on_watched: Callable[[NodeClient, str], None] | None = None
        self.on_lost: Callable[[NodeClient, RemotingClient], None] | None = None
        self._lost_watch: asyncio.Task | None = None

    def supports(self, feature: str) -> bool:
        """Whether the node (as of its last connection) offers `feature` (store_wire.FEATURES)."""
        return self.info.supports(feature)

    @property
    def alive(self) -> bool:
        """Listed with a connected primary: takes writes and reads."""
        return self.listed and bool(self.addr) and self.conn is not None and not self.conn.closed.is_set()

    @property
    def readable(self) -> bool:
        """Alive, or listed with replicas to read from."""
        return self.alive or (self.listed and bool(self.replica_addrs))

    async def connect(self, timeout: float) -> None:
        async with self._connecting:
            if self.conn is not None and not self.conn.closed.is_set():
                return
            host, port = (
                (self.addr, 0) if self.addr.startswith(UNIX_PREFIX) else parse_host_port(self.addr, 10911)
            )
            conn = await RemotingClient.connect(
                host, port, self._on_request, timeout=timeout, auth=self.auth, ssl=self.tls
            )
            try:
                r = await conn.invoke(w.HELLO, w.hello_fields(), timeout=timeout)
                info = w.parse_hello(r.code, r.remark, r.body)
                if info.name is not None and self.name not in (info.name, info.group):
                    raise OSError(f"{self.addr} is store node {info.name}, not {self.name}")
            except BaseException:
                await conn.close()
                raise
            self.info, self.conn = info, conn
            if self.on_lost is not None:
                self._lost_watch = asyncio.get_running_loop().create_task(self._when_lost(conn))

    async def _when_lost(self, conn: RemotingClient) -> None:
        await conn.closed.wait()
        if self.on_lost is not None:
            self.on_lost(self, conn)

    async def set_replicas(self, addrs: list[str]) -> None:
        """The replicas the name server lists now; connections to the others are closed."""
        self.replica_addrs = list(addrs)
        for addr in [a for a in self._replicas if a not in addrs]:
            with contextlib.suppress(Exception):
                await self._replicas.pop(addr).close()

    async def _replica(self, addr: str) -> RemotingClient:
        """The open connection to replica `addr` (opened now if need be)."""
        async with self._connecting:
            conn = self._replicas.get(addr)
            if conn is None or conn.closed.is_set():
                host, port = parse_host_port(addr, 10911)
                conn = await RemotingClient.connect(
                    host, port, timeout=self.connect_timeout_s, auth=self.auth, ssl=self.tls
                )
                self._replicas[addr] = conn
            return conn

    def _on_request(self, cmd: RemotingCommand) -> None:
        if cmd.code == w.TXN_CHECK:
            for m in w.decode_messages(cmd.body):
                self._on_txn_check(self, m)
        elif cmd.code == w.WATCHED and self.on_watched is not None:
            self.on_watched(self, cmd.ext_fields.get("topic", ""))

    async def close(self) -> None:
        """Close the primary's connection (the replicas' stay: `close_all`)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close_all(self) -> None:
        await self.close()
        await self.set_replicas([])

    async def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        body: bytes = b"",
        *,
        timeout: float = 10.0,
        sent: Callable[[int], None] | None = None,
    ) -> RemotingCommand:
        """The SUCCESS reply of `op`; raises the store exception a failure stands for, or
        NodeUnavailable. `sent(opaque)` is called once the request is on its way. A read falls
        back to a replica when the primary cannot be reached."""
        conn = self.conn
        try:
            if conn is None or conn.closed.is_set() or not self.addr:
                raise NodeUnavailable(f"store node {self.name} is not connected")
            if op not in self.info.features:
                raise NodeTooOld(f"store node {self.name} (protocol version {self.info.version}) has no {op}")
            cmd = conn.command(w.OPS[op], {"a": w.dumps(args)} if args else None, body)
            if sent is not None:
                sent(cmd.opaque)
            try:
                r = await conn.invoke(cmd, timeout=timeout)
            except (RemotingClientError, OSError, TimeoutError) as e:
                raise NodeUnavailable(f"store node {self.name} ({self.addr}): {e or type(e).__name__}") from e
        except NodeUnavailable:
            if op not in w.READS or not self.replica_addrs:
                raise
            r = await self._call_replica(op, args, body, timeout)
        return self._success(r)

    async def _call_replica(
        self, op: str, args: dict[str, Any] | None, body: bytes, timeout: float
    ) -> RemotingCommand:
        """The reply of the first replica that answers `op` (NodeUnavailable when none does)."""
        errors = []
        for addr in list(self.replica_addrs):
            try:
                conn = await self._replica(addr)
                return await conn.invoke(
                    w.OPS[op], {"a": w.dumps(args)} if args else None, body, timeout=timeout
                )
            except (RemotingClientError, OSError, TimeoutError) as e:
                errors.append(f"{addr}: {e or type(e).__name__}")
        tried = "; ".join(errors)
        raise NodeUnavailable(f"store node {self.name}: no primary and no replica answered ({tried})")

    def _success(self, r: RemotingCommand) -> RemotingCommand:
        if r.code != ResponseCode.SUCCESS:
            if "error" in r.ext_fields:
                kind, remark = r.ext_fields["error"], r.remark or ""
                old = kind == "StoreError" and not self.supports("not_replicated")
                if old and w.OLD_NOT_REPLICATED in remark:
                    kind = "NotReplicated"  # a version 0 node's words for it: never written again
                raise w.make_error(kind, remark)
            raise StoreError(f"store node {self.name}: {r.remark} (code {r.code})")
        return r

    async def value(self, op: str, args: dict[str, Any] | None = None, body: bytes = b"") -> Any:
        return w.reply_value((await self.call(op, args, body)).body)

    def cancel(self, opaque: int) -> None:
        conn = self.conn
        if conn is not None and not conn.closed.is_set():
            conn.oneway(w.CANCEL, {"opaque": opaque})


class AppendBatcher:
    """The sends to one node and topic, in the order they were made: at most `max_inflight` append
    requests are on the wire; the sends that arrive meanwhile wait, then leave together as one
    request (one group commit on the node). Alone, a send leaves at once.

    Order: requests are written in submission order and the node places each request's records
    before it reads the next, so one proxy's sends to a topic keep their order on the node (an AMQP
    queue's FIFO, an MQTT publisher's order). A waiting send is never overtaken by a later one.

    A request holds one topic, so the node refuses all of it or none (a missing topic, a closed
    store); a send naming its queues goes alone (a bad queue id is found mid-placement). A refused
    request is retried send by send so each caller gets its own answer; one the node wrote but its
    replicas did not acknowledge in time (`NotReplicated`) is not sent again."""

    def __init__(self, node: NodeClient, timeout: float, max_inflight: int = 2, max_batch: int = 256) -> None:
        self.node = node
        self.timeout = timeout
        self.max_inflight = max_inflight
        self.max_batch = max_batch
        # (messages, whether they may share a request, the caller's future)
        self.pending: collections.deque[tuple[list[Message], bool, asyncio.Future[list[Any]]]] = (
            collections.deque()
        )
        self.inflight = 0

    def submit(self, msgs: list[Message]) -> asyncio.Future[list[Any]]:
        """The node's JSON results for `msgs` (all of this node and topic), in order."""
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.pending.append((msgs, all(m.queue_id < 0 for m in msgs), fut))
        self._kick()
        return fut

    def _kick(self) -> None:
        pending = self.pending
        while pending and self.inflight < self.max_inflight:
            first = pending.popleft()
            batch = [first]
            n = len(first[0])
            if first[1]:
                while pending and pending[0][1] and n + len(pending[0][0]) <= self.max_batch:
                    n += len(pending[0][0])
                    batch.append(pending.popleft())
            self.inflight += 1
            asyncio.ensure_future(self._send(batch))

    async def _send(self, batch: list[tuple[list[Message], bool, asyncio.Future[list[Any]]]]) -> None:
        try:
            msgs = batch[0][0] if len(batch) == 1 else [m for e in batch for m in e[0]]
            try:
                r = await self.node.call("append", None, w.encode_messages(msgs), timeout=self.timeout)
                results = w.reply_value(r.body)
            except NodeUnavailable as e:
                for _, _, f in batch:
                    if not f.done():
                        f.set_exception(e)
                return
            except Exception as e:  # noqa: BLE001 - refused as a whole: answer each on its own
                if len(batch) == 1 or isinstance(e, NotReplicated):  # (written: never sent again)
                    for _, _, f in batch:
                        if not f.done():
                            f.set_exception(e)
                    return
                for ms, _, f in batch:
                    try:
                        one = await self.node.call(
                            "append", None, w.encode_messages(ms), timeout=self.timeout
                        )
                        if not f.done():
                            f.set_result(w.reply_value(one.body))
                    except Exception as e1:  # noqa: BLE001 - that caller's failure
                        if not f.done():
                            f.set_exception(e1)
                return
            at = 0
            for ms, _, f in batch:
                if not f.done():
                    f.set_result(results[at : at + len(ms)])
                at += len(ms)
        finally:
            self.inflight -= 1
            self._kick()
