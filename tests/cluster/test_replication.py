"""Commit log replication between store nodes (cluster/replication.py) over real sockets: a replica
follows its primary byte for byte, the primary counts its acknowledgements (the sync policy's
basis), and an old primary that comes back truncates what the new primary never had."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster import store_wire as w
from cluster.nodes import NodeClient
from cluster.replication import Follower, Primary
from cluster.store_node import StoreNode, StoreNodeConfig
from store import Message, Store, StoreConfig, StoreError

SEGMENT = 64 * 1024
T = 10.0


async def open_node(root: Path, name: str, **config) -> StoreNode:
    store = await Store.open(
        StoreConfig(data_dir=str(root / name), flush="sync", segment_size=SEGMENT, default_queues=2)
    )
    node = StoreNode(StoreNodeConfig(name=name, port=0, **config), store)
    node.replication = Primary(store)
    await node.start()
    return node


async def close_node(node: StoreNode) -> None:
    await node.stop(0)
    await node.store.close()


async def write(node: StoreNode, prefix: str, n: int) -> None:
    """`n` messages of mixed sizes, tags, keys and topics appended on `node`'s store."""
    for i in range(n):
        body = f"{prefix}-{i}".encode() * (1 + i % 40)
        m = Message(f"t{i % 3}", body, tag=f"tag{i % 4}", keys=(f"{prefix}-k{i}",))
        await node.store.append(m)
        node.replication.appended()


async def until(cond, timeout: float = T) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


def _read_all(store: Store, end: int) -> bytes:
    out, pos = bytearray(), 0
    while pos < end:
        chunk = store.read_log_chunk(pos, 1 << 20)
        assert chunk, pos
        out += chunk
        pos += len(chunk)
    return bytes(out)


def contents(store: Store) -> dict[tuple[str, int], list[tuple[bytes, str, tuple[str, ...]]]]:
    out = {}
    for t in store.topics():
        if t.name.startswith("%"):
            continue
        for q in range(t.queues):
            msgs = store.read(t.name, q, store.min_offset(t.name, q), max_messages=10_000)
            out[(t.name, q)] = [(m.body, m.tag, m.keys) for m in msgs]
    return out


@pytest.fixture
async def nodes(tmp_path):
    opened: list[StoreNode] = []

    async def make(name: str, **config) -> StoreNode:
        node = await open_node(tmp_path, name, **config)
        opened.append(node)
        return node

    yield make
    for node in opened:
        await close_node(node)


async def test_a_replica_follows_byte_for_byte_and_acknowledges(nodes):
    primary, replica = await nodes("a"), await nodes("b")
    await write(primary, "before", 150)  # across several 64 KiB segments
    follower = Follower(replica.store, "b", primary.address, chunk=8192, wait_ms=500)
    follower.start()
    try:
        await until(lambda: replica.store.log_end == primary.store.log_end)
        await write(primary, "live", 60)  # while following: pulls are woken by the appends
        end = primary.store.log_end
        primary.replication.required = {"b"}
        assert await primary.replication.wait_replicated(end, T)
        assert replica.store.log_end == end
        assert _read_all(replica.store, end) == _read_all(primary.store, end)
        assert contents(replica.store) == contents(primary.store)
        m = replica.store.get_by_key("live-k7")
        assert [x.body for x in m] == [b"live-7" * 8]
        assert primary.replication.in_sync(max_lag=0, max_age_s=5.0) == ["b"]
    finally:
        await follower.stop()
    # with the replica gone, a send is not replicated in time: the sync policy refuses it
    await write(primary, "alone", 1)
    assert not await primary.replication.wait_replicated(primary.store.log_end, 0.3)


