"""A proxy's `ClusterStoreClient` while its name server is gone or refilling (docs/cluster.md, "When
every name server is gone"), in process over real sockets: the last routes stay in use while no
name server answers (health says so), a restarted name server that lists only some nodes yet does
not make the proxy drop the others, one that has been up long enough is believed at once, and the
name server protocol's HELLO (version, features, uptime; version 0 for a name server without it)."""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster.remote_store import ClusterStoreClient
from cluster.store_node import StoreNode, StoreNodeConfig
from namesrv.client import NameServerClient
from namesrv.config import NamesrvSettings
from namesrv.server import NameServer
from namesrv.version import BASE_FEATURES, HELLO
from store import Message, Store, StoreConfig

LEASE = dict(lease_period_s=0.2, lease_expiry_s=5.0)


def settings(port: int = 0) -> NamesrvSettings:
    return NamesrvSettings(port=port, scan_interval_s=0.05, **LEASE)


async def until(cond, timeout: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


class Env:
    def __init__(self, root) -> None:  # noqa: ANN001
        self.root = root
        self.ns: NameServer | None = None
        self.nodes: dict[str, StoreNode] = {}

    async def start_ns(self, port: int = 0) -> NameServer:
        self.ns = NameServer(settings(port))
        await self.ns.start()
        return self.ns

    async def add_node(self, name: str) -> StoreNode:
        assert self.ns is not None
        store = await Store.open(StoreConfig(data_dir=str(self.root / name), flush="async"))
        node = StoreNode(StoreNodeConfig(name=name, port=0, namesrv=self.ns.address, **LEASE), store)
        await node.start()
        self.nodes[name] = node
        return node

    def hold_heartbeats(self, name: str) -> None:
        self.nodes[name]._registration.cancel()

    def resume_heartbeats(self, name: str) -> None:
        node = self.nodes[name]
        node._registration = node.namesrv.keep_registered(node.register, 0.2)

    async def close(self) -> None:
        for node in self.nodes.values():
            await node.stop(0)
            await node.store.close()
        if self.ns is not None:
            await self.ns.stop()


@pytest.fixture
async def env(tmp_path):
    e = Env(tmp_path)
    await e.start_ns()
    await e.add_node("store-a")
    await e.add_node("store-b")
    yield e
    await e.close()


async def client(env: Env, grace_s: float) -> ClusterStoreClient:
    assert env.ns is not None
    c = ClusterStoreClient(env.ns.address, refresh_s=0.05, namesrv_grace_s=grace_s)
    await c.start(wait_s=5)
    await until(lambda: len(c.live()) == 2)
    return c


async def refreshes(c: ClusterStoreClient, n: int) -> None:
    at = c.refreshes
    await until(lambda: c.refreshes >= at + n)


async def test_no_name_server_keeps_the_last_routes_and_health_says_so(env):
    c = await client(env, 5.0)
    try:
        await c.create_topic("t", 1, None, None)
        assert c.health() == {
            "namesrv": "ok", "store_nodes_live": ["store-a", "store-b"],
            "store_nodes_known": ["store-a", "store-b"], "problems": [],
        }  # fmt: skip
        port = env.ns.port
        await env.ns.stop()
        await refreshes(c, 3)
        h = c.health()
        assert h["namesrv"] == "unreachable" and h["store_nodes_live"] == ["store-a", "store-b"]
        assert h["problems"] and "no name server" in h["problems"][0]
        results = [await c.append(Message("t", b"%d" % i)) for i in range(20)]
        assert {r.queue_id for r in results} == {0, 1}  # both nodes take sends
        got = []
        while len(got) < 20:
            popped = await c.pop("g", "t", 32, 30_000, wait_ms=500)
            assert popped
            await c.ack_many([p.receipt_handle for p in popped])
            got += [p.message.body for p in popped]
        assert sorted(got) == sorted(b"%d" % i for i in range(20))
        await env.start_ns(port)  # back, empty; the nodes' next heartbeats refill it
        await until(lambda: c.health()["problems"] == [])
        assert len(env.ns.routes.brokers) == 2
    finally:
        await c.close()


async def test_a_node_restarted_while_no_name_server_answers_is_connected_again(env):
    c = await client(env, 5.0)
    try:
        await c.create_topic("t", 1, None, None)
        await env.ns.stop()
        await refreshes(c, 2)
        b = env.nodes.pop("store-b")
        port = int(b.address.rsplit(":", 1)[1])
        await b.stop(0)
        await b.store.close()
        await until(lambda: [n.name for n in c.live()] == ["store-a"])  # its connection broke
        store = await Store.open(StoreConfig(data_dir=str(env.root / "store-b"), flush="async"))
        config = StoreNodeConfig(name="store-b", port=port, namesrv=env.ns.address, **LEASE)
        env.nodes["store-b"] = node = StoreNode(config, store)
        await node.start()
        await until(lambda: [n.name for n in c.live()] == ["store-a", "store-b"])  # no name server
        results = [await c.append(Message("t", b"x")) for _ in range(4)]
        assert {r.queue_id for r in results} == {0, 1}
    finally:
        await c.close()


async def test_a_restarted_name_server_that_lists_one_node_yet_does_not_drop_the_other(env):
    c = await client(env, 5.0)
    try:
        port = env.ns.port
        env.hold_heartbeats("store-b")
        await env.ns.stop()
        await env.start_ns(port)  # store-a registers again, store-b not yet
        await until(lambda: list(env.ns.routes.brokers) == ["store-a"] or len(env.ns.routes.brokers) == 1)
        await refreshes(c, 5)
        assert [n.name for n in c.live()] == ["store-a", "store-b"]
        assert c.health()["problems"] == ["store nodes kept while not listed: store-b"]
        env.resume_heartbeats("store-b")
        await until(lambda: c.health()["problems"] == [])
        assert [n.name for n in c.live()] == ["store-a", "store-b"]
    finally:
        await c.close()


async def test_a_name_server_up_longer_than_the_grace_is_believed_at_once(env):
    c = await client(env, 0.3)
    try:
        await asyncio.sleep(0.4)  # the name server is older than the grace
        env.hold_heartbeats("store-b")
        b = env.nodes["store-b"]
        await b.namesrv.unregister_broker(cluster="DefaultCluster", name="store-b", addr=b.advertised)
        await until(lambda: [n.name for n in c.live()] == ["store-a"])  # dropped, connection open
    finally:
        await c.close()


async def test_name_server_hello_gives_version_features_and_uptime(env):
    ns = NameServerClient(env.ns.address)
    try:
        await ns.cluster_info()
        info = ns.info[env.ns.address]
        assert info.version == 1 and {"hello", "uptime", "routes", "proxies"} <= info.features
        assert info.uptime_s is not None and 0 <= info.uptime_s < 30
        age = ns.listing_age_s()
        assert age is not None and age >= info.uptime_s
    finally:
        await ns.close()


async def test_a_name_server_without_hello_is_version_0_and_still_serves(env):
    del env.ns.handlers[HELLO]  # as a name server from before the handshake answers it
    ns = NameServerClient(env.ns.address)
    try:
        assert "store-a" in (await ns.cluster_info())["brokerAddrTable"]
        info = ns.info[env.ns.address]
        assert (info.version, info.features, info.uptime_s) == (0, BASE_FEATURES, None)
        assert ns.listing_age_s() is not None  # counted from the connection
    finally:
        await ns.close()


async def test_a_returning_name_server_is_refilled_within_a_second_not_a_lease_period(tmp_path):
    """Store nodes renew every 30 s here; a name server that restarts (or comes back after an
    outage) has them again within about a second: a closed connection and a missing name server
    make the next renewal due at once or within RETRY_S."""
    ns = NameServer(settings())
    await ns.start()
    port = ns.port
    store = await Store.open(StoreConfig(data_dir=str(tmp_path / "s"), flush="async"))
    node = StoreNode(
        StoreNodeConfig(name="s", port=0, namesrv=ns.address, lease_period_s=30, lease_expiry_s=120), store
    )
    await node.start()
    try:
        assert list(ns.routes.brokers) == ["s"]
        await ns.stop()
        await asyncio.sleep(1.5)  # down for longer than one retry
        ns = NameServer(settings(port))
        await ns.start()
        t0 = time.monotonic()
        await until(lambda: list(ns.routes.brokers) == ["s"], 3)
        assert time.monotonic() - t0 < 1.5
    finally:
        await node.stop(0)
        await store.close()
        await ns.stop()
