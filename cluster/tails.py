"""Tail reads (offset reads of a whole topic, `StoreClient.tail`) in CLUSTER mode: each live
node is asked for its own queues, the caller's global positions split by node (global queue id =
`local * nodes + ordinal`, ids.py). First every node without waiting, in parallel; if nothing
came and the caller waits, every node long-polls at once and the first non-empty answer wins. The
other polls are cancelled (CANCEL); a tail read changes nothing on a node, so what they still
return is dropped, and the caller reads it again from its unchanged positions."""

from __future__ import annotations

import asyncio
import time

from store import Message, TopicNotFound

from . import store_wire as w
from .ids import IdMap
from .membership import Membership
from .nodes import NodeClient, NodeUnavailable

LONG_POLL_SLICE_S = 5.0  # a long poll is re-issued this often, so (re)joined nodes are read too


class Tails:
    """`tail` of the cluster's StoreClient."""

    def __init__(self, members: Membership, ids: IdMap, request_timeout_s: float) -> None:
        self.members = members
        self.ids = ids
        self.request_timeout_s = request_timeout_s

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
        return [await self.ids.globalize(node, m) for m in w.decode_messages(r.body)]

    async def tail(
        self, topic: str, positions: dict[int, int], max_messages: int = 128, wait_ms: int = 0
    ) -> list[Message]:
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
        deadline = time.monotonic() + wait_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            slice_ms = int(min(left, LONG_POLL_SLICE_S) * 1000)
            live = self.members.need_live()
            opaques: dict[str, int] = {}
            tasks = {
                asyncio.ensure_future(self._tail_node(n, topic, positions, max_n, slice_ms, opaques)): n
                for n in live
            }
            pending = set(tasks)
            failed: list[BaseException] = []
            winner: list[Message] = []
            try:
                while pending and not winner:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for t in done:
                        if t.exception() is not None:
                            failed.append(t.exception())  # type: ignore[arg-type]
                        elif t.result():
                            winner += t.result()
                if not winner and len(failed) == len(tasks):
                    raise failed[0]  # every node refused: do not spin until the deadline
            finally:
                for t in pending:
                    node = tasks[t]
                    if node.name in opaques:
                        node.cancel(opaques[node.name])
                    t.cancel()
            if winner:
                return winner
        return []
