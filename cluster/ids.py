"""Ids that stay valid across proxies in CLUSTER mode, whichever store node a message is on:

- receipt handles are `<node name>@<node's handle>`;
- commit log offsets carry the node's 14-bit tag (crc32 of its name) in bits 48-61
  (`tag << 48 | offset`), so transaction ids and 4.x send-back find their node;
- queue ids are global: `local * nodes + ordinal`, where `ordinal` is the node's rank by name
  among the `nodes` seen: interleaved, so a queue keeps its global id when a topic's queue count
  per node (its "stride") changes (logic queues, docs/store.md);
- a replica of a replica group registers with the name server under its group's name with a
  broker id >= 1 derived from its own name (`replica_broker_id`); the primary registers as 0.

`IdMap` translates between a node's local ids and these global ones, over the nodes a `NodeDirectory`
lists (`membership.Membership` is one; it is handed in, this module does not import it)."""

from __future__ import annotations

import zlib
from typing import Protocol

from store import AppendResult, InvalidReceiptHandle, Message, TopicNotFound

from .chains import Chain
from .nodes import NodeClient, NodeUnavailable

CLO_SHIFT = 48
CLO_MASK = (1 << CLO_SHIFT) - 1
TAG_BITS = 14
HANDLE_SEP = "@"


def node_tag(name: str) -> int:
    """A node's commit log offset tag: stable across proxies, derived from its name alone."""
    return zlib.crc32(name.encode()) & ((1 << TAG_BITS) - 1)


def replica_broker_id(name: str) -> int:
    """The broker id (>= 1) a replica named `name` registers with: stable across restarts and
    role changes, known without asking the other members (crc32 of the name, 31 bits)."""
    return 1 + zlib.crc32(name.encode()) % ((1 << 31) - 1)


class NodeDirectory(Protocol):
    """What `IdMap` reads of the store nodes: every node seen by name, by tag, and its rank."""

    nodes: dict[str, NodeClient]
    by_tag: dict[int, NodeClient]
    ordinal: dict[str, int]

    def readable(self) -> list[NodeClient]: ...

    def node_count(self) -> int: ...


class ChainLookup(Protocol):
    """The logic queue tables (chain_table.ChainTable): a chained topic's queue ids are logical."""

    chains: dict[str, Chain]


