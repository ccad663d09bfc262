"""Offset operations on a chained topic's logical queue (chains.py): each is turned into calls on
the segments' nodes, in chain order, and their physical offsets back into logical ones. Used by
the cluster's StoreClient (remote_store.py) for topics that have a table; others keep the plain
`local * nodes + ordinal` mapping of ids.py.

- `read` starts in the segment holding `start` and goes on into the next ones until it has
  `max_messages` (a sealed segment read short is read to its end).
- `min_offset` is the first segment's first retained offset; `max_offset` the open segment's end.
- `commit_offset` writes the segment holding the offset and, once per group, the end of every
  segment before it (their node then sees the group done with them: backlog, drain and the FIFO
  gate); `committed_offset` is the newest segment's commit at or past its start."""

from __future__ import annotations

from typing import Any, Protocol

from store import ALL, Filter, Message

from . import store_wire as w
from .chains import Chain, Segment
from .nodes import NodeClient, NodeUnavailable


class Nodes(Protocol):
    nodes: dict[str, NodeClient]


class Globalizer(Protocol):
    def globalize_all(self, node: NodeClient, msgs: list[Message]) -> list[Message]: ...


class ChainReads:
    """Reads and offsets of logical queues over their segments' nodes."""

    def __init__(self, members: Nodes, ids: Globalizer, request_timeout_s: float) -> None:
        self.members = members
        self.ids = ids
        self.request_timeout_s = request_timeout_s
        self._ends_committed: set[tuple[str, str, str, int]] = set()  # (group, topic, node, queue)

    def _node(self, seg: Segment, topic: str, lq: int) -> NodeClient:
        node = self.members.nodes.get(seg.node)
        if node is None or not node.readable:
            raise NodeUnavailable(f"queue {lq} of {topic} continues on store node {seg.node}, which is down")
        return node

    async def min_offset(self, chain: Chain, lq: int) -> int:
        segs = chain.queues[lq]
        for s in segs:
            low = await self._node(s, chain.topic, lq).value(
                "min_offset", {"topic": chain.topic, "queue_id": s.queue}
            )
            if s.end is None or max(low, s.start) < s.end:
                return s.logical(max(low, s.start))
        return segs[-1].base

    async def max_offset(self, chain: Chain, lq: int) -> int:
        s = chain.head(lq)
        high = await self._node(s, chain.topic, lq).value(
            "max_offset", {"topic": chain.topic, "queue_id": s.queue}
        )
        return s.logical(max(high, s.start))

    async def search_offset(self, chain: Chain, lq: int, timestamp_ms: int) -> int:
        args = {"topic": chain.topic, "timestamp_ms": timestamp_ms}
        for s in chain.queues[lq]:
            p = await self._node(s, chain.topic, lq).value("search_offset", {**args, "queue_id": s.queue})
            if s.end is None or p < s.end:
                return s.logical(max(p, s.start))
        return chain.queues[lq][-1].base

    async def read(
        self, chain: Chain, lq: int, start: int, end: int | None, max_messages: int, filter: Filter = ALL
    ) -> list[Message]:
        out: list[Message] = []
        pos = max(start, chain.queues[lq][0].base)
        while len(out) < max_messages and (end is None or pos < end):
            i, s = chain.segment_at(lq, pos)
            stop = s.logical_end()
            if end is not None:
                stop = end if stop is None else min(stop, end)
            if stop is not None and pos >= stop:
                break
            node = self._node(s, chain.topic, lq)
            want = max_messages - len(out)
            args: dict[str, Any] = {
                "topic": chain.topic,
                "queue_id": s.queue,
                "start": s.physical(pos),
                "end": None if stop is None else s.physical(stop),
                "max": want,
                "tags": w.filter_json(filter),
            }
            r = await node.call("read", args, timeout=self.request_timeout_s)
            got = self.ids.globalize_all(node, w.decode_messages(r.body))
            out += got if filter.predicate is None else [m for m in got if filter.predicate(m)]
            if len(got) >= want or s.open or i == len(chain.queues[lq]) - 1:
                break
            pos = s.logical_end()  # type: ignore[assignment] - read to its end: the next segment
        return out

    async def commit_offset(self, chain: Chain, group: str, lq: int, offset: int) -> None:
        i, s = chain.segment_at(lq, offset)
        topic = chain.topic
        for prev in chain.queues[lq][:i]:
            key = (group, topic, prev.node, prev.queue)
            if key in self._ends_committed or prev.end is None:
                continue
            node = self.members.nodes.get(prev.node)
            if node is None or not node.alive:
                continue
            args = {"group": group, "topic": topic, "queue_id": prev.queue, "offset": prev.end}
            await node.call("commit_offset", args)
            self._ends_committed.add(key)
        node = self._node(s, topic, lq)
        phys = max(s.physical(offset), s.start)
        await node.call(
            "commit_offset", {"group": group, "topic": topic, "queue_id": s.queue, "offset": phys}
        )

    async def committed_offset(self, chain: Chain, group: str, lq: int) -> int:
        for s in reversed(chain.queues[lq]):
            node = self.members.nodes.get(s.node)
            if node is None or not node.readable:
                continue
            args = {"group": group, "topic": chain.topic, "queue_id": s.queue}
            v = await node.value("committed_offset", args)
            if v >= s.start and v >= 0:
                return s.logical(v if s.end is None else min(v, s.end))
        return -1
