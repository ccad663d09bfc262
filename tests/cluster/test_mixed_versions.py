"""A mixed cluster (docs/cluster.md, "Upgrading node by node"): the store node of the release before
the protocol versions (commit 2b8aa3c, the state when issues 48-52 were filed; its tree from `git
archive`, run in pure Python) beside a new store node, under a new proxy and two name servers (the
old release's, asked first, and a new one).
The proxy sees the old node as store protocol version 0 (it answers HELLO "not supported") and
uses only its base operations; every protocol's sends and pops go through the proxy, over both
nodes, and nothing is lost: gRPC, MQTT, AMQP (aio-pika), CloudEvents over HTTP, RocketMQ 4.x
(ali-ons), and gRPC and MQTT publishers with gRPC consumers and MQTT subscribers under load."""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import sys
import time
from pathlib import Path

import aio_pika
import aiomqtt
import grpc
import httpx
import pytest

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2_grpc
from cluster import store_wire as w
from conformance.gateway_proc import GatewayProc as Proc
from conformance.runner import REPO
from namesrv.client import NameServerClient
from tests.adapters.grpc import support as g
from tests.adapters.remoting.support import alions_missing, received, run
from tests.cluster.load import Load
from tests.cluster.support import LEASE, Cluster
from tests.support import wait_until

OLD_COMMIT = "2b8aa3c"  # the commit before issue 51: store protocol version 0
pytestmark = pytest.mark.timeout(120)


def _old_tree(dest: Path) -> str | None:
    """`git archive` of OLD_COMMIT into `dest` (None when this is not a git checkout that has it)."""
    if shutil.which("git") is None:
        return "git is not installed"
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", OLD_COMMIT], capture_output=True, check=False
    )
    if archive.returncode != 0:
        return f"no commit {OLD_COMMIT} here: {archive.stderr.decode().strip()}"
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return None


