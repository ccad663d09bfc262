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
from .chain_table import ChainTable
from .chains import Chain
from .ids import IdMap
from .long_poll import first_answer
from .membership import Membership
from .nodes import NodeClient, NodeUnavailable

MAX_CALLERS = 4096  # positions dicts whose layout is remembered (one per fan-out loop and topic)
PAST = 1 << 62  # the position of a node's queue no logical queue reads now (nothing is at or past it)


class Tails:
    """`tail` of the cluster's StoreClient."""

    def __init__(self, members: Membership, ids: IdMap, request_timeout_s: float, chains: ChainTable) -> None:
        self.members = members
        self.ids = ids
        self.request_timeout_s = request_timeout_s
        self.chains = chains
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

    def _chain_positions(self, chain: Chain, positions: dict[int, int]) -> dict[str, dict[str, int]]:
        """Per node, the physical positions of the segments the caller's logical positions are in
        (a logical queue missing from `positions` is read from its first segment); every other
        queue of the topic on that node is given a position past its end."""
        out: dict[str, dict[str, int]] = {}
        for lq in range(len(chain)):
            off = positions.get(lq)
            if off is None:
                s = chain.queues[lq][0]
                phys = 0 if s.start == 0 else s.start
            else:
                _, s = chain.segment_at(lq, max(off, chain.queues[lq][0].base))
                phys = s.physical(max(off, s.base))
            out.setdefault(s.node, {})[str(s.queue)] = phys
        for name, mine in out.items():
            count = self.chains.node_queues.get((name, chain.topic), 0)
            for q in range(max(count, max(int(k) for k in mine) + 1)):
                mine.setdefault(str(q), PAST)
        return out

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
        chain = self.chains.get(topic)
        if chain is None:
            local = self._local_positions(node, positions)
            args = {"topic": topic, "positions": local, "max": max_n, "wait_ms": wait_ms, "chain": 0}
        else:
            local = self._chain_positions(chain, positions).get(node.name)
            if local is None:  # no logical queue reads this node now
                return []
            args = {
                "topic": topic,
                "positions": local,
                "max": max_n,
                "wait_ms": wait_ms,
                "chain": chain.epoch,
            }
        sent = None if opaques is None else (lambda o: opaques.__setitem__(node.name, o))
        try:
            r = await node.call("tail", args, timeout=wait_ms / 1000 + self.request_timeout_s, sent=sent)
        except w.StaleChain:  # the caller reads again with the newer table
            await self.chains.reload()
            return []
        msgs = w.decode_messages(r.body)
        if chain is not None:  # nothing past a sealed segment's end (the node's own later writes)
            msgs = [m for m in msgs if _within(chain, node.name, m)]
        return self.ids.globalize_all(node, msgs)

    async def tail(
        self, topic: str, positions: dict[int, int], max_messages: int = 128, wait_ms: int = 0
    ) -> list[Message]:
        chain = self.chains.get(topic)
        if chain is None:
            self._rekey(topic, positions)
            live = self.members.need_live()
        else:  # only the nodes of the segments the positions are in
            names = self._chain_positions(chain, positions)
            live = [n for n in self.members.need_live() if n.name in names]
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


def _within(chain: Chain, node: str, m: Message) -> bool:
    at = chain.where(node, m.queue_id)
    return at is not None and (at[1].end is None or m.queue_offset < at[1].end)
