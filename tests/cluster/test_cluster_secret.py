"""A closed cluster (`--cluster-secret-file`, docs/security.md): a name server, a store node and a
proxy as real processes sharing one secret. With it, MQTT publish and consume through the proxy
work; without it (or with a wrong one) a process can neither register a store, nor ask the name
server for routes or its broker list, nor pop or delete through the store node: it is refused
(NO_PERMISSION, the connection closed) and both sides log why, never the secret. A secret file
readable by others, empty or too short stops every process with exit 2. The handshake's checks
(replay, clock skew, the server's own proof) and the idle-connection timeout run in process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
from pathlib import Path

import aiomqtt
import pytest

from cluster import store_wire as w
from cluster.replication import Follower, Primary
from cluster.store_node import StoreNode, StoreNodeConfig
from conformance.gateway_proc import GATEWAY
from conformance.gateway_proc import GatewayProc as Proc
from namesrv.client import NameServerClient, NameServerError
from namesrv.routeinfo import TopicQueues
from remoting import ResponseCode, parse_host_port
from remoting.client import ClusterAuthError, RemotingClient
from remoting.cluster_auth import AUTH_CODE, AuthRefused, ClusterAuth, ClusterSecretError, read_secret
from remoting.server import FrameServer, serve_tcp
from store import Message, Store, StoreConfig
from tests.cluster.support import LEASE, Cluster, wait_for

pytestmark = pytest.mark.timeout(120)

SECRET = b"4f1d9c0e2b7a6e35a1c8d0f94b2e7c61"
WRONG = b"0000000000000000-not-the-secret!"


def secret_file(path: Path, data: bytes, mode: int = 0o600) -> str:
    path.write_bytes(data + b"\n")
    path.chmod(mode)
    return str(path)


@pytest.fixture(scope="module")
def closed(tmp_path_factory):
    root = tmp_path_factory.mktemp("closed-cluster")
    good = secret_file(root / "cluster.secret", SECRET)
    c = Cluster(root)
    try:
        args = ["namesrv", "--port", "0", *LEASE, "--scan-interval-s", "0.2"]
        ns = Proc(args, "namesrv", env={"GATEWAY_CLUSTER_SECRET_FILE": good})  # the namesrv reads it too
        c.procs.append(ns)
        c.namesrv = ns.wait_ready(60)["namesrv"]
        c.start_stores("store-a", extra=("--cluster-secret-file", good))
        c.start_proxies(1, "mqtt,http", extra=("--cluster-secret-file", good))
        yield c
    finally:
        c.close()


def namesrv_proc(c: Cluster) -> Proc:
    return next(p for p in c.procs if p.name == "namesrv")


async def test_with_the_secret_the_cluster_works_end_to_end(closed):
    ((_, listeners),) = closed.proxies
    host, port = listeners["mqtt"].rsplit(":", 1)
    async with aiomqtt.Client(host, int(port), identifier="sub") as sub:
        await sub.subscribe("sealed/#", qos=1)
        async with aiomqtt.Client(host, int(port), identifier="pub") as pub:
            for i in range(5):
                await pub.publish(f"sealed/{i}", f"m{i}".encode(), qos=1)
        got: list[bytes] = []

        async def read() -> None:
            async for m in sub.messages:
                got.append(m.payload)
                if len(got) == 5:
                    return

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(read(), 15)
    assert sorted(got) == [f"m{i}".encode() for i in range(5)]
    ns = NameServerClient(closed.namesrv, auth=ClusterAuth(SECRET))
    try:
        info = await ns.cluster_info()
        assert set(info["brokerAddrTable"]) == {"store-a"}
        assert len(await ns.proxies()) == 1
    finally:
        await ns.close()


async def test_without_the_secret_the_name_server_serves_nothing(closed):
    topics = {"t": TopicQueues(1, 1)}
    for ask in (
        lambda c: c.register_broker(
            cluster="DefaultCluster", name="intruder", addr="127.0.0.1:1", topics=topics
        ),
        lambda c: c.cluster_info(),
        lambda c: c.route("sealed"),
    ):
        intruder = NameServerClient(closed.namesrv)  # a new connection each: a refused one is closed
        try:
            with pytest.raises(NameServerError) as e:
                await ask(intruder)
            assert e.value.code == ResponseCode.NO_PERMISSION
            assert "no cluster authentication" in str(e.value)
        finally:
            await intruder.close()
    wait_for(lambda: "refused: no cluster authentication" in namesrv_proc(closed).output(), what="ns log")
    ns = NameServerClient(closed.namesrv, auth=ClusterAuth(SECRET))
    try:
        assert "intruder" not in (await ns.cluster_info())["brokerAddrTable"]
    finally:
        await ns.close()


async def test_without_the_secret_a_store_node_refuses_pop_and_delete(closed):
    store_proc, addr = closed.stores["store-a"]
    host, port = parse_host_port(addr, 10911)
    member = await RemotingClient.connect(host, port, auth=ClusterAuth(SECRET))
    create = {"name": "kept", "queues": 1, "retention_ms": None, "retention_bytes": None}
    r = await member.invoke(w.OPS["create_topic"], {"a": w.dumps(create)})
    assert r.code == ResponseCode.SUCCESS, r.remark
    pop = {"group": "g", "topic": "kept", "max": 32, "invisible_ms": 30000, "wait_ms": 0}
    for op, args in (("pop", pop), ("delete_topic", {"name": "kept"})):
        c = await RemotingClient.connect(host, port)
        try:
            r = await c.invoke(w.OPS[op], {"a": w.dumps(args)})
            assert r.code == ResponseCode.NO_PERMISSION, (op, r.remark)
            await asyncio.wait_for(c.closed.wait(), 5)  # and the connection is closed
        finally:
            await c.close()
    wait_for(lambda: "refused: no cluster authentication" in store_proc.output(), what="store log")
    # The topic is still there, listed to the authenticated connection (open all along).
    try:
        r = await member.invoke(w.OPS["list_topics"])
        assert r.code == ResponseCode.SUCCESS
        assert "kept" in {t["name"] for t in w.reply_value(r.body)}
    finally:
        await member.close()


async def test_a_wrong_secret_is_refused_and_logged_on_both_sides(closed, tmp_path):
    _, addr = closed.stores["store-a"]
    host, port = parse_host_port(addr, 10911)
    with pytest.raises(ClusterAuthError, match="bad cluster secret"):
        await RemotingClient.connect(host, port, auth=ClusterAuth(WRONG))
    # A store node with the wrong secret: the name server refuses it (both log it), it is not listed.
    wrong = secret_file(tmp_path / "wrong.secret", WRONG)
    (bad_addr,) = closed.start_stores("store-wrong", extra=("--cluster-secret-file", wrong))
    bad_proc = closed.stores["store-wrong"][0]
    assert f"cluster peer {closed.namesrv} refused: bad cluster secret (code 16)" in bad_proc.output()
    wait_for(lambda: "refused: bad cluster secret" in namesrv_proc(closed).output(), what="ns log")
    ns = NameServerClient(closed.namesrv, auth=ClusterAuth(SECRET))
    try:
        assert "store-wrong" not in (await ns.cluster_info())["brokerAddrTable"]
    finally:
        await ns.close()
    # ... and its own port refuses the cluster's secret (mutual: the client checks the server too).
    bhost, bport = parse_host_port(bad_addr, 10911)
    with pytest.raises(ClusterAuthError, match="bad cluster secret"):
        await RemotingClient.connect(bhost, bport, auth=ClusterAuth(SECRET))
    out = closed.output()
    assert SECRET.decode() not in out and WRONG.decode() not in out


def _run(args: list[str], path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GATEWAY, *args, "--cluster-secret-file", path],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")},
    )


def test_a_secret_file_others_can_read_stops_every_process_with_exit_2(tmp_path):
    path = secret_file(tmp_path / "s", SECRET, 0o644)
    for args in (
        ["namesrv", "--port", "0"],
        ["store", "--port", "0", "--data-dir", str(tmp_path / "d"), "--namesrv", "127.0.0.1:1"],
        ["start", "--mode", "cluster", "--namesrv", "127.0.0.1:1", "--data-dir", str(tmp_path / "p")],
    ):
        r = _run(args, path)
        assert r.returncode == 2, (args, r.stderr)
        assert "mode 0644" in r.stderr and "chmod 600" in r.stderr, (args, r.stderr)
        assert SECRET.decode() not in r.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was opened


@pytest.mark.parametrize(
    ("data", "why"), [(b"   \n", "is empty"), (b"short-secret", "at least 16 are needed")]
)
def test_an_empty_or_short_secret_stops_the_process_with_exit_2(tmp_path, data, why):
    r = _run(
        ["store", "--port", "0", "--data-dir", str(tmp_path / "d")],
        secret_file(tmp_path / "s", data),
    )
    assert r.returncode == 2 and why in r.stderr, r.stderr
    assert "short-secret" not in r.stderr


# ---------------------------------------------------------------------- in process


def test_read_secret_strips_whitespace_and_refuses_a_missing_file(tmp_path):
    assert read_secret(secret_file(tmp_path / "s", b"  " + SECRET + b"\n\n")) == SECRET
    with pytest.raises(ClusterSecretError, match="cannot read"):
        read_secret(str(tmp_path / "missing"))
    assert SECRET.decode() not in repr(ClusterAuth(SECRET))


def test_the_handshake_refuses_replays_skew_and_a_server_without_the_secret():
    now = [1_000_000.0]
    client, server = ClusterAuth(SECRET, clock=lambda: now[0]), ClusterAuth(SECRET, clock=lambda: now[0])
    hello = client.hello()
    reply = server.check_hello(hello)
    client.check_welcome(hello, reply)  # mutual: the server proved the secret too
    with pytest.raises(AuthRefused, match="replayed"):
        server.check_hello(hello)
    with pytest.raises(AuthRefused, match="bad cluster secret"):
        ClusterAuth(WRONG).check_hello(client.hello())
    with pytest.raises(AuthRefused, match="bad cluster secret"):
        client.check_welcome(hello, ClusterAuth(WRONG, clock=lambda: now[0]).check_hello(hello))
    with pytest.raises(AuthRefused, match="bad cluster secret"):  # the client's proof reflected back
        client.check_welcome(hello, {"mac": hello["mac"]})
    old = client.hello()
    now[0] += 61
    with pytest.raises(AuthRefused, match="off this clock"):
        server.check_hello(old)
    with pytest.raises(AuthRefused, match="malformed"):
        server.check_hello({"nonce": "n", "ts": "x", "mac": "m"})


async def test_a_connection_that_never_authenticates_is_closed():
    class Echo:
        def opened(self, conn) -> None: ...

        def closed(self, conn) -> None: ...

        async def dispatch(self, conn, cmd):
            return cmd.response(ResponseCode.SUCCESS)

    log = logging.getLogger("test")
    frames = FrameServer(Echo(), name="test", log=log, auth=ClusterAuth(SECRET), auth_timeout_s=0.2)
    srv, addr = await serve_tcp(frames, "127.0.0.1", 0)
    try:
        host, port = parse_host_port(addr, 0)
        idle = await RemotingClient.connect(host, port)
        await asyncio.wait_for(idle.closed.wait(), 5)
        ok = await RemotingClient.connect(host, port, auth=ClusterAuth(SECRET))
        assert (await ok.invoke(1234)).code == ResponseCode.SUCCESS
        assert (await ok.invoke(AUTH_CODE)).code == ResponseCode.SUCCESS  # served as any request now
        await ok.close()
        await idle.close()
    finally:
        srv.close()
        frames.abort()


async def test_a_replica_pulls_from_its_primary_only_with_the_secret(tmp_path, caplog):
    store = await Store.open(StoreConfig(data_dir=str(tmp_path / "p"), flush="async", segment_size=1 << 16))
    node = StoreNode(StoreNodeConfig(name="p", port=0, auth=ClusterAuth(SECRET)), store)
    node.replication = Primary(store)
    await node.start()
    replicas = [
        (await Store.open(StoreConfig(data_dir=str(tmp_path / name), segment_size=1 << 16)), auth)
        for name, auth in (("with", ClusterAuth(SECRET)), ("without", None))
    ]
    followers = [
        Follower(s, f"r-{i}", node.address, wait_ms=50, retry_s=0.05, auth=a)
        for i, (s, a) in enumerate(replicas)
    ]
    try:
        await store.append(Message("t", b"x" * 100))
        node.replication.appended()
        for f in followers:
            f.start()
        await asyncio.wait_for(followers[0].connected.wait(), 10)
        async with asyncio.timeout(10):
            while replicas[0][0].log_end != store.log_end or "r-1: replication" not in caplog.text:
                await asyncio.sleep(0.01)
        assert "cluster peer" in caplog.text and "refused: no cluster authentication" in caplog.text
        assert not followers[1].connected.is_set() and replicas[1][0].log_end == 0
    finally:
        for f in followers:
            await f.stop()
        for s, _ in replicas:
            await s.close()
        await node.stop(0)
        await store.close()
