"""Replication of a store's non-log state (cluster/state_replication.py) over real sockets: a
replica takes its primary's consumer progress, key-value data and topic/group settings, first
whole and then change by change; under the sync policy a key-value write is answered only once
the replicas the sends wait for applied it; and a replica that takes over hands out only what the
old primary's consumers had not acknowledged."""

from __future__ import annotations

import asyncio

import pytest

from cluster import store_wire as w
from cluster.nodes import NodeClient
from cluster.replication import Follower
from cluster.state_replication import StateFeed, StateFollower
from store import Message, StoreError, state_replica
from tests.cluster.test_replication import T, close_node, open_node, until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def nodes(tmp_path):
    opened = []

    async def make(name: str, **config):
        opened.append(await open_node(tmp_path, name, **config))
        return opened[-1]

    yield make
    for node in opened:
        await close_node(node)


async def follow(primary, replica, name: str = "b") -> tuple[Follower, StateFollower]:
    log = Follower(replica.store, name, primary.address, chunk=65536, wait_ms=200)
    state = StateFollower(replica.store, name, primary.address, wait_ms=200)
    log.start()
    state.start()
    await asyncio.wait_for(state.synced.wait(), T)
    return log, state


async def stop(*parts) -> None:
    for p in parts:
        await p.stop()


async def test_a_replica_takes_key_value_data_catalog_and_progress_whole_then_by_change(nodes):
    primary = await nodes("a")
    replica = await nodes("b")
    ps = primary.store
    primary.state_feed = StateFeed(ps)
    # state before the replica joins: copied whole
    await ps.kv.put("security.users", "alice", b"hash-1")
    await ps.kv.put("mqtt.sessions", "dev-1", b"session")
    ps.create_topic("orders", queues=3, retention_ms=60_000)
    ps.create_group("billing", max_attempts=4)
    for i in range(20):
        await ps.append(Message("orders", f"o{i}".encode(), queue_id=i % 3))
    popped = await ps.pop("billing", "orders", max_messages=20, invisible_time_ms=60_000)
    assert len(popped) == 20
    for p in popped[:12]:
        ps.ack(p.receipt_handle)
    await replica.store.kv.put("stale", "key", b"only on the replica")  # replaced by the copy
    log_f, state_f = await follow(primary, replica)
    rs = replica.store
    try:
        assert await rs.kv.get("security.users", "alice") == b"hash-1"
        assert await rs.kv.get("stale", "key") is None
        assert rs.topic("orders").queues == 3 and rs.topic("orders").retention_ms == 60_000
        assert rs.group("billing").max_attempts == 4
        await until(lambda: rs.inflight_count("billing", "orders") == 8)
        # then change by change
        await ps.kv.put("security.users", "bob", b"hash-2")
        await ps.kv.delete("mqtt.sessions", "dev-1")
        ps.create_topic("audit", queues=2)
        primary.state_feed.catalog_changed()  # (the node does this for catalog writes it serves)
        for p in popped[12:]:
            ps.ack(p.receipt_handle)
        await until(lambda: rs.inflight_count("billing", "orders") == 0, T)
        assert await rs.kv.get("security.users", "bob") == b"hash-2"
        assert await rs.kv.get("mqtt.sessions", "dev-1") is None
        await until(lambda: "audit" in {t.name for t in rs.topics()})
        assert rs.backlog("billing", "orders") == ps.backlog("billing", "orders") == 0
        for q in range(3):
            assert rs.committed_offset("billing", "orders", q) == ps.committed_offset("billing", "orders", q)
    finally:
        await stop(log_f, state_f)


async def test_the_replica_that_takes_over_hands_out_only_what_was_not_acknowledged(nodes):
    primary = await nodes("a")
    replica = await nodes("b")
    ps = primary.store
    primary.state_feed = StateFeed(ps)
    log_f, state_f = await follow(primary, replica)
    for i in range(30):
        await ps.append(Message("jobs", f"j{i}".encode()))
        primary.replication.appended()
    popped = await ps.pop("workers", "jobs", max_messages=30, invisible_time_ms=60_000)
    acked = {p.message.body for p in popped[:20]}
    for p in popped[:20]:
        ps.ack(p.receipt_handle)
    in_flight = popped[20:]
    rs = replica.store
    await until(lambda: rs.log_end == ps.log_end and rs.inflight_count("workers", "jobs") == 10)
    await stop(log_f, state_f)  # the primary is gone
    await rs.state.take_over()
    rs.resume_own_writes()
    # the messages in flight stay invisible until their deadline, and their handles still work
    assert await rs.pop("workers", "jobs", max_messages=30, invisible_time_ms=1000) == []
    for p in in_flight[:5]:
        rs.ack(p.receipt_handle)
    assert rs.inflight_count("workers", "jobs") == 5
    for p in in_flight[5:]:
        rs.change_invisible_time(p.receipt_handle, 0)
    again = await rs.pop("workers", "jobs", max_messages=30, invisible_time_ms=1000, wait_ms=2000)
    assert {p.message.body for p in again} == {p.message.body for p in in_flight[5:]}
    assert not acked & {p.message.body for p in again}


