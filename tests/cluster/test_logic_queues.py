"""Logic queues spanning store nodes and draining (cluster/chains.py, chain_table.py, fence.py,
logic_admin.py) with in-process store nodes over real sockets: a topic extended to another node
keeps its queue count and offsets continuous, reads follow the chain, a sealed queue refuses
appends, FIFO groups keep their order for pops across the switch, and a drained node takes no new
writes and reports when it is safe to stop. The process-level run under load is
test_logic_queues_load.py."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from cluster import logic_admin as la
from cluster import store_wire as w
from cluster.chains import Chain, initial, plan_moves
from cluster.remote_store import ClusterStoreClient
from namesrv.client import NameServerClient
from store import Filter, Message

from .test_remote_store import env, until  # noqa: F401 - the fixture


async def _route_epoch(ns: NameServerClient, topic: str, epoch: int) -> bool:
    table = await ns.logic_queues(topic)
    return table is not None and table["epoch"] == epoch


async def until_async(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def test_chain_arithmetic_and_plans():
    c = initial("t", ["s1", "s2", "s3"], 2)
    assert [c.head(lq).node for lq in range(6)] == ["s1", "s2", "s3", "s1", "s2", "s3"]
    m = c.moved(0, 10, "s4", 1, 5)
    assert (m.epoch, len(m)) == (2, 6)
    old, new = m.queues[0]
    assert (old.end, new.base, new.start, new.open) == (10, 10, 5, True)
    assert m.segment_at(0, 9)[1] is old and m.segment_at(0, 10)[1] is new
    assert new.logical(5) == 10 and new.physical(12) == 7 and m.where("s4", 1) == (0, new)
    assert Chain.from_bytes(m.to_bytes()) == m
    assert plan_moves(c, ["s1", "s2", "s3", "s4"]) == [(2, "s4")]  # 2,2,2,0 -> at most one apart
    moves = plan_moves(c, ["s1", "s2", "s3"], frozenset({"s2"}))
    assert sorted(lq for lq, _ in moves) == [1, 4] and all(t != "s2" for _, t in moves)
    assert m.without("s1").queues[0] == [new]  # offsets continue at 10


async def test_extend_keeps_offsets_continuous_and_reads_follow_the_chain(env):  # noqa: F811
    c = env.client
    await c.create_topic("lq", 2, None, None)  # 4 logical queues over store-a, store-b
    before = [await c.append(Message("lq", b"a%d" % i, message_group="g")) for i in range(5)]
    lq = before[0].queue_id
    assert {r.queue_id for r in before} == {lq} and [r.queue_offset for r in before] == list(range(5))
    await env.add_node("store-c")
    await until(lambda: len(c.live()) == 3)
    assert (await c.get_topic("lq")).queues == 4  # the join kept the count (a table over a and b)
    chain = await la.extend(c, "lq", "store-c", [lq])
    assert chain.head(lq).node == "store-c" and chain.queues[lq][0].end == 5
    after = [await c.append(Message("lq", b"c%d" % i, message_group="g")) for i in range(5)]
    assert {r.queue_id for r in after} == {lq} and [r.queue_offset for r in after] == list(range(5, 10))
    assert await c.min_offset("lq", lq) == 0 and await c.max_offset("lq", lq) == 10
    got = await c.read("lq", lq, 0, None, 100)
    assert [m.body for m in got] == [b"a%d" % i for i in range(5)] + [b"c%d" % i for i in range(5)]
    assert [m.queue_offset for m in got] == list(range(10)) and {m.queue_id for m in got} == {lq}
    assert [m.body for m in await c.read("lq", lq, 3, 7, 100)] == [b"a3", b"a4", b"c0", b"c1"]
    # the new records are on store-c, the old ones stayed where they were (nothing copied)
    assert env.nodes["store-c"].store.max_offset("lq", chain.head(lq).queue) == 5
    # the name server's route lists the table (refilled by the nodes' registrations)
    ns = NameServerClient(env.ns.address)
    try:
        await until_async(lambda: _route_epoch(ns, "lq", chain.epoch))
        table = Chain.from_bytes(orjson.dumps(await ns.logic_queues("lq")))
        assert table == chain and table.queues[lq][1].json() == ["store-c", chain.head(lq).queue, 5, 0, None]
    finally:
        await ns.close()
    # a stale sender is refused by the sealed queue
    old = chain.queues[lq][0]
    with pytest.raises(w.QueueSealed):
        await c.members.nodes[old.node].call(
            "append", None, w.encode_messages([Message("lq", b"x", queue_id=old.queue)])
        )
    # offsets committed through the chain stay continuous
    await c.create_group("readers")
    await c.commit_offset("readers", "lq", lq, 7)
    assert await c.committed_offset("readers", "lq", lq) == 7
    assert env.nodes[old.node].store.committed_offset("readers", "lq", old.queue) == 5  # done there
    # tail reads go on across the switch
    positions, tailed = {lq: 3}, []
    for _ in range(3):  # one read per segment: the caller moves its position on
        for m in await c.tail("lq", positions, 100, 0):
            if m.queue_id == lq:
                tailed.append(m)
                positions[lq] = m.queue_offset + 1
    tailed = [m for m in tailed]
    assert [m.body for m in tailed if m.queue_id == lq] == [b"a3", b"a4", b"c0", b"c1", b"c2", b"c3", b"c4"]
    # pops of one message group keep its order across the switch (the FIFO gate)
    await c.create_group("fifo")
    order = []
    for _ in range(30):
        for p in await c.pop("fifo", "lq", 32, 5000, Filter(), 300):
            order.append(p.message.body)
            await c.ack(p.receipt_handle)
        if len(order) == 10:
            break
    assert order == [b"a%d" % i for i in range(5)] + [b"c%d" % i for i in range(5)]


async def test_drain_moves_the_writes_and_reports_safe_to_stop(env):  # noqa: F811
    c = env.client
    await c.create_topic("dq", 2, None, None)
    await c.create_group("g")
    for i in range(8):
        await c.append(Message("dq", b"m%d" % i))
    rows = {r["name"]: r for r in await la.nodes(c)}
    b = rows["store-b"]
    assert b["unread"] > 0 and not b["draining"] and not b["safe_to_stop"]  # (no group read it yet)
    with pytest.raises(la.AdminError):
        await la.drain(c, "store-a")  # first by name: the key-value data
    out = await la.drain(c, "store-b")
    assert out["moved"] == {"dq": 2}
    rs = [await c.append(Message("dq", b"n%d" % i)) for i in range(6)]
    chain = c.chains.get("dq")
    assert all(chain.head(lq).node == "store-a" for lq in range(4)) and len(rs) == 6
    assert (await c.get_topic("dq")).queues == 4
    with pytest.raises(w.NodeDraining):
        await c.members.nodes["store-b"].call("append", None, w.encode_messages([Message("dq", b"x")]))
    rows = {r["name"]: r for r in await la.nodes(c)}
    assert rows["store-b"]["draining"] and not rows["store-b"]["safe_to_stop"]
    got = set()
    for _ in range(20):
        for p in await c.pop("g", "dq", 32, 5000, Filter(), 300):
            got.add(p.message.body)
            await c.ack(p.receipt_handle)
        if len(got) == 14:
            break
    assert got == {b"m%d" % i for i in range(8)} | {b"n%d" % i for i in range(6)}
    rows = {r["name"]: r for r in await la.nodes(c)}
    assert rows["store-b"]["backlog"] == 0 and rows["store-b"]["safe_to_stop"]
    out = await la.forget(c, "store-b")
    assert out["topics"] == ["dq"] and "store-b" not in c.chains.get("dq").nodes()


async def test_automatic_mode_extends_topics_onto_a_joining_node(env):  # noqa: F811
    c = env.client
    await c.create_topic("auto", 2, None, None)  # 4 logical queues over store-a, store-b
    assert await la.set_auto_extend(c, True) == ["store-a", "store-b"]
    await env.add_node("store-c")
    await until(lambda: (ch := c.chains.get("auto")) is not None and ch.heads_on("store-c"), 10)
    chain = c.chains.get("auto")
    assert len(chain) == 4 and sorted(chain.load().values()) == [1, 1, 2]  # least loaded first
    r = await c.append(Message("auto", b"x", queue_id=chain.heads_on("store-c")[0]))
    assert r.queue_id == chain.heads_on("store-c")[0] and (await c.get_topic("auto")).queues == 4
    assert env.nodes["store-c"].store.max_offset("auto", chain.head(r.queue_id).queue) == 1


async def test_a_long_poll_waiting_through_a_switch_hands_out_nothing_of_the_new_segment(env):  # noqa: F811
    """A pop that waits on the new segment's node from before the switch must not return what is
    written there after it while the old segment's messages are still in flight: the node refuses
    it (StaleChain) once it took part in the newer table, the messages stay visible, and the
    proxy's retry of that node goes through the FIFO gate of the new table."""
    c = env.client
    await c.create_topic("sw", 2, None, None)
    await c.create_group("fifo")
    old = [await c.append(Message("sw", b"a%d" % i, message_group="g")) for i in range(3)]
    lq = old[0].queue_id
    await env.add_node("store-c")
    await until(lambda: len(c.live()) == 3)
    in_flight = await c.pop("fifo", "sw", 32, 30_000, Filter(), 0)  # popped, not acked yet
    assert [p.message.body for p in in_flight] == [b"a0"]  # (a group's next waits for its ack)
    waiting = asyncio.create_task(c.pop("fifo", "sw", 32, 30_000, Filter(), 3000))
    await asyncio.sleep(0.3)  # its long polls wait on every node, store-c's with the old table
    await la.extend(c, "sw", "store-c", [lq])
    new = await c.append(Message("sw", b"c0", message_group="g"))
    assert new.queue_id == lq and new.queue_offset == 3
    got = await waiting
    assert [p.message.body for p in got] == [], "a new segment's message before the old ones were acked"
    for p in in_flight:
        await c.ack(p.receipt_handle)
    after = []
    for _ in range(30):
        for p in await c.pop("fifo", "sw", 32, 30_000, Filter(), 300):
            after.append(p.message.body)
            await c.ack(p.receipt_handle)
        if len(after) >= 3:
            break
    assert after == [b"a1", b"a2", b"c0"]


