"""`ClusterStoreClient` against two in-process store nodes and a name server (one event loop,
real sockets): the StoreClient contract across nodes, id tagging, FIFO placement, pop across
nodes without starving, failover when a node goes, the wire codec."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster import store_wire as w
from cluster.ids import CLO_SHIFT, node_tag
from cluster.nodes import NodeUnavailable
from cluster.remote_store import ClusterStoreClient
from cluster.store_node import StoreNode, StoreNodeConfig
from messaging_processor import ClientContext, MessagingProcessor
from messaging_processor.store_client import PartlyStored, stored_despite
from namesrv.config import NamesrvSettings
from namesrv.server import NameServer
from store import (
    Filter,
    InvalidReceiptHandle,
    Message,
    MessageType,
    PoppedMessage,
    Store,
    StoreConfig,
    TopicNotFound,
)


@dataclass
class Env:
    ns: NameServer
    nodes: dict[str, StoreNode]
    client: ClusterStoreClient
    root: Path

    async def add_node(self, name: str) -> StoreNode:
        node_config = StoreNodeConfig(
            name=name, port=0, namesrv=self.ns.address, lease_period_s=0.2, lease_expiry_s=5.0
        )
        config = StoreConfig(
            data_dir=str(self.root / name),
            flush="async",
            auto_create_topics=False,
            transaction_timeout_ms=200,
            transaction_check_interval_ms=100,
        )
        store = await Store.open(config)
        node = StoreNode(node_config, store)
        await node.start()
        self.nodes[name] = node
        return node

    async def stop_node(self, name: str) -> None:
        node = self.nodes.pop(name)
        await node.stop(0)
        await node.store.close()


async def until(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def env(tmp_path):
    ns = NameServer(NamesrvSettings(port=0, lease_period_s=0.2, lease_expiry_s=5.0, scan_interval_s=0.05))
    await ns.start()
    e = Env(ns, {}, ClusterStoreClient(ns.address, refresh_s=0.1), tmp_path)
    await e.add_node("store-a")
    await e.add_node("store-b")
    await e.client.start(wait_s=5)
    await until(lambda: len(e.client.live()) == 2)
    yield e
    await e.client.close()
    for name in list(e.nodes):
        await e.stop_node(name)
    await ns.stop()


def node_of(clo: int) -> int:
    return clo >> CLO_SHIFT


def test_wire_round_trip_of_messages_and_errors():
    m = Message(
        "t", b"\x00body", tag="a", keys=("k1", "k2"), properties={"p": "v"}, message_group="g", queue_id=3
    )
    m.commitlog_offset, m.queue_offset, m.reconsume_times, m.message_id = 77, 5, 2, "ID"
    (back,) = w.decode_popped(w.encode_messages([PoppedMessage(m, "h 1 2", 123)]))
    assert back.receipt_handle == "h 1 2" and back.invisible_until == 123
    b = back.message
    assert (b.topic, b.body, b.tag, b.keys, b.properties, b.message_group) == (
        "t",
        b"\x00body",
        "a",
        ("k1", "k2"),
        {"p": "v"},
        "g",
    )
    assert (b.queue_id, b.queue_offset, b.commitlog_offset, b.reconsume_times, b.message_id) == (
        3,
        5,
        77,
        2,
        "ID",
    )
    with pytest.raises(w.WireError):
        w.decode_popped(b"\x00\x00\x00\x05xx")
    err = w.make_error(*w.error_fields(TopicNotFound("orders")))
    assert isinstance(err, TopicNotFound) and str(err) == "orders"
    assert isinstance(w.make_error("NoSuchThing", "x"), w.StoreError)


async def test_sends_spread_over_nodes_and_pop_sees_all(env):
    c = env.client
    t = await c.create_topic("orders", 2, None, None)
    assert t.queues == 4  # 2 per node, 2 nodes: global queue ids 0..3
    for n in env.nodes.values():  # admin reached every node
        assert n.store.topic_configs["orders"].queues == 2
    await c.create_group("billing", 16, None)
    results = [await c.append(Message("orders", f"m{i}".encode())) for i in range(10)]
    assert {node_of(r.commitlog_offset) for r in results} == {node_tag("store-a"), node_tag("store-b")}
    assert {r.queue_id for r in results} <= {0, 1, 2, 3} and len({r.queue_id for r in results}) == 4
    got = await c.pop("billing", "orders", 32, 30_000)
    assert sorted(p.message.body for p in got) == sorted(f"m{i}".encode() for i in range(10))
    assert {p.receipt_handle.split("@")[0] for p in got} == {"store-a", "store-b"}
    # Offsets and reads by global queue id agree with the send results.
    for r in results:
        (m,) = await c.read("orders", r.queue_id, r.queue_offset, r.queue_offset + 1, 1)
        assert m.message_id == r.message_id and m.commitlog_offset == r.commitlog_offset
        assert (await c.get_message(r.commitlog_offset)).message_id == r.message_id
    assert sum([await c.max_offset("orders", q) for q in range(4)]) == 10
    assert await c.backlog("billing", "orders") == 10 and await c.inflight_count("billing", "orders") == 10
    for p in got:
        await c.ack(p.receipt_handle)
    assert await c.backlog("billing", "orders") == 0
    with pytest.raises(InvalidReceiptHandle):
        await c.ack(got[0].receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        await c.ack("nonsense")
    with pytest.raises(ValueError):
        await c.read("orders", 9, 0)
    assert ("billing", "orders") in await c.subscriptions()
    assert [m.message_id for m in await c.get_by_id(results[3].message_id)] == [results[3].message_id]
    with pytest.raises(TopicNotFound):  # store exceptions come back as themselves
        await c.pop("billing", "nothing", 1, 1000)


async def test_fifo_group_stays_on_one_node_and_fixed_queues_map(env):
    c = env.client
    await c.create_topic("fifo", 2, None, None)
    rs = await c.append_many(
        [Message("fifo", b"x", message_group="g1", msg_type=MessageType.FIFO) for _ in range(6)]
    )
    assert len({node_of(r.commitlog_offset) for r in rs}) == 1
    for q in range(4):  # a producer-chosen global queue lands exactly there
        r = await c.append(Message("fifo", b"q", queue_id=q))
        assert r.queue_id == q
    mixed = await c.append_many([Message("fifo", b"a", queue_id=0), Message("fifo", b"b", queue_id=3)])
    assert [r.queue_id for r in mixed] == [0, 3]


async def test_a_send_of_several_topics_one_of_them_missing_says_which_messages_it_stored(env):
    """A send of several topics goes as one request per topic: a missing topic's request is refused,
    the others are stored all the same, and the failure (PartlyStored) names them, so that a caller
    sends again only what was not stored (an AMQP publish routed to a queue deleted through another
    proxy: its other copies were stored twice). Sends split by node or queue say so too."""
    c = env.client
    await c.create_topic("kept", 1, None, None)
    batch = [Message("kept", b"k1"), Message("missing", b"m"), Message("kept", b"k2")]
    with pytest.raises(PartlyStored) as e:
        await c.append_many(batch)
    assert isinstance(e.value.error, TopicNotFound) and str(e.value.error) == "missing"
    assert e.value.stored == {0, 2}
    assert stored_despite(e.value, batch) == {0, 2}
    await c.create_group("g", 16, None)
    got = await c.pop("g", "kept", 32, 30_000)
    assert sorted(p.message.body for p in got) == [b"k1", b"k2"]
    by_queue = [Message("kept", b"q0", queue_id=0), Message("missing", b"m", queue_id=0)]
    with pytest.raises(PartlyStored) as e:
        await c.append_many(by_queue)
    assert isinstance(e.value.error, TopicNotFound) and e.value.stored == {0}
    with pytest.raises(TopicNotFound):  # one topic: refused as a whole, the store's own exception
        await c.append_many([Message("missing", b"m1"), Message("missing", b"m2")])


async def test_long_poll_wakes_for_a_message_on_any_node(env):
    c = env.client
    await c.create_topic("lp", 1, None, None)
    await c.create_group("g", 16, None)
    for target in ("store-a", "store-b"):
        node = env.nodes[target]
        t0 = time.monotonic()
        pop = asyncio.ensure_future(c.pop("g", "lp", 4, 30_000, wait_ms=5000))
        await until(lambda: all(n.polls for n in env.nodes.values()))  # long polling on both nodes
        assert not pop.done()
        await node.store.append(Message("lp", target.encode()))  # straight into one node
        got = await asyncio.wait_for(pop, 3)
        assert [p.message.body for p in got] == [target.encode()]
        assert time.monotonic() - t0 < 2.0
        await c.ack(got[0].receipt_handle)
    # The other node's cancelled long poll handed nothing out: nothing is in flight.
    await until(lambda: not any(n.frames.running() for n in env.nodes.values()))
    assert await c.inflight_count("g", "lp") == 0


async def test_predicate_filters_run_on_the_proxy(env):
    c = env.client
    await c.create_topic("p", 1, None, None)
    await c.create_group("g", 16, None)
    for i in range(6):
        await c.append(Message("p", str(i).encode(), tag="even" if i % 2 == 0 else "odd"))
    f = Filter(predicate=lambda m: int(m.body) % 3 == 0)
    got = await c.pop("g", "p", 32, 30_000, f)
    assert sorted(p.message.body for p in got) == [b"0", b"3"]
    assert await c.backlog("g", "p") == 2  # the others are done for the group, as in the store
    tagged = await c.read("p", 0, 0, None, 32, Filter(tags=frozenset({"odd"})))
    assert all(m.tag == "odd" for m in tagged)


async def test_kv_lives_on_one_node_and_admin_reaches_all(env):
    c = env.client
    await c.kv_put("ns", "k1", b"v1")
    await c.kv_put_many("ns", {"k2": b"v2", "k3": None})
    assert await c.kv_get("ns", "k1") == b"v1"
    assert await c.kv_scan("ns", "k") == [("k1", b"v1"), ("k2", b"v2")]
    assert await c.kv_delete("ns", "k1") is True
    assert await c.kv_put_if_absent("ns", "k2", b"other") == b"v2"  # kept
    assert await c.kv_put_if_absent("ns", "k4", b"v4") is None and await c.kv_get("ns", "k4") == b"v4"
    assert await env.nodes["store-a"].store.kv.get("ns", "k2") == b"v2"  # first node by name
    assert await env.nodes["store-b"].store.kv.get("ns", "k2") is None
    await c.create_group("grp", 3, None)
    assert all("grp" in n.store.group_configs for n in env.nodes.values())
    assert [g.name for g in await c.list_groups()] == ["grp"]
    await c.delete_group("grp")
    assert await c.get_group("grp") is None
    await c.create_topic("gone", 1, None, None)
    await c.delete_topic("gone")
    assert await c.get_topic("gone") is None


async def test_transactions_route_by_offset_tag_and_checks_reach_the_proxy(env):
    c = env.client
    await c.create_topic("tx", 1, None, None)
    checked: list[Message] = []

    async def checker(m: Message) -> None:
        checked.append(m)

    c.set_transaction_checker(checker)
    halves = [await c.append(Message("tx", b"h", msg_type=MessageType.TRANSACTION)) for _ in range(2)]
    assert {node_of(h.commitlog_offset) for h in halves} == {node_tag("store-a"), node_tag("store-b")}
    for h in halves:
        r = await c.end_transaction(h.commitlog_offset, True)
        assert (
            r is not None and r.topic == "tx" and node_of(r.commitlog_offset) == node_of(h.commitlog_offset)
        )
    # An unresolved one is checked through the proxy, with its tagged offset.
    h = await c.append(Message("tx", b"late", msg_type=MessageType.TRANSACTION))
    await until(lambda: any(m.commitlog_offset == h.commitlog_offset for m in checked), 10)
    assert await c.end_transaction(h.commitlog_offset, False) is None


async def test_node_loss_fails_over_sends_and_rejoin_serves_its_messages(env):
    c = env.client
    await c.create_topic("fo", 1, None, None)
    await c.create_group("g", 16, None)
    before = [await c.append(Message("fo", f"b{i}".encode())) for i in range(6)]
    on_b = [r for r in before if node_of(r.commitlog_offset) == node_tag("store-b")]
    assert on_b
    data_b = env.nodes["store-b"].store.config.data_dir
    await env.stop_node("store-b")
    await until(lambda: [n.name for n in c.live()] == ["store-a"])
    after = [await c.append(Message("fo", f"a{i}".encode())) for i in range(6)]
    assert {node_of(r.commitlog_offset) for r in after} == {node_tag("store-a")}
    with pytest.raises(NodeUnavailable):
        await c.read("fo", 1, 0)  # store-b's queue
    # store-b comes back (new port, same data): its messages are consumable again.
    env.root = Path(data_b).parent
    await env.add_node("store-b")
    await until(lambda: len(c.live()) == 2)
    seen: list[bytes] = []
    deadline = time.monotonic() + 5
    while len(seen) < 12 and time.monotonic() < deadline:
        for p in await c.pop("g", "fo", 32, 30_000, wait_ms=200):
            seen.append(p.message.body)
            await c.ack(p.receipt_handle)
    stored = [m.body for m in await c.read("fo", 1, 0)] + [m.body for m in await c.read("fo", 0, 0)]
    expected = sorted([f"b{i}".encode() for i in range(6)] + [f"a{i}".encode() for i in range(6)])
    # On a mismatch, say what the stores hold (a store-level loss shows up here, not in `seen`).
    assert sorted(seen) == expected, ("stored:", sorted(stored))


async def test_processor_over_cluster_store(env):
    p = MessagingProcessor(env.client, auto_create_topics=True)
    await p.start()
    try:
        ctx = ClientContext("test")
        rs = await p.send(ctx, [Message("auto", b"x")])
        assert rs[0].topic == "auto"
        route = await p.query_route(ctx, "auto")
        assert len(route.queues) == 16  # 8 default queues per node
        info = await p.get_topic("auto")
        assert info.messages == 1
    finally:
        await p.close()


async def test_concurrent_sends_are_coalesced_per_node(env):
    c = env.client
    await c.create_topic("burst", 2, None, None)
    codes: list[int] = []
    for n in env.nodes.values():

        async def counting(conn, cmd, orig=n.dispatch):
            codes.append(cmd.code)
            return await orig(conn, cmd)

        n.dispatch = counting
    rs = await asyncio.gather(*(c.append(Message("burst", str(i).encode())) for i in range(200)))
    appends = codes.count(w.OPS["append"])
    assert appends < 60, appends  # 200 messages, far fewer requests
    for i, r in enumerate(rs):  # and every caller got its own message's result
        assert (await c.get_message(r.commitlog_offset)).body == str(i).encode()
    assert len({r.message_id for r in rs}) == 200
    # A batch the node refuses: every caller gets its own answer.
    bad = await asyncio.gather(*(c.append(Message("nope", b"x")) for _ in range(20)), return_exceptions=True)
    assert all(isinstance(e, TopicNotFound) for e in bad), bad


async def test_concurrent_sends_to_a_topic_keep_their_order_on_the_node(env):
    """One proxy's sends to a topic are placed in the order they were made, whatever their size: a
    send that waits behind the requests in flight is not overtaken by a later batch (the AMQP
    publishes of one channel, split over socket reads, went to a queue out of order)."""
    c = env.client
    await c.create_topic("order", 1, None, None)
    await c.create_topic("order2", 1, None, None)

    def msg(topic: str, i: int) -> Message:  # one message group: all on one node, one queue
        return Message(topic, str(i).encode(), message_group="g", msg_type=MessageType.FIFO)

    sends = []  # in submission order; sizes 1 and several, one spanning two topics
    i = 0
    for size in (1, 1, 1, 5, 1, 3, 1, 1, 4):
        sends.append([msg("order", i + k) for k in range(size)])
        i += size
    sends.insert(5, [msg("order", 100), msg("order2", 0), msg("order", 101)])
    results = await asyncio.gather(*(c.append(s[0]) if len(s) == 1 else c.append_many(s) for s in sends))
    placed = sorted(
        (r.queue_offset, m.body)
        for s, rs in zip(sends, results, strict=True)
        for m, r in zip(s, rs if isinstance(rs, list) else [rs], strict=True)
        if m.topic == "order"
    )
    submitted = [m.body for s in sends for m in s if m.topic == "order"]
    assert [b for _, b in placed] == submitted


async def test_a_restarted_empty_name_server_does_not_empty_the_store_list(env):
    c = env.client
    port = env.ns.port
    for node in env.nodes.values():  # hold the stores' heartbeats: the new name server stays empty
        node._registration.cancel()
    await env.ns.stop()
    seen: list[int] = []
    sampler = asyncio.ensure_future(_sample(c, seen))
    try:
        env.ns = NameServer(
            NamesrvSettings(port=port, lease_period_s=0.2, lease_expiry_s=5.0, scan_interval_s=0.05)
        )
        await env.ns.start()
        n = c.refreshes
        await until(lambda: c.refreshes >= n + 4)  # route refreshes against the empty name server
        assert env.ns.routes.brokers == {}
        for node in env.nodes.values():
            node._registration = node.namesrv.keep_registered(node.register, 0.2)
        await until(lambda: len(env.ns.routes.brokers) == 2)  # refilled by the heartbeats
        n = c.refreshes
        await until(lambda: c.refreshes >= n + 2)
    finally:
        sampler.cancel()
    assert seen and min(seen) == 2  # both stores stayed in use throughout
    await c.create_topic("after-restart", 1, None, None)
    assert (await c.append(Message("after-restart", b"x"))).topic == "after-restart"


async def _sample(c: ClusterStoreClient, seen: list[int]) -> None:
    while True:
        seen.append(len(c.live()))
        await asyncio.sleep(0.02)


async def test_pop_of_a_topic_no_node_has_fails_at_once_even_when_long_polling(env):
    t0 = time.monotonic()
    with pytest.raises(TopicNotFound):
        await env.client.pop("g", "missing", 1, 1000, wait_ms=5000)
    assert time.monotonic() - t0 < 1.0


async def test_compacted_topic_latest_values_across_nodes(env):
    c = env.client
    t = await c.create_topic("shadows", 2, None, None, compacted=True)
    assert t.compacted
    assert all(n.store.topic("shadows").compacted for n in env.nodes.values())
    last = 0

    async def next_millisecond() -> None:
        # Across nodes the newest record of a key is the one with the latest store time (in
        # milliseconds): each version is stored at least a millisecond after the previous one.
        while time.time_ns() // 1_000_000 <= last:
            await asyncio.sleep(0.001)

    for version in range(3):
        await next_millisecond()
        for k in range(6):  # over both nodes (sends spread over the queues of every node)
            r = await c.append(Message("shadows", b"%d@%d" % (k, version), keys=(f"k{k}",)))
            last = max(last, r.store_timestamp)
    await next_millisecond()
    await c.append(Message("shadows", b"", keys=("k5",)))  # a tombstone: newer than k5's values
    latest = await c.latest("shadows", "k2")
    assert latest is not None and latest.body == b"2@2"
    assert await c.latest("shadows", "k5") is None
    assert (await c.latest("shadows", "k5", tombstones=True)).body == b""
    items = await c.latest_items("shadows")
    assert [(m.keys[0], m.body) for m in items] == [(f"k{k}", b"%d@2" % k) for k in range(5)]
    stats = await c.compact()
    assert stats.records_in == 0  # nothing in a closed segment yet: nothing compacted


async def test_tail_reads_every_node_by_global_queue_and_long_polls_all(env):
    c = env.client
    await c.create_topic("tl", 2, None, None)  # global queues 0..3 over two nodes
    await c.create_group("g", 16, None)
    first = [await c.append(Message("tl", b"a%d" % i, queue_id=i % 4)) for i in range(8)]
    positions = {q: await c.max_offset("tl", q) for q in range(4)}
    assert positions == {0: 2, 1: 2, 2: 2, 3: 2}
    assert await c.tail("tl", dict(positions), 16, 0) == []
    rs = [await c.append(Message("tl", b"b%d" % i, queue_id=i % 4)) for i in range(4)]
    got = await c.tail("tl", positions, 16, 0)
    assert {(m.queue_id, m.queue_offset, m.message_id) for m in got} == {
        (r.queue_id, r.queue_offset, r.message_id) for r in rs
    }
    for m in got:
        positions[m.queue_id] = m.queue_offset + 1
    # From the start (no positions) every message of both nodes.
    assert {m.message_id for m in await c.tail("tl", {}, 100, 0)} == {r.message_id for r in first + rs}
    # A long poll waits on every node; an append straight into either wakes it.
    for target in ("store-a", "store-b"):
        t0 = time.monotonic()
        waiting = asyncio.ensure_future(c.tail("tl", positions, 16, 5000))
        await until(lambda: all(n.polls for n in env.nodes.values()))
        assert not waiting.done()
        await env.nodes[target].store.append(Message("tl", target.encode(), queue_id=0))
        got = await asyncio.wait_for(waiting, 3)
        assert [m.body for m in got] == [target.encode()] and time.monotonic() - t0 < 2.0
        for m in got:
            positions[m.queue_id] = m.queue_offset + 1
    await until(lambda: not any(n.polls for n in env.nodes.values()))  # the losing poll was cancelled
    # Tail reads hand nothing out: the pop group still has every message.
    assert await c.inflight_count("g", "tl") == 0 and await c.backlog("g", "tl") == 14
    with pytest.raises(TopicNotFound):
        await c.tail("nothing", {}, 1, 1000)


async def test_tail_positions_follow_their_queues_when_a_node_joins(env):
    c = env.client
    await c.create_topic("tj", 2, None, None)  # global queues 0..3 over store-a, store-b
    before = [await c.append(Message("tj", b"old%d" % i, queue_id=i % 4)) for i in range(8)]
    positions: dict[int, int] = {}
    got = await c.tail("tj", positions, 100, 0)
    assert {m.message_id for m in got} == {r.message_id for r in before}
    for m in got:
        positions[m.queue_id] = m.queue_offset + 1
    # store-0 sorts first: every node's ordinal changes, but the topic keeps its queues (a logic
    # queue table over store-a and store-b is made before the node counts: cluster/chain_table.py)
    await env.add_node("store-0")
    await until(lambda: len(c.live()) == 3)
    await c.create_topic("tj", 2, None, None)  # (the new node gets the topic too)
    after = [
        await env.nodes[n].store.append(Message("tj", n.encode(), queue_id=1)) for n in ("store-a", "store-b")
    ]
    got = await c.tail("tj", positions, 100, 0)
    # nothing replayed, nothing skipped: only the two new messages (the new node's queues are empty)
    assert sorted(m.body for m in got) == [b"store-a", b"store-b"]
    assert {m.queue_offset for m in got} == {r.queue_offset for r in after}
    assert set(positions) == {0, 1, 2, 3} and (await c.get_topic("tj")).queues == 4  # ids and count kept
