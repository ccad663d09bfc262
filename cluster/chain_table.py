"""A proxy's copy of the logic queue tables (chains.py) and of which store nodes drain.

Every node that offers `logic_queues` keeps every table in its key-value table (`CHAINS_NS`, key =
topic); the proxy takes, per topic, the highest epoch any node has (`reload`: at each route
refresh, when a node refuses an append to a sealed queue or a pop with an older table, and when a
node joins). `publish` writes a table to every live node. `freeze` gives the topics that have no
table one (epoch 1, the layout of the nodes seen so far) before a joining node is counted, so the
queue count clients see stays the same.

`FifoGate` keeps a logical queue's order for pop consumers across a switch: a node that holds a
segment following another is not popped for a group until the group has acknowledged everything
of the segments before it (their node's ack watermark reached their end)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from .chains import CHAINS_NS, NODE_NS, Chain, initial
from .nodes import NodeClient
from .store_wire import b64, unb64

log = logging.getLogger("cluster")
GATE_RECHECK_S = 0.1  # how often a closed gate asks the older segments' nodes again
FEATURE = "logic_queues"


class Nodes(Protocol):
    nodes: dict[str, NodeClient]

    def live(self) -> list[NodeClient]: ...

    def readable(self) -> list[NodeClient]: ...


class ChainTable:
    """Tables by topic, the draining nodes and each chained topic's queue count per node."""

    def __init__(self, members: Nodes) -> None:
        self.members = members
        self.chains: dict[str, Chain] = {}
        self.draining: set[str] = set()
        self.node_queues: dict[tuple[str, str], int] = {}  # (node, chained topic) -> its queues
        self.states: dict[str, dict[str, Any]] = {}  # node -> its draining flag at the last reload
        self._lock = asyncio.Lock()
        self._reloaded = 0.0  # when the last reload began (what it read is at least that new)

    def get(self, topic: str) -> Chain | None:
        return self.chains.get(topic) if self.chains else None

    def epoch(self, topic: str) -> int:
        c = self.chains.get(topic)
        return 0 if c is None else c.epoch

    async def reload(self, at_least: float | None = None) -> None:
        """Read every readable node's tables, draining flag and queue counts. Concurrent callers
        share one reload, but only one that began after they asked (after `at_least`): a reload
        under way when a caller asks may have read the tables before the change it reacts to."""
        asked = time.monotonic() if at_least is None else at_least
        async with self._lock:
            if self._reloaded > asked:
                return
            began = time.monotonic()
            nodes = [n for n in self.members.readable() if n.supports(FEATURE)]
            got = await asyncio.gather(*(self._read(n) for n in nodes), return_exceptions=True)
            chains: dict[str, Chain] = {}
            draining, states = set(), {}
            for node, g in zip(nodes, got, strict=True):
                if isinstance(g, BaseException):
                    if node.name in self.draining:
                        draining.add(node.name)  # unknown now: keep what it said
                    continue
                rows, state, counts = g
                states[node.name] = state
                if state.get("draining"):
                    draining.add(node.name)
                for topic, raw in rows:
                    c = Chain.from_bytes(raw)
                    if topic not in chains or c.epoch > chains[topic].epoch:
                        chains[topic] = c
                for topic, q in counts.items():
                    self.node_queues[(node.name, topic)] = q
            for topic, c in self.chains.items():  # never step back (a node that missed a write)
                if topic not in chains or chains[topic].epoch < c.epoch:
                    chains[topic] = c
            self.chains, self.draining, self.states = chains, draining, states
            self._reloaded = began

    async def _read(self, node: NodeClient) -> tuple[list, dict, dict[str, int]]:
        rows = await node.value("kv_scan", {"ns": CHAINS_NS, "prefix": ""})
        flag = await node.value("kv_get", {"ns": NODE_NS, "key": "draining"})  # (cheaper than node_state)
        state = {"draining": flag is not None and unb64(flag) == b"1"}
        counts = {}
        if rows:
            chained = {t for t, _ in rows}
            for t in await node.value("list_topics"):
                if t["name"] in chained:
                    counts[t["name"]] = max(t["queues"], t.get("read_queues") or 0)
        return [(t, unb64(v)) for t, v in rows], state, counts

    async def publish(self, chain: Chain) -> None:
        """Write `chain` to every live node that keeps tables (raises when none took it)."""
        nodes = [n for n in self.members.live() if n.supports(FEATURE)]
        args = {"ns": CHAINS_NS, "items": {chain.topic: b64(chain.to_bytes())}}
        res = await asyncio.gather(*(n.call("kv_put_many", args) for n in nodes), return_exceptions=True)
        errors = [r for r in res if isinstance(r, BaseException)]
        if len(errors) == len(res):
            raise errors[0] if errors else RuntimeError("no store node keeps logic queue tables")
        self.chains[chain.topic] = chain

    async def freeze(self, names: list[str]) -> None:
        """Before a node joins: every user topic without a table gets epoch 1 over `names` (the
        nodes seen so far), so its queue ids and count stay as clients know them."""
        live = [n for n in self.members.live() if n.supports(FEATURE)]
        if not live or not names:
            return
        await self.reload()
        for t in await live[0].value("list_topics"):
            name = t["name"]
            if name.startswith("%") or name in self.chains:
                continue
            c = initial(name, names, t["queues"])
            try:
                await self.publish(c)
            except Exception as e:  # noqa: BLE001 - the topic then grows with the node, as before
                log.warning("could not keep the queue count of %s: %s", name, e)
                continue
            log.info("topic %s keeps its %d queues over %s", name, len(c), ", ".join(sorted(names)))


class FifoGate:
    """Which nodes a group's pops of a chained topic skip for now (see the module docstring)."""

    def __init__(self, members: Nodes, table: ChainTable) -> None:
        self.members = members
        self.table = table
        self._done: set[tuple[str, str, str, int, int]] = set()  # (group, topic, node, queue, end)
        # (group, topic) -> (recheck time, the table's epoch, skipped nodes): a new table rechecks
        self._closed_until: dict[tuple[str, str], tuple[float, int, frozenset[str]]] = {}

    async def skipped(self, group: str, topic: str) -> frozenset[str]:
        chain = self.table.get(topic)
        if chain is None:
            return frozenset()
        key = (group, topic)
        now = time.monotonic()
        cached = self._closed_until.get(key)
        if cached is not None and now < cached[0] and cached[1] == chain.epoch:
            return cached[2]
        out: set[str] = set()
        for segs in chain.queues:
            for i in range(1, len(segs)):
                if segs[i].node in out:
                    continue
                for prev in segs[:i]:
                    if not await self._done_with(group, topic, prev.node, prev.queue, prev.start, prev.end):
                        out.add(segs[i].node)
                        break
        skipped = frozenset(out)
        self._closed_until[key] = (now + GATE_RECHECK_S, chain.epoch, skipped)
        return skipped

    async def _done_with(
        self, group: str, topic: str, name: str, queue: int, start: int, end: int | None
    ) -> bool:
        if end is None or end <= start:
            return True
        key = (group, topic, name, queue, end)
        if key in self._done:
            return True
        node = self.members.nodes.get(name)
        if node is None or not node.readable:
            return False  # its messages wait for it: so does what follows them
        try:
            wm = await node.value("committed_offset", {"group": group, "topic": topic, "queue_id": queue})
            if wm < end:
                low = await node.value("min_offset", {"topic": topic, "queue_id": queue})
                if low < end:
                    return False
        except Exception:  # noqa: BLE001 - unknown now: closed
            return False
        self._done.add(key)
        return True
