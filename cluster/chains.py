"""Logic queues spanning store nodes (docs/cluster.md, "Logic queues across nodes"): a topic's
logical queue is a chain of segments, each a physical queue on one store node, the last one open
(it takes the writes), the others sealed at an end offset. Offsets are continuous: a segment's
logical offsets start at its `base`, and logical offset = base + (physical offset - start). Nothing
is copied: a sealed segment stays where it was written and is read there.

    logical queue 3 of `orders`:  0 ............ 120 ............ 310 ..........
                                  | store-2 q1   | store-4 q0     | store-1 q2 (open)
                                  | start 0      | start 0        | start 57
                                  | end 120      | end 190        | end -

A `Chain` is one topic's table (every logical queue's segments) with an `epoch` that grows with
each change; its JSON form is what the store nodes keep (the key-value namespace `CHAINS_NS`, on
every node) and what the name server's routes list. Pure data and arithmetic: no I/O here."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson

CHAINS_NS = "cluster.chains"  # key-value namespace of the tables (key: topic), on every node
FENCE_NS = "cluster.fence"  # a node's own seals and the newest epoch it took part in (key: topic)
NODE_NS = "cluster.node"  # a node's own state (key "draining")


@dataclass
class Segment:
    """Part of a logical queue: physical queue `queue` of node `node`, logical offsets from `base`
    on, physical offsets from `start` to `end` (exclusive; None while it is the open one)."""

    node: str
    queue: int
    base: int = 0
    start: int = 0
    end: int | None = None

    @property
    def open(self) -> bool:
        return self.end is None

    def logical(self, physical: int) -> int:
        return self.base + physical - self.start

    def physical(self, logical: int) -> int:
        return self.start + logical - self.base

    def logical_end(self) -> int | None:
        """The first logical offset past this segment (None while open)."""
        return None if self.end is None else self.base + self.end - self.start

    def json(self) -> list[Any]:
        return [self.node, self.queue, self.base, self.start, self.end]


@dataclass
class Chain:
    """A topic's logical queues, each a list of segments in order (the last one open)."""

    topic: str
    epoch: int
    queues: list[list[Segment]]
    # the nodes the first layout spread the queues over: a message group keeps the logical queue
    # it had before the table (node crc32 % spread, then that node's queue crc32 % queues)
    spread: int = 1
    _where: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._where = {
            (s.node, s.queue): (lq, i) for lq, segs in enumerate(self.queues) for i, s in enumerate(segs)
        }

    # ------------------------------------------------------------------ codec
    def to_bytes(self) -> bytes:
        queues = [[s.json() for s in q] for q in self.queues]
        return orjson.dumps(
            {"topic": self.topic, "epoch": self.epoch, "queues": queues, "spread": self.spread}
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Chain:
        d = orjson.loads(data)
        queues = [[Segment(*s) for s in q] for q in d["queues"]]
        return cls(d["topic"], int(d["epoch"]), queues, int(d.get("spread", 1)))

    # ------------------------------------------------------------------ lookups
    def __len__(self) -> int:
        return len(self.queues)

    def head(self, lq: int) -> Segment:
        """The open segment of logical queue `lq` (where its writes go)."""
        return self.queues[lq][-1]

    def where(self, node: str, queue: int) -> tuple[int, Segment] | None:
        """(logical queue, segment) of node `node`'s physical queue `queue`, if it is in the table."""
        at = self._where.get((node, queue))
        return None if at is None else (at[0], self.queues[at[0]][at[1]])

    def segment_at(self, lq: int, offset: int) -> tuple[int, Segment]:
        """(index, segment) holding logical offset `offset` of `lq`: the first whose logical end
        is past it (an offset at a sealed segment's end belongs to the next one)."""
        segs = self.queues[lq]
        for i, s in enumerate(segs):
            end = s.logical_end()
            if end is None or offset < end:
                return i, s
        return len(segs) - 1, segs[-1]

    def key_queue(self, key: str) -> int:
        """The logical queue of a message group (an MQTT path): the same one before and after a
        switch, so its order holds."""
        h, n = zlib.crc32(key.encode()), self.spread
        if n <= 1 or len(self.queues) % n:
            return h % len(self.queues)
        return (h % (len(self.queues) // n)) * n + h % n

    def nodes(self) -> set[str]:
        return {s.node for q in self.queues for s in q}

    def heads_on(self, node: str) -> list[int]:
        """The logical queues whose open segment is on `node`."""
        return [lq for lq, q in enumerate(self.queues) if q[-1].node == node]

    def used(self, node: str) -> set[int]:
        """The physical queues of `node` any segment names (each hosts at most one, ever)."""
        return {s.queue for q in self.queues for s in q if s.node == node}

    def load(self) -> dict[str, int]:
        """Open segments per node."""
        out: dict[str, int] = {}
        for q in self.queues:
            out[q[-1].node] = out.get(q[-1].node, 0) + 1
        return out

    # ------------------------------------------------------------------ changes
    def moved(self, lq: int, end: int, node: str, queue: int, start: int) -> Chain:
        """A new table (next epoch) in which `lq`'s open segment is sealed at physical offset
        `end` and continues on `node`'s physical queue `queue` from its physical offset `start`."""
        queues = [[Segment(*s.json()) for s in q] for q in self.queues]
        old = queues[lq][-1]
        old.end = max(end, old.start)
        base = old.logical_end()
        assert base is not None
        queues[lq].append(Segment(node, queue, base, start, None))
        return Chain(self.topic, self.epoch + 1, queues, self.spread)

    def without(self, node: str) -> Chain:
        """A new table without `node`'s sealed segments (a forgotten node, fully consumed): the
        next segment keeps its base, so offsets stay continuous (min offsets move up)."""
        queues = [[s for s in q if s.node != node or s.open] for q in self.queues]
        return Chain(self.topic, self.epoch + 1, queues, self.spread)


def initial(topic: str, nodes: list[str], per_node: int) -> Chain:
    """Epoch 1: the layout before any move, one logical queue per physical queue with the ids
    proxies gave them (`local * nodes + ordinal`, ids.py), offsets unchanged."""
    names = sorted(nodes)
    n = len(names)
    queues = [[Segment(names[g % n], g // n)] for g in range(per_node * n)]
    return Chain(topic, 1, queues, n)


def plan_moves(
    chain: Chain, targets: list[str], avoid: frozenset[str] = frozenset()
) -> list[tuple[int, str]]:
    """(logical queue, target) moves that take every open segment off the nodes not in `targets`
    (or in `avoid`: a draining node) and even out the open segments over `targets`, the least
    loaded first (at most one apart)."""
    targets = [t for t in targets if t not in avoid]
    if not targets:
        return []
    load: dict[str, list[int]] = {t: [] for t in sorted(targets)}
    homeless = []
    for lq in range(len(chain)):
        node = chain.head(lq).node
        load.get(node, homeless).append(lq)
    moves: dict[int, str] = {}

    def least() -> str:
        return min(load, key=lambda x: (len(load[x]), x))

    for lq in homeless:
        t = least()
        load[t].append(lq)
        moves[lq] = t
    while True:
        hi, lo = max(load, key=lambda x: (len(load[x]), x)), least()
        if len(load[hi]) - len(load[lo]) <= 1:
            break
        lq = load[hi].pop(0)
        load[lo].append(lq)
        moves[lq] = lo
    return sorted(moves.items())
