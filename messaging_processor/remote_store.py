"""The network `StoreClient` of CLUSTER mode: one proxy's view of every live store node.

`ClusterStoreClient` finds store nodes through the name server (GET_BROKER_CLUSTER_INFO, every
`refresh_s`), keeps one remoting connection per node (`NodeClient`) and spreads the StoreClient
operations over them:

- sends go round robin over live nodes; a message with a FIFO message group goes to the node its
  group hashes to (the next live one if that is down); a send that fails on a node that went away
  is retried on the next one;
- pop reads all live nodes: a non-blocking pass in rotation, then a concurrent long poll where the
  first non-empty answer wins and the others are cancelled (late messages are released at once);
- receipt handles carry their node's name (`name@handle`), commit log offsets its 14-bit tag
  (`tag << 48 | offset`), so any proxy can ack, end transactions and find messages;
- queue ids are global: `ordinal * queues + local`, where `ordinal` is the node's rank by name
  among the nodes this proxy has seen and `queues` the topic's queue count on each node (topic
  and group admin is applied to every live node, so they agree);
- kv operations go to the first live node by name;
- a node whose lease expired (no longer listed) or whose connection broke is skipped until the
  name server lists it again and it reconnects; a (re)joining node gets the topics and groups
  the others have.

Filter predicates (Python callables) cannot travel: nodes filter by tags and the proxy applies the
predicate, acking popped messages it does not match (what the store does for non-matching ones)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from adapters.remoting.client import RemotingClient, RemotingClientError
from adapters.remoting.codec import RemotingCommand, ResponseCode, parse_host_port
from store import (
    ALL,
    AppendResult,
    Filter,
    GroupConfig,
    InvalidReceiptHandle,
    Message,
    PoppedMessage,
    RetryPolicy,
    StoreError,
    TopicConfig,
    TopicNotFound,
    TransactionNotFound,
)

from . import store_wire as w

log = logging.getLogger("messaging_processor.cluster")

CLO_SHIFT = 48
CLO_MASK = (1 << CLO_SHIFT) - 1
TAG_BITS = 14
HANDLE_SEP = "@"
LONG_POLL_SLICE_S = 5.0  # a long poll is re-issued this often, so (re)joined nodes are polled too


def node_tag(name: str) -> int:
    """A node's commit log offset tag: stable across proxies, derived from its name alone."""
    return zlib.crc32(name.encode()) & ((1 << TAG_BITS) - 1)


class NodeUnavailable(StoreError):
    """A store node could not be reached (connection refused, closed or timed out)."""