def old_release(tree: str) -> dict:
    """GatewayProc keywords that run `gateway` from the old tree: it first on the path, pure Python
    (the archive holds no compiled modules)."""
    return {
        "command": [sys.executable, "-m", "gateway.cli"],
        "cwd": tree,
        "env": {"PYTHONPATH": tree, "GATEWAY_PURE_PYTHON": "1"},
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    why = _old_tree(root / "old-tree")
    if why is not None:
        pytest.skip(why)
    old = str(root / "old-tree")
    c = Cluster(root)
    try:
        c.start_namesrv()
        # a name server of the old release too, listed first: it answers the proxy's route
        # refreshes (HELLO not supported: version 0, no uptime)
        ns = Proc(["namesrv", "--port", "0", *LEASE], "namesrv-old", **old_release(old))
        c.procs.append(ns)
        c.old_namesrv = ns.wait_ready(60)["namesrv"]  # type: ignore[attr-defined]
        c.namesrv = f"{c.old_namesrv};{c.namesrv}"  # type: ignore[attr-defined]
        c.start_stores("store-a")
        c.start_stores("store-b", **old_release(old))  # the old store node
        c.start_proxies(1)
        c.old_tree = old  # type: ignore[attr-defined]
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def li(cluster) -> dict[str, str]:
    proxy, listeners = cluster.proxies[0]
    deadline = time.monotonic() + 10
    while "store node store-b" not in proxy.output(100_000) and time.monotonic() < deadline:
        time.sleep(0.05)
    return listeners


def test_the_proxy_uses_the_old_node_as_version_0(cluster, li):
    logs = cluster.proxies[0][0].output(100_000)
    assert "store node store-b (" in logs and "is live, store protocol version 0 (before HELLO" in logs
    assert "store node store-a (" in logs and f"is live, store protocol version {w.VERSION}" in logs
    r = httpx.get(f"http://{li['http']}/healthz", timeout=5).json()
    assert r["status"] == "ok" and r["cluster"]["store_nodes_live"] == ["store-a", "store-b"]


async def test_the_old_name_server_lists_every_node_and_proxy(cluster, li):
    ns = NameServerClient(cluster.old_namesrv)
    try:
        info = await ns.cluster_info()
        assert sorted(info["clusterAddrTable"]["DefaultCluster"]) == ["store-a", "store-b"]
        assert len(await ns.proxies()) == 1
        assert ns.info[cluster.old_namesrv].version == 0  # HELLO not supported
    finally:
        await ns.close()


async def test_grpc_sends_and_pops_over_both_nodes(li):
    async with grpc.aio.insecure_channel(li["grpc"]) as ch:
        s = service_pb2_grpc.MessagingServiceStub(ch)
        bodies = [b"g%d" % i for i in range(20)]
        for b in bodies:
            assert (await g.send(s, g.msg("mx-grpc", b))).status.code == d.OK
        got, stores = [], set()
        deadline = time.monotonic() + 15
        while len(got) < 20 and time.monotonic() < deadline:
            st, msgs, _ = await g.receive(s, "g-mx", "mx-grpc", batch=32, poll_ms=500)
            assert st.code in (d.OK, d.MESSAGE_NOT_FOUND), st
            if msgs:
                handles = [m.system_properties.receipt_handle for m in msgs]
                r = await g.ack(s, "g-mx", "mx-grpc", *handles)
                assert all(e.status.code == d.OK for e in r.entries), r
                stores |= {h.split("@", 1)[0] for h in handles}
                got += [m.body for m in msgs]
    assert sorted(got) == sorted(bodies)
    assert stores == {"store-a", "store-b"}  # the old node stored and served its share


async def test_mqtt_publishes_and_subscriptions(li):
    host, port = li["mqtt"].rsplit(":", 1)
    async with aiomqtt.Client(host, int(port), identifier="mx-sub") as sub:
        await sub.subscribe("mx-mqtt/#", qos=1)
        async with aiomqtt.Client(host, int(port), identifier="mx-pub") as pub:
            for i in range(20):  # paths hash to both nodes
                await pub.publish(f"mx-mqtt/dev{i}", b"m%d" % i, qos=1)
        got = []
        async with asyncio.timeout(15):
            async for m in sub.messages:
                got.append(bytes(m.payload))
                if len(got) == 20:
                    break
    assert sorted(got) == sorted(b"m%d" % i for i in range(20))


async def test_amqp_publishes_and_consumes(li):
    host, port = li["amqp"].rsplit(":", 1)
    conn = await aio_pika.connect(host=host, port=int(port))
    try:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("mx-amqp", durable=True)
        for i in range(20):
            await ch.default_exchange.publish(aio_pika.Message(b"a%d" % i), routing_key="mx-amqp")
        got = []
        async with asyncio.timeout(15), q.iterator() as it:
            async for m in it:
                await m.ack()
                got.append(m.body)
                if len(got) == 20:
                    break
    finally:
        await conn.close()
    assert sorted(got) == sorted(b"a%d" % i for i in range(20))


async def test_cloudevents_ingest_and_pull(li):
    base = f"http://{li['http']}/topics/mx-ce"
    async with httpx.AsyncClient(timeout=10) as h:
        for i in range(20):
            headers = {"ce-specversion": "1.0", "ce-id": f"e{i}", "ce-source": "/mx", "ce-type": "t"}
            r = await h.post(f"{base}/events", content=b"c%d" % i, headers=headers)
            assert r.status_code == 202, r.text
        got = []
        deadline = time.monotonic() + 15
        while len(got) < 20 and time.monotonic() < deadline:
            r = await h.post(f"{base}/subscriptions/g-ce/pop", json={"max_events": 32, "wait_ms": 500})
            assert r.status_code == 200, r.text
            events = r.json()
            if events:
                acked = await h.post(
                    f"{base}/subscriptions/g-ce/ack",
                    json={"receipt_handles": [e["receipthandle"] for e in events]},
                )
                assert acked.json()["failed"] == [], acked.text
                got += [base64.b64decode(e["data_base64"]) for e in events]
    assert sorted(got) == sorted(b"c%d" % i for i in range(20))


@pytest.mark.skipif(alions_missing() is not None, reason=str(alions_missing()))
async def test_4x_produce_and_consume(li, tmp_path):
    home = tmp_path / "home"
    sent = await run("alions", "produce", "--namesrv", li["remoting"], "--topic", "mx4", "--count", "10",
                     "--prefix", "x", home=home)  # fmt: skip
    assert [e["status"] for e in sent] == ["SEND_OK"] * 10
    got = await run("alions", "consume", "--namesrv", li["remoting"], "--topic", "mx4", "--group", "g-mx4",
                    "--expect", "10", home=home)  # fmt: skip
    assert sorted(e["body"] for e in received(got)) == sorted(e["body"] for e in sent)


async def test_nothing_lost_under_load(li):
    load = Load([li], "mxload", "g-mxload")
    try:
        await load.start()
        await wait_until(lambda: len(load.acked()) > 100, timeout=30)  # (a busy host sends slower)
        load.stop_sending()
        await load.drain(load.acked())
    finally:
        await load.close()
    assert len(load.acked()) > 100
    assert load.failures() == {}, {k: v[:5] for k, v in load.failures().items()}
    assert load.lost() == set()
    assert all(load.acked() <= {b for _, b in c.ok} for c in load.subscribed.values())


async def test_a_proxy_of_the_old_release_works_with_the_new_node(cluster, li):
    """Store nodes upgraded before proxies: an old proxy (no HELLO) over the new and the old node."""
    old = cluster.old_tree
    (listeners,) = cluster.start_proxies(1, "grpc,http", **old_release(old))
    async with grpc.aio.insecure_channel(listeners["grpc"]) as ch:
        s = service_pb2_grpc.MessagingServiceStub(ch)
        bodies = [b"o%d" % i for i in range(20)]
        for b in bodies:
            assert (await g.send(s, g.msg("mx-old", b))).status.code == d.OK
        got, stores = [], set()
        deadline = time.monotonic() + 15
        while len(got) < 20 and time.monotonic() < deadline:
            st, msgs, _ = await g.receive(s, "g-old", "mx-old", batch=32, poll_ms=500)
            if msgs:
                handles = [m.system_properties.receipt_handle for m in msgs]
                r = await g.ack(s, "g-old", "mx-old", *handles)
                assert all(e.status.code == d.OK for e in r.entries), r
                stores |= {h.split("@", 1)[0] for h in handles}
                got += [m.body for m in msgs]
    assert sorted(got) == sorted(bodies) and stores == {"store-a", "store-b"}