class IdMap:
    """Local <-> global ids over the nodes of `members`, with each topic's stride cached. A topic
    with a logic queue table (`chains`) has logical queue ids and offsets instead (chains.py)."""

    def __init__(self, members: NodeDirectory, chains: ChainLookup | None = None) -> None:
        self.members = members
        self._table = chains
        self._stride: dict[str, int] = {}  # topic -> queues per node

    def _logical(self, node: NodeClient, m: Message) -> bool:
        """Give `m` its logical queue id and offset if its topic is chained (in place)."""
        table = self._table
        c = table.chains.get(m.topic) if table is not None and table.chains else None
        at = None if c is None else c.where(node.name, m.queue_id)
        if at is None:
            return False
        m.queue_id = at[0]
        if m.queue_offset >= 0:
            m.queue_offset = at[1].logical(m.queue_offset)
        return True

    # ------------------------------------------------------------------ strides
    def remember(self, topic: str, queues_per_node: int) -> None:
        self._stride[topic] = queues_per_node

    def forget(self, topic: str) -> None:
        self._stride.pop(topic, None)

    async def stride(self, topic: str, node: NodeClient | None = None) -> int | None:
        """Queues per node of `topic` (None when no live node has it)."""
        q = self._stride.get(topic)
        if q is not None:
            return q
        for n in [node] if node is not None else self.members.readable():
            try:
                t = await n.value("get_topic", {"name": topic})
            except NodeUnavailable:
                continue
            if t is not None:
                self._stride[topic] = t["queues"]
                return t["queues"]
        return None

    # ------------------------------------------------------------------ commit log offsets
    @staticmethod
    def global_clo(node: NodeClient, clo: int) -> int:
        return (node.tag << CLO_SHIFT) | clo if clo >= 0 else clo

    def node_of_clo(self, clo: int) -> tuple[NodeClient, int]:
        node = self.members.by_tag.get(clo >> CLO_SHIFT)
        if node is None:
            raise KeyError(f"no store node has commit log offset {clo}")
        return node, clo & CLO_MASK

    # ------------------------------------------------------------------ messages and results
    def globalize(self, node: NodeClient, m: Message) -> Message:
        """`m`, read from `node`, with global commit log offset and queue id (in place)."""
        m.commitlog_offset = self.global_clo(node, m.commitlog_offset)
        if m.queue_id >= 0 and not self._logical(node, m):
            m.queue_id = self.global_queue(node, m.queue_id)
        return m

    def globalize_all(self, node: NodeClient, msgs: list[Message]) -> list[Message]:
        """`globalize` of each of `msgs` (in place), the node's shift and ordinal looked up once."""
        shift = node.tag << CLO_SHIFT
        count, ordinal = self.members.node_count(), None
        chained = self._table is not None and bool(self._table.chains)
        for m in msgs:
            if m.commitlog_offset >= 0:
                m.commitlog_offset |= shift
            if m.queue_id >= 0:
                if chained and self._logical(node, m):
                    continue
                if ordinal is None:
                    ordinal = self.members.ordinal[node.name]
                m.queue_id = m.queue_id * count + ordinal
        return msgs

    def global_queue(self, node: NodeClient, local: int) -> int:
        return local * self.members.node_count() + self.members.ordinal[node.name]

    def result(self, node: NodeClient, r: AppendResult | None) -> AppendResult | None:
        """An append result of `node` with global queue id and commit log offset."""
        if r is None:
            return None
        c = self._table.chains.get(r.topic) if self._table is not None and self._table.chains else None
        at = None if c is None or r.queue_id < 0 else c.where(node.name, r.queue_id)
        if at is not None:
            qid, qoff = at[0], at[1].logical(r.queue_offset)
            return r._replace(
                queue_id=qid, queue_offset=qoff, commitlog_offset=self.global_clo(node, r.commitlog_offset)
            )
        qid = self.global_queue(node, r.queue_id) if r.queue_id >= 0 else r.queue_id
        return r._replace(queue_id=qid, commitlog_offset=self.global_clo(node, r.commitlog_offset))

    def results(self, node: NodeClient, raw: list[list | None]) -> list[AppendResult | None]:
        """The append results of `node` as its reply lists them (`store_wire.result_json`), with
        global queue ids and commit log offsets: one tuple each, the node's shift looked up once."""
        shift = node.tag << CLO_SHIFT
        count, ordinal = self.members.node_count(), None
        out: list[AppendResult | None] = []
        chains = self._table.chains if self._table is not None else None
        for v in raw:
            if v is None:
                out.append(None)
                continue
            mid, topic, qid, qoff, clo, size, ts = v
            c = chains.get(topic) if chains else None
            at = None if c is None or qid < 0 else c.where(node.name, qid)
            if at is not None:
                out.append(
                    AppendResult(
                        mid, topic, at[0], at[1].logical(qoff), clo | shift if clo >= 0 else clo, size, ts
                    )
                )
                continue
            if qid >= 0:
                if ordinal is None:
                    ordinal = self.members.ordinal[node.name]
                qid = qid * count + ordinal
            out.append(AppendResult(mid, topic, qid, qoff, clo | shift if clo >= 0 else clo, size, ts))
        return out

    # ------------------------------------------------------------------ queues and handles
    async def locate(self, topic: str, queue_id: int) -> tuple[NodeClient, int]:
        """(node, local queue id) of a global queue id; NodeUnavailable when its node is down (a
        group without a primary still serves reads from its replicas)."""
        q = await self.stride(topic)
        if q is None:
            raise TopicNotFound(topic)
        local, ordinal = divmod(queue_id, self.members.node_count())
        for name, o in self.members.ordinal.items():
            if o == ordinal:
                node = self.members.nodes[name]
                if not node.readable:
                    raise NodeUnavailable(
                        f"queue {queue_id} of {topic} is on store node {name}, which is down"
                    )
                return node, local
        raise ValueError(f"topic {topic} has no queue {queue_id}")

    @staticmethod
    def handle(node: NodeClient, local: str) -> str:
        return f"{node.name}{HANDLE_SEP}{local}"

    def node_of_handle(self, handle: str) -> tuple[NodeClient, str]:
        """(node, the node's own handle); InvalidReceiptHandle or NodeUnavailable."""
        name, sep, local = handle.partition(HANDLE_SEP)
        node = self.members.nodes.get(name) if sep else None
        if node is None:
            raise InvalidReceiptHandle(f"malformed receipt handle {handle!r}")
        if not node.alive:
            raise NodeUnavailable(f"store node {name} of this receipt handle is down")
        return node, local
