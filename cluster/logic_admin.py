"""The operator's side of logic queues and draining (docs/cluster.md), over a started
`ClusterStoreClient` (what `gateway topic extend` and `gateway store drain|list|forget` open):

- `extend(topic, to)`: logical queues of `topic` continue on node `to` (the fair share, or the
  ones named): each old open segment is sealed on its node (which answers once its appends under
  way are acknowledged, with the segment's end), the new segment starts at the end offset of a
  free physical queue of `to`, and the new table is written to every node. Nothing is copied.
- `drain(name)`: every topic's open segments leave `name` (topics without a table get one first,
  so their queue ids and count stay), then the node refuses appends from proxies. Its consumers go
  on reading what it holds.
- `nodes()`: each node's role, draining state, open segments, backlog and `safe_to_stop`.
- `forget(name)`: a drained node's sealed segments leave the tables (offsets stay continuous).
- `rebalance(to)`: every user topic's open segments even out over the live nodes, `to` included
  (`extend` with the fair share). The automatic mode (`set_auto_extend`, `gateway store
  auto-extend on`, kept in every node's key-value table) runs it when a node joins: the proxy
  that first takes the join's claim (`AUTO_NS` on the first node by name) does it, once per node
  name."""

from __future__ import annotations

import time
from typing import Any, Protocol

from .chain_table import FEATURE, ChainTable
from .chains import NODE_NS, Chain, initial, plan_moves
from .nodes import NodeClient
from .store_wire import b64

AUTO_NS = "cluster.auto_extend"  # key: a joined node's name, claimed by the proxy that extends


class Cluster(Protocol):
    chains: ChainTable

    def live(self) -> list[NodeClient]: ...


class AdminError(Exception):
    """An operation that cannot be done as asked (the message says why)."""


def _node(cluster: Cluster, name: str) -> NodeClient:
    for n in cluster.live():
        if n.name == name:
            if not n.supports(FEATURE):
                raise AdminError(f"store node {name} (protocol version {n.info.version}) has no logic queues")
            return n
    raise AdminError(f"store node {name} is not live")


async def _chain(cluster: Cluster, topic: str, exclude: str | None = None) -> Chain:
    """The topic's table; epoch 1 over the nodes that hold it when it has none (`exclude` left
    out when it holds nothing of the topic yet: the node it is extended to)."""
    table = cluster.chains
    await table.reload()
    c = table.get(topic)
    if c is not None:
        return c
    holders, per_node = [], 0
    for n in cluster.live():
        t = await n.value("get_topic", {"name": topic})
        if t is None:
            continue
        per_node = per_node or t["queues"]
        if n.name == exclude:
            ends = [await n.value("max_offset", {"topic": topic, "queue_id": q}) for q in range(t["queues"])]
            if not any(ends):
                continue
        holders.append(n.name)
    if not holders:
        raise AdminError(f"no live store node has topic {topic}")
    return initial(topic, holders, per_node)


async def _free_queues(node: NodeClient, chain: Chain, k: int) -> list[tuple[int, int]]:
    """`k` physical queues of `node` no segment names yet, with their end offsets (the topic is
    created there, or given more queues, when it lacks them)."""
    topic = chain.topic
    t = await node.value("get_topic", {"name": topic})
    if t is None:
        t = await node.value(
            "create_topic",
            {"name": topic, "queues": k, "retention_ms": None, "retention_bytes": None, "compacted": False},
        )
    used = chain.used(node.name)
    free = [q for q in range(t["queues"]) if q not in used]
    if len(free) < k:
        count = t["queues"] + k - len(free)
        await node.value("resize_topic", {"name": topic, "queues": count})
        free += list(range(t["queues"], count))
    out = []
    for q in free[:k]:
        out.append((q, await node.value("max_offset", {"topic": topic, "queue_id": q})))
    return out


async def move(cluster: Cluster, chain: Chain, moves: list[tuple[int, str]]) -> Chain:
    """Apply `moves` ((logical queue, target node)) in one new epoch; the new table."""
    if not moves:
        return chain
    epoch = chain.epoch + 1
    topic = chain.topic
    targets: dict[str, list[int]] = {}
    for lq, to in moves:
        targets.setdefault(to, []).append(lq)
    slots: dict[int, tuple[str, int, int]] = {}
    for to, lqs in targets.items():
        node = _node(cluster, to)
        for lq, (q, start) in zip(lqs, await _free_queues(node, chain, len(lqs)), strict=True):
            slots[lq] = (to, q, start)
        # the new segments' node refuses pops and tails made with an older table from now on
        await node.value("chain_fence", {"topic": topic, "epoch": epoch, "seal": []})
    by_old: dict[str, list[int]] = {}
    for lq, _ in moves:
        by_old.setdefault(chain.head(lq).node, []).append(lq)
    ends: dict[int, int] = {}
    for old, lqs in by_old.items():
        node = _node(cluster, old)
        seal = [chain.head(lq).queue for lq in lqs]
        got = await node.value("chain_fence", {"topic": topic, "epoch": epoch, "seal": seal})
        for lq in lqs:
            ends[lq] = int(got[str(chain.head(lq).queue)])
    new = chain
    for lq, _ in moves:
        to, q, start = slots[lq]
        new = new.moved(lq, ends[lq], to, q, start)
    new = Chain(topic, epoch, new.queues, chain.spread)
    await cluster.chains.publish(new)
    return new


