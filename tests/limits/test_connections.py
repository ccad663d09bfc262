"""Connection limits (docs/limits.md "Connections") with real clients: over --max-connections each
protocol gets its own refusal (MQTT CONNACK 0x97 / 3, AMQP connection.close 530, HTTP 503 with
Retry-After, gRPC 42900), a place freed is served again, the per-user limit with authentication on,
and a reconnect storm from one address is slowed while another address connects promptly."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time

import aio_pika
import aiomqtt
import aiormq
import grpc
import httpx
import pytest

from adapters.amqp import AmqpAdapter
from adapters.grpc import GrpcAdapter
from adapters.grpc.codes import Code
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from adapters.limits import CONNECTION_RATE, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_USER
from gateway.http import HttpAdapter, create_app
from gateway.http.metrics import render
from tests.adapters.grpc.support import msg
from tests.limits.support import add_mqtt, connect_packet, core_with, limiter
from tests.support import T, wait_until

V5 = aiomqtt.ProtocolVersion.V5


def _rc(err: aiomqtt.MqttCodeError) -> int:
    rc = err.rc
    return int(getattr(rc, "value", rc))


def mqtt(port: int, cid: str, **kw) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", port, identifier=cid, timeout=T, **kw)


async def test_mqtt_over_max_connections_gets_quota_exceeded(tmp_path):
    lim = limiter(max_connections=2)
    async with core_with(tmp_path) as core:
        port = await add_mqtt(core, lim)
        async with mqtt(port, "a"), mqtt(port, "b", protocol=V5):
            with pytest.raises(aiomqtt.MqttCodeError) as v5:
                async with mqtt(port, "c", protocol=V5):
                    pass
            assert _rc(v5.value) == 0x97  # Quota exceeded
            with pytest.raises(aiomqtt.MqttCodeError) as v3:
                async with mqtt(port, "d"):
                    pass
            assert _rc(v3.value) == 0x88  # paho's name for 3.1.1's 3, which the wire carries:
            assert await asyncio.to_thread(_connack, "127.0.0.1", port, 4) == 3
            assert lim.connections["mqtt"] == 2
        await wait_until(lambda: lim.connections["mqtt"] == 0)
        async with mqtt(port, "e"):  # places freed: served again
            pass
    assert lim.refusals[("mqtt", MAX_CONNECTIONS)] == 3
    text = render(core.processor, (), lim)
    assert 'gateway_limit_refusals_total{protocol="mqtt",limit="max_connections"} 3' in text


async def test_amqp_over_max_connections_gets_530(tmp_path):
    lim = limiter(max_connections=1)
    async with core_with(tmp_path) as core:
        adapter = await core.add(AmqpAdapter(core.processor, "127.0.0.1", 0, limiter=lim))
        url = f"amqp://guest:guest@127.0.0.1:{adapter.bound_port}/"
        first = await aio_pika.connect(url, timeout=T)
        with pytest.raises(aiormq.exceptions.ConnectionClosed) as err:
            await aio_pika.connect(url, timeout=T)
        assert err.value.errno == 530  # connection.close 530 NOT_ALLOWED
        await first.close()
        await wait_until(lambda: lim.connections["amqp"] == 0)
        again = await aio_pika.connect(url, timeout=T)
        await again.close()
    assert lim.refusals[("amqp", MAX_CONNECTIONS)] == 1


async def test_http_over_max_connections_gets_503_with_retry_after(tmp_path):
    lim = limiter(max_connections=1)
    async with core_with(tmp_path) as core:
        http = await core.add(HttpAdapter(create_app(core.processor), "127.0.0.1", 0, limiter=lim))
        base = f"http://{http.address}"
        async with (
            httpx.AsyncClient(base_url=base, timeout=T) as a,
            httpx.AsyncClient(base_url=base, timeout=T) as b,
        ):
            assert (await a.get("/healthz")).status_code == 200  # a keeps its connection open
            refused = await b.get("/healthz")
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            await a.aclose()
            await wait_until(lambda: lim.connections["http"] == 0)
            assert (await b.get("/healthz")).status_code == 200
    assert lim.refusals[("http", MAX_CONNECTIONS)] == 1


async def test_grpc_over_max_connections_gets_42900(tmp_path):
    lim = limiter(max_connections=1)
    async with core_with(tmp_path) as core:
        await core.processor.create_topic("Limits")
        adapter = await core.add(GrpcAdapter(core.processor, host="127.0.0.1", port=0, limiter=lim))
        async with grpc.aio.insecure_channel(adapter.address) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            a, b = (("x-mq-client-id", "client-a"),), (("x-mq-client-id", "client-b"),)
            req = s.SendMessageRequest(messages=[msg("Limits")])
            assert (await stub.SendMessage(req, metadata=a)).status.code == Code.OK
            refused = await stub.SendMessage(req, metadata=b)
            assert refused.status.code == Code.TOO_MANY_REQUESTS == 42900
            assert (await stub.SendMessage(req, metadata=a)).status.code == Code.OK  # a known client
            await stub.NotifyClientTermination(s.NotifyClientTerminationRequest(), metadata=a)
            assert (await stub.SendMessage(req, metadata=b)).status.code == Code.OK
    assert lim.refusals[("grpc", MAX_CONNECTIONS)] == 1


async def test_per_user_connection_limit_with_auth(tmp_path):
    lim = limiter(max_connections_per_user=1)
    async with core_with(tmp_path, auth=True) as core:
        for user in ("alice", "bob"):
            await core.security.add_user(user, password="pw-" + user, role="user")
        port = await add_mqtt(core, lim)
        amqp = await core.add(AmqpAdapter(core.processor, "127.0.0.1", 0, limiter=lim))
        async with mqtt(port, "alice-1", username="alice", password="pw-alice", protocol=V5):
            with pytest.raises(aiomqtt.MqttCodeError) as err:
                async with mqtt(port, "alice-2", username="alice", password="pw-alice", protocol=V5):
                    pass
            assert _rc(err.value) == 0x97
            with pytest.raises(aiormq.exceptions.ConnectionClosed) as amqp_err:  # alice over AMQP too
                await aio_pika.connect(f"amqp://alice:pw-alice@127.0.0.1:{amqp.bound_port}/", timeout=T)
            assert amqp_err.value.errno == 530
            async with mqtt(port, "bob-1", username="bob", password="pw-bob"):  # another user: served
                pass
        await wait_until(lambda: "alice" not in lim.user_connections)
        conn = await aio_pika.connect(f"amqp://alice:pw-alice@127.0.0.1:{amqp.bound_port}/", timeout=T)
        await conn.close()
    assert lim.refusals[("mqtt", MAX_CONNECTIONS_PER_USER)] == 1
    assert lim.refusals[("amqp", MAX_CONNECTIONS_PER_USER)] == 1


# A device in a reconnect loop: CONNECT, read the CONNACK, close, again, as fast as it can.
STORM = """
import socket, sys, time, json
port, seconds, connect = int(sys.argv[1]), float(sys.argv[2]), bytes.fromhex(sys.argv[3])
ok = refused = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(connect)
    ack = s.recv(4)
    s.close()
    if len(ack) == 4 and ack[3] == 0:
        ok += 1
    else:
        refused += 1
