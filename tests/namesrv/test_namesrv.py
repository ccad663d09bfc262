"""The name server over real sockets: broker registration with leases, routes, cluster info,
proxy registration, soft state; `NameServerClient`; the `gateway namesrv` process."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import zlib

import pytest

from conformance.gateway_proc import GATEWAY, GatewayProc
from namesrv.body import body_crc32, decode_register_body, encode_register_body
from namesrv.client import NameServerClient, NameServerError
from namesrv.config import NamesrvSettings, load
from namesrv.routeinfo import RouteInfo, TopicQueues
from namesrv.server import NameServer
from remoting import RequestCode, ResponseCode, loads
from remoting.client import RemotingClient
from tests.support import wait_until

R = ResponseCode
RC = RequestCode


@pytest.fixture
async def ns():
    server = NameServer(NamesrvSettings(port=0, lease_expiry_s=120, scan_interval_s=0.05))
    await server.start()
    yield server
    await server.stop()


async def register(c: RemotingClient, name: str, addr: str, topics: dict[str, TopicQueues], **ext):
    body = encode_register_body(topics)
    fields = {
        "brokerName": name,
        "brokerAddr": addr,
        "clusterName": "c1",
        "haServerAddr": addr,
        "brokerId": 0,
        "compressed": False,
        "bodyCrc32": body_crc32(body),
        **ext,
    }
    return await c.invoke(RC.REGISTER_BROKER, fields, body)


async def test_register_route_cluster_info_and_unregister(ns):
    c = await RemotingClient.connect("127.0.0.1", ns.port)
    try:
        r = await register(
            c, "store-a", "10.0.0.1:10911", {"orders": TopicQueues(4, 4), "x": TopicQueues(1, 1)}
        )
        assert r.code == R.SUCCESS and json.loads(r.body) == {"table": {}}
        assert (
            r.ext_fields["leasePeriodMillis"] == "30000"
            and r.ext_fields["heartbeatTimeoutMillis"] == "120000"
        )
        await register(c, "store-b", "10.0.0.2:10911", {"orders": TopicQueues(2, 2)})
        r = await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})
        route = json.loads(r.body)
        assert [q["brokerName"] for q in route["queueDatas"]] == ["store-a", "store-b"]
        assert route["queueDatas"][1]["writeQueueNums"] == 2
        assert {b["brokerName"]: b["brokerAddrs"] for b in route["brokerDatas"]} == {
            "store-a": {"0": "10.0.0.1:10911"},
            "store-b": {"0": "10.0.0.2:10911"},
        }
        old = await RemotingClient.connect("127.0.0.1", ns.port, version=121)
        r = await old.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})
        assert b'"brokerAddrs":{0:"10.0.0.1:10911"}' in r.body
        await old.close()
        assert (await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "nope"})).code == R.TOPIC_NOT_EXIST
        info = loads((await c.invoke(RC.GET_BROKER_CLUSTER_INFO, {})).body)
        assert info["clusterAddrTable"] == {"c1": ["store-a", "store-b"]}
        assert loads((await c.invoke(RC.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, {})).body)["topicList"] == [
            "orders",
            "x",
        ]
        # Re-registration replaces a broker's topics: x is gone.
        await register(c, "store-a", "10.0.0.1:10911", {"orders": TopicQueues(4, 4)})
        assert (await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "x"})).code == R.TOPIC_NOT_EXIST
        ext = {"brokerName": "store-b", "brokerAddr": "10.0.0.2:10911", "clusterName": "c1", "brokerId": 0}
        assert (await c.invoke(RC.UNREGISTER_BROKER, ext)).code == R.SUCCESS
        route = json.loads((await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "orders"})).body)
        assert [b["brokerName"] for b in route["brokerDatas"]] == ["store-a"]
        assert (await c.invoke(RC.GET_KV_CONFIG, {"namespace": "n", "key": "k"})).code == R.QUERY_NOT_FOUND
        assert (await c.invoke(RC.SEND_MESSAGE, {})).code == R.REQUEST_CODE_NOT_SUPPORTED
    finally:
        await c.close()


async def test_body_crc_compressed_body_and_slaves(ns):
    c = await RemotingClient.connect("127.0.0.1", ns.port)
    try:
        r = await register(c, "b", "h:1", {"t": TopicQueues(1, 1)}, bodyCrc32=12345)
        assert r.code == R.SYSTEM_ERROR and "crc" in r.remark
        body = encode_register_body({"t": TopicQueues(3, 2, 6)}, compressed=True)
        ext = {
            "brokerName": "b",
            "brokerAddr": "h:1",
            "clusterName": "c1",
            "brokerId": 0,
            "compressed": "true",
        }
        assert (await c.invoke(RC.REGISTER_BROKER, {**ext, "haServerAddr": "h:2"}, body)).code == R.SUCCESS
        route = json.loads((await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})).body)
        assert route["queueDatas"][0]["readQueueNums"] == 3 and route["queueDatas"][0]["writeQueueNums"] == 2
        r = await c.invoke(
            RC.REGISTER_BROKER, {**ext, "brokerAddr": "h:9", "brokerId": 1, "compressed": "false"}
        )
        assert r.ext_fields["masterAddr"] == "h:1" and r.ext_fields["haServerAddr"] == "h:2"
        route = json.loads((await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})).body)
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": "h:1", "1": "h:9"}
        bad = await c.invoke(RC.REGISTER_BROKER, {**ext, "compressed": "true"}, b"not deflate")
        assert bad.code == R.SYSTEM_ERROR
    finally:
        await c.close()


def test_register_body_decoding_forms():
    topics = {"a": TopicQueues(8, 8), "b": TopicQueues(1, 2, 4)}
    for compressed in (False, True):
        got, version = decode_register_body(encode_register_body(topics, compressed=compressed), compressed)
        assert got == {"a": TopicQueues(8, 8), "b": TopicQueues(1, 2, 4)} and "counter" in version
    # A 5.x TopicConfig encoding carries attributes JSON after the filter type.
    raw = b'{"counter":1}'
    enc = b'c 4 4 6 SINGLE_TAG {"+message.type":"NORMAL"}'
    blob = struct.pack(">i", len(raw)) + raw + struct.pack(">i", 1) + struct.pack(">i", len(enc)) + enc
    got, version = decode_register_body(zlib.compress(blob + struct.pack(">i", 2) + b"[]"), True)
    assert got == {"c": TopicQueues(4, 4, 6)} and version == {"counter": 1}
    assert decode_register_body(b"", False) == ({}, {})


async def test_leases_expire_and_closed_connections_unregister():
    clock = [0.0]
    server = NameServer(
        NamesrvSettings(port=0, lease_expiry_s=30, scan_interval_s=0.02), clock=lambda: clock[0]
    )
    await server.start()
    c = await RemotingClient.connect("127.0.0.1", server.port)
    c2 = await RemotingClient.connect("127.0.0.1", server.port)
    try:
        await register(c, "a", "h:1", {"t": TopicQueues(1, 1)}, heartbeatTimeoutMillis=10_000)
        await register(c2, "b", "h:2", {"t": TopicQueues(1, 1)})
        clock[0] = 11.0  # a's 10 s lease ran out; b has the default 30 s
        await wait_until(lambda: "a" not in server.routes.brokers)
        route = json.loads((await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})).body)
        assert [b["brokerName"] for b in route["brokerDatas"]] == ["b"]
        # A heartbeat (QUERY_DATA_VERSION) renews b's lease.
        r = await c2.invoke(322, {"brokerAddr": "h:2"}, b'{"counter":0,"timestamp":0}')
        assert r.code == R.SUCCESS and r.ext_fields["changed"] == "false"
        clock[0] = 35.0
        await asyncio.sleep(0.1)
        assert "b" in server.routes.brokers
        await c2.close()  # closing the connection it registered through drops it at once
        await wait_until(lambda: not server.routes.brokers)
        assert (await c.invoke(RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "t"})).code == R.TOPIC_NOT_EXIST
    finally:
        await c.close()
        await server.stop()


async def test_proxy_registration(ns):
    c = await RemotingClient.connect("127.0.0.1", ns.port)
    try:
        body = json.dumps(
            {"endpoints": {"grpc": "p1:8081", "remoting": "p1:8080"}, "attributes": {"mode": "c"}}
        )
        r = await c.invoke(RC.REGISTER_PROXY, {"proxyName": "p1", "clusterName": "c1"}, body.encode())
        assert r.code == R.SUCCESS and r.ext_fields["leasePeriodMillis"] == "30000"
        body2 = json.dumps({"endpoints": {"mqtt": "p2:1883"}}).encode()
        await c.invoke(RC.REGISTER_PROXY, {"proxyName": "p2", "heartbeatTimeoutMillis": 5000}, body2)
        proxies = json.loads((await c.invoke(RC.GET_PROXY_LIST, {})).body)["proxies"]
        assert [(p["name"], p["endpoints"]) for p in proxies] == [
            ("p1", {"grpc": "p1:8081", "remoting": "p1:8080"}),
            ("p2", {"mqtt": "p2:1883"}),
        ]
        assert proxies[0]["attributes"] == {"mode": "c"} and proxies[1]["heartbeatTimeoutMillis"] == 5000
        only = json.loads((await c.invoke(RC.GET_PROXY_LIST, {"protocol": "grpc"})).body)["proxies"]
        assert [p["name"] for p in only] == ["p1"]
        assert (await c.invoke(RC.UNREGISTER_PROXY, {"proxyName": "p1"})).code == R.SUCCESS
        assert [p["name"] for p in json.loads((await c.invoke(RC.GET_PROXY_LIST, {})).body)["proxies"]] == [
            "p2"
        ]
        assert (await c.invoke(RC.REGISTER_PROXY, {"proxyName": "p3"}, b"[1]")).code == R.SYSTEM_ERROR
        assert (await c.invoke(RC.REGISTER_PROXY, {}, b"{}")).code == R.SYSTEM_ERROR
    finally:
        await c.close()


def test_routeinfo_proxy_expiry_and_broker_move():
    ri = RouteInfo(default_timeout_s=10)
    ri.register_proxy(name="p", endpoints={"grpc": "x"}, now=0)
    ri.register_broker(cluster="c", addr="h:1", name="b", broker_id=0, topics={"t": TopicQueues(1, 1)}, now=0)
    ri.register_broker(cluster="c", addr="h:5", name="b", broker_id=0, topics={"t": TopicQueues(1, 1)}, now=1)
    assert ri.brokers["b"].addrs == {0: "h:5"} and "h:1" not in ri.leases  # the master moved
    assert ri.scan(10.5) == ["proxy p"]
    assert ri.scan(11.5) == ["broker h:5"] and ri.route("t") is None and not ri.clusters


async def test_name_server_client(ns):
    client = NameServerClient([f"127.0.0.1:{ns.port}", "127.0.0.1:1"], timeout=1.0)  # second one is down
    try:
        await client.register_broker(cluster="c", name="s1", addr="h:1", topics={"t": TopicQueues(2, 2)})
        await client.register_broker(
            cluster="c",
            name="s2",
            addr="h:2",
            topics={"t": TopicQueues(1, 1)},
            compressed=True,
            timeout_ms=60_000,
        )
        brokers, queues = await client.route("t")
        assert sorted(b.name for b in brokers) == ["s1", "s2"] and sum(q.write_queues for q in queues) == 3
        assert await client.route("nope") is None
        assert (await client.cluster_info())["clusterAddrTable"] == {"c": ["s1", "s2"]}
        await client.register_proxy(name="p", endpoints={"remoting": "h:8080"}, timeout_ms=5000)
        assert [p["name"] for p in await client.proxies("remoting")] == ["p"]
        await client.unregister_proxy("p")
        await client.unregister_broker(cluster="c", name="s2", addr="h:2")
        brokers, _ = await client.route("t")
        assert [b.name for b in brokers] == ["s1"]
        calls = []

        async def again():
            calls.append(1)

        task = client.keep_registered(again, period_s=0.02)
        await wait_until(lambda: len(calls) >= 3)
        task.cancel()
        with pytest.raises(NameServerError):
            await client.register_proxy(name="", endpoints={})
    finally:
        await client.close()


def test_settings_layers(tmp_path):
    assert (NamesrvSettings().port, NamesrvSettings().lease_period_s, NamesrvSettings().lease_expiry_s) == (
        9876,
        30.0,
        120.0,
    )
    toml = tmp_path / "ns.toml"
    toml.write_text("[namesrv]\nport = 1000\nlease_expiry_s = 60\n")
    s = load({"lease_period_s": 10}, {"GATEWAY_NAMESRV_PORT": "2000"}, toml)
    assert (s.port, s.lease_period_s, s.lease_expiry_s) == (2000, 10.0, 60.0)
    from gateway.config import ConfigError

    for bad in ({"port": 70000}, {"lease_expiry_s": 5}, {"scan_interval_s": 0}, {"log_level": "loud"}):
        with pytest.raises(ConfigError):
            load(bad)
    with pytest.raises(ConfigError, match="GATEWAY_NAMESRV_PORT"):
        load(env={"GATEWAY_NAMESRV_PORT": "x"})
    toml.write_text("nope = 1\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load(toml_path=toml)


def test_gateway_namesrv_process(tmp_path):
    """`gateway namesrv --port 0`: serves, logs its address, exits 0 on SIGTERM; bad settings exit 2."""
    p = GatewayProc(["namesrv", "--port", "0", "--scan-interval-s", "0.1"], "namesrv")
    try:
        addr = p.wait_ready(60)["namesrv"]
        host, port = addr.rsplit(":", 1)

        async def talk():
            c = NameServerClient(f"{host}:{port}")
            try:
                await c.register_broker(cluster="c", name="s", addr="h:1", topics={"t": TopicQueues(1, 1)})
                assert await c.route("t")
            finally:
                await c.close()

        asyncio.run(talk())
        rc = p.stop(10)  # SIGTERM
        out = p.drain()
        assert rc == 0, out
        assert "broker h:1 (s id 0, cluster c) registered" in out
    finally:
        p.kill()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    r = subprocess.run(
        [*GATEWAY, "namesrv", "--lease-expiry-s", "1"], capture_output=True, text=True, env=env, timeout=30
    )
    assert r.returncode == 2 and "lease_expiry_s" in r.stderr
