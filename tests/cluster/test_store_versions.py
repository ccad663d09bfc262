"""The store protocol's version handshake (docs/cluster.md, "Upgrading node by node"), in process over
real sockets: a proxy learns each node's version and features at HELLO; a node from before HELLO
(version 0: "request code not supported") is used with the base operations; an operation a node
does not offer is never sent to it (a fallback where there is one, NodeTooOld otherwise); a node
that answers under another name than the name server lists is not used."""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster import store_wire as w
from cluster.nodes import NodeTooOld
from cluster.remote_store import ClusterStoreClient
from cluster.store_node import StoreNode, StoreNodeConfig
from namesrv.config import NamesrvSettings
from namesrv.server import NameServer
from remoting import ResponseCode
from store import Message, NotReplicated, Store, StoreConfig, StoreError


class RecordingNode(StoreNode):
    """A store node that records the request codes it gets, answers HELLO as `hello` says
    ("new", "old": not supported, or a features set) and under `hello_name`."""

    def __init__(self, *a, hello="new", hello_name=None, **kw) -> None:  # noqa: ANN001, ANN002, ANN003
        super().__init__(*a, **kw)
        self.codes: list[int] = []
        self.hello = hello
        self.hello_name = hello_name
        self.refuse_appends = False

    async def dispatch(self, conn, cmd):  # noqa: ANN001, ANN201
        self.codes.append(cmd.code)
        if cmd.code == w.HELLO and self.hello == "old":  # what a version 0 node answers
            return cmd.response(
                ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f"request type {cmd.code} not supported"
            )
        if cmd.code == w.HELLO and (self.hello != "new" or self.hello_name):
            features = w.FEATURES if self.hello == "new" else self.hello
            body = w.loads(w.hello_reply(self.hello_name or self.name, None))
            body["features"] = sorted(features)
            return cmd.response(ResponseCode.SUCCESS, None, None, w.dumps(body).encode())
        if cmd.code == w.OPS["append"] and self.refuse_appends:  # as a version 0 primary says it
            remark = "not replicated to the SyncStateSet within 3 s"
            return cmd.response(ResponseCode.SYSTEM_ERROR, remark, {"error": "StoreError"})
        return await super().dispatch(conn, cmd)


async def until(cond, timeout: float = 5.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def ns():
    n = NameServer(NamesrvSettings(port=0, lease_period_s=0.2, lease_expiry_s=5.0, scan_interval_s=0.05))
    await n.start()
    yield n
    await n.stop()


@pytest.fixture
async def cluster(ns, tmp_path):
    """start(**{node name: RecordingNode keywords}) -> (client, nodes)."""
    nodes: list[RecordingNode] = []
    clients: list[ClusterStoreClient] = []

    async def start(**kinds: dict) -> tuple[ClusterStoreClient, dict[str, RecordingNode]]:
        for name, kw in kinds.items():
            store = await Store.open(StoreConfig(data_dir=str(tmp_path / name), flush="async"))
            config = StoreNodeConfig(
                name=name, port=0, namesrv=ns.address, lease_period_s=0.2, lease_expiry_s=5
            )
            node = RecordingNode(config, store, **kw)
            await node.start()
            nodes.append(node)
        await until(lambda: len(ns.routes.brokers) == len(nodes))  # all registered
        c = ClusterStoreClient(ns.address, refresh_s=0.1)
        clients.append(c)
        await c.start(wait_s=5)
        return c, {n.name: n for n in nodes}

    yield start
    for c in clients:
        await c.close()
    for n in nodes:
        await n.stop(0)
        await n.store.close()


async def test_a_new_node_says_its_version_and_features(cluster):
    c, _ = await cluster(**{"store-a": {}})
    await until(lambda: len(c.live()) == 1)
    (node,) = c.live()
    assert (node.info.version, node.info.features, node.info.name) == (w.VERSION, w.FEATURES, "store-a")
    assert node.supports("ack_many") and node.supports("not_replicated")


async def test_a_node_from_before_hello_is_used_with_the_base_operations(cluster):
    c, nodes = await cluster(**{"store-a": {"hello": "old"}, "store-b": {}})
    await until(lambda: len(c.live()) == 2)
    a, b = c.live()
    assert (a.info.version, a.info.features) == (0, w.BASE_FEATURES)
    assert b.info.version == w.VERSION
    await c.create_topic("t", 2, None, None)
    for i in range(20):
        await c.append(Message("t", b"%d" % i))
    got = []
    while len(got) < 20:
        popped = await c.pop("g", "t", 32, 30_000, wait_ms=500)
        assert all(e is None for e in await c.ack_many([p.receipt_handle for p in popped]))
        got += [p.message.body for p in popped]
    assert sorted(got) == sorted(b"%d" % i for i in range(20))
    assert {n.name: n.codes.count(w.HELLO) for n in nodes.values()} == {"store-a": 1, "store-b": 1}


async def test_an_operation_the_node_does_not_offer_is_never_sent(cluster):
    fewer = w.FEATURES - {"ack_many", "tail"}
    c, nodes = await cluster(**{"store-a": {"hello": fewer}})
    await until(lambda: len(c.live()) == 1)
    node = nodes["store-a"]
    await c.create_topic("t", 1, None, None)
    for i in range(3):
        await c.append(Message("t", b"%d" % i))
    popped = await c.pop("g", "t", 32, 30_000)
    assert len(popped) == 3
    assert await c.ack_many([p.receipt_handle for p in popped]) == [None] * 3  # acked one by one
    assert w.OPS["ack_many"] not in node.codes and node.codes.count(w.OPS["ack"]) == 3
    assert await c.pop("g", "t", 32, 30_000) == []  # they were acked
    with pytest.raises(NodeTooOld):
        await c.live()[0].call("tail", {"topic": "t"})
    assert w.OPS["tail"] not in node.codes


async def test_a_node_answering_under_another_name_is_not_used(cluster):
    c, _ = await cluster(**{"store-a": {"hello_name": "store-z"}, "store-b": {}})
    await c.refresh()
    assert [n.name for n in c.live()] == ["store-b"]


@pytest.mark.parametrize("hello", ["old", "new"])
async def test_a_version_0_nodes_not_replicated_is_not_replicated(cluster, hello):
    c, nodes = await cluster(**{"store-a": {"hello": hello}})
    await until(lambda: len(c.live()) == 1)
    await c.create_topic("t", 1, None, None)
    nodes["store-a"].refuse_appends = True
    # five concurrent sends: two leave alone (two requests in flight), three wait and leave as one
    # batch, which a refusal sends again message by message unless it says NotReplicated
    results = await asyncio.gather(
        *(c.append(Message("t", b"%d" % i)) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, StoreError) for r in results)
    assert all(isinstance(r, NotReplicated) for r in results) is (hello == "old")  # version 0: read as such
    assert nodes["store-a"].codes.count(w.OPS["append"]) == (3 if hello == "old" else 6)
