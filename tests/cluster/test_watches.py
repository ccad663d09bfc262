"""Watches over store nodes (cluster/watches.py): a caught-up reader of a ClusterStoreClient parks
on one WATCH per node and topic instead of a long poll each, and is woken once by the next record,
by a record appended before its WATCH reached the node, or by the loss of the node's connection;
a node without the feature leaves the reader to long-poll. Two in-process store nodes and a name
server (tests/cluster/test_remote_store.py's `env`)."""

from __future__ import annotations

import asyncio

from cluster import store_wire as w
from store import Message
from tests.cluster.test_remote_store import env, until  # noqa: F401 - the fixture

TOPIC = "watched"


async def caught_up(c, positions: dict[int, int]) -> None:
    while msgs := await c.tail(TOPIC, positions, 100, 0):
        for m in msgs:
            positions[m.queue_id] = m.queue_offset + 1


def node_watches(e) -> list[int]:
    """Per store node, the WATCHes it holds for TOPIC (over all proxy connections)."""
    return [sum(TOPIC in regs for regs in n._watches.values()) for n in e.nodes.values()]


async def test_parked_readers_share_one_watch_per_node_and_wake_once_on_the_next_record(env):  # noqa: F811
    c = env.client
    await c.create_topic(TOPIC, 2, None, None)
    await c.append(Message(TOPIC, b"old"))
    positions: dict[int, int] = {}
    await caught_up(c, positions)
    woken: list[int] = []
    unwatches = [c.watch(TOPIC, lambda i=i: woken.append(i), positions) for i in range(50)]
    assert all(u is not None for u in unwatches)
    await until(lambda: node_watches(env) == [1, 1])  # one per node, not one per reader
    await asyncio.sleep(0.1)
    assert woken == []  # nothing new: nobody woken
    await c.append(Message(TOPIC, b"new"))
    await until(lambda: len(woken) == 50)
    await c.append(Message(TOPIC, b"newer"))  # a watch fires once
    await asyncio.sleep(0.2)
    assert sorted(woken) == list(range(50))
    assert len(await c.tail(TOPIC, positions, 100, 0)) == 2


async def test_a_record_appended_before_the_watch_reaches_the_node_wakes_at_once(env):  # noqa: F811
    c = env.client
    await c.create_topic(TOPIC, 2, None, None)
    positions: dict[int, int] = {}
    await caught_up(c, positions)
    await c.append(Message(TOPIC, b"meanwhile"))  # after the empty read, before the watch
    woken = asyncio.Event()
    assert c.watch(TOPIC, woken.set, positions) is not None
    await asyncio.wait_for(woken.wait(), 5)


async def test_an_ended_watch_is_not_called_and_a_lost_connection_wakes_the_readers(env):  # noqa: F811
    c = env.client
    await c.create_topic(TOPIC, 2, None, None)
    positions: dict[int, int] = {}
    await caught_up(c, positions)
    ended: list[str] = []
    unwatch = c.watch(TOPIC, lambda: ended.append("called"), positions)
    assert unwatch is not None
    unwatch()
    woken = asyncio.Event()
    assert c.watch(TOPIC, woken.set, positions) is not None
    await until(lambda: node_watches(env) == [1, 1])
    await env.stop_node("store-b")  # its connection closes: its WATCH will never be answered
    await asyncio.wait_for(woken.wait(), 5)
    assert ended == []


async def test_a_node_without_the_feature_leaves_the_reader_to_long_poll(env):  # noqa: F811
    c = env.client
    await c.create_topic(TOPIC, 2, None, None)
    node = c.members.live()[0]
    node.info = w.NodeInfo(2, node.info.features - {"watch"}, node.info.name, node.info.group)
    assert c.watch(TOPIC, lambda: None, {}) is None


async def test_a_malformed_watch_is_answered_and_the_connection_keeps_serving(env):  # noqa: F811
    c = env.client
    await c.create_topic(TOPIC, 2, None, None)
    woken = asyncio.Event()
    assert c.watch(TOPIC, woken.set, {}) is not None  # (parks; the malformed one below wakes it)
    node = c.members.live()[0]
    conn = node.conn
    for bad in ("[1, 2]", "not json", '{"x": "y"}'):
        woken.clear()
        assert c.watch(TOPIC, woken.set, {}) is not None
        conn.oneway(w.WATCH, {"topic": TOPIC, "a": bad})
        await asyncio.wait_for(woken.wait(), 5)  # answered WATCHED, not dropped
        assert node.conn is conn and not conn.closed.is_set()
    await c.append(Message(TOPIC, b"after"))
    assert [m.body for m in await c.tail(TOPIC, {}, 10, 0)] == [b"after"]