async def _second_proxy(env) -> ClusterStoreClient:  # noqa: F811
    """Another proxy's client, whose tables change only when it reloads them itself."""
    p = ClusterStoreClient(env.ns.address, refresh_s=60)
    await p.start(wait_s=5)
    await until(lambda: len(p.live()) == len(env.nodes))
    await p.chains.reload()
    return p


async def test_a_reload_asked_for_while_another_runs_reads_the_tables_again(env):  # noqa: F811
    """A caller that asks for a reload while one is under way (that one may have read the tables
    before the change the caller reacts to) gets a reload that began after it asked."""
    c = env.client
    await c.create_topic("rl", 2, None, None)
    await env.add_node("store-c")
    await until(lambda: len(c.live()) == 3 and c.chains.get("rl") is not None)
    p = await _second_proxy(env)
    try:
        before = p.chains.epoch("rl")
        read, held = p.chains._read, asyncio.Event()
        reading = asyncio.Event()

        async def slow_read(node):  # reads now, answers once released: an early, stale reload
            got = await read(node)
            reading.set()
            await held.wait()
            return got

        p.chains._read = slow_read
        early = asyncio.create_task(p.chains.reload())
        await reading.wait()
        chain = await la.extend(c, "rl", "store-c", [0])  # the change, after the early reads
        asked = asyncio.create_task(p.chains.reload())
        await asyncio.sleep(0.05)
        p.chains._read = read
        held.set()
        await asyncio.gather(early, asked)
        assert chain.epoch > before and p.chains.epoch("rl") == chain.epoch
    finally:
        await p.close()


