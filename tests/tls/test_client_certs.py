"""Client certificates and refusals: `--tls-required` on the remoting port, `--tls-client-ca` with
`--tls-require-client-cert`, MQTT's `--mqtt-cert-identity` and AMQP's SASL EXTERNAL with `--auth`."""

from __future__ import annotations

import contextlib
import socket
import ssl

import aio_pika
import aiomqtt
import httpx
import pytest
from aiormq.exceptions import AuthenticationError, ProbableAuthenticationError

from tests.tls.certs import TestCa
from tests.tls.support import client_context, port_of, remoting_call, start_gateway

ADMIN_PW = "Adm1n-pw-for-tls-tests"


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> TestCa:
    return TestCa(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def strict(tmp_path_factory, ca):
    """Remoting and HTTP(S): TLS required, and a client certificate of the test CA required."""
    server = ca.server("strict", 1)
    proc = start_gateway(
        tmp_path_factory.mktemp("strict"),
        *("--tls-cert", server.cert, "--tls-key", server.key, "--tls-client-ca", ca.cert),
        *("--tls-require-client-cert", "--tls-required", "--auto-create-topics"),
        protocols="remoting,http",
    )
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def authed(tmp_path_factory, ca):
    """MQTT and AMQP with --auth, client certificates asked for (optional), MQTT taking the CN."""
    server = ca.server("authed", 2)
    proc = start_gateway(
        tmp_path_factory.mktemp("authed"),
        *("--tls-cert", server.cert, "--tls-key", server.key, "--tls-client-ca", ca.cert),
        *("--auth", "--mqtt-cert-identity"),
        protocols="mqtt,amqp,http",
        env={"GATEWAY_ADMIN_PASSWORD": ADMIN_PW},
    )
    admin = ("admin", ADMIN_PW)
    base = f"http://{proc.listeners['http']}/admin"
    for body in ({"name": "alice"}, {"name": "ana", "password": "ana-pw"}):
        assert httpx.post(f"{base}/users", json=body, auth=admin, timeout=10).status_code == 201
    rule = {"subject": "role:user", "pattern": "%u/#", "actions": ["publish", "subscribe"]}
    assert httpx.post(f"{base}/acl", json=rule, auth=admin, timeout=10).status_code == 201
    yield proc
    assert proc.stop() == 0


def test_tls_required_refuses_a_plain_remoting_client(strict, ca):
    address = strict.listeners["remoting"]
    with socket.create_connection(("127.0.0.1", port_of(address)), timeout=10) as plain:
        plain.sendall(b"\x00\x00\x00\x10not tls at all..")
        with contextlib.suppress(ConnectionResetError):
            assert plain.recv(100) == b""  # closed, nothing answered
    assert strict.wait_line(r"plain connection from 127\.0\.0\.1:\d+ refused: TLS is required", 10)
    alice = ca.client("alice")
    reply = remoting_call(address, client_context(ca.cert, alice.cert, alice.key))
    assert reply.is_response and reply.opaque == 7 and reply.code == 0, reply.remark


def test_required_client_certificate(strict, ca):
    no_cert = client_context(ca.cert)
    with pytest.raises((ssl.SSLError, ConnectionError, AssertionError)):
        remoting_call(strict.listeners["remoting"], no_cert)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"https://{strict.listeners['https']}/healthz", verify=no_cert, timeout=10)
    other_ca = TestCa(ca.dir / "other")  # a certificate the gateway's client CA did not sign
    stranger = other_ca.client("alice")
    with pytest.raises(httpx.HTTPError):
        httpx.get(
            f"https://{strict.listeners['https']}/healthz",
            verify=client_context(ca.cert, stranger.cert, stranger.key),
            timeout=10,
        )
    alice = ca.client("alice")
    r = httpx.get(
        f"https://{strict.listeners['https']}/healthz",
        verify=client_context(ca.cert, alice.cert, alice.key),
        timeout=10,
    )
    assert r.status_code == 200


async def test_mqtt_certificate_cn_is_the_user(authed, ca):
    alice = ca.client("alice")
    ctx = client_context(ca.cert, alice.cert, alice.key)
    port = port_of(authed.listeners["mqtts"])
    async with aiomqtt.Client("127.0.0.1", port, tls_context=ctx, identifier="alice-dev") as c:
        await c.subscribe("alice/t", qos=1)
        await c.publish("alice/t", b"by certificate", qos=1)
        async for m in c.messages:
            assert m.payload == b"by certificate"
            break
        granted = await c.subscribe("bob/t", qos=1)  # her rights, not anyone's: bob/# is not hers
        assert [int(getattr(g, "value", g)) for g in granted] == [0x80], granted
    # without a certificate on the same TLS port: the user name and password of CONNECT
    async with aiomqtt.Client(
        "127.0.0.1", port, tls_context=client_context(ca.cert), username="ana", password="ana-pw"
    ) as c:
        await c.publish("ana/t", b"by password", qos=1)
    mallory = ca.client("mallory")  # a valid certificate, but no such user
    ctx = client_context(ca.cert, mallory.cert, mallory.key)
    with pytest.raises(aiomqtt.MqttCodeError) as refused:
        async with aiomqtt.Client("127.0.0.1", port, tls_context=ctx):
            pass
    assert "bad user name or password" in str(refused.value).lower(), refused.value


async def test_amqp_sasl_external(authed, ca):
    port = port_of(authed.listeners["amqps"])
    alice = ca.client("alice")
    url = f"amqps://127.0.0.1:{port}/?auth=external"
    conn = await aio_pika.connect(url, ssl_context=client_context(ca.cert, alice.cert, alice.key), timeout=10)
    async with conn:
        ch = await conn.channel()
        assert not ch.is_closed
    mallory = ca.client("mallory")
    with pytest.raises(ProbableAuthenticationError, match="ACCESS_REFUSED"):  # no such user
        await aio_pika.connect(
            url, ssl_context=client_context(ca.cert, mallory.cert, mallory.key), timeout=10
        )
    with pytest.raises(AuthenticationError) as not_offered:  # no certificate: EXTERNAL is not offered
        await aio_pika.connect(url, ssl_context=client_context(ca.cert), timeout=10)
    assert "EXTERNAL" not in str(not_offered.value.args[0]), not_offered.value
