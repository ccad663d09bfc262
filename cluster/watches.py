"""Watches over store nodes: a caught-up reader parks with no long poll (`ClusterStoreClient.watch`).

A reader that read a topic to its end (`tail` found nothing) asks `watch(topic, callback,
positions)`: each live node gets one WATCH of that topic from this proxy (store_wire.py), with the
reader's next offsets in that node's queues, and answers WATCHED once the topic has a record past
them; every callback of the topic is then called once, and each reader reads again (run to
completion: offset_delivery.py). A WATCH already pending at a node for the topic serves the next
readers too, so a node holds at most one per topic and proxy connection, whatever the number of
parked readers. Before, each parked reader held a long poll on every node, re-issued every 5 s:
an idle fleet of persistent sessions under `--workers` cost the store process a request per
session every few seconds, and subscribing slowed as sessions accumulated.

- Race: a record appended between the reader's empty read and the node's WATCH is past the
  positions the WATCH carries, so the node answers at once.
- A lost connection answers every WATCH that was pending on it (the readers read again, and meet
  the error or the records); so does a WATCHED that comes for a topic whose readers moved on.
- None (the caller long-polls) when a live node lacks the `watch` feature (an older release), when
  no node is live, or for a topic with logical queues over nodes (chains.py: its reads follow the
  chain's segments).
"""

from __future__ import annotations

from collections.abc import Callable

from remoting.client import RemotingClient

from . import store_wire as w
from .chain_table import ChainTable
from .membership import Membership
from .nodes import NodeClient


class Watches:
    """The pending WATCHes of this proxy and the callbacks parked on them (see the module docstring)."""

    def __init__(self, members: Membership, chains: ChainTable) -> None:
        self.members = members
        self.chains = chains
        self.pending: dict[tuple[str, str], RemotingClient] = {}  # (node, topic) -> connection
        self.parked: dict[str, dict[object, Callable[[], object]]] = {}  # topic -> callbacks

    def watch(
        self, topic: str, callback: Callable[[], object], positions: dict[int, int]
    ) -> Callable[[], None] | None:
        """Call `callback` once when `topic` has a record past `positions` (global queue ids ->
        next offsets); the function that ends the watch unfired, or None: long-poll instead."""
        if self.chains.get(topic) is not None:
            return None
        live = [n for n in self.members.live() if n.conn is not None and not n.conn.closed.is_set()]
        if not live or not all(n.supports("watch") for n in live):
            return None
        token = object()
        self.parked.setdefault(topic, {})[token] = callback
        count = self.members.node_count()
        for node in live:
            key = (node.name, topic)
            conn = node.conn
            if conn is None or self.pending.get(key) is conn:
                continue
            ordinal = self.members.ordinal.get(node.name, -1)
            local = {str(g // count): off for g, off in positions.items() if g % count == ordinal}
            self.pending[key] = conn
            conn.oneway(w.WATCH, {"topic": topic, "a": w.dumps(local)})

        def unwatch() -> None:
            callbacks = self.parked.get(topic)
            if callbacks is not None:
                callbacks.pop(token, None)
                if not callbacks:
                    del self.parked[topic]

        return unwatch

    def watched(self, node: NodeClient, topic: str) -> None:
        """A node's WATCHED: wake every reader parked on `topic`."""
        self.pending.pop((node.name, topic), None)
        self._wake(topic)

    def lost(self, node: NodeClient, conn: RemotingClient) -> None:
        """`conn` to `node` closed: its WATCHes will not be answered; wake their readers."""
        topics = [t for (n, t), c in self.pending.items() if n == node.name and c is conn]
        for t in topics:
            del self.pending[(node.name, t)]
        for t in topics:
            self._wake(t)

    def _wake(self, topic: str) -> None:
        for callback in self.parked.pop(topic, {}).values():
            callback()  # (it may park again: into a fresh dict)