class NodeClient:
    """One store node: `call(op, args, body)` over a remoting connection."""

    def __init__(self, name: str, addr: str, on_txn_check: Callable[[NodeClient, Message], None]) -> None:
        self.name = name
        self.addr = addr
        self.tag = node_tag(name)
        self.listed = False  # the name server lists it (lease alive)
        self.conn: RemotingClient | None = None
        self._on_txn_check = on_txn_check
        self._connecting: asyncio.Lock = asyncio.Lock()

    @property
    def alive(self) -> bool:
        return self.listed and self.conn is not None and not self.conn.closed.is_set()

    async def connect(self, timeout: float) -> None:
        async with self._connecting:
            if self.conn is not None and not self.conn.closed.is_set():
                return
            host, port = parse_host_port(self.addr, 10911)
            self.conn = await RemotingClient.connect(host, port, self._on_request, timeout=timeout)

    def _on_request(self, cmd: RemotingCommand) -> None:
        if cmd.code == w.TXN_CHECK:
            for m in w.decode_messages(cmd.body):
                self._on_txn_check(self, m)

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

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
        NodeUnavailable. `sent(opaque)` is called once the request is on its way."""
        conn = self.conn
        if conn is None or conn.closed.is_set():
            raise NodeUnavailable(f"store node {self.name} is not connected")
        cmd = conn.command(w.OPS[op], {"a": w.dumps(args)} if args else None, body)
        if sent is not None:
            sent(cmd.opaque)
        try:
            r = await conn.invoke(cmd, timeout=timeout)
        except (RemotingClientError, OSError, TimeoutError) as e:
            raise NodeUnavailable(f"store node {self.name} ({self.addr}): {e or type(e).__name__}") from e
        if r.code != ResponseCode.SUCCESS:
            if "error" in r.ext_fields:
                raise w.make_error(r.ext_fields["error"], r.remark or "")
            raise StoreError(f"store node {self.name}: {r.remark} (code {r.code})")
        return r

    async def value(self, op: str, args: dict[str, Any] | None = None, body: bytes = b"") -> Any:
        return w.reply_value((await self.call(op, args, body)).body)

    def cancel(self, opaque: int) -> None:
        conn = self.conn
        if conn is not None and not conn.closed.is_set():
            conn.oneway(w.CANCEL, {"opaque": opaque})


class AppendBatcher:
    """Concurrent single-message appends for one node and topic, coalesced: at most `max_inflight`
    append requests are on the wire; messages that arrive meanwhile leave together as one batch
    (one request, one group commit on the node). Alone, a message leaves at once.

    A batch holds one topic, so the node refuses all of it or none (a missing topic, a closed
    store); a refused batch is retried message by message so each caller gets its own answer."""

    def __init__(self, node: NodeClient, timeout: float, max_inflight: int = 2, max_batch: int = 256) -> None:
        self.node = node
        self.timeout = timeout
        self.max_inflight = max_inflight
        self.max_batch = max_batch
        self.pending: list[tuple[Message, asyncio.Future[list[Any]]]] = []
        self.inflight = 0

    def submit(self, msg: Message) -> asyncio.Future[list[Any]]:
        fut: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.pending.append((msg, fut))
        self._kick()
        return fut

    def _kick(self) -> None:
        while self.pending and self.inflight < self.max_inflight:
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch :]
            self.inflight += 1
            asyncio.ensure_future(self._send(batch))

    async def _send(self, batch: list[tuple[Message, asyncio.Future[list[Any]]]]) -> None:
        try:
            try:
                r = await self.node.call(
                    "append", None, w.encode_messages([m for m, _ in batch]), timeout=self.timeout
                )
                results = w.reply_value(r.body)
            except NodeUnavailable as e:
                for _, f in batch:
                    if not f.done():
                        f.set_exception(e)
                return
            except Exception as e:  # noqa: BLE001 - refused as a whole: answer each on its own
                if len(batch) == 1:
                    if not batch[0][1].done():
                        batch[0][1].set_exception(e)
                    return
                for m, f in batch:
                    try:
                        one = await self.node.call(
                            "append", None, w.encode_messages([m]), timeout=self.timeout
                        )
                        if not f.done():
                            f.set_result(w.reply_value(one.body)[0])
                    except Exception as e1:  # noqa: BLE001 - that caller's failure
                        if not f.done():
                            f.set_exception(e1)
                return
            for (_, f), v in zip(batch, results, strict=True):
                if not f.done():
                    f.set_result(v)
        finally:
            self.inflight -= 1
            self._kick()


class ClusterStoreClient:
    """StoreClient over the store nodes of `cluster` listed by the name server(s) `namesrv`
    (see the module docstring). `await start()` before use, `await close()` after."""

    def __init__(
        self,
        namesrv: str | list[str],
        cluster: str = "DefaultCluster",
        *,
        refresh_s: float = 5.0,
        request_timeout_s: float = 10.0,
        connect_timeout_s: float = 2.0,
        namesrv_grace_s: float = 30.0,
    ) -> None:
        from namesrv.client import NameServerClient

        self.ns = NameServerClient(namesrv)
        self.cluster = cluster
        self.refresh_s = refresh_s
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.namesrv_grace_s = namesrv_grace_s  # how long an empty cluster listing is not believed
        self._absent_since: float | None = None
        self.refreshes = 0  # route refreshes so far
        self.nodes: dict[str, NodeClient] = {}  # every node seen, by name
        self._ordinal: dict[str, int] = {}
        self._by_tag: dict[int, NodeClient] = {}
        self._stride: dict[str, int] = {}  # topic -> queues per node
        self._batchers: dict[tuple[str, str], AppendBatcher] = {}  # (node, topic) -> send batcher
        self._rr = itertools.count()
        self._pop_rr = itertools.count()
        self._checker: Callable[[Message], Awaitable[None]] | None = None
        self._stats: dict[str, object] = {}
        self._refresher: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._refresh_lock = asyncio.Lock()

    # ------------------------------------------------------------------ membership
    async def start(self, wait_s: float = 0.0) -> None:
        """First route refresh (retried for up to `wait_s` until a node is live), then refresh
        every `refresh_s` in the background."""
        deadline = time.monotonic() + wait_s
        while True:
            await self.refresh()
            if self.live() or time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(0.2, self.refresh_s))
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop(), name="store routes")

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - a bad answer must not end the refreshes
                log.exception("store route refresh failed")

    async def refresh(self) -> None:
        """Ask the name server which store nodes are alive; connect new or returning ones and drop
        those it no longer lists."""
        async with self._refresh_lock:
            self.refreshes += 1
            try:
                info = await self.ns.cluster_info()
            except Exception as e:  # noqa: BLE001 - keep the current view until it answers
                log.warning("cannot refresh store routes: %s", e)
                return
            clusters = info.get("clusterAddrTable") or {}
            if self.cluster in clusters:
                self._absent_since = None
            elif any(n.alive for n in self.nodes.values()):
                # No store of the cluster listed at all: most likely a restarted name server not
                # refilled yet (soft state). Keep the current stores for one lease period.
                now = time.monotonic()
                if self._absent_since is None:
                    self._absent_since = now
                    log.warning(
                        "the name server lists no store of %s: keeping the current ones", self.cluster
                    )
                if now - self._absent_since < self.namesrv_grace_s:
                    return
            names = set(clusters.get(self.cluster, ()))
            listed: dict[str, str] = {}
            for name, bd in (info.get("brokerAddrTable") or {}).items():
                addrs = {int(k): v for k, v in (bd.get("brokerAddrs") or {}).items()}
                if name in names and 0 in addrs:
                    listed[name] = addrs[0]
            for name, addr in sorted(listed.items()):
                node = self.nodes.get(name)
                if node is None:
                    node = self._add(name, addr)
                elif node.addr != addr:
                    await node.close()
                    node.addr = addr
                was_alive = node.alive
                node.listed = True
                if not node.alive:
                    try:
                        await node.connect(self.connect_timeout_s)
                    except (OSError, TimeoutError) as e:
                        log.warning("store node %s at %s is listed but unreachable: %s", name, addr, e)
                        continue
                if not was_alive:
                    log.info("store node %s (%s) is live", name, addr)
                    self._spawn(self._sync_node(node))
            for name, node in self.nodes.items():
                if name not in listed and node.listed:
                    node.listed = False
                    log.warning(
                        "store node %s (%s) dropped: no longer listed by the name server", name, node.addr
                    )
                    await node.close()
            self._spawn(self._refresh_stats())

    def _add(self, name: str, addr: str) -> NodeClient:
        node = NodeClient(name, addr, self._txn_check)
        other = self._by_tag.get(node.tag)
        if other is not None:
            log.error("store nodes %s and %s share offset tag %d: rename one", name, other.name, node.tag)
        self.nodes[name] = node
        self._by_tag[node.tag] = node
        self._ordinal = {n: i for i, n in enumerate(sorted(self.nodes))}
        return node

    def live(self) -> list[NodeClient]:
        return [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].alive]

    def _need_live(self) -> list[NodeClient]:
        nodes = self.live()
        if not nodes:
            raise NodeUnavailable("no store node is available")
        return nodes

    def _spawn(self, coro: Awaitable[Any]) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _sync_node(self, node: NodeClient) -> None:
        """Give a (re)joining node the topics and groups the other live nodes have."""
        others = [n for n in self.live() if n is not node]
        if not others:
            return
        try:
            mine = {t["name"] for t in await node.value("list_topics")}
            theirs = await others[0].value("list_topics")
            for t in theirs:
                if t["name"] not in mine and not t["name"].startswith("%"):
                    await node.value(
                        "create_topic",
                        {k: t[k] for k in ("name", "queues", "retention_ms", "retention_bytes")},
                    )
            my_groups = {g["name"] for g in await node.value("list_groups")}
            for g in await others[0].value("list_groups"):
                if g["name"] not in my_groups and not g["name"].startswith("%"):
                    await node.value("create_group", g)
        except Exception as e:  # noqa: BLE001 - best effort; admin calls fix the rest
            log.warning("syncing topics and groups to store node %s failed: %s", node.name, e)

    async def _refresh_stats(self) -> None:
        total: dict[str, float] = {}
        for node in self.live():
            try:
                for k, v in (await node.value("stats")).items():
                    if isinstance(v, int | float):
                        total[k] = total.get(k, 0) + v
            except Exception:  # noqa: BLE001, S112 - stats are best effort
                continue
        self._stats = {**total, "store_nodes_live": len(self.live()), "store_nodes_known": len(self.nodes)}

    # ------------------------------------------------------------------ id mapping
    async def stride(self, topic: str, node: NodeClient | None = None) -> int | None:
        """Queues per node of `topic` (None when no live node has it)."""
        q = self._stride.get(topic)
        if q is not None:
            return q
        for n in [node] if node is not None else self.live():
            try:
                t = await n.value("get_topic", {"name": topic})
            except NodeUnavailable:
                continue
            if t is not None:
                self._stride[topic] = t["queues"]
                return t["queues"]
        return None

    def _global_clo(self, node: NodeClient, clo: int) -> int:
        return (node.tag << CLO_SHIFT) | clo if clo >= 0 else clo

    def _node_of_clo(self, clo: int) -> tuple[NodeClient, int]:
        node = self._by_tag.get(clo >> CLO_SHIFT)
        if node is None:
            raise KeyError(f"no store node has commit log offset {clo}")
        return node, clo & CLO_MASK

    async def _globalize(self, node: NodeClient, m: Message) -> Message:
        m.commitlog_offset = self._global_clo(node, m.commitlog_offset)
        if m.queue_id >= 0:
            q = await self.stride(m.topic, node)
            if q:
                m.queue_id += self._ordinal[node.name] * q
        return m

    async def _result(self, node: NodeClient, r: AppendResult | None) -> AppendResult | None:
        if r is None:
            return None
        q = await self.stride(r.topic, node) if r.queue_id >= 0 else None
        qid = r.queue_id + self._ordinal[node.name] * q if q else r.queue_id
        return r._replace(queue_id=qid, commitlog_offset=self._global_clo(node, r.commitlog_offset))

    async def _locate(self, topic: str, queue_id: int) -> tuple[NodeClient, int]:
        q = await self.stride(topic)
        if q is None:
            raise TopicNotFound(topic)
        ordinal, local = divmod(queue_id, q)
        for name, o in self._ordinal.items():
            if o == ordinal:
                node = self.nodes[name]
                if not node.alive:
                    raise NodeUnavailable(
                        f"queue {queue_id} of {topic} is on store node {name}, which is down"
                    )
                return node, local
        raise ValueError(f"topic {topic} has no queue {queue_id}")

    def _handle_node(self, handle: str) -> tuple[NodeClient, str]:
        name, sep, local = handle.partition(HANDLE_SEP)
        node = self.nodes.get(name) if sep else None
        if node is None:
            raise InvalidReceiptHandle(f"malformed receipt handle {handle!r}")
        if not node.alive:
            raise NodeUnavailable(f"store node {name} of this receipt handle is down")
        return node, local

    # ------------------------------------------------------------------ send
    def _target(self, msg: Message, stride: int | None, exclude: set[str]) -> tuple[NodeClient, int]:
        """(node, local queue id or -1) for one message."""
        live = [n for n in self._need_live() if n.name not in exclude]
        if not live:
            raise NodeUnavailable("no store node is available")
        if msg.queue_id >= 0 and stride:
            ordinal, local = divmod(msg.queue_id, stride)
            for n in live:
                if self._ordinal[n.name] == ordinal:
                    return n, local
        if msg.message_group:
            names = sorted(self.nodes)
            start = zlib.crc32(msg.message_group.encode()) % len(names)
            for k in range(len(names)):
                n = self.nodes[names[(start + k) % len(names)]]
                if n in live:
                    return n, -1
        return live[next(self._rr) % len(live)], -1

    async def _append_on(self, msgs: list[Message], exclude: set[str] | None = None) -> list[AppendResult]:
        """Append `msgs` (all bound for one node) with failover to other nodes when it is down."""
        exclude = set() if exclude is None else exclude
        stride = await self.stride(msgs[0].topic) if any(m.queue_id >= 0 for m in msgs) else None
        while True:
            node, local = self._target(msgs[0], stride, exclude)
            wire = [m if m.queue_id == local else dataclasses.replace(m, queue_id=local) for m in msgs]
            try:
                if len(wire) == 1 and local < 0:
                    raw = [await self._batcher(node, wire[0].topic).submit(wire[0])]
                else:
                    r = await node.call(
                        "append", None, w.encode_messages(wire), timeout=self.request_timeout_s
                    )
                    raw = w.reply_value(r.body)
            except NodeUnavailable as e:
                log.warning("send failed on %s, trying another store node: %s", node.name, e)
                exclude.add(node.name)
                continue
            return [await self._result(node, w.result_from_json(v)) for v in raw]  # type: ignore[misc]

    def _batcher(self, node: NodeClient, topic: str) -> AppendBatcher:
        b = self._batchers.get((node.name, topic))
        if b is None:
            b = self._batchers[(node.name, topic)] = AppendBatcher(node, self.request_timeout_s)
        return b

    async def append(self, msg: Message) -> AppendResult:
        return (await self._append_on([msg]))[0]

    async def append_many(self, msgs: list[Message]) -> list[AppendResult]:
        if not any(m.queue_id >= 0 or m.message_group for m in msgs):
            return await self._append_on(msgs)
        # Messages bound for particular queues or groups: one sub-batch per target node.
        stride = await self.stride(msgs[0].topic)
        parts: dict[str, list[int]] = {}
        for i, m in enumerate(msgs):
            node, _ = self._target(m, stride, set())
            parts.setdefault(node.name, []).append(i)
        out: list[AppendResult | None] = [None] * len(msgs)
        for idxs in parts.values():
            for i, r in zip(idxs, await self._append_on([msgs[i] for i in idxs]), strict=True):
                out[i] = r
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------------ consume
    async def _pop_node(
        self,
        node: NodeClient,
        args: dict[str, Any],
        wait_ms: int,
        opaques: dict[str, int] | None = None,
    ) -> list[PoppedMessage]:
        a = {**args, "wait_ms": wait_ms}
        sent = None if opaques is None else (lambda o: opaques.__setitem__(node.name, o))
        r = await node.call("pop", a, timeout=wait_ms / 1000 + self.request_timeout_s, sent=sent)
        out = w.decode_popped(r.body)
        for p in out:
            await self._globalize(node, p.message)
            p.receipt_handle = f"{node.name}{HANDLE_SEP}{p.receipt_handle}"
        return out

    async def _release(self, popped: list[PoppedMessage]) -> None:
        for p in popped:
            with contextlib.suppress(Exception):
                await self.change_invisible_time(p.receipt_handle, 0)

    async def _pop_once(self, args: dict[str, Any], max_n: int, wait_ms: int) -> list[PoppedMessage]:
        live = self._need_live()
        start = next(self._pop_rr)
        out: list[PoppedMessage] = []
        errors: list[BaseException] = []
        for k in range(len(live)):
            node = live[(start + k) % len(live)]
            try:
                out += await self._pop_node(node, {**args, "max": max_n - len(out)}, 0)
            except (NodeUnavailable, TopicNotFound) as e:  # others may have it: a (re)joining node
                errors.append(e)
                continue
            if len(out) >= max_n:
                break
        if len(errors) == len(live):
            raise errors[0]
        if out or wait_ms <= 0:
            return out
        return await self._long_poll(args, max_n, wait_ms)

    async def _long_poll(self, args: dict[str, Any], max_n: int, wait_ms: int) -> list[PoppedMessage]:
        """Long poll every live node at once; the first non-empty answer wins."""
        deadline = time.monotonic() + wait_ms / 1000
        a = {**args, "max": max_n}
        while (left := deadline - time.monotonic()) > 0:
            slice_ms = int(min(left, LONG_POLL_SLICE_S) * 1000)
            live = self._need_live()
            opaques: dict[str, int] = {}
            tasks = {asyncio.ensure_future(self._pop_node(n, a, slice_ms, opaques)): n for n in live}
            winner: list[PoppedMessage] = []
            pending = set(tasks)
            failed: list[BaseException] = []
            try:
                while pending and not winner:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        if t.exception() is not None:
                            failed.append(t.exception())  # type: ignore[arg-type]
                        elif t.result():
                            if winner:
                                self._spawn(self._release(t.result()))
                            else:
                                winner = t.result()
                if not winner and len(failed) == len(tasks):
                    raise failed[0]  # every node refused: do not spin until the deadline
            finally:
                for t in pending:
                    node = tasks[t]
                    if node.name in opaques:
                        node.cancel(opaques[node.name])
                    self._spawn(self._settle(t))
            if winner:
                return winner
        return []

    async def _settle(self, t: asyncio.Future) -> None:
        """A cancelled long poll: release whatever it still hands out."""
        try:
            got = await t
        except Exception:  # noqa: BLE001 - node gone: nothing to release
            return
        if got:
            await self._release(got)

    async def pop(
        self,
        group: str,
        topic: str,
        max_messages: int = 32,
        invisible_time_ms: int = 30_000,
        filter: Filter = ALL,
        wait_ms: int = 0,
    ) -> list[PoppedMessage]:
        args = {
            "group": group,
            "topic": topic,
            "invisible_ms": invisible_time_ms,
            "tags": w.filter_json(filter),
        }
        if filter.predicate is None:
            return await self._pop_once(args, max_messages, wait_ms)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            left = int(max(deadline - time.monotonic(), 0) * 1000)
            got = await self._pop_once(args, max_messages, left)
            keep = [p for p in got if filter.predicate(p.message)]
            for p in got:
                if p not in keep:
                    await self.ack(p.receipt_handle)  # what the store does with non-matching ones
            if keep or left <= 0:
                return keep

    async def ack(self, handle: str) -> None:
        node, local = self._handle_node(handle)
        await node.call("ack", {"handle": local})

    async def change_invisible_time(self, handle: str, invisible_time_ms: int) -> str:
        node, local = self._handle_node(handle)
        new = await node.value("change_invisible_time", {"handle": local, "invisible_ms": invisible_time_ms})
        return f"{node.name}{HANDLE_SEP}{new}"

    async def nack(self, handle: str) -> str:
        node, local = self._handle_node(handle)
        return f"{node.name}{HANDLE_SEP}{await node.value('nack', {'handle': local})}"

    async def forward_to_dlq(self, handle: str, reason: str = "forwarded") -> AppendResult:
        node, local = self._handle_node(handle)
        r = w.result_from_json(await node.value("forward_to_dlq", {"handle": local, "reason": reason}))
        return await self._result(node, r)  # type: ignore[return-value]

    async def end_transaction(self, transaction_id: int | str, commit: bool) -> AppendResult | None:
        if isinstance(transaction_id, int):
            node, local = self._node_of_clo(transaction_id)
            r = await node.value("end_transaction", {"tid": local, "commit": commit})
            return await self._result(node, w.result_from_json(r))
        for node in self._need_live():
            try:
                r = await node.value("end_transaction", {"tid": transaction_id, "commit": commit})
            except TransactionNotFound:
                continue
            return await self._result(node, w.result_from_json(r))
        raise TransactionNotFound(transaction_id)

    def set_transaction_checker(self, fn: Callable[[Message], Awaitable[None]] | None) -> None:
        self._checker = fn

    def _txn_check(self, node: NodeClient, msg: Message) -> None:
        fn = self._checker
        if fn is None:
            return

        async def run() -> None:
            await fn(await self._globalize(node, msg))

        self._spawn(run())

    # ------------------------------------------------------------------ topics and groups
    def _topic(self, d: dict[str, Any]) -> TopicConfig:
        t = w.topic_from_json(d)
        assert t is not None
        self._stride[t.name] = t.queues
        t.queues *= max(len(self.nodes), 1)
        return t

    async def _all(self, op: str, args: dict[str, Any]) -> list[Any]:
        """`op` on every live node; the results of those that succeeded (raises when none did)."""
        nodes = self._need_live()
        res = await asyncio.gather(*(n.value(op, args) for n in nodes), return_exceptions=True)
        ok = [r for r in res if not isinstance(r, BaseException)]
        if not ok:
            err = next(r for r in res if isinstance(r, BaseException))
            raise err
        return ok

    async def get_topic(self, name: str) -> TopicConfig | None:
        for node in self._need_live():
            try:
                t = await node.value("get_topic", {"name": name})
            except NodeUnavailable:
                continue
            if t is not None:
                return self._topic(t)
        return None

    async def create_topic(
        self,
        name: str,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
    ) -> TopicConfig:
        args = {
            "name": name,
            "queues": queues,
            "retention_ms": retention_ms,
            "retention_bytes": retention_bytes,
        }
        self._stride.pop(name, None)
        return self._topic((await self._all("create_topic", args))[0])

    async def delete_topic(self, name: str) -> None:
        self._stride.pop(name, None)
        await self._all("delete_topic", {"name": name})

    async def list_topics(self) -> list[TopicConfig]:
        seen: dict[str, TopicConfig] = {}
        for ts in await self._all("list_topics", {}):
            for t in ts:
                if t["name"] not in seen:
                    seen[t["name"]] = self._topic(t)
        return [seen[n] for n in sorted(seen)]

    async def get_group(self, name: str) -> GroupConfig | None:
        for node in self._need_live():
            try:
                g = await node.value("get_group", {"name": name})
            except NodeUnavailable:
                continue
            if g is not None:
                return w.group_from_json(g)
        return None

    async def create_group(
        self, name: str, max_attempts: int = 16, retry: RetryPolicy | None = None
    ) -> GroupConfig:
        args = {
            "name": name,
            "max_attempts": max_attempts,
            "retry": None if retry is None else dataclasses.asdict(retry),
        }
        g = w.group_from_json((await self._all("create_group", args))[0])
        assert g is not None
        return g

    async def delete_group(self, name: str) -> None:
        await self._all("delete_group", {"name": name})

    async def list_groups(self) -> list[GroupConfig]:
        seen: dict[str, GroupConfig] = {}
        for gs in await self._all("list_groups", {}):
            for g in gs:
                seen.setdefault(g["name"], w.group_from_json(g))  # type: ignore[arg-type]
        return [seen[n] for n in sorted(seen)]

    async def subscriptions(self) -> list[tuple[str, str]]:
        pairs: set[tuple[str, str]] = set()
        for subs in await self._all("subscriptions", {}):
            pairs.update((g, t) for g, t in subs)
        return sorted(pairs)

    # ------------------------------------------------------------------ offsets
    async def min_offset(self, topic: str, queue_id: int) -> int:
        node, local = await self._locate(topic, queue_id)
        return await node.value("min_offset", {"topic": topic, "queue_id": local})

    async def max_offset(self, topic: str, queue_id: int) -> int:
        node, local = await self._locate(topic, queue_id)
        return await node.value("max_offset", {"topic": topic, "queue_id": local})

    async def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int | None = None,
        max_messages: int = 32,
        filter: Filter = ALL,
    ) -> list[Message]:
        node, local = await self._locate(topic, queue_id)
        args = {
            "topic": topic,
            "queue_id": local,
            "start": start,
            "end": end,
            "max": max_messages,
            "tags": w.filter_json(filter),
        }
        r = await node.call("read", args, timeout=self.request_timeout_s)
        out = [await self._globalize(node, m) for m in w.decode_messages(r.body)]
        return out if filter.predicate is None else [m for m in out if filter.predicate(m)]

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        node, local = await self._locate(topic, queue_id)
        return await node.value(
            "search_offset", {"topic": topic, "queue_id": local, "timestamp_ms": timestamp_ms}
        )

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        node, local = await self._locate(topic, queue_id)
        await node.call(
            "commit_offset", {"group": group, "topic": topic, "queue_id": local, "offset": offset}
        )

    async def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        node, local = await self._locate(topic, queue_id)
        return await node.value("committed_offset", {"group": group, "topic": topic, "queue_id": local})

    async def backlog(self, group: str, topic: str) -> int:
        return sum(await self._all("backlog", {"group": group, "topic": topic}))

    async def inflight_count(self, group: str, topic: str) -> int:
        return sum(await self._all("inflight_count", {"group": group, "topic": topic}))

    async def get_by_id(self, message_id: str) -> list[Message]:
        out: list[Message] = []
        for node in self._need_live():
            try:
                r = await node.call("get_by_id", {"id": message_id})
            except NodeUnavailable:
                continue
            out += [await self._globalize(node, m) for m in w.decode_messages(r.body)]
        return out

    async def get_message(self, commitlog_offset: int) -> Message:
        node, local = self._node_of_clo(commitlog_offset)
        if not node.alive:
            raise NodeUnavailable(f"store node {node.name} is down")
        r = await node.call("get_message", {"offset": local})
        return await self._globalize(node, w.decode_messages(r.body)[0])

    # ------------------------------------------------------------------ kv (one deterministic node)
    def _kv_node(self) -> NodeClient:
        return self._need_live()[0]

    async def kv_put(self, ns: str, key: str, value: bytes) -> None:
        await self._kv_node().call("kv_put", {"ns": ns, "key": key}, value)

    async def kv_put_many(self, ns: str, items: dict[str, bytes | None]) -> None:
        enc = {k: (None if v is None else w.b64(v)) for k, v in items.items()}
        await self._kv_node().call("kv_put_many", {"ns": ns, "items": enc})

    async def kv_put_if_absent(self, ns: str, key: str, value: bytes) -> bytes | None:
        v = await self._kv_node().value("kv_put_if_absent", {"ns": ns, "key": key}, value)
        return None if v is None else w.unb64(v)

    async def kv_get(self, ns: str, key: str) -> bytes | None:
        v = await self._kv_node().value("kv_get", {"ns": ns, "key": key})
        return None if v is None else w.unb64(v)

    async def kv_delete(self, ns: str, key: str) -> bool:
        return bool(await self._kv_node().value("kv_delete", {"ns": ns, "key": key}))

    async def kv_scan(self, ns: str, prefix: str = "") -> list[tuple[str, bytes]]:
        return [
            (k, w.unb64(v)) for k, v in await self._kv_node().value("kv_scan", {"ns": ns, "prefix": prefix})
        ]

    # ------------------------------------------------------------------ misc
    def store_count(self) -> int:
        """Nodes seen: a topic has `queues` on each (create_topic's count is per node, as
        RocketMQ's `updateTopic -c` creates the count on every broker of the cluster)."""
        return max(len(self.nodes), 1)

    def stats(self) -> dict[str, object]:
        """Counters summed over live nodes (as of the last route refresh)."""
        return {**self._stats, "flush_latency_ms": []}

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        for t in list(self._tasks):
            t.cancel()
        for node in self.nodes.values():
            await node.close()
        await self.ns.close()