print(json.dumps({"ok": ok, "refused": refused}))
"""


def _connack(address: str, port: int, level: int = 4) -> int:
    """The CONNACK code a raw CONNECT from `address` gets."""
    with socket.create_connection(("127.0.0.1", port), timeout=T, source_address=(address, 0)) as sock:
        sock.sendall(connect_packet("raw", level))
        ack = sock.recv(4)
    assert ack[:2] == b"\x20\x02", ack
    return ack[3]


def _connect_from(address: str, port: int) -> float:
    """Seconds a raw MQTT CONNECT from `address` takes to be accepted (CONNACK 0); raises if refused."""
    t0 = time.monotonic()
    assert _connack(address, port) == 0
    return time.monotonic() - t0


async def test_reconnect_storm_from_one_address_is_slowed_without_disturbing_another(tmp_path):
    rate, burst, seconds = 20, 5, 2.0
    lim = limiter(max_connection_rate=rate, connection_burst=burst)
    async with core_with(tmp_path) as core:
        port = await add_mqtt(core, lim)
        storm = await asyncio.create_subprocess_exec(
            sys.executable, "-c", STORM, str(port), str(seconds), connect_packet("storm").hex(),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        await wait_until(lambda: lim.refusals[("mqtt", CONNECTION_RATE)] > 100)
        # Meanwhile clients from another address connect at once, one after the other.
        waits = [await asyncio.to_thread(_connect_from, "127.0.0.2", port) for _ in range(burst)]
        out, _ = await asyncio.wait_for(storm.communicate(), T + seconds)
    counts = json.loads(out)
    assert counts["ok"] <= burst + rate * (seconds + 1)  # slowed to its rate
    assert counts["refused"] > 10 * counts["ok"]  # ... while it kept trying hard
    assert max(waits) < 0.5, waits
