"""Device tokens (JWT, docs/security.md "Device tokens (JWT)") with each protocol's real client against
an in-process gateway started with `--auth --jwt-public-key PEM --jwt-secret-file FILE
--jwt-device-claim dev`: PyJWT-made RS256 and HS256 tokens accepted, expired or wrongly signed ones
refused with the protocol's own error, `%d` in ACL rules the token's device, and an MQTT client
disconnected when its token expires (5.0: DISCONNECT 0xA0 Maximum connect time)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import aiomqtt
import aiormq
import grpc
import httpx
import jwt
import paho.mqtt.client as paho
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from adapters.grpc.codes import Code
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from gateway.server import Gateway
from tests.adapters.grpc.support import CLIENT_ID, msg
from tests.adapters.mqtt.support import next_message
from tests.support import T, running_gateway

pytestmark = pytest.mark.timeout(60)
SECRET = b"0123456789abcdef0123456789abcdef-device-token-secret"
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
OTHER_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # not the gateway's


def rs256(key: rsa.RSAPrivateKey = RSA_KEY, **claims: object) -> str:
    return jwt.encode({"sub": "dev-1", "dev": "d1", "exp": int(time.time()) + 300} | claims, key, "RS256")


def hs256(secret: bytes = SECRET, **claims: object) -> str:
    return jwt.encode({"sub": "dev-1", "dev": "d1", "exp": int(time.time()) + 300} | claims, secret, "HS256")


def expired() -> str:
    return rs256(exp=int(time.time()) - 60)


def wrong_signature() -> str:
    return rs256(OTHER_KEY)


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Gateway]:
    pem = tmp_path / "jwt.pub.pem"
    pem.write_bytes(
        RSA_KEY.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    secret = tmp_path / "jwt.secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    async with running_gateway(
        str(tmp_path / "data"),
        ("mqtt", "amqp", "http", "grpc"),
        auth=True,
        default_queues=2,
        jwt_public_key=str(pem),
        jwt_secret_file=str(secret),
        jwt_device_claim="dev",
    ) as g:
        p = g.processor
        sec = p.security
        assert sec is not None and sec.jwt is not None
        rule = sec.directory.add_rule
        await rule("anyone", "topic", "devices/%d/#", ("publish", "subscribe"), False)
        await rule("anyone", "topic", "jq", ("publish", "subscribe", "admin"), False)
        await rule("anyone", "topic", "cejwt", ("publish",), False)
        for topic in ("devices", "cejwt"):
            await p.create_topic(topic, queues=2)
        yield g


def address(g: Gateway, name: str) -> str:
    return next(a for a in g.adapters if a.name == name).address


def port(g: Gateway, name: str) -> int:
    return int(address(g, name).rsplit(":", 1)[1])


def code(rc) -> int:  # noqa: ANN001 - paho's ReasonCode or an int
    return rc if isinstance(rc, int) else rc.value


# ---------------------------------------------------------------------------- MQTT


@pytest.mark.parametrize("version", [aiomqtt.ProtocolVersion.V311, aiomqtt.ProtocolVersion.V5])
@pytest.mark.parametrize("make", [rs256, hs256], ids=["RS256", "HS256"])
async def test_mqtt_token_as_password_and_device_rules(gw, version, make):
    # the user name may be anything: the user is the token's `sub`, `%d` its `dev`
    client = aiomqtt.Client(
        "127.0.0.1", port(gw, "mqtt"), identifier="c1", username="any", password=make(), protocol=version
    )
    async with client:
        await client.subscribe("devices/d1/#", qos=1)
        granted = await client.subscribe("devices/d2/#", qos=1)
        assert [code(r) for r in granted] == [0x80 if version == aiomqtt.ProtocolVersion.V311 else 0x87]
        await client.publish("devices/d1/temp", b"21.5", qos=1)
        got = await next_message(client)
        assert (str(got.topic), got.payload) == ("devices/d1/temp", b"21.5")


@pytest.mark.parametrize("version", [aiomqtt.ProtocolVersion.V311, aiomqtt.ProtocolVersion.V5])
@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (expired, "jwt_expired"),
        (wrong_signature, "jwt_bad_signature"),
        (lambda: hs256(b"x" * 40), "jwt_bad_signature"),
    ],
)
async def test_mqtt_expired_or_wrongly_signed_token_refused(gw, version, make, reason, caplog):
    token = make()
    client = aiomqtt.Client(
        "127.0.0.1", port(gw, "mqtt"), identifier="c2", username="any", password=token, protocol=version
    )
    with pytest.raises(aiomqtt.MqttCodeError) as e:
        async with client:
            pass
    assert code(e.value.rc) == 0x86  # Bad user name or password (paho maps 3.1.1's 4 to it)
    assert gw.processor.metrics.auth_failures[("mqtt", reason)] == 1
    assert f"reason={reason}" in caplog.text and token not in caplog.text  # the audit log, no secret


async def test_mqtt_passwords_still_work_beside_tokens(gw):
    sec = gw.processor.security
    await sec.add_user("alice", password="alice.pw.not-a-token")  # dots, yet not a JWT's shape
    await sec.directory.add_rule("user:alice", "topic", "devices/alice/#", ("publish",), False)
    mqtt_port = port(gw, "mqtt")
    async with aiomqtt.Client("127.0.0.1", mqtt_port, username="alice", password="alice.pw.not-a-token") as c:
        await c.publish("devices/alice/x", b"1", qos=1)
    with pytest.raises(aiomqtt.MqttCodeError):
        async with aiomqtt.Client("127.0.0.1", mqtt_port, username="alice", password="wrong"):
            pass


def paho_until_disconnected(mqtt_port: int, protocol: int, token: str) -> tuple[int, int, float]:
    """Connect with `token`, wait for the server to end the connection: (CONNACK code, DISCONNECT
    reason code, time.time() of the disconnect)."""
    out: dict[str, object] = {}
    gone = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="expiring", protocol=protocol)
    c.username_pw_set("any", token)

    def on_connect(client, userdata, flags, rc, props):  # noqa: ANN001
        out["connack"] = code(rc)

    def on_disconnect(client, userdata, flags, rc, props):  # noqa: ANN001
        out["at"] = time.time()
        out["reason"] = code(rc)
        gone.set()

    c.on_connect, c.on_disconnect = on_connect, on_disconnect
    c.connect("127.0.0.1", mqtt_port, keepalive=60)
    c.loop_start()
    try:
        assert gone.wait(T), "not disconnected"
    finally:
        c.loop_stop()
    return out["connack"], out["reason"], out["at"]  # type: ignore[return-value]


@pytest.mark.parametrize("protocol", [paho.MQTTv5, paho.MQTTv311])
async def test_mqtt_client_disconnected_when_its_token_expires(gw, protocol):
    exp = int(time.time()) + 2
    connack, reason, at = await asyncio.to_thread(
        paho_until_disconnected, port(gw, "mqtt"), protocol, rs256(exp=exp)
    )
    assert connack == 0
    assert at >= exp - 0.05  # not before the token's exp (the deadline wheel never fires early)
    assert at < exp + 2  # ... and soon after it
    if protocol == paho.MQTTv5:
        assert reason == 0xA0  # DISCONNECT Maximum connect time
    else:
        assert reason != 0  # 3.1.1 has no server DISCONNECT: the connection is closed
    # reconnecting with the expired token is refused
    client = aiomqtt.Client(
        "127.0.0.1", port(gw, "mqtt"), identifier="expiring", username="any", password=rs256(exp=exp)
    )
    with pytest.raises(aiomqtt.MqttCodeError):
        async with client:
            pass


# ---------------------------------------------------------------------------- AMQP


@pytest.mark.parametrize("make", [rs256, hs256], ids=["RS256", "HS256"])
async def test_amqp_plain_password_token(gw, make):
    url = f"amqp://dev:{make()}@127.0.0.1:{port(gw, 'amqp')}/"
    conn = await aio_pika.connect(url, timeout=T)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("jq", durable=True)
        await ch.default_exchange.publish(aio_pika.Message(b"hi", delivery_mode=2), routing_key="jq")
        got = await q.get(timeout=T)
        assert got.body == b"hi"
        await got.ack()


@pytest.mark.parametrize("make", [expired, wrong_signature])
async def test_amqp_expired_or_wrongly_signed_token_refused(gw, make):
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):  # connection.close 403
        await aio_pika.connect(f"amqp://dev:{make()}@127.0.0.1:{port(gw, 'amqp')}/", timeout=T)


# ---------------------------------------------------------------------------- HTTP (CloudEvents)


async def test_http_bearer_token(gw):
    m = to_binary_event(CloudEvent({"type": "io.example.t", "source": "/dev", "id": "e-1"}, b"x"))
    async with httpx.AsyncClient(base_url=f"http://{address(gw, 'http')}", timeout=T) as c:
        for make in (rs256, hs256):
            h = dict(m.headers) | {"Authorization": f"Bearer {make()}"}
            r = await c.post("/topics/cejwt/events", headers=h, content=m.body)
            assert r.status_code == 202, r.text
        for bad in (expired(), wrong_signature()):
            h = dict(m.headers) | {"Authorization": f"Bearer {bad}"}
            r = await c.post("/topics/cejwt/events", headers=h, content=m.body)
            assert r.status_code == 401 and "WWW-Authenticate" in r.headers
        h = dict(m.headers) | {"Authorization": f"Bearer {rs256()}"}
        r = await c.post("/topics/devices/events", headers=h, content=m.body)  # no rule allows it
        assert r.status_code == 403
        # a token naming the admin user is not an admin: device tokens never carry the admin role
        r = await c.get("/admin/users", headers={"Authorization": f"Bearer {rs256(sub='admin')}"})
        assert r.status_code == 403


# ---------------------------------------------------------------------------- gRPC


async def test_grpc_bearer_metadata(gw):
    async with grpc.aio.insecure_channel(address(gw, "grpc")) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)

        def md(token: str) -> tuple:
            return (("x-mq-client-id", CLIENT_ID), ("authorization", f"Bearer {token}"))

        for make in (rs256, hs256):
            r = await stub.SendMessage(
                s.SendMessageRequest(messages=[msg("devices", tag="d1")]), metadata=md(make())
            )
            assert r.status.code == Code.OK, r.status
        r = await stub.SendMessage(
            s.SendMessageRequest(messages=[msg("devices", tag="d2")]), metadata=md(rs256())
        )
        assert r.status.code == Code.FORBIDDEN  # `devices/%d/#` with %d = d1
        for bad in (expired(), wrong_signature()):
            r = await stub.SendMessage(
                s.SendMessageRequest(messages=[msg("devices", tag="d1")]), metadata=md(bad)
            )
            assert r.status.code == Code.UNAUTHORIZED
