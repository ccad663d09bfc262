"""MQTT over WebSocket on the HTTP port (issue 50 item 1: "/mqtt on the HTTP port"): a real
`gateway start` process; paho-mqtt over WebSocket to the HTTP port's /mqtt subscribes (3.1.1 and
5.0) and gets what aiomqtt publishes over TCP, and publishes what an aiomqtt subscriber gets; the
HTTP API keeps answering on the same port; a handshake without the `mqtt` subprotocol is refused
(HTTP 403); /metrics counts the connection as ws."""

from __future__ import annotations

import asyncio
import uuid

import aiomqtt
import httpx
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from tests.tls.support import port_of, start_gateway

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def gateway(tmp_path):
    proc = start_gateway(tmp_path, protocols="mqtt,http")
    yield proc
    proc.stop()


def ws_client(version: int, loop: asyncio.AbstractEventLoop, got: asyncio.Queue, ready: asyncio.Queue):
    proto = paho.MQTTv5 if version == 5 else paho.MQTTv311
    cid = f"ws-{uuid.uuid4().hex[:8]}"
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=cid, transport="websockets", protocol=proto)
    c.ws_set_options(path="/mqtt")
    c.on_connect = lambda _c, _u, _f, rc, _p: loop.call_soon_threadsafe(ready.put_nowait, rc)
    c.on_subscribe = lambda _c, _u, _m, rcs, _p: loop.call_soon_threadsafe(ready.put_nowait, rcs)
    c.on_message = lambda _c, _u, m: loop.call_soon_threadsafe(got.put_nowait, (m.topic, m.payload))
    return c


@pytest.mark.parametrize("version", [4, 5])
async def test_paho_over_the_http_ports_websocket_both_ways(gateway, version):
    loop = asyncio.get_running_loop()
    got: asyncio.Queue = asyncio.Queue()
    ready: asyncio.Queue = asyncio.Queue()
    http_port = port_of(gateway.listeners["http"])
    mqtt_port = port_of(gateway.listeners["mqtt"])
    base = f"ws/{uuid.uuid4().hex[:8]}"
    c = ws_client(version, loop, got, ready)
    await asyncio.to_thread(c.connect, "127.0.0.1", http_port, 30)
    c.loop_start()
    try:
        rc = await asyncio.wait_for(ready.get(), 10)
        assert not rc.is_failure, rc
        c.subscribe(f"{base}/down", qos=1)
        rcs = await asyncio.wait_for(ready.get(), 10)
        assert [int(r.value) if hasattr(r, "value") else int(r) for r in rcs] == [1], rcs
        async with aiomqtt.Client("127.0.0.1", mqtt_port) as tcp:
            await tcp.subscribe(f"{base}/up", qos=1)
            await tcp.publish(f"{base}/down", b"to the browser", qos=1)
            assert await asyncio.wait_for(got.get(), 10) == (f"{base}/down", b"to the browser")
            c.publish(f"{base}/up", b"from the browser", qos=1)
            m = await asyncio.wait_for(anext(tcp.messages), 10)
            assert (str(m.topic), m.payload) == (f"{base}/up", b"from the browser")
            async with httpx.AsyncClient(base_url=f"http://{gateway.listeners['http']}") as http:
                assert (await http.get("/healthz")).status_code == 200  # the HTTP API, same port
                metrics = (await http.get("/metrics")).text
            assert 'transport="ws"' in metrics
    finally:
        c.loop_stop()
        c.disconnect()


async def test_a_handshake_without_the_mqtt_subprotocol_is_refused(gateway):
    url = f"ws://127.0.0.1:{port_of(gateway.listeners['http'])}/mqtt"
    with pytest.raises(InvalidStatus) as e:
        async with connect(url, subprotocols=["chat"]):
            pass
    assert e.value.response.status_code == 403
    async with connect(url, subprotocols=["mqtt"]) as ws:  # offered: accepted, MQTT follows
        assert ws.subprotocol == "mqtt"
