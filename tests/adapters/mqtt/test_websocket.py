"""MQTT over WebSocket and secure WebSocket (adapters/mqtt/websocket.py): paho-mqtt with
`transport="websockets"` in 3.1.1 and 5.0, across transports with aiomqtt over TCP, over wss with
a test certificate; packets split across frames and frames holding several packets; and the bad
inputs (not a WebSocket, wrong subprotocol, wrong path, a text frame) closed cleanly while the
server keeps serving."""

from __future__ import annotations

import asyncio
import queue
import socket
import ssl
import uuid

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from adapters.mqtt import websocket
from adapters.mqtt.codec import Connack, Connect, Decoder, Pingresp, encode_connect
from adapters.mqtt.websocket import MqttWebSockets
from tests.adapters.mqtt.support import STORE, V3, V5, close_env, make_cert, next_message, open_env, serve
from tests.support import Core, T

PAHO = {V3: paho.MQTTv311, V5: paho.MQTTv5}


@pytest.fixture
async def wenv(tmp_path):
    cert, key = make_cert(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    ws = MqttWebSockets("127.0.0.1", 0, ssl=ctx, tls_port=0)
    e = await open_env(str(tmp_path / "data"), websockets=ws)
    listeners = e.adapter.extra_listeners
    e.ws_port = int(listeners["mqtt_ws"].rsplit(":", 1)[1])
    e.wss_port = int(listeners["mqtt_wss"].rsplit(":", 1)[1])
    e.cert = cert
    yield e
    await close_env(e)


class Paho:
    """A paho-mqtt client over WebSocket in its own network thread; events land in queues."""

    def __init__(self, version, port: int, *, cert: str | None = None, path: str = "/mqtt") -> None:
        self.messages: queue.Queue = queue.Queue()
        self.acks: queue.Queue = queue.Queue()
        self.version = version
        self.c = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id="ws-" + uuid.uuid4().hex[:8],
            protocol=PAHO[version],
            transport="websockets",
        )
        self.c.ws_set_options(path=path)
        if cert is not None:
            self.c.tls_set(ca_certs=cert)
        self.c.on_connect = lambda _c, _u, _f, rc, _p: self.acks.put(("connack", rc))
        self.c.on_subscribe = lambda _c, _u, _m, rcs, _p: self.acks.put(("suback", rcs))
        self.c.on_message = lambda _c, _u, m: self.messages.put((m.topic, m.payload))
        self.port = port

    async def start(self) -> None:
        if self.version == V5:
            await asyncio.to_thread(self.c.connect, "127.0.0.1", self.port, 30, clean_start=True)
        else:
            await asyncio.to_thread(self.c.connect, "127.0.0.1", self.port, 30)
        self.c.loop_start()
        kind, rc = await self.next(self.acks)
        assert kind == "connack" and not rc.is_failure, rc

    async def subscribe(self, topic: str, qos: int = 1) -> None:
        self.c.subscribe(topic, qos)
        kind, rcs = await self.next(self.acks)
        assert kind == "suback" and [int(r.value) for r in rcs] == [qos], rcs

    async def publish(self, topic: str, payload: bytes, qos: int = 1) -> None:
        info = self.c.publish(topic, payload, qos)
        await asyncio.to_thread(info.wait_for_publish, T)
        assert info.is_published()

    @staticmethod
    async def next(q: queue.Queue):
        return await asyncio.to_thread(q.get, True, T)

    def stop(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


@pytest.mark.parametrize("version", [pytest.param(V3, id="v311"), pytest.param(V5, id="v5")])
async def test_paho_over_ws_and_aiomqtt_over_tcp(wenv, version):
    """paho over ws subscribes and gets an aiomqtt (TCP) publish; what it publishes reaches an
    aiomqtt subscriber and itself."""
    p = Paho(version, wenv.ws_port)
    await p.start()
    try:
        await p.subscribe("ws/+/temp")
        async with wenv.client(version) as tcp:
            await tcp.subscribe("ws/#", qos=1)
            await tcp.publish("ws/tcp/temp", b"from-tcp", qos=1)
            assert await p.next(p.messages) == ("ws/tcp/temp", b"from-tcp")
            assert (await next_message(tcp)).payload == b"from-tcp"  # its own publish, first
            big = bytes(range(256)) * 400  # 100 KiB: several frames of paho's, one MQTT packet
            await p.publish("ws/paho/temp", big)
            m = await next_message(tcp)
            assert (str(m.topic), m.payload) == ("ws/paho/temp", big)
            assert await p.next(p.messages) == ("ws/paho/temp", big)
    finally:
        p.stop()


async def test_paho_over_wss(wenv):
    p = Paho(V5, wenv.wss_port, cert=wenv.cert)
    await p.start()
    try:
        await p.subscribe("wss/t")
        async with wenv.client(V5) as tcp:
            await tcp.publish("wss/t", b"secure", qos=1)
        assert await p.next(p.messages) == ("wss/t", b"secure")
    finally:
        p.stop()


async def _still_serving(wenv) -> None:
    p = Paho(V3, wenv.ws_port)
    await p.start()
    p.stop()


async def test_packets_split_across_frames_and_packed_in_one(wenv):
    """A CONNECT in three binary frames (the last a continuation-free new message), then two
    PINGREQs in one frame: one CONNACK, two PINGRESPs."""
    connect = encode_connect(Connect("split-" + uuid.uuid4().hex[:6], 4))
    dec = Decoder("client", version=4)
    async with ws_connect(f"ws://127.0.0.1:{wenv.ws_port}/mqtt", subprotocols=["mqtt"]) as ws:
        assert ws.subprotocol == "mqtt"
        for part in (connect[:1], connect[1:5], connect[5:]):
            await ws.send(part)
        got: list = []
        while len(got) < 1:
            dec.feed(await asyncio.wait_for(ws.recv(), T))
            while (p := dec.next_packet()) is not None:
                got.append(p)
        assert isinstance(got[0], Connack) and got[0].reason_code == 0, got
        await ws.send(b"\xc0\x00\xc0\x00")  # PINGREQ, PINGREQ
        while len(got) < 3:
            dec.feed(await asyncio.wait_for(ws.recv(), T))
            while (p := dec.next_packet()) is not None:
                got.append(p)
        assert [type(p) for p in got[1:]] == [Pingresp, Pingresp]


async def test_mqttv31_subprotocol_accepted(wenv):
    async with ws_connect(f"ws://127.0.0.1:{wenv.ws_port}/mqtt", subprotocols=["mqttv3.1"]) as ws:
        assert ws.subprotocol == "mqttv3.1"


@pytest.mark.parametrize(
    ("path", "subprotocols", "status"),
    [
        pytest.param("/mqtt", ["chat"], 400, id="wrong-subprotocol"),
        pytest.param("/mqtt", None, 400, id="no-subprotocol"),
        pytest.param("/other", ["mqtt"], 404, id="wrong-path"),
    ],
)
async def test_refused_handshakes(wenv, path, subprotocols, status):
    with pytest.raises(InvalidStatus) as e:
        async with ws_connect(f"ws://127.0.0.1:{wenv.ws_port}{path}", subprotocols=subprotocols):
            pass
    assert e.value.response.status_code == status
    await _still_serving(wenv)


async def test_text_frame_closes_with_1003(wenv):
    async with ws_connect(f"ws://127.0.0.1:{wenv.ws_port}/mqtt", subprotocols=["mqtt"]) as ws:
        await ws.send("\x10 not binary")
        with pytest.raises(ConnectionClosed) as e:
            await asyncio.wait_for(ws.recv(), T)
    assert e.value.rcvd is not None and e.value.rcvd.code == 1003
    assert not wenv.adapter.connections  # the MQTT side of it is gone too
    await _still_serving(wenv)


@pytest.mark.parametrize(
    "request_bytes",
    [
        pytest.param(b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n", id="plain-http"),
        pytest.param(encode_connect(Connect("raw", 4)), id="raw-mqtt"),
    ],
)
async def test_not_a_websocket_is_answered_and_closed(wenv, request_bytes, monkeypatch):
    """A plain HTTP request gets 426; bytes that never end an HTTP request line are closed at the
    handshake timeout (shortened here)."""
    monkeypatch.setattr(websocket, "HANDSHAKE_TIMEOUT_S", 0.3)
    r, w = await asyncio.open_connection("127.0.0.1", wenv.ws_port)
    w.write(request_bytes)
    answer = await asyncio.wait_for(r.read(), T)  # read() returns at EOF: the server closed
    if request_bytes.startswith(b"GET"):
        assert answer.startswith(b"HTTP/1.1 426"), answer[:60]
    else:
        assert answer == b""  # never a complete request: closed without a word
    w.close()
    await _still_serving(wenv)


async def test_a_taken_port_is_skipped_only_when_optional(caplog):
    """The default ports (optional) are skipped with a warning when taken; a chosen port fails."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        optional = MqttWebSockets("127.0.0.1", port, optional=True)
        await optional.start(None)  # type: ignore[arg-type]  # no connection comes
        assert optional.extra_listeners == {}
        assert f"mqtt_ws not started: cannot listen on 127.0.0.1:{port}" in caplog.text
        with pytest.raises(OSError):
            await MqttWebSockets("127.0.0.1", port).start(None)  # type: ignore[arg-type]


async def test_metrics_count_connections_by_transport(wenv):
    from gateway.http.metrics import render

    ws, wss = Paho(V3, wenv.ws_port), Paho(V5, wenv.wss_port, cert=wenv.cert)
    await ws.start()
    await wss.start()
    try:
        async with wenv.client(V5):
            assert wenv.adapter.connections_by_transport() == {"tcp": 1, "ws": 1, "wss": 1}
            text = render(wenv.processor, [wenv.adapter])
        for transport in ("tcp", "ws", "wss"):
            assert f'gateway_connections_by_transport{{protocol="mqtt",transport="{transport}"}} 1' in text
    finally:
        ws.stop()
        wss.stop()


async def test_stop_with_an_open_websocket_session(tmp_path):
    """Stopping the adapter with a 5.0 client connected over ws: DISCONNECT 0x8B reaches it."""
    e = await open_env(str(tmp_path / "data"), websockets=MqttWebSockets("127.0.0.1", 0))
    port = int(e.adapter.extra_listeners["mqtt_ws"].rsplit(":", 1)[1])
    p = Paho(V5, port)
    gone: queue.Queue = queue.Queue()
    await p.start()
    p.c.on_disconnect = lambda _c, _u, _f, rc, _p: gone.put(rc)
    try:
        await close_env(e)
        rc = await p.next(gone)
        assert rc.value == 0x8B, rc
    finally:
        p.c.loop_stop()


async def test_auth_and_acl_over_websocket(tmp_path):
    """With authentication on: a wrong password is refused (0x86), a user gets SUBACK 0x87 outside
    its ACL and its messages inside it, over ws as over TCP."""
    core = await Core.open(str(tmp_path / "data"), auth=True, **STORE)
    e = await serve(core, websockets=MqttWebSockets("127.0.0.1", 0))
    port = int(e.adapter.extra_listeners["mqtt_ws"].rsplit(":", 1)[1])
    try:
        await core.security.add_user("dev1", password="pw-1", role="user")
        await core.security.directory.add_rule(
            "role:user", "topic", "devices/%u/#", ("publish", "subscribe"), False
        )
        bad = Paho(V5, port)
        bad.c.username_pw_set("dev1", "wrong")
        with pytest.raises(AssertionError, match="Bad user name or password"):
            await bad.start()
        bad.c.loop_stop()
        p = Paho(V5, port)
        p.c.username_pw_set("dev1", "pw-1")
        await p.start()
        try:
            p.c.subscribe("devices/other/#", 1)
            _, rcs = await p.next(p.acks)
            assert [int(r.value) for r in rcs] == [0x87]
            await p.subscribe("devices/dev1/#")
            await p.publish("devices/dev1/t", b"mine")
            assert await p.next(p.messages) == ("devices/dev1/t", b"mine")
        finally:
            p.stop()
    finally:
        await close_env(e)
