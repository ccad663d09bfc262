"""Tail reads (offset reads of a whole topic, `StoreClient.tail`) in CLUSTER mode: each live
node is asked for its own queues, the caller's global positions split by node (global queue id =
`local * nodes + ordinal`, ids.py). First every node without waiting, in parallel; if nothing
came and the caller waits, every node long-polls at once and the first non-empty answer wins
(long_poll.py). A tail read changes nothing on a node, so what the other polls still return is
dropped, and the caller reads it again from its unchanged positions. When the nodes seen change,
the caller's positions are re-keyed in place to the new global queue ids (`_rekey`)."""

from __future__ import annotations

import asyncio

from store import Message, TopicNotFound

from . import store_wire as w
from .ids import IdMap
from .long_poll import first_answer
from .membership import Membership
from .nodes import NodeClient, NodeUnavailable

MAX_CALLERS = 4096  # positions dicts whose layout is remembered (one per fan-out loop and topic)


class Tails:
    """`tail` of the cluster's StoreClient."""

    def __init__(self, members: Membership, ids: IdMap, request_timeout_s: float) -> None:
        self.members = members
        self.ids = ids
        self.request_timeout_s = request_timeout_s
        # (topic, id of a caller's positions) -> the node ordinals its global queue ids were made with
        self._layouts: dict[tuple[str, int], dict[str, int]] = {}

    def _rekey(self, topic: str, positions: dict[int, int]) -> None:
        """A global queue id names another queue once the nodes seen change (`local * nodes +
        ordinal`, ids.py): re-key the caller's positions (in place) from the layout they were
        made with to the current one. A queue of a node no longer seen is dropped."""
        layout = self.members.ordinal
        key = (topic, id(positions))
        old = self._layouts.pop(key, None)
        self._layouts[key] = layout
        while len(self._layouts) > MAX_CALLERS:
            del self._layouts[next(iter(self._layouts))]
        if old is None or old is layout or old == layout:
            return
        n_old, n_new = max(len(old), 1), max(len(layout), 1)
        name_of = {o: name for name, o in old.items()}
        moved = {}
        for g, off in positions.items():
            local, o = divmod(g, n_old)
            name = name_of.get(o)
            if name in layout:
                moved[local * n_new + layout[name]] = off
        positions.clear()
        positions.update(moved)

    def _local_positions(self, node: NodeClient, positions: dict[int, int]) -> dict[str, int]:
        n = self.members.node_count()
        ordinal = self.members.ordinal.get(node.name, -1)
        return {str(g // n): off for g, off in positions.items() if g % n == ordinal}

    async def _tail_node(
        self,
        node: NodeClient,
        topic: str,
        positions: dict[int, int],
        max_n: int,
        wait_ms: int,
        opaques: dict[str, int] | None = None,
    ) -> list[Message]:
        local = self._local_positions(node, positions)
        args = {"topic": topic, "positions": local, "max": max_n, "wait_ms": wait_ms}
        sent = None if opaques is None else (lambda o: opaques.__setitem__(node.name, o))
        r = await node.call("tail", args, timeout=wait_ms / 1000 + self.request_timeout_s, sent=sent)
        return self.ids.globalize_all(node, w.decode_messages(r.body))

    async def tail(
        self, topic: str, positions: dict[int, int], max_messages: int = 128, wait_ms: int = 0
    ) -> list[Message]:
        self._rekey(topic, positions)
        live = self.members.need_live()
        got = await asyncio.gather(
            *(self._tail_node(n, topic, positions, max_messages, 0) for n in live), return_exceptions=True
        )
        out: list[Message] = []
        errors: list[BaseException] = []
        for g in got:
            if isinstance(g, BaseException):
                if not isinstance(g, (NodeUnavailable, TopicNotFound)):
                    raise g
                errors.append(g)
            else:
                out += g
        if len(errors) == len(live):
            raise errors[0]
        if out or wait_ms <= 0:
            return out
        return await self._long_poll(topic, positions, max_messages, wait_ms)

    async def _long_poll(
        self, topic: str, positions: dict[int, int], max_n: int, wait_ms: int
    ) -> list[Message]:
        # what a losing poll returned is dropped: the caller's positions still point at it
        return await first_answer(
            self.members,
            lambda node, slice_ms, opaques: self._tail_node(node, topic, positions, max_n, slice_ms, opaques),
            wait_ms,
            lambda extra: None,
            lambda t: t.cancel(),
        )
