"""Reads while degraded (docs/cluster.md): the replicas of a replica group register with the name
server beside the primary (broker ids >= 1), and a proxy reads from one while the group has no
primary. Here a group of two (sync, min-insync 2), a name server and a proxy as real processes
with a real etcd: with etcd stopped (no failover possible) and the primary killed with `kill -9`,
the Spark read API of the proxy still returns every message while sends are refused with 503;
once etcd is back the replica is elected, registers as the master, and sends work again when the
old primary has rejoined as a replica. Also: the name server's side of the scheme (RouteInfo, pure)
and a demoted primary registering again as a replica at once (in-process nodes, real etcd)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from analytics.client import GatewayError, ReadClient
from cluster.controller import EtcdController
from cluster.group import GroupMember
from cluster.ids import replica_broker_id
from cluster.store_node import StoreNode, StoreNodeConfig
from conformance.gateway_proc import GatewayProc as Proc
from namesrv.client import NameServerClient
from namesrv.config import NamesrvSettings
from namesrv.routeinfo import RouteInfo, TopicQueues
from namesrv.server import NameServer
from remoting.codes import MASTER_ID
from store import Store, StoreConfig
from tests.cluster.etcd_support import EtcdProcess, etcd_missing
from tests.cluster.support import LEASE, Cluster, _ready

TOPIC = "sensors"
GROUP = "g1"
N = 60


def test_replicas_register_beside_the_master_and_a_new_master_replaces_the_dead_one() -> None:
    """The name server side of the scheme (namesrv/routeinfo.py, RocketMQ's BrokerData model)."""
    routes = RouteInfo()
    a_conn, b_conn = object(), object()
    b_id = replica_broker_id("b")
    assert b_id >= 1 and b_id == replica_broker_id("b") != replica_broker_id("a")
    topics = {TOPIC: TopicQueues(4, 4)}
    routes.register_broker(
        cluster="c", addr="h:1", name=GROUP, broker_id=0, topics=topics, conn=a_conn, now=0
    )
    routes.register_broker(cluster="c", addr="h:2", name=GROUP, broker_id=b_id, topics={}, conn=b_conn, now=0)
    brokers, queues = routes.route(TOPIC) or ([], [])
    assert brokers[0].addrs == {MASTER_ID: "h:1", b_id: "h:2"}
    assert [q.read_queues for q in queues] == [4]  # a replica's (empty) topics do not replace the master's
    routes.connection_closed(a_conn)  # the primary dies: its topics stay routable via the replica
    brokers, _ = routes.route(TOPIC) or ([], [])
    assert brokers[0].addrs == {b_id: "h:2"}
    # the replica elected registers as the master: one address, under id 0
    routes.register_broker(
        cluster="c", addr="h:2", name=GROUP, broker_id=0, topics=topics, conn=b_conn, now=1
    )
    # the old primary back as a replica
    a_id = replica_broker_id("a")
    routes.register_broker(cluster="c", addr="h:3", name=GROUP, broker_id=a_id, topics={}, now=1)
    assert routes.broker_list()[0].addrs == {MASTER_ID: "h:2", a_id: "h:3"}
    # a stale master registration is replaced by the new one (and its lease dropped)
    routes.register_broker(cluster="c", addr="h:4", name=GROUP, broker_id=0, topics=topics, now=2)
    assert routes.broker_list()[0].addrs == {MASTER_ID: "h:4", a_id: "h:3"}
    assert "h:2" not in routes.leases


async def start_in_process(root: Path, name: str, namesrv: str, etcd: str, poll_s: float) -> GroupMember:
    """A group member in this process, registering with `namesrv` (lease renewals every 30 s: any
    registration seen sooner comes from a role change)."""
    store = await Store.open(StoreConfig(data_dir=str(root / name), flush="sync"))
    config = StoreNodeConfig(
        name=name, port=0, namesrv=namesrv, group="g", lease_period_s=30, min_insync=2, replication="sync"
    )
    node = StoreNode(config, store)
    await node.start()
    controller = EtcdController(etcd, prefix=f"/demote-{id(root)}", lease_ttl_s=2)
    member = GroupMember(node, controller, "g", poll_s=poll_s, in_sync_age_s=1.5, wait_ms=300)
    await member.start()
    return member


@pytest.mark.skipif(etcd_missing(), reason="etcd is not installed (deps/debian-packages.txt)")
async def test_a_demoted_primary_registers_again_as_a_replica(tmp_path, etcd: EtcdProcess) -> None:
    """The primary loses its claim (its etcd lease revoked): the replica, polling faster, is
    elected and registers as the master; the old primary steps down and registers as a replica
    at once, not at its next lease renewal."""
    ns = NameServer(NamesrvSettings(port=0, lease_expiry_s=120, scan_interval_s=0.05))
    await ns.start()
    members: list[GroupMember] = []
    try:
        members.append(await start_in_process(tmp_path, "a", ns.address, etcd.endpoint, 1.0))
        members.append(await start_in_process(tmp_path, "b", ns.address, etcd.endpoint, 0.1))
        a, b = members
        assert a.role == "primary" and b.role == "replica"
        addrs = {m.name: m.node.advertised for m in members}

        def listed() -> dict[int, str]:
            return next((bd.addrs for bd in ns.routes.broker_list() if bd.name == "g"), {})

        assert await until(
            lambda: listed() == {MASTER_ID: addrs["a"], replica_broker_id("b"): addrs["b"]}, 5, "both"
        )
        await until(lambda: a.state is not None and set(a.state.sync_state_set) == {"a", "b"}, 10, "in sync")
        revoker = EtcdController(etcd.endpoint, prefix=f"/demote-{id(tmp_path)}")
        try:
            assert a.state is not None
            await revoker.resign("g", a.state)
        finally:
            await revoker.close()
        await until(lambda: a.role == "replica" and b.role == "primary", 10, "b elected, a stepped down")
        want = {MASTER_ID: addrs["b"], replica_broker_id("a"): addrs["a"]}
        await until(lambda: listed() == want, 5, "b registered as the master, a as a replica")
    finally:
        for m in members:
            await m.stop(resign=False)
            await m.node.stop(0)
            await m.node.store.close()
            await m.controller.close()
        await ns.stop()


def start_member(c: Cluster, name: str, etcd: str) -> Proc:
    args = ["store", "--data-dir", str(c.root / name), "--port", "0", "--name", name, "--namesrv", c.namesrv]
    args += [*LEASE, "--flush", "sync", "--group", GROUP, "--controller", etcd]
    p = Proc([*args, "--replication", "sync", "--min-insync", "2"], name)
    c.procs.append(p)
    c.stores[name] = (p, _ready(p)["store"])
    return p


async def group_state(etcd: str):
    controller = EtcdController(etcd)
    try:
        return await controller.state(GROUP)
    finally:
        await controller.close()


async def until(cond, timeout: float, what: str):
    """Poll `cond` (a function, or a coroutine function) until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.1)


def registered(namesrv: str, want: dict[int, str]):
    """A condition: the name server lists group GROUP with exactly these {broker id: address}."""

    async def check() -> bool:
        ns = NameServerClient(namesrv)
        try:
            table = (await ns.cluster_info()).get("brokerAddrTable") or {}
        finally:
            await ns.close()
        addrs = (table.get(GROUP) or {}).get("brokerAddrs") or {}
        return {int(k): v for k, v in addrs.items()} == want

    return check


def events(ids: list[str]) -> list[dict[str, str]]:
    return [
        {
            "specversion": "1.0",
            "id": i,
            "source": "/t",
            "type": "t",
            "datacontenttype": "text/plain",
            "data": i,
        }
        for i in ids
    ]


def read_bodies(read: ReadClient) -> list[bytes]:
    """Every message of TOPIC through the read API, as the Spark source reads it (queues, then
    offset ranges as Arrow batches)."""
    out: list[bytes] = []
    for q, (lo, hi) in sorted(read.queues(TOPIC).items()):
        for batch in read.read_range(TOPIC, q, lo, hi):
            out += batch.column("body").to_pylist()
    return out


@pytest.mark.skipif(etcd_missing(), reason="etcd is not installed (deps/debian-packages.txt)")
@pytest.mark.timeout(120)
async def test_offset_reads_survive_the_loss_of_the_primary_and_sends_are_refused(
    tmp_path, etcd: EtcdProcess
):
    c = Cluster(tmp_path)
    try:
        c.start_namesrv()
        for name in ("a", "b"):
            start_member(c, name, etcd.endpoint)
        (listeners,) = c.start_proxies(1, "http")

        async def both_in_sync():
            s = await group_state(etcd.endpoint)
            return s if s is not None and s.primary and set(s.sync_state_set) == {"a", "b"} else None

        state = await until(both_in_sync, 20, "both nodes in the SyncStateSet")
        primary, replica = state.primary, ({"a", "b"} - {state.primary}).pop()
        addr = {n: c.stores[n][1] for n in ("a", "b")}
        want = {MASTER_ID: addr[primary], replica_broker_id(replica): addr[replica]}
        await until(registered(c.namesrv, want), 10, "the replica registered beside the primary")
        read = ReadClient(f"http://{listeners['http']}", timeout=15)
        sent = [f"m{i}" for i in range(N)]
        read.publish_events(TOPIC, events(sent))
        assert sorted(read_bodies(read)) == sorted(s.encode() for s in sent)

        # no controller, no primary: nothing can be elected, the replica alone holds the data
        etcd.stop()
        proc = c.stores[primary][0].p
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        await until(registered(c.namesrv, {replica_broker_id(replica): addr[replica]}), 10, "primary gone")
        t0 = time.monotonic()
        assert sorted(read_bodies(read)) == sorted(s.encode() for s in sent)
        assert time.monotonic() - t0 < 5  # from the replica at once, not after a request timeout
        with pytest.raises(GatewayError) as refused:
            read.publish_events(TOPIC, events(["while-degraded"]))
        assert refused.value.status == 503, refused.value
        with pytest.raises(GatewayError) as refused:  # committing progress is a write too
            read.commit("spark", TOPIC, {0: 1})
        assert refused.value.status == 503, refused.value

        # etcd back: the replica is elected once the dead primary's claim expires and registers as
        # the master; with min-insync 2, sends wait for the old primary, which rejoins as a replica
        etcd.start()

        async def replica_elected():
            s = await group_state(etcd.endpoint)
            return s if s is not None and s.primary == replica and s.epoch > state.epoch else None

        await until(replica_elected, 20, "the replica elected")
        await until(registered(c.namesrv, {MASTER_ID: addr[replica]}), 10, "the replica as the master")
        start_member(c, primary, etcd.endpoint)
        addr[primary] = c.stores[primary][1]
        await until(both_in_sync, 30, "the old primary back in the SyncStateSet")
        want = {MASTER_ID: addr[replica], replica_broker_id(primary): addr[primary]}
        await until(registered(c.namesrv, want), 10, "the old primary registered as a replica")

        async def send_works() -> bool:
            try:
                read.publish_events(TOPIC, events(["after"]))
            except GatewayError:
                return False
            return True

        await until(send_works, 10, "a send acknowledged again")
        # (a send refused after the primary wrote it may be stored too: compare sets)
        assert set(read_bodies(read)) == {s.encode() for s in [*sent, "after"]}
    except BaseException:
        print(c.output()[-20000:])
        raise
    finally:
        c.close()