async def test_a_message_group_keeps_its_queue_when_a_proxy_hears_of_a_drain_before_its_table(env):  # noqa: F811
    """A proxy that knows a node drains but still holds the table from before the drain sends a
    message group's message to the group's own logical queue (the node refuses it, the proxy
    reloads and finds its new open segment), never to the next logical queue."""
    c = env.client
    await c.create_topic("kq", 2, None, None)  # 4 logical queues over store-a, store-b
    await env.add_node("store-c")
    await until(lambda: len(c.live()) == 3 and c.chains.get("kq") is not None)
    p = await _second_proxy(env)
    try:
        chain = p.chains.get("kq")
        key = next(f"g{i}" for i in range(100) if chain.head(chain.key_queue(f"g{i}")).node == "store-b")
        first = await p.append(Message("kq", b"before", message_group=key))
        await la.drain(c, "store-b")
        p.chains.draining.add("store-b")  # what it heard (a refusal, a reload) before the new table
        assert p.chains.get("kq").head(first.queue_id).node == "store-b"  # (the old table still)
        after = await p.append(Message("kq", b"after", message_group=key))
        assert (after.queue_id, after.queue_offset) == (first.queue_id, first.queue_offset + 1)
        assert p.chains.get("kq").head(first.queue_id).node != "store-b"
    finally:
        await p.close()
