"""Where a proxy's sends go in CLUSTER mode: round robin over live nodes; a message with a FIFO
message group to the node its group hashes to (the next live one while that node is down); a
message for a given queue to the node owning that queue. A send that fails because its node went
away is retried on another node. The sends to one node and topic leave in the order they were made,
the concurrent ones together (`AppendBatcher`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import zlib
from typing import Any

from store import AppendResult, Message
from store.message import PATH_PROPERTY

from .ids import IdMap
from .membership import Membership
from .nodes import AppendBatcher, NodeClient, NodeUnavailable

log = logging.getLogger("cluster")


class Sends:
    """`append` / `append_many` of the cluster's StoreClient."""

    def __init__(self, members: Membership, ids: IdMap, request_timeout_s: float) -> None:
        self.members = members
        self.ids = ids
        self.request_timeout_s = request_timeout_s
        self._batchers: dict[tuple[str, str], AppendBatcher] = {}  # (node, topic) -> its sends, in order
        self._rr = itertools.count()

    def _target(self, msg: Message, stride: int | None, exclude: set[str]) -> tuple[NodeClient, int]:
        """(node, local queue id or -1) for one message."""
        live = [n for n in self.members.need_live() if n.name not in exclude]
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

    async def _append_on(self, msgs: list[Message], exclude: set[str] | None = None) -> list[AppendResult]:
        """Append `msgs` (all bound for one node) with failover to other nodes when it is down."""
        exclude = set() if exclude is None else exclude
        stride = await self.ids.stride(msgs[0].topic) if any(m.queue_id >= 0 for m in msgs) else None
        while True:
            node, local = self._target(msgs[0], stride, exclude)
            wire = [m if m.queue_id == local else dataclasses.replace(m, queue_id=local) for m in msgs]
            try:
                raw = await self._submit(node, wire)
            except NodeUnavailable as e:
                log.warning("send failed on %s, trying another store node: %s", node.name, e)
                exclude.add(node.name)
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
        for idxs, fut in futs:
            for i, v in zip(idxs, fut.result(), strict=True):
                out[i] = v
        return out

    async def append(self, msg: Message) -> AppendResult:
        return (await self._append_on([msg]))[0]

    async def append_many(self, msgs: list[Message]) -> list[AppendResult]:
        if not any(m.queue_id >= 0 or m.message_group for m in msgs):
            return await self._append_on(msgs)
        # Messages bound for particular queues or groups: one sub-batch per target node.
        stride = await self.ids.stride(msgs[0].topic)
        parts: dict[str, list[int]] = {}
        for i, m in enumerate(msgs):
            node, _ = self._target(m, stride, set())
            parts.setdefault(node.name, []).append(i)
        out: list[AppendResult | None] = [None] * len(msgs)
        for idxs in parts.values():
            for i, r in zip(idxs, await self._append_on([msgs[i] for i in idxs]), strict=True):
                out[i] = r
        return out  # type: ignore[return-value]
