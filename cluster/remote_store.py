"""The network `StoreClient` of CLUSTER mode: one proxy's view of every live store node
(docs/cluster.md), behind the same interface as LOCAL mode's in-process store (the RocketMQ
proxy's ClusterMessageService beside its LocalMessageService).

It composes the pieces of this package: `Membership` (which nodes are live), `IdMap` (global
receipt handles, commit log offsets and queue ids), `Sends` (placement and batching) and `Pops`
(pop fan-out and long polls). What is left here: operations on one message (by receipt handle or
commit log offset), topic and group admin applied to every live node, offsets and reads by global
queue id, and key-value data on the first node by name.

Reads (`store_wire.READS`) use every readable node: one whose group has no primary is read from a
replica (nodes.py); writes need the primary and fail with NodeUnavailable without one."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from remoting.cluster_auth import ClusterAuth
from store import (
    ALL,
    AppendResult,
    CompactionStats,
    Filter,
    GroupConfig,
    Message,
    PoppedMessage,
    RetryPolicy,
    TopicConfig,
    TransactionNotFound,
    compaction_key,
)

from . import logic_admin
from . import store_wire as w
from .chain_reads import ChainReads
from .chain_table import ChainTable
from .chains import CHAINS_NS
from .ids import IdMap
from .membership import Membership, StaticNodes
from .nodes import NodeClient, NodeUnavailable
from .pops import Pops
from .sends import Sends
from .tails import Tails
from .watches import Watches

log = logging.getLogger("cluster")


class ClusterStoreClient:
    """StoreClient over the store nodes of `cluster` listed by the name server(s) `namesrv`.
    `await start()` before use, `await close()` after."""

    def __init__(
        self,
        namesrv: str | list[str] | StaticNodes,
        cluster: str = "DefaultCluster",
        *,
        refresh_s: float = 5.0,
        request_timeout_s: float = 10.0,
        connect_timeout_s: float = 2.0,
        namesrv_grace_s: float = 30.0,
        auth: ClusterAuth | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.members = Membership(
            namesrv,
            cluster,
            self._txn_check,
            refresh_s=refresh_s,
            connect_timeout_s=connect_timeout_s,
            namesrv_grace_s=namesrv_grace_s,
            auth=auth,
            tls=tls,
        )
        self.chains = ChainTable(self.members)  # logic queues spanning nodes (chains.py)
        self.members.before_join = self.chains.freeze
        self.members.after_refresh = self._reload_chains
        self.members.joined = self._joined
        self.ids = IdMap(self.members, self.chains)
        self.request_timeout_s = request_timeout_s
        self.sends = Sends(self.members, self.ids, request_timeout_s, self.chains)
        self.pops = Pops(self.members, self.ids, request_timeout_s, self.chains)
        self.tails = Tails(self.members, self.ids, request_timeout_s, self.chains)
        self.watches = Watches(self.members, self.chains)
        self.members.on_watched, self.members.on_lost = self.watches.watched, self.watches.lost
        self.watch = self.watches.watch
        self.chain_reads = ChainReads(self.members, self.ids, request_timeout_s)
        self.tail = self.tails.tail
        self.append = self.sends.append
        self.append_many = self.sends.append_many
        self._checker: Callable[[Message], Awaitable[None]] | None = None

    # ------------------------------------------------------------------ membership
    async def start(self, wait_s: float = 0.0) -> None:
        """First route refresh (retried for up to `wait_s` until a node is live), then refresh
        in the background."""
        await self.members.start(wait_s)
        await self._reload_chains()

    async def _joined(self, node: NodeClient) -> None:
        """A node joined: the automatic mode extends the topics onto it (logic_admin.py)."""
        moved = await logic_admin.auto_extend(
            self, node.name, f"{socket.gethostname()}-{os.getpid()}-{id(self)}"
        )
        if moved:
            log.info("store node %s joined: open queues moved onto it %s", node.name, moved)

    async def _reload_chains(self) -> None:
        try:
            await self.chains.reload()
        except Exception:  # noqa: BLE001 - the tables of the last reload stay in use
            return

    async def refresh(self) -> None:
        await self.members.refresh()

    @property
    def refreshes(self) -> int:
        return self.members.refreshes

    def live(self) -> list[NodeClient]:
        return self.members.live()

    def health(self) -> dict[str, Any]:
        """The cluster as this proxy sees it (Membership.health): `problems` empty when all is well."""
        return self.members.health()

    # ------------------------------------------------------------------ consume
    async def pop(
        self,
        group: str,
        topic: str,
        max_messages: int = 32,
        invisible_time_ms: int = 30_000,
        filter: Filter = ALL,
        wait_ms: int = 0,
    ) -> list[PoppedMessage]:
        return await self.pops.pop(group, topic, max_messages, invisible_time_ms, filter, wait_ms)

    async def ack(self, handle: str) -> None:
        node, local = self.ids.node_of_handle(handle)
        await node.call("ack", {"handle": local})

    async def ack_many(self, handles: Sequence[str]) -> list[Exception | None]:
        """One `ack_many` call per store node the handles name (in parallel); per handle None or
        the error (a node that cannot be reached fails its handles)."""
        out: list[Exception | None] = [None] * len(handles)
        by_node: dict[str, tuple[Any, list[int], list[str]]] = {}
        for i, h in enumerate(handles):
            try:
                node, local = self.ids.node_of_handle(h)
            except Exception as e:  # noqa: BLE001 - a malformed or foreign handle: its own error
                out[i] = e
                continue
            entry = by_node.setdefault(node.name, (node, [], []))
            entry[1].append(i)
            entry[2].append(local)

        async def one(node: Any, at: list[int], local: list[str]) -> None:
            if not node.supports("ack_many"):  # a node older than ack_many: one ack per handle
                acks = await asyncio.gather(
                    *(node.call("ack", {"handle": h}) for h in local), return_exceptions=True
                )
                for i, r in zip(at, acks, strict=True):
                    out[i] = r if isinstance(r, Exception) else None
                return
            try:
                errors = await node.value("ack_many", {"handles": local})
            except Exception as e:  # noqa: BLE001 - every handle of that node failed
                for i in at:
                    out[i] = e
                return
            for i, err in zip(at, errors, strict=True):
                out[i] = None if err is None else w.make_error(*err)  # type: ignore[assignment]

        await asyncio.gather(*(one(*entry) for entry in by_node.values()))
        return out

    async def change_invisible_time(self, handle: str, invisible_time_ms: int) -> str:
        node, local = self.ids.node_of_handle(handle)
        new = await node.value("change_invisible_time", {"handle": local, "invisible_ms": invisible_time_ms})
        return self.ids.handle(node, new)

    async def nack(self, handle: str) -> str:
        node, local = self.ids.node_of_handle(handle)
        return self.ids.handle(node, await node.value("nack", {"handle": local}))

    async def forward_to_dlq(self, handle: str, reason: str = "forwarded") -> AppendResult:
        node, local = self.ids.node_of_handle(handle)
        r = w.result_from_json(await node.value("forward_to_dlq", {"handle": local, "reason": reason}))
        return self.ids.result(node, r)  # type: ignore[return-value]

    async def end_transaction(self, transaction_id: int | str, commit: bool) -> AppendResult | None:
        if isinstance(transaction_id, int):
            node, local = self.ids.node_of_clo(transaction_id)
            r = await node.value("end_transaction", {"tid": local, "commit": commit})
            return self.ids.result(node, w.result_from_json(r))
        for node in self.members.need_live():
            try:
                r = await node.value("end_transaction", {"tid": transaction_id, "commit": commit})
            except TransactionNotFound:
                continue
            return self.ids.result(node, w.result_from_json(r))
        raise TransactionNotFound(transaction_id)

    def set_transaction_checker(self, fn: Callable[[Message], Awaitable[None]] | None) -> None:
        self._checker = fn

    def _txn_check(self, node: NodeClient, msg: Message) -> None:
        fn = self._checker
        if fn is None:
            return

        async def run() -> None:
            await fn(self.ids.globalize(node, msg))

        self.members.spawn(run())

    # ------------------------------------------------------------------ topics and groups
    def _topic(self, d: dict[str, Any]) -> TopicConfig:
        """A node's topic config as the proxy presents it: queues over all nodes."""
        t = w.topic_from_json(d)
        assert t is not None
        self.ids.remember(t.name, t.queues)
        chain = self.chains.get(t.name)
        if chain is not None:  # its logical queues, wherever their segments are
            t.queues = len(chain)
            t.read_queues = 0
            t.epochs = []
            return t
        t.queues *= self.store_count()
        t.read_queues *= self.store_count()
        return t

    async def _all(self, op: str, args: dict[str, Any]) -> list[Any]:
        """`op` on every live node (every readable one for a read); the results of those that
        succeeded (raises when none did)."""
        nodes = self.members.need_readable() if op in w.READS else self.members.need_live()
        res = await asyncio.gather(*(n.value(op, args) for n in nodes), return_exceptions=True)
        ok = [r for r in res if not isinstance(r, BaseException)]
        if not ok:
            err = next(r for r in res if isinstance(r, BaseException))
            raise err
        return ok

    async def get_topic(self, name: str) -> TopicConfig | None:
        for node in self.members.need_readable():
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
        compacted: bool = False,
    ) -> TopicConfig:
        args = {
            "name": name,
            "queues": queues,
            "retention_ms": retention_ms,
            "retention_bytes": retention_bytes,
            "compacted": compacted,
        }
        self.ids.forget(name)
        return self._topic((await self._all("create_topic", args))[0])

    async def resize_topic(self, name: str, queues: int) -> TopicConfig:
        """Logic queues: `queues` per node from now on, on every node (docs/store.md)."""
        if self.chains.get(name) is not None:
            raise ValueError(f"topic {name} has logical queues over store nodes: its count stays")
        self.ids.forget(name)
        return self._topic((await self._all("resize_topic", {"name": name, "queues": queues}))[0])

    async def delete_topic(self, name: str) -> None:
        self.ids.forget(name)
        await self._all("delete_topic", {"name": name})
        if self.chains.chains.pop(name, None) is not None:
            await self._all("kv_delete", {"ns": CHAINS_NS, "key": name})

    async def list_topics(self) -> list[TopicConfig]:
        seen: dict[str, TopicConfig] = {}
        for ts in await self._all("list_topics", {}):
            for t in ts:
                if t["name"] not in seen:
                    seen[t["name"]] = self._topic(t)
        return [seen[n] for n in sorted(seen)]

    async def get_group(self, name: str) -> GroupConfig | None:
        for node in self.members.need_readable():
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
        chain = self.chains.get(topic)
        if chain is not None:
            return await self.chain_reads.min_offset(chain, self._lq(chain, queue_id))
        node, local = await self.ids.locate(topic, queue_id)
        return await node.value("min_offset", {"topic": topic, "queue_id": local})

    async def max_offset(self, topic: str, queue_id: int) -> int:
        chain = self.chains.get(topic)
        if chain is not None:
            return await self.chain_reads.max_offset(chain, self._lq(chain, queue_id))
        node, local = await self.ids.locate(topic, queue_id)
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
        chain = self.chains.get(topic)
        if chain is not None:
            lq = self._lq(chain, queue_id)
            return await self.chain_reads.read(chain, lq, start, end, max_messages, filter)
        node, local = await self.ids.locate(topic, queue_id)
        args = {
            "topic": topic,
            "queue_id": local,
            "start": start,
            "end": end,
            "max": max_messages,
            "tags": w.filter_json(filter),
        }
        r = await node.call("read", args, timeout=self.request_timeout_s)
        out = self.ids.globalize_all(node, w.decode_messages(r.body))
        return out if filter.predicate is None else [m for m in out if filter.predicate(m)]

    async def read_raw(
        self, topic: str, queue_id: int, start: int, end: int, max_records: int, max_bytes: int
    ) -> None:
        """No raw range reads across the network: the read API uses `read`."""
        return None

    async def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        chain = self.chains.get(topic)
        if chain is not None:
            return await self.chain_reads.search_offset(chain, self._lq(chain, queue_id), timestamp_ms)
        node, local = await self.ids.locate(topic, queue_id)
        return await node.value(
            "search_offset", {"topic": topic, "queue_id": local, "timestamp_ms": timestamp_ms}
        )

    async def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        chain = self.chains.get(topic)
        if chain is not None:
            return await self.chain_reads.commit_offset(chain, group, self._lq(chain, queue_id), offset)
        node, local = await self.ids.locate(topic, queue_id)
        await node.call(
            "commit_offset", {"group": group, "topic": topic, "queue_id": local, "offset": offset}
        )

    async def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        chain = self.chains.get(topic)
        if chain is not None:
            return await self.chain_reads.committed_offset(chain, group, self._lq(chain, queue_id))
        node, local = await self.ids.locate(topic, queue_id)
        return await node.value("committed_offset", {"group": group, "topic": topic, "queue_id": local})

    @staticmethod
    def _lq(chain: Any, queue_id: int) -> int:
        if not 0 <= queue_id < len(chain):
            raise ValueError(f"topic {chain.topic} has no queue {queue_id}")
        return queue_id

    async def backlog(self, group: str, topic: str) -> int:
        return sum(await self._all("backlog", {"group": group, "topic": topic}))

    async def inflight_count(self, group: str, topic: str) -> int:
        return sum(await self._all("inflight_count", {"group": group, "topic": topic}))

    async def get_by_id(self, message_id: str) -> list[Message]:
        return await self._messages_of_every_node("get_by_id", {"id": message_id})

    async def get_by_key(self, key: str) -> list[Message]:
        """Every node's records whose keys include `key` (the store's key index on each node)."""
        return await self._messages_of_every_node("get_by_key", {"key": key})

    async def _messages_of_every_node(self, op: str, args: dict[str, Any]) -> list[Message]:
        """The messages `op` answers on every readable node (a node that is down is left out)."""
        out: list[Message] = []
        for node in self.members.need_readable():
            try:
                r = await node.call(op, args)
            except NodeUnavailable:
                continue
            out += self.ids.globalize_all(node, w.decode_messages(r.body))
        return out

    async def latest(self, topic: str, key: str, tombstones: bool = False) -> Message | None:
        """The newest (by store time) of each node's latest record of `key`."""
        best: Message | None = None
        for node in self.members.need_readable():
            try:
                r = await node.call("latest", {"topic": topic, "key": key})
            except NodeUnavailable:
                continue
            for m in w.decode_messages(r.body):
                if best is None or m.store_timestamp >= best.store_timestamp:
                    best = self.ids.globalize(node, m)
        if best is None or (not best.body and not tombstones):
            return None
        return best

    async def latest_items(self, topic: str, tombstones: bool = False) -> list[Message]:
        """Per key, the newest (by store time) of the nodes' latest records."""
        out: dict[str, Message] = {}
        for node in self.members.need_readable():
            try:
                r = await node.call("latest_items", {"topic": topic})
            except NodeUnavailable:
                continue
            for m in w.decode_messages(r.body):
                key = compaction_key(m) or m.message_id
                have = out.get(key)
                if have is None or m.store_timestamp >= have.store_timestamp:
                    out[key] = self.ids.globalize(node, m)
        return [m for _k, m in sorted(out.items()) if tombstones or m.body]

    async def compact(self) -> CompactionStats:
        total = CompactionStats()
        for d in await self._all("compact", {}):
            for f in dataclasses.fields(total):
                setattr(total, f.name, getattr(total, f.name) + d[f.name])
        return total

    async def get_message(self, commitlog_offset: int) -> Message:
        node, local = self.ids.node_of_clo(commitlog_offset)
        if not node.readable:
            raise NodeUnavailable(f"store node {node.name} is down")
        r = await node.call("get_message", {"offset": local})
        return self.ids.globalize(node, w.decode_messages(r.body)[0])

    # ------------------------------------------------------------------ kv (one deterministic node)
    def _kv_node(self) -> NodeClient:
        """The first readable node by name: while its group has no primary, kv reads go to a
        replica and kv writes fail (rather than land on another node)."""
        return self.members.need_readable()[0]

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
        return max(len(self.members.nodes), 1)

    def stats(self) -> dict[str, object]:
        """Counters summed over live nodes (as of the last route refresh)."""
        return {**self.members.stats, "flush_latency_ms": []}

    async def close(self) -> None:
        await self.members.close()
