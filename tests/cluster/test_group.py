"""A replica group of two store nodes (cluster/group.py) with a real etcd as the controller: the
first node is elected, the second follows it into the SyncStateSet, sends are acknowledged once
both hold them; when the primary dies without a word, the replica is elected at the next epoch
and holds every acknowledged message; the old primary comes back as a replica, truncates what it
wrote that was never acknowledged, and catches up byte for byte."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cluster import store_wire as w
from cluster.controller import EtcdController
from cluster.group import GroupMember
from cluster.nodes import NodeClient
from cluster.store_node import StoreNode, StoreNodeConfig
from store import Message, Store, StoreConfig, StoreError
from tests.cluster.etcd_support import etcd_missing

pytestmark = pytest.mark.skipif(etcd_missing(), reason="etcd is not installed (deps/debian-packages.txt)")

TTL = 2  # the primary's lease (s): a dead primary's claim is gone within this
T = 15.0


class Member:
    """One node of the group: its store, store node, controller client and GroupMember."""

    def __init__(self, root: Path, name: str, endpoint: str) -> None:
        self.root, self.name, self.endpoint = root, name, endpoint

    async def start(self) -> Member:
        self.store = await Store.open(
            StoreConfig(data_dir=str(self.root / self.name), flush="sync", segment_size=64 * 1024)
        )
        config = StoreNodeConfig(
            name=self.name,
            port=0,
            group="g",
            replication="sync",
            min_insync=2,
            replication_timeout_s=1.0,
        )
        self.node = StoreNode(config, self.store)
        await self.node.start()
        self.controller = EtcdController(self.endpoint, prefix=f"/t-{id(self.root)}", lease_ttl_s=TTL)
        self.member = GroupMember(self.node, self.controller, "g", poll_s=0.2, in_sync_age_s=1.5, wait_ms=300)
        await self.member.start()
        return self

    async def crash(self) -> None:
        """Stop without resigning or unregistering anything (as `kill -9` would)."""
        await self.member.stop(resign=False)
        await self.node.stop(0)
        await self.store.close()
        await self.controller.close()


async def until(cond, timeout: float = T) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.02)


async def send(node: StoreNode, body: bytes) -> list:
    client = NodeClient(node.name, node.address, 0, lambda *_: None)
    await client.connect(T)
    try:
        r = await client.call("append", None, w.encode_messages([Message("orders", body)]))
        return w.reply_value(r.body)
    finally:
        await client.close()


def log_bytes(store: Store, end: int) -> bytes:
    out, pos = bytearray(), 0
    while pos < end:
        chunk = store.read_log_chunk(pos, 1 << 20)
        out += chunk
        pos += len(chunk)
    return bytes(out)


def bodies(store: Store) -> set[bytes]:
    return {
        m.body
        for q in range(store.queue_count("orders"))
        for m in store.read("orders", q, 0, max_messages=1000)
    }


@pytest.fixture
async def members(tmp_path, etcd) -> AsyncIterator[dict[str, Member]]:
    out: dict[str, Member] = {}
    yield out
    for m in out.values():
        if not m.store._closed:
            await m.crash()


async def test_failover_keeps_every_acknowledged_message_and_the_old_primary_rejoins(tmp_path, etcd, members):
    a = members["a"] = await Member(tmp_path, "a", etcd.endpoint).start()
    assert a.member.role == "primary" and a.member.state.epoch == 1
    a.store.create_topic("orders", queues=2)
    b = members["b"] = await Member(tmp_path, "b", etcd.endpoint).start()
    assert b.member.role == "replica"
    with pytest.raises(StoreError, match="serves reads only"):
        await send(b.node, b"to a replica")
    await until(lambda: set(a.member.state.sync_state_set) == {"a", "b"})
    acked = []
    for i in range(20):
        await send(a.node, f"m{i}".encode())
        acked.append(f"m{i}".encode())
    assert bodies(b.store) == set(acked)  # acknowledged: on both
    # a record the primary wrote but never acknowledged (it died before its replica had it)
    await a.store.append(Message("orders", b"never acknowledged"))
    common = b.store.log_end
    await a.crash()
    t0 = time.monotonic()
    await until(lambda: b.member.role == "primary")
    failover_s = time.monotonic() - t0
    assert failover_s < TTL + 3  # the lease runs out, then the next poll elects the in-sync replica
    assert b.member.state.epoch == 2 and b.store.epochs.current == (2, common)
    assert bodies(b.store) == set(acked)
    with pytest.raises(StoreError, match="1 of the 2 nodes"):  # min-insync 2: alone, it refuses
        await send(b.node, b"alone")
    # the old primary comes back: a replica now, it truncates its unacknowledged tail and catches up
    a = members["a"] = await Member(tmp_path, "a", etcd.endpoint).start()
    assert a.member.role == "replica"
    await until(lambda: set(b.member.state.sync_state_set) == {"a", "b"})
    assert a.member.follower is not None and a.member.follower.truncated == [common]
    (res,) = await send(b.node, b"after the failover")
    acked.append(b"after the failover")
    await until(lambda: a.store.log_end == b.store.log_end)
    assert log_bytes(a.store, b.store.log_end) == log_bytes(b.store, b.store.log_end)
    assert bodies(a.store) == bodies(b.store) == set(acked)
    assert res[4] >= common