async def test_an_old_primary_rejoins_truncating_what_the_new_one_never_had(nodes):
    a, b = await nodes("a"), await nodes("b")
    a.store.epochs.start(1, 0)
    await write(a, "e1", 80)
    follower = Follower(b.store, "b", a.address, chunk=16384, wait_ms=300)
    follower.start()
    await until(lambda: b.store.log_end == a.store.log_end)
    await follower.stop()
    common = a.store.log_end
    await write(a, "lost", 30)  # never replicated: never acknowledged under the sync policy
    # b becomes primary at epoch 2 and takes writes; a comes back as its replica
    b.store.epochs.start(2, b.store.log_end)
    await write(b, "e2", 50)
    rejoin = Follower(a.store, "a", b.address, chunk=16384, wait_ms=300)
    rejoin.start()
    try:
        await until(lambda: a.store.log_end == b.store.log_end and rejoin.connected.is_set())
        assert rejoin.truncated == [common]
        end = b.store.log_end
        assert _read_all(a.store, end) == _read_all(b.store, end)
        assert contents(a.store) == contents(b.store)
        assert a.store.get_by_key("lost-k3") == []
        assert [tuple(e) for e in a.store.epochs.entries] == [(1, 0), (2, common)]
    finally:
        await rejoin.stop()


async def test_sync_policy_acknowledges_a_send_only_once_a_replica_holds_it(nodes):
    primary = await nodes("a", replication="sync", min_insync=2, replication_timeout_s=0.5)
    replica = await nodes("b")
    primary.store.create_topic("orders", queues=2)
    client = NodeClient("a", primary.address, 0, lambda *_: None)
    await client.connect(T)

    async def send(body: bytes) -> list:
        r = await client.call("append", None, w.encode_messages([Message("orders", body)]))
        return w.reply_value(r.body)

    try:
        end = primary.store.log_end
        with pytest.raises(StoreError, match="1 of the 2 nodes"):
            await send(b"nobody in sync")
        assert primary.store.log_end == end  # refused before it was written
        follower = Follower(replica.store, "b", primary.address, chunk=8192, wait_ms=200)
        follower.start()
        await until(lambda: primary.replication.in_sync(0, 0.5) == ["b"])
        primary.replication.required = {"b"}  # (the group member's part: b joined the SyncStateSet)
        (res,) = await send(b"replicated")
        assert replica.store.log_end >= res[4] + res[5]  # acknowledged: the replica holds it
        assert [m.body for m in replica.store.read("orders", res[2], res[3])] == [b"replicated"]
        await follower.stop()
        with pytest.raises(StoreError, match="not replicated to the SyncStateSet"):
            await send(b"replica gone")  # b is still required, but it never acknowledges
        primary.replication.required = set()  # (b left the SyncStateSet)
        with pytest.raises(StoreError, match="1 of the 2 nodes"):
            await send(b"replica out of the set")
    finally:
        await client.close()


async def test_a_replica_that_pulls_but_never_catches_up_is_lagging(nodes):
    primary = await nodes("a")
    fast, slow = await nodes("b"), await nodes("c")
    slow_apply = slow.store.apply_log_chunk

    async def crawl(start: int, data: bytes) -> int:  # a slow disk: one small chunk per 50 ms
        await asyncio.sleep(0.05)
        return await slow_apply(start, data)

    slow.store.apply_log_chunk = crawl
    followers = [
        Follower(fast.store, "b", primary.address, chunk=1 << 20, wait_ms=200),
        Follower(slow.store, "c", primary.address, chunk=2048, wait_ms=200),
    ]
    for f in followers:
        f.start()
    try:
        await until(lambda: set(primary.replication.replicas) == {"b", "c"})
        assert primary.replication.lagging(1.0) == set()
        deadline = asyncio.get_running_loop().time() + 2.5
        while asyncio.get_running_loop().time() < deadline:  # appends faster than c applies them
            await write(primary, "load", 20)
            await asyncio.sleep(0.01)
        await until(lambda: fast.store.log_end == primary.store.log_end)  # b caught up just now
        assert primary.replication.lagging(1.0) == {"c"}  # c still pulls, but never caught up
        assert set(primary.replication.in_sync(None, 1.0)) == {"b", "c"}
    finally:
        for f in followers:
            await f.stop()
