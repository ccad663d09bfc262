"""A store node's side of logic queues and draining (docs/cluster.md): which of its physical
queues are sealed (a logical queue continued on another node from there), the newest chain epoch
of each topic it took part in, and whether it drains (it takes no new writes from proxies).

- `chain_fence(topic, epoch, seal)`: seal the listed queues (appends to them are refused with
  QueueSealed from now on), remember `epoch`, wait until every append already under way is
  answered, and return each listed queue's end (its max offset): the switch happens only after
  the old segment's in-flight appends are acknowledged.
- A pop or tail read carrying `chain` older than the topic's epoch here is refused (StaleChain):
  the proxy reloads the table first, so no proxy hands out a new segment's messages unaware that
  older ones come first.
- `set_draining(on)`: every append from a proxy is refused (NodeDraining); the node's own writes
  (retries, dead letters, transactions, delayed messages) go on. `node_state` reports role,
  draining and backlog (what `gateway store list` shows).

The state is kept in the node's key-value table (namespaces `chains.FENCE_NS`, `chains.NODE_NS`),
so it survives a restart and, in a replica group, a failover (the state stream copies it: a group
drains as a whole); a node that becomes primary reloads it before its first append."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from store import Store

from . import store_wire as w
from .chains import FENCE_NS, NODE_NS


class NodeFence:
    """The seals, epochs and draining flag of one node's store."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sealed: dict[str, set[int]] = {}  # topic -> sealed physical queues
        self.epochs: dict[str, int] = {}  # topic -> newest chain epoch this node took part in
        self.draining = False
        self.appending: set[asyncio.Task] = set()  # appends being served (the seal waits for them)
        self._loaded_as: bool | None = None  # the role (primary?) the state was loaded for

    @property
    def active(self) -> bool:
        """Whether appends must be checked (a seal, or draining)."""
        return self.draining or bool(self.sealed)

    def loaded(self, primary: bool) -> bool:
        """Whether the state in memory holds for this role (a replica's may lag: not checked)."""
        return self._loaded_as is primary or (self._loaded_as is not None and not primary)

    async def load(self, primary: bool) -> None:
        """(Re)load from the key-value table when first used or when the node became primary."""
        if self.loaded(primary):
            return
        sealed, epochs = {}, {}
        for topic, raw in await self.store.kv.scan(FENCE_NS, ""):
            d = orjson.loads(raw)
            epochs[topic] = int(d["epoch"])
            if d["sealed"]:
                sealed[topic] = set(d["sealed"])
        flag = await self.store.kv.get(NODE_NS, "draining")
        self.sealed, self.epochs, self.draining = sealed, epochs, flag == b"1"
        self._loaded_as = primary

    def check_append(self, body: bytes) -> None:
        """Refuse an append (all of it) that writes a sealed queue, or any while draining."""
        if self.draining:
            raise w.NodeDraining("this store node drains: it takes no new writes")
        for m in w.decode_messages(body):
            qs = self.sealed.get(m.topic)
            if qs is not None and (m.queue_id < 0 or m.queue_id in qs):
                raise w.QueueSealed(f"queue {m.queue_id} of {m.topic} continues on another store node")

    def check_read(self, args: dict[str, Any]) -> None:
        """Refuse a pop or tail made with an older chain table than this node took part in."""
        have = self.epochs.get(args.get("topic", ""))
        known = args.get("chain")
        if have is not None and known is not None and known < have:
            raise w.StaleChain(f"the chain of {args['topic']} is at epoch {have} here, not {known}")

    async def serve(self, op: str, args: dict[str, Any], state: dict[str, Any]) -> Any:
        if op == "chain_fence":
            return await self._fence(
                args["topic"], int(args["epoch"]), [int(q) for q in args.get("seal", ())]
            )
        if op == "set_draining":
            self.draining = bool(args["on"])
            await self.store.kv.put(NODE_NS, "draining", b"1" if self.draining else b"0")
            return self.draining
        return await self._state(state)

    async def _fence(self, topic: str, epoch: int, seal: list[int]) -> dict[str, int]:
        if seal:
            self.sealed.setdefault(topic, set()).update(seal)
        self.epochs[topic] = max(epoch, self.epochs.get(topic, 0))
        doc = {"epoch": self.epochs[topic], "sealed": sorted(self.sealed.get(topic, ()))}
        await self.store.kv.put(FENCE_NS, topic, orjson.dumps(doc))
        me = asyncio.current_task()
        under_way = [t for t in self.appending if t is not me]
        if under_way:  # appends that passed the check before the seal: answered first
            await asyncio.wait(under_way)
        return {str(q): self.store.max_offset(topic, q) for q in seal}

    async def _state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Role, draining and backlog: every (group, topic) with progress, and what it lacks."""
        store = self.store
        backlogs = []
        total = 0
        for group, topic in sorted(store.progress.states):
            if group.startswith("%"):
                continue
            try:
                n = store.backlog(group, topic)
            except Exception:  # noqa: BLE001, S112 - a topic deleted meanwhile
                continue
            total += n
            if n:
                backlogs.append([group, topic, n])
        unread = 0  # messages of user topics no group has progress on
        groups_of = {t for _g, t in store.progress.states}
        for t in store.topics():
            if t.name.startswith("%") or t.name in groups_of:
                continue
            unread += sum(
                store.max_offset(t.name, q) - store.min_offset(t.name, q)
                for q in range(store.queue_count(t.name))
            )
        return {**state, "draining": self.draining, "backlog": total, "backlogs": backlogs, "unread": unread}
