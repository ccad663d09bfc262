"""The SyncStateSet shrinks under the sends in flight (cluster/group.py, cluster/replication.py):
a replica group of three in-process store nodes, sync replication with min-insync 2, a real etcd.
A replica that stops pulling (frozen, as SIGSTOP freezes a process) while a send waits for it
leaves the set once that send has waited `stall_s`, and the send is acknowledged by the other
replica well within the replication timeout; a write is never acknowledged by fewer nodes than
min-insync, even when the set shrinks under it."""

from __future__ import annotations

import asyncio
import time
import uuid
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

pytestmark = [
    pytest.mark.skipif(etcd_missing(), reason="etcd is not installed (deps/debian-packages.txt)"),
    pytest.mark.timeout(60),
]
T = 15.0
TIMEOUT_S = 3.0  # the replication timeout (the default of `gateway store`)


class Member:
    """One node of the group; `freeze()` stops its pulls without a word (as SIGSTOP would)."""

    def __init__(self, root: Path, name: str, endpoint: str, prefix: str, in_sync_age_s: float) -> None:
        self.root, self.name, self.endpoint, self.prefix = root, name, endpoint, prefix
        self.in_sync_age_s = in_sync_age_s

    async def start(self) -> Member:
        self.store = await Store.open(StoreConfig(data_dir=str(self.root / self.name), flush="sync"))
        config = StoreNodeConfig(
            name=self.name,
            port=0,
            group="g",
            replication="sync",
            min_insync=2,
            replication_timeout_s=TIMEOUT_S,
        )
        self.node = StoreNode(config, self.store)
        await self.node.start()
        self.controller = EtcdController(self.endpoint, prefix=self.prefix, lease_ttl_s=2)
        self.member = GroupMember(
            self.node, self.controller, "g", poll_s=0.2, in_sync_age_s=self.in_sync_age_s, wait_ms=300
        )
        await self.member.start()
        return self

    async def freeze(self) -> None:
        task, self.member._task = self.member._task, None
        assert task is not None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await self.member._stop_following()

    def thaw(self) -> None:
        self.member._task = asyncio.get_running_loop().create_task(self.member._run())

    async def stop(self) -> None:
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


@pytest.fixture
async def group(tmp_path, etcd) -> AsyncIterator:
    started: list[Member] = []

    async def make(in_sync_age_s: float) -> tuple[Member, Member, Member]:
        prefix = f"/isr-{uuid.uuid4().hex}"
        a = await Member(tmp_path, "a", etcd.endpoint, prefix, in_sync_age_s).start()
        started.append(a)
        assert a.member.role == "primary"
        a.store.create_topic("orders", queues=2)
        for name in ("b", "c"):
            started.append(await Member(tmp_path, name, etcd.endpoint, prefix, in_sync_age_s).start())
        await until(lambda: set(a.member.state.sync_state_set) == {"a", "b", "c"})
        await send(a.node, b"all three")
        return started[0], started[1], started[2]

    yield make
    for m in started:
        await m.stop()


async def test_a_send_in_flight_when_a_replica_stops_is_acknowledged_by_the_others(group):
    # in_sync_age_s longer than the replication timeout: only the stalled send takes b out in time
    a, b, c = await group(in_sync_age_s=5.0)
    await b.freeze()
    t0 = time.monotonic()
    (res,) = await send(a.node, b"in flight")  # refused after 3 s before the shrink under sends
    took = time.monotonic() - t0
    assert took < TIMEOUT_S - 0.5, took  # the stall (1 s) and one etcd write, not the timeout
    assert set(a.member.state.sync_state_set) == {"a", "c"}
    assert c.store.log_end >= res[4] + res[5]  # the remaining in-sync replica holds it
    t0 = time.monotonic()
    await send(a.node, b"without b")
    assert time.monotonic() - t0 < 0.5  # b is no longer waited for
    # b comes back: it catches up and rejoins; sends wait for it again
    b.thaw()
    await until(lambda: set(a.member.state.sync_state_set) == {"a", "b", "c"})
    (res,) = await send(a.node, b"with b again")
    assert b.store.log_end >= res[4] + res[5]


async def test_a_send_is_never_acknowledged_by_fewer_nodes_than_min_insync(group):
    # both replicas stop: one may leave for the stalled send, the other leaves by the age rule
    # (1.5 s, before the timeout), and the send, held by the primary alone, is not acknowledged
    a, b, c = await group(in_sync_age_s=1.5)
    await b.freeze()
    await c.freeze()
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="not replicated"):
        await send(a.node, b"alone")
    assert time.monotonic() - t0 >= TIMEOUT_S - 0.1
    assert set(a.member.state.sync_state_set) == {"a"}
    with pytest.raises(StoreError, match="1 of the 2 nodes"):  # refused before it is written
        await send(a.node, b"refused")
