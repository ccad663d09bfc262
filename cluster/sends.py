"""Where a proxy's sends go in CLUSTER mode: round robin over live nodes; a message with a FIFO
message group to the node its group hashes to (the next live one while that node is down); a
message for a given queue to the node owning that queue. A send that fails because its node went
away is retried on another node. The sends to one node and topic leave in the order they were made,
the concurrent ones together (`AppendBatcher`). A send of several topics (or nodes) goes as one
request each, stored or refused as a whole: when one is refused (a topic deleted meanwhile) the
others are stored all the same, and the failure says which (PartlyStored)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import zlib
from typing import Any

from messaging_processor.store_client import PartlyStored
from store import AppendResult, Message
from store.message import PATH_PROPERTY

from . import store_wire as w
from .chain_table import ChainTable
from .chains import Chain
from .ids import IdMap
from .membership import Membership
from .nodes import AppendBatcher, NodeClient, NodeUnavailable

# a part of a send failed thus is sent again with the rest (`_append_on`: to another node, another
# queue), not reported as PartlyStored
_RESENT = (NodeUnavailable, w.QueueSealed, w.NodeDraining)

MAX_RESOLVES = 40  # a send refused by a sealed queue or a draining node: tables reloaded this often
RESOLVE_PAUSE_S = 0.05  # between two reloads that found no newer table (a switch under way)

log = logging.getLogger("cluster")


class Sends:
    """`append` / `append_many` of the cluster's StoreClient."""

    def __init__(self, members: Membership, ids: IdMap, request_timeout_s: float, chains: ChainTable) -> None:
        self.members = members
        self.ids = ids
        self.chains = chains
        self.request_timeout_s = request_timeout_s
        self._batchers: dict[tuple[str, str], AppendBatcher] = {}  # (node, topic) -> its sends, in order
        self._rr = itertools.count()

    def _target(self, msg: Message, stride: int | None, exclude: set[str]) -> tuple[NodeClient, int]:
        """(node, local queue id or -1) for one message."""
        draining = self.chains.draining
        up = [n for n in self.members.need_live() if n.name not in exclude]
        live = [n for n in up if n.name not in draining]
        chain = self.chains.get(msg.topic)
        if chain is not None and up:
            return self._chain_target(chain, msg, live, up)
        if not live:
            raise NodeUnavailable("no store node is available")
        if msg.queue_id >= 0 and stride:
            local, ordinal = divmod(msg.queue_id, self.members.node_count())
            for n in live:
                if self.members.ordinal[n.name] == ordinal:
                    return n, local
        key = msg.message_group or (msg.properties.get(PATH_PROPERTY) if msg.properties else None)
        if key:  # a message group's (an MQTT path's) messages stay on one node: their order
            nodes = self.members.nodes
            names = sorted(nodes)
            start = zlib.crc32(key.encode()) % len(names)
            for k in range(len(names)):
                n = nodes[names[(start + k) % len(names)]]
                if n in live:
                    return n, -1
        return live[next(self._rr) % len(live)], -1

    def _chain_target(
        self, chain: Chain, msg: Message, live: list[NodeClient], up: list[NodeClient]
    ) -> tuple[NodeClient, int]:
        """A chained topic's message goes to the open segment of its logical queue: the one it
        names, its message group's (MQTT path's), else the next in rotation on a live node that
        does not drain. A message group's (a path's, a named queue's) open segment on a node known
        to drain is tried all the same: this table is older than the drain, and the node's refusal
        makes the send reload it, where the next logical queue would break the group's order."""
        key = msg.message_group or (msg.properties.get(PATH_PROPERTY) if msg.properties else None)
        n = len(chain)
        if msg.queue_id >= 0:
            first = msg.queue_id % n
        elif key:
            first = chain.key_queue(key)
        else:
            first = next(self._rr) % n
        if msg.queue_id >= 0 or key:
            head = chain.head(first)
            for node in up:
                if node.name == head.node:
                    return node, head.queue
        ok = {n.name: n for n in live}
        for k in range(n):  # (the next logical queue while that one's node is down: as above)
            head = chain.head((first + k) % n)
            node = ok.get(head.node)
            if node is not None:
                return node, head.queue
        raise NodeUnavailable(f"no live store node holds an open queue of {msg.topic}")

    async def _append_on(self, msgs: list[Message], exclude: set[str] | None = None) -> list[AppendResult]:
        """Append `msgs` (all bound for one node) with failover to other nodes when it is down,
        and to a queue's next segment when it was sealed or its node drains (tables reloaded)."""
        exclude = set() if exclude is None else exclude
        topic = msgs[0].topic
        stride = await self.ids.stride(topic) if any(m.queue_id >= 0 for m in msgs) else None
        resolves = 0
        while True:
            node, local = self._target(msgs[0], stride, exclude)
            wire = [m if m.queue_id == local else dataclasses.replace(m, queue_id=local) for m in msgs]
            if local >= 0 and topic in self.chains.chains and any(m.topic != topic for m in msgs):
                wire = [m if m.topic == topic else dataclasses.replace(m, queue_id=-1) for m in wire]
            try:
                raw = await self._submit(node, wire)
            except NodeUnavailable as e:
                log.warning("send failed on %s, trying another store node: %s", node.name, e)
                exclude.add(node.name)
                continue
            except (w.QueueSealed, w.NodeDraining) as e:
                resolves += 1
                if resolves > MAX_RESOLVES:
                    raise NodeUnavailable(f"{topic}: no open queue to write ({e})") from e
                epoch = self.chains.epoch(topic)
                await self.chains.reload()
                if isinstance(e, w.NodeDraining):
                    self.chains.draining.add(node.name)
                if self.chains.epoch(topic) == epoch and topic in self.chains.chains:
                    await asyncio.sleep(RESOLVE_PAUSE_S)  # sealed, the new table not written yet
                continue
            return self.ids.results(node, raw)  # type: ignore[return-value]

    def _batcher(self, node: NodeClient, topic: str) -> AppendBatcher:
        b = self._batchers.get((node.name, topic))
        if b is None:
            b = self._batchers[(node.name, topic)] = AppendBatcher(node, self.request_timeout_s)
        return b

    async def _submit(self, node: NodeClient, msgs: list[Message]) -> list[Any]:
        """The node's results for `msgs`, sent through their topics' batchers (each topic's part
        queued now, in order: a later send to a topic never overtakes this one)."""
        topic = msgs[0].topic
        if all(m.topic == topic for m in msgs):
            return await self._batcher(node, topic).submit(msgs)
        parts: dict[str, list[int]] = {}
        for i, m in enumerate(msgs):
            parts.setdefault(m.topic, []).append(i)
        futs = [(idxs, self._batcher(node, t).submit([msgs[i] for i in idxs])) for t, idxs in parts.items()]
        out: list[Any] = [None] * len(msgs)
        for _, fut in futs:  # (all awaited: a failed part raises once every part is answered)
            with contextlib.suppress(Exception):
                await asyncio.shield(fut)
        failed: Exception | None = None
        stored: list[int] = []
        for idxs, fut in futs:
            try:
                values = fut.result()
            except Exception as e:  # noqa: BLE001 - the first failure is raised, after the others
                failed = failed or e
                continue
            for i, v in zip(idxs, values, strict=True):
                out[i] = v
            stored += idxs
        if failed is None:
            return out
        if isinstance(failed, _RESENT):
            raise failed  # sent again whole (`_append_on`)
        raise PartlyStored(failed, frozenset(stored))  # the other parts are stored: not to be sent again

    async def append(self, msg: Message) -> AppendResult:
        return (await self._append_on([msg]))[0]

    async def append_many(self, msgs: list[Message]) -> list[AppendResult]:
        chains = self.chains.chains
        chained = bool(chains) and any(m.topic in chains for m in msgs)
        if not chained and not any(m.queue_id >= 0 or m.message_group for m in msgs):
            return await self._append_on(msgs)
        # Messages bound for particular queues, groups or logical queues: one sub-batch per target
        # node and queue (a chained topic's per topic too: its queue is its logical queue's).
        stride = await self.ids.stride(msgs[0].topic)
        parts: dict[tuple[str, int, str], list[int]] = {}
        for i, m in enumerate(msgs):
            node, local = self._target(m, stride, set())
            parts.setdefault((node.name, local, m.topic if m.topic in chains else ""), []).append(i)
        out: list[AppendResult | None] = [None] * len(msgs)
        stored: list[int] = []
        for idxs in parts.values():
            try:
                results = await self._append_on([msgs[i] for i in idxs])
            except Exception as e:  # noqa: BLE001 - the parts before are stored (not in the batch's order)
                if isinstance(e, PartlyStored):
                    stored += [idxs[j] for j in e.stored]
                    e = e.error
                raise PartlyStored(e, frozenset(stored)) from e
            for i, r in zip(idxs, results, strict=True):
                out[i] = r
            stored += idxs
        return out  # type: ignore[return-value]
