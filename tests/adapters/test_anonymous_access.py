"""Anonymous clients under ACL rules (`--auth --allow-anonymous`, docs/security.md "Anonymous
clients"), with each protocol's own client connecting without credentials: paho-mqtt and aiomqtt,
pika (SASL ANONYMOUS), httpx with the cloudevents SDK, the official RocketMQ 5 Python client, and
the 4.x clients (ali-ons, the C++ client) without an AccessKey. The anonymous principal gets what
the rules of `anonymous` grant and nothing else; with `--auth` alone, every such client is refused.

`test_paho_subscribe_failure` is the Eclipse Paho interoperability suite's `test_subscribe_failure`
(client_test.py / client_test5.py): an anonymous client subscribes to `test/nosubscribe` at QoS 2
and must get a failure in its SUBACK (here by a deny rule for `anonymous`)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import aiomqtt
import httpx
import paho.mqtt.client as paho
import pika
import pika.credentials
import pika.exceptions
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_structured_event, to_binary_event
from cloudevents.core.v1.event import CloudEvent

from adapters.amqp.codec import (
    PROTOCOL_HEADER,
    ConnectionClose,
    ConnectionStart,
    ConnectionStartOk,
)
from adapters.cloudevents.codec import BATCH, STRUCTURED
from gateway.server import Gateway
from tests.adapters.amqp.support import Raw
from tests.adapters.mqtt.support import next_message
from tests.adapters.remoting.support import ClientFailed, needs_alions, needs_cpp, received, run
from tests.support import T, running_gateway

pytestmark = pytest.mark.timeout(300)
PROTOCOLS = ("mqtt", "amqp", "http", "grpc", "remoting")
GRPC_CLIENT = Path(__file__).resolve().parent / "grpc" / "official_client.py"
ANON = "anonymous"


async def _policy(g: Gateway) -> None:
    p = g.processor
    sec = p.security
    assert sec is not None
    rule = sec.directory.add_rule
    await rule(ANON, "topic", "test/#", ("publish", "subscribe"), False)
    await rule(ANON, "topic", "test/nosubscribe", ("subscribe",), True)  # the Paho suite's topic
    await rule(ANON, "topic", "anon-q", ("publish", "subscribe", "admin"), False)
    await rule(ANON, "topic", "anon-ce", ("publish", "subscribe"), False)
    await rule(ANON, "group", "anon-ce-g", ("subscribe",), False)
    await rule(ANON, "topic", "AnonT/#", ("publish", "subscribe"), False)
    await rule(ANON, "group", "AnonG", ("subscribe",), False)
    await rule(ANON, "topic", "AnonR/#", ("publish", "subscribe"), False)
    for group in ("anon-js", "anon-cpp"):
        await rule(ANON, "group", group, ("subscribe",), False)
    await rule("anyone", "topic", "members/#", ("publish", "subscribe"), False)  # not anonymous's
    for topic in ("anon-ce", "AnonT", "AnonR", "closed"):
        await p.create_topic(topic, queues=2)


@pytest.fixture
async def anon(tmp_path) -> AsyncIterator[Gateway]:
    """`--auth --allow-anonymous` with the policy above."""
    async with running_gateway(
        str(tmp_path / "data"), PROTOCOLS, auth=True, allow_anonymous=True, default_queues=2
    ) as g:
        await _policy(g)
        yield g


@pytest.fixture
async def closed(tmp_path) -> AsyncIterator[Gateway]:
    """`--auth` alone (the default): the same policy, and anonymous clients refused."""
    async with running_gateway(str(tmp_path / "data"), PROTOCOLS, auth=True, default_queues=2) as g:
        await _policy(g)
        yield g


def port(g: Gateway, name: str) -> int:
    return int(address(g, name).rsplit(":", 1)[1])


def address(g: Gateway, name: str) -> str:
    return next(a for a in g.adapters if a.name == name).address


def code(rc) -> int:  # noqa: ANN001 - paho's ReasonCode or an int
    return rc if isinstance(rc, int) else rc.value


# ---------------------------------------------------------------------------- MQTT


def paho_subscribe(mqtt_port: int, protocol: int, topic: str, user: str | None = None) -> list[int]:
    """The Paho suite's steps: connect (no credentials), subscribe `topic` at QoS 2; the SUBACK's
    reason codes (ConnectionRefusedError with the CONNACK code when the CONNECT is refused)."""
    connected, subscribed = threading.Event(), threading.Event()
    rcs: list[int] = []
    acks: list[int] = []
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="myclientid", protocol=protocol)
    if user is not None:
        c.username_pw_set(user, "wrong-password")

    def on_connect(client, userdata, flags, rc, props):  # noqa: ANN001
        rcs.append(code(rc))
        connected.set()

    def on_subscribe(client, userdata, mid, reason_codes, props):  # noqa: ANN001
        acks.extend(code(r) for r in reason_codes)
        subscribed.set()

    c.on_connect, c.on_subscribe = on_connect, on_subscribe
    c.connect("127.0.0.1", mqtt_port)
    c.loop_start()
    try:
        assert connected.wait(T)
        if rcs[0] != 0:
            raise ConnectionRefusedError(rcs[0])
        c.subscribe(topic, 2)
        assert subscribed.wait(T)
        return acks
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.mark.parametrize(("protocol", "failure"), [(paho.MQTTv311, 0x80), (paho.MQTTv5, 0x87)])
async def test_paho_subscribe_failure(anon, protocol, failure):
    mqtt_port = port(anon, "mqtt")
    assert await asyncio.to_thread(paho_subscribe, mqtt_port, protocol, "test/nosubscribe") == [failure]
    assert await asyncio.to_thread(paho_subscribe, mqtt_port, protocol, "test/allowed") == [2]
    # `anyone` means every authenticated user: its rules do not reach the anonymous principal
    assert await asyncio.to_thread(paho_subscribe, mqtt_port, protocol, "members/x") == [failure]
    # credentials that do not verify are refused, not taken as anonymous
    with pytest.raises(ConnectionRefusedError) as e:
        await asyncio.to_thread(paho_subscribe, mqtt_port, protocol, "test/allowed", "nobody")
    assert e.value.args[0] == 0x86


async def test_aiomqtt_anonymous_publish_and_subscribe_under_rules(anon):
    mqtt_port = port(anon, "mqtt")
    sub = aiomqtt.Client("127.0.0.1", mqtt_port, identifier="anon-sub", protocol=aiomqtt.ProtocolVersion.V5)
    pub = aiomqtt.Client("127.0.0.1", mqtt_port, identifier="anon-pub", protocol=aiomqtt.ProtocolVersion.V5)
    async with sub, pub:
        await sub.subscribe("test/#", qos=1)
        await pub.publish("members/x", b"not-allowed", qos=1)  # PUBACK 0x87: dropped, never stored
        await pub.publish("test/a", b"hello", qos=1)
        m = await next_message(sub)
        assert (str(m.topic), m.payload) == ("test/a", b"hello")
    assert anon.processor.metrics.acl_denials[("mqtt", "publish")] >= 1


@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv5])
async def test_mqtt_anonymous_refused_by_default(closed, protocol):
    with pytest.raises(ConnectionRefusedError) as e:
        await asyncio.to_thread(paho_subscribe, port(closed, "mqtt"), protocol, "test/allowed")
    assert e.value.args[0] == 0x87  # Not authorized (3.1.1: 5, which paho maps to 0x87)
    assert closed.processor.metrics.auth_failures[("mqtt", "missing_credentials")] >= 1


# ---------------------------------------------------------------------------- AMQP


class AnonymousCredentials(pika.credentials.ExternalCredentials):
    """SASL ANONYMOUS (RFC 4505) for pika, through its documented extension point (a subclass of
    ExternalCredentials): chosen only when the server offers the mechanism."""

    TYPE = "ANONYMOUS"

    def response_for(self, start):  # noqa: ANN001, ANN201
        if b"ANONYMOUS" not in pika.compat.as_bytes(start.mechanisms).split():
            return None, None
        return self.TYPE, b"pika"  # the optional trace information


def pika_params(amqp_port: int, vhost: str = "/") -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        "127.0.0.1", amqp_port, vhost, credentials=AnonymousCredentials(), blocked_connection_timeout=T
    )


def pika_round_trip(amqp_port: int) -> dict:
    out: dict = {}
    conn = pika.BlockingConnection(pika_params(amqp_port))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("anon-q", durable=True)
        ch.basic_publish("", "anon-q", b"anon-body", pika.BasicProperties(headers={"k": "v"}))
        method, props, body = None, None, None
        for _ in range(200):
            method, props, body = ch.basic_get("anon-q", auto_ack=True)
            if method is not None:
                break
            conn.sleep(0.02)
        out["got"] = (body, props.headers if props else None)
        try:
            ch.queue_declare("closed-q", durable=True)
        except pika.exceptions.ChannelClosedByBroker as e:
            out["declare_closed"] = e.reply_code
    finally:
        if conn.is_open:
            conn.close()
    try:
        pika.BlockingConnection(pika_params(amqp_port, "other"))
    except pika.exceptions.ProbableAccessDeniedError as e:  # pika's name for a close while opening
        out["other_vhost"] = str(e)
    return out


async def test_pika_anonymous_under_rules(anon):
    out = await asyncio.to_thread(pika_round_trip, port(anon, "amqp"))
    assert out["got"] == (b"anon-body", {"k": "v"})
    assert out["declare_closed"] == 403  # ACCESS_REFUSED: no rule lets anonymous configure it
    assert '(530) "NOT_ALLOWED' in out["other_vhost"]  # anonymous opens the default vhost only


def pika_connect(amqp_port: int, credentials) -> None:  # noqa: ANN001
    pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", amqp_port, credentials=credentials)
    ).close()


async def test_pika_anonymous_refused_by_default(closed):
    amqp_port = port(closed, "amqp")
    with pytest.raises(pika.exceptions.AuthenticationError):  # ANONYMOUS is not offered
        await asyncio.to_thread(pika_connect, amqp_port, AnonymousCredentials())
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):  # pika's default guest/guest
        await asyncio.to_thread(pika_connect, amqp_port, pika.PlainCredentials("guest", "guest"))


async def start_of(g: Gateway, start_ok: ConnectionStartOk | None = None) -> tuple[bytes, list]:
    """The mechanisms of `connection.start`, then what answers `start_ok` until the socket closes."""
    raw = await Raw.open(SimpleNamespace(port=port(g, "amqp")))
    raw.send(PROTOCOL_HEADER)
    start = (await raw.recv()).method
    assert isinstance(start, ConnectionStart)
    if start_ok is None:
        raw.writer.close()
        return start.mechanisms, []
    raw.method(0, start_ok)
    return start.mechanisms, [e.method for e in await raw.recv_until_eof()]


async def test_amqp_offers_anonymous_only_with_allow_anonymous(anon):
    mechanisms, _ = await start_of(anon)
    assert mechanisms.split() == [b"PLAIN", b"AMQPLAIN", b"ANONYMOUS"]
    # a malformed PLAIN is refused as a wrong login, never taken as anonymous
    _, (close,) = await start_of(anon, ConnectionStartOk({}, "PLAIN", b"no separators"))
    assert isinstance(close, ConnectionClose) and close.reply_code == 403


async def test_amqp_anonymous_mechanism_refused_by_default(closed):
    mechanisms, _ = await start_of(closed)
    assert b"ANONYMOUS" not in mechanisms.split()
    _, (close,) = await start_of(closed, ConnectionStartOk({}, "ANONYMOUS", b""))
    assert isinstance(close, ConnectionClose) and close.reply_code == 503  # COMMAND_INVALID


# ---------------------------------------------------------------------------- HTTP / CloudEvents


async def test_cloudevents_anonymous_under_rules(anon):
    url = f"http://{address(anon, 'http')}"
    ev = CloudEvent({"type": "io.example.t", "source": "/anon", "id": "a-1"}, b"payload")
    msg = to_binary_event(ev)
    async with httpx.AsyncClient(base_url=url, timeout=T) as client:
        r = await client.post("/topics/anon-ce/events", headers=msg.headers, content=msg.body)
        assert r.status_code == 202, r.text
        r = await client.post("/topics/closed/events", headers=msg.headers, content=msg.body)
        assert r.status_code == 403 and r.headers["content-type"] == "application/problem+json"
        r = await client.post(
            "/topics/anon-ce/subscriptions/anon-ce-g/pop", json={"max_events": 4, "wait_ms": 2000}
        )
        assert r.status_code == 200 and r.headers["content-type"] == BATCH
        (got,) = r.json()
        got = {k: v for k, v in got.items() if k != "receipthandle"}
        back = from_structured_event(HTTPMessage({"content-type": STRUCTURED}, json.dumps(got).encode()))
        assert back.get_id() == "a-1" and back.get_source() == "/anon" and back.get_data() == b"payload"
        # the console, the admin API and the docs still ask for a login (so a browser prompts)
        for path in ("/admin/topics", "/console", "/admin/users"):
            r = await client.get(path)
            assert r.status_code == 401 and "WWW-Authenticate" in r.headers, path
        # credentials that do not verify are refused, not taken as anonymous
        r = await client.post(
            "/topics/anon-ce/events", headers=msg.headers, content=msg.body, auth=("nobody", "x")
        )
        assert r.status_code == 401


async def test_cloudevents_anonymous_refused_by_default(closed):
    ev = CloudEvent({"type": "io.example.t", "source": "/anon", "id": "a-1"}, b"payload")
    msg = to_binary_event(ev)
    async with httpx.AsyncClient(base_url=f"http://{address(closed, 'http')}", timeout=T) as client:
        r = await client.post("/topics/anon-ce/events", headers=msg.headers, content=msg.body)
    assert r.status_code == 401 and "WWW-Authenticate" in r.headers


# ---------------------------------------------------------------------------- gRPC


async def grpc_probe(endpoint: str, topic: str, group: str) -> dict:
    """The official RocketMQ 5 Python client without credentials (tests/adapters/grpc/official_client.py
    probe: one send, then a SimpleConsumer receive)."""
    if importlib.util.find_spec("rocketmq") is None:
        pytest.skip("rocketmq-python-client is not installed")
    env = dict(os.environ, HOME=os.environ.get("TMPDIR", "/tmp"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(GRPC_CLIENT), "probe", endpoint, topic, group,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_grpc_official_client_anonymous_under_rules(anon):
    endpoint = address(anon, "grpc")
    res = await grpc_probe(endpoint, "AnonT", "AnonG")
    assert "id" in res["send"], res
    assert [m["id"] for m in res["receive"]["got"]] == [res["send"]["id"]], res
    res = await grpc_probe(endpoint, "closed", "AnonG")
    # no rule lets anonymous use `closed`: its route query is FORBIDDEN, so nothing is sent
    assert "error" in res["send"] and "error" in res["receive"], res
    assert anon.processor.metrics.acl_denials[("grpc", "subscribe")] >= 1
    assert not anon.processor.metrics.auth_failures


async def test_grpc_official_client_anonymous_refused_by_default(closed):
    res = await grpc_probe(address(closed, "grpc"), "AnonT", "AnonG")
    assert "error" in res["send"] and "error" in res["receive"], res
    assert closed.processor.metrics.auth_failures[("grpc", "missing_credentials")] >= 1


# ---------------------------------------------------------------------------- RocketMQ 4.x remoting


@needs_alions
@needs_cpp
@pytest.mark.parametrize(("client", "group"), [("alions", "anon-js"), ("cpp", "anon-cpp")])
async def test_remoting_clients_anonymous_under_rules(anon, tmp_path, client, group):
    home, ns = tmp_path / "home", ["--namesrv", address(anon, "remoting")]
    prefix = uuid.uuid4().hex[:6]
    sent = await run(
        client, "produce", *ns, "--topic", "AnonR", "--count", "2", "--prefix", prefix, home=home
    )
    assert len(sent) == 2
    got = await run(client, "consume", *ns, "--topic", "AnonR", "--group", group, "--expect", "2", home=home)
    assert {e["body"] for e in received(got)} == {e["body"] for e in sent}
    with pytest.raises(ClientFailed):
        await run(client, "produce", *ns, "--topic", "closed", home=home, timeout=60)
    assert sum(anon.processor.metrics.acl_denials.values()) >= 1  # refused by the ACL (the route)
    assert not anon.processor.metrics.auth_failures  # ... not by authentication


@needs_alions
@needs_cpp
@pytest.mark.parametrize("client", ["alions", "cpp"])
async def test_remoting_clients_anonymous_refused_by_default(closed, tmp_path, client):
    with pytest.raises(ClientFailed):
        await run(
            client, "produce", "--namesrv", address(closed, "remoting"), "--topic", "AnonR",
            home=tmp_path / "home", timeout=60,
        )  # fmt: skip
    assert closed.processor.metrics.auth_failures[("remoting", "missing_credentials")] >= 1