async def extend(cluster: Cluster, topic: str, to: str, queues: list[int] | None = None) -> Chain:
    """Logical queues of `topic` continue on node `to`: those named, else its fair share."""
    _node(cluster, to)
    chain = await _chain(cluster, topic, exclude=to)
    if queues:
        bad = [q for q in queues if not 0 <= q < len(chain)]
        if bad:
            raise AdminError(f"topic {topic} has {len(chain)} queues: no {bad[0]}")
        moves = [(lq, to) for lq in queues if chain.head(lq).node != to]
    else:
        heads = {chain.head(lq).node for lq in range(len(chain))} | {to}
        live = {n.name for n in cluster.live()} - cluster.chains.draining
        moves = [(lq, t) for lq, t in plan_moves(chain, sorted(heads & live | {to})) if t == to]
    return await move(cluster, chain, moves)


async def _user_topics(cluster: Cluster) -> list[str]:
    names: set[str] = set()
    for n in cluster.live():
        names.update(t["name"] for t in await n.value("list_topics") if not t["name"].startswith("%"))
    return sorted(names)


async def rebalance(cluster: Cluster, to: str) -> dict[str, int]:
    """The automatic mode: every user topic extends onto `to` by its fair share; moves per topic."""
    out = {}
    for topic in await _user_topics(cluster):
        before = cluster.chains.get(topic)
        after = await extend(cluster, topic, to)
        out[topic] = sum(1 for lq in range(len(after)) if after.head(lq).node == to) - (
            0 if before is None else len(before.heads_on(to))
        )
    return out


async def drain(cluster: Cluster, name: str) -> dict[str, Any]:
    """`name` takes no new writes: its open segments move to the other live nodes, then it refuses
    appends from proxies. Returns the moves per topic."""
    node = _node(cluster, name)
    live = sorted(n.name for n in cluster.live() if n.supports(FEATURE))
    if live and live[0] == name:
        raise AdminError(f"store node {name} is first by name: it holds the cluster's key-value data")
    await cluster.chains.reload()
    targets = [n for n in live if n != name and n not in cluster.chains.draining]
    if not targets:
        raise AdminError("no other live store node takes writes")
    moved: dict[str, int] = {}
    t0 = time.monotonic()
    for topic in await _user_topics(cluster):
        chain = await _chain(cluster, topic)
        if name not in chain.nodes():
            continue
        if cluster.chains.get(topic) is None:
            await cluster.chains.publish(chain)  # its ids and count from now on, wherever it goes
        moves = plan_moves(chain, targets, frozenset({name}))
        await move(cluster, chain, [(lq, t) for lq, t in moves if chain.head(lq).node == name])
        moved[topic] = len(moves)
    await node.value("set_draining", {"on": True})
    cluster.chains.draining.add(name)
    return {"node": name, "moved": moved, "seconds": round(time.monotonic() - t0, 3)}


async def nodes(cluster: Cluster) -> list[dict[str, Any]]:
    """Each live node's role, draining state, open segments and backlog; `safe_to_stop` once a
    draining node has no open segment and nothing unconsumed."""
    await cluster.chains.reload()
    heads: dict[str, int] = {}
    for c in cluster.chains.chains.values():
        for node, k in c.load().items():
            heads[node] = heads.get(node, 0) + k
    out = []
    for n in cluster.live():
        row: dict[str, Any] = {"name": n.name, "address": n.addr, "version": n.info.version}
        if n.supports(FEATURE):
            st = await n.value("node_state")
            row.update(
                role=st["role"],
                group=st.get("group"),
                draining=st["draining"],
                backlog=st["backlog"],
                unread=st["unread"],
                backlogs=st["backlogs"],
            )
        else:
            row.update(role="unknown", draining=False, backlog=None, unread=None, backlogs=[])
        row["open_segments"] = heads.get(n.name, 0)
        row["safe_to_stop"] = bool(
            row["draining"] and row["backlog"] == 0 and not row["unread"] and row["open_segments"] == 0
        )
        out.append(row)
    return out


async def forget(cluster: Cluster, name: str) -> dict[str, Any]:
    """Drop a drained node from every table (refused while it holds an open segment or, if it
    is still live, anything unconsumed)."""
    for row in await nodes(cluster):
        if row["name"] == name and not row["safe_to_stop"]:
            raise AdminError(
                f"store node {name} is not safe to stop yet: drain it and let its backlog reach 0"
            )
    changed = []
    for topic, c in sorted(cluster.chains.chains.items()):
        if name not in c.nodes():
            continue
        if c.heads_on(name):
            raise AdminError(f"store node {name} still takes writes of {topic}: drain it first")
        await cluster.chains.publish(c.without(name))
        changed.append(topic)
    return {"node": name, "topics": changed}


async def set_auto_extend(cluster: Cluster, on: bool) -> list[str]:
    """The automatic mode on or off, on every live node; the nodes told."""
    told = []
    for n in cluster.live():
        if n.supports(FEATURE):
            await n.call("kv_put", {"ns": NODE_NS, "key": "auto_extend"}, b"1" if on else b"0")
            told.append(n.name)
    if not told:
        raise AdminError("no live store node keeps logic queue tables")
    return told


async def auto_extend(cluster: Cluster, joined: str, claimant: str) -> dict[str, int] | None:
    """When node `joined` has joined: if the automatic mode is on and this caller (`claimant`)
    wins the claim, every user topic extends onto it by its fair share; the moves, else None."""
    others = [n for n in cluster.live() if n.name != joined and n.supports(FEATURE)]
    if not others:
        return None
    flags = [await n.value("kv_get", {"ns": NODE_NS, "key": "auto_extend"}) for n in others]
    if b64(b"1") not in flags:
        return None
    first = min(others, key=lambda n: n.name)
    await first.call("kv_put_if_absent", {"ns": AUTO_NS, "key": joined}, claimant.encode())
    got = await first.value("kv_get", {"ns": AUTO_NS, "key": joined})
    if got != b64(claimant.encode()):
        return None  # another proxy extends
    return await rebalance(cluster, joined)
