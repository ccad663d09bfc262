"""Pop in CLUSTER mode: every live node is read. First without waiting, in rotation, until
`max_messages`; then, if nothing came and the caller long-polls, all nodes at once: the first
non-empty answer wins, the other polls are cancelled (CANCEL) and whatever they still hand out is
made visible again at once (long_poll.py).

Filter predicates (Python callables) cannot travel: nodes filter by tags and the proxy applies the
predicate, acking popped messages it does not match (what the store does for non-matching ones)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any

from store import ALL, Filter, PoppedMessage, TopicNotFound

from . import store_wire as w
from .chain_table import ChainTable, FifoGate
from .ids import IdMap
from .long_poll import first_answer
from .membership import Membership
from .nodes import NodeClient, NodeUnavailable


class Pops:
    """`pop` of the cluster's StoreClient."""

    def __init__(self, members: Membership, ids: IdMap, request_timeout_s: float, chains: ChainTable) -> None:
        self.members = members
        self.ids = ids
        self.request_timeout_s = request_timeout_s
        self.chains = chains
        self.gate = FifoGate(members, chains)
        self._rr = itertools.count()

    async def _nodes(self, args: dict[str, Any]) -> list[NodeClient]:
        """The live nodes to pop for this group and topic (a chained topic's FIFO gate applied)."""
        live = self.members.need_live()
        if self.chains.chains and args["topic"] in self.chains.chains:
            args["chain"] = self.chains.epoch(args["topic"])
            skipped = await self.gate.skipped(args["group"], args["topic"])
            if skipped:
                return [n for n in live if n.name not in skipped]
        else:
            args["chain"] = 0
        return live

    async def _pop_node(
        self,
        node: NodeClient,
        args: dict[str, Any],
        wait_ms: int,
        opaques: dict[str, int] | None = None,
    ) -> list[PoppedMessage]:
        a = {**args, "wait_ms": wait_ms}
        sent = None if opaques is None else (lambda o: opaques.__setitem__(node.name, o))
        try:
            r = await node.call("pop", a, timeout=wait_ms / 1000 + self.request_timeout_s, sent=sent)
        except w.StaleChain:  # the node took part in a newer table: read it, then pop again
            await self.chains.reload()
            a["chain"] = self.chains.epoch(a["topic"])
            if node.name in await self.gate.skipped(a["group"], a["topic"]):
                return []  # it holds a segment that follows one the group is not done with
            try:
                r = await node.call("pop", a, timeout=self.request_timeout_s)
            except w.StaleChain:  # a switch under way: its table is not written yet
                return []
        out = w.decode_popped(r.body)
        for p in out:
            self.ids.globalize(node, p.message)
            p.receipt_handle = self.ids.handle(node, p.receipt_handle)
        return out

    async def _release(self, popped: list[PoppedMessage]) -> None:
        """Make what a losing poll handed out visible again at once."""
        for p in popped:
            with contextlib.suppress(Exception):
                node, local = self.ids.node_of_handle(p.receipt_handle)
                await node.call("change_invisible_time", {"handle": local, "invisible_ms": 0})

    async def _pop_once(self, args: dict[str, Any], max_n: int, wait_ms: int) -> list[PoppedMessage]:
        live = await self._nodes(args)
        if not live:  # every node waits for older segments: poll again shortly
            await asyncio.sleep(min(wait_ms, 100) / 1000)
            return []
        start = next(self._rr)
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
        if len(live) < len(self.members.live()):  # a FIFO gate is closed: short polls until it opens
            wait_ms = min(wait_ms, 200)
        return await self._long_poll(args, max_n, wait_ms, live)

    async def _long_poll(
        self, args: dict[str, Any], max_n: int, wait_ms: int, nodes: list[NodeClient]
    ) -> list[PoppedMessage]:
        """Long poll every live node at once (of `nodes`); the first non-empty answer wins,
        whatever the others hand out is released."""
        a = {**args, "max": max_n}
        return await first_answer(
            _Only(self.members, nodes),
            lambda node, slice_ms, opaques: self._pop_node(node, a, slice_ms, opaques),
            wait_ms,
            lambda extra: self.members.spawn(self._release(extra)),
            lambda t: self.members.spawn(self._settle(t)),
        )

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
                if p not in keep:  # what the store does with non-matching ones
                    node, local = self.ids.node_of_handle(p.receipt_handle)
                    await node.call("ack", {"handle": local})
            if keep or left <= 0:
                return keep


class _Only:
    """The members `first_answer` polls, limited to `nodes` (a FIFO gate leaves some out)."""

    def __init__(self, members: Membership, nodes: list[NodeClient]) -> None:
        self._members = members
        self._names = {n.name for n in nodes}
        self._all = len(nodes) == len(members.live())

    def need_live(self) -> list[NodeClient]:
        live = self._members.need_live()
        return live if self._all else [n for n in live if n.name in self._names]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._members, name)