async def test_what_the_old_primary_may_have_handed_out_unreplicated_counts_as_redelivered(
    nodes, monkeypatch
):
    monkeypatch.setattr(state_replica, "UNCERTAIN_POPS", 5)
    primary = await nodes("a")
    replica = await nodes("b")
    ps = primary.store
    ps.create_topic("jobs", queues=1)
    primary.state_feed = StateFeed(ps)
    log_f, state_f = await follow(primary, replica)
    for i in range(30):
        await ps.append(Message("jobs", f"j{i}".encode()))
        primary.replication.appended()
    for p in await ps.pop("workers", "jobs", max_messages=10, invisible_time_ms=60_000):
        ps.ack(p.receipt_handle)
    rs = replica.store
    await until(lambda: rs.log_end == ps.log_end and rs.backlog("workers", "jobs") == 20)
    await stop(log_f, state_f)
    # handed out and acknowledged by the old primary, the pops never replicated: it dies
    lost = await ps.pop("workers", "jobs", max_messages=3, invisible_time_ms=60_000)
    for p in lost:
        ps.ack(p.receipt_handle)
    await rs.state.take_over()
    rs.resume_own_writes()
    got = await rs.pop("workers", "jobs", max_messages=30, invisible_time_ms=60_000)
    attempts = {p.message.body: p.message.reconsume_times + 1 for p in got}
    assert len(attempts) == 20 and {p.message.body for p in lost} <= set(attempts)
    # the window past the replicated cursor (5 here): a second delivery; after it, a first
    assert [attempts[f"j{i}".encode()] for i in range(10, 30)] == [2] * 5 + [1] * 15


async def test_sync_policy_answers_a_key_value_write_once_the_replicas_applied_it(nodes):
    primary = await nodes("a", replication="sync", min_insync=2, replication_timeout_s=0.5)
    replica = await nodes("b")
    primary.state_feed = StateFeed(primary.store)
    client = NodeClient("a", primary.address, 0, lambda *_: None)
    await client.connect(T)

    async def put(key: str, value: bytes) -> None:
        r = await client.call("kv_put", {"ns": "security.users", "key": key}, value)
        w.reply_value(r.body)

    log_f, state_f = await follow(primary, replica)
    try:
        primary.replication.required = {"b"}  # (the group member's part: b is in the SyncStateSet)
        await put("carol", b"h")
        assert await replica.store.kv.get("security.users", "carol") == b"h"  # before the answer
        r = await client.call(
            "create_topic", {"name": "ledger", "queues": 2, "retention_ms": None, "retention_bytes": None}
        )
        w.reply_value(r.body)
        assert replica.store.topic("ledger", create=False).queues == 2
        await state_f.stop()
        with pytest.raises(StoreError, match="not replicated to the SyncStateSet"):
            await put("dave", b"h")  # b is still required but no longer applies changes
        assert await replica.store.kv.get("security.users", "dave") is None
    finally:
        await client.close()
        await stop(log_f, state_f)


async def test_a_replica_too_far_behind_takes_a_whole_copy_again(nodes, monkeypatch):
    from cluster import state_replication

    monkeypatch.setattr(state_replication, "MAX_KV_CHANGES", 5)
    primary = await nodes("a")
    replica = await nodes("b")
    ps = primary.store
    primary.state_feed = StateFeed(ps)
    log_f, state_f = await follow(primary, replica)
    await state_f.stop()
    for i in range(20):  # more changes than the primary keeps
        await ps.kv.put("retained", f"t{i}", b"v")
    session = primary.state_feed.replicas["b"]
    state_f.start()
    try:
        await until(lambda: session.synced and state_f.kpos == primary.state_feed.kv_seq)
        assert len(await replica.store.kv.scan("retained")) == 20
    finally:
        await stop(log_f, state_f)
