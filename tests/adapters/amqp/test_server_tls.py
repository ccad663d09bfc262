"""AMQP over TLS (amqps) when a certificate is configured."""

from __future__ import annotations

import asyncio
import ssl

import pika

from tests.adapters.amqp.support import close_env, open_env
from tests.adapters.mqtt.support import make_cert


async def test_amqps_listener_serves_pika_over_tls(tmp_path):
    cert, key = make_cert(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    env = await open_env(str(tmp_path / "data"), ssl=server_ctx, tls_port=0)
    try:
        tls_address = env.adapter.extra_listeners["amqps"]
        port = int(tls_address.rsplit(":", 1)[1])
        client_ctx = ssl.create_default_context(cafile=cert)

        def scenario():
            params = pika.ConnectionParameters(
                "127.0.0.1",
                port,
                credentials=pika.PlainCredentials("guest", "guest"),
                ssl_options=pika.SSLOptions(client_ctx, "localhost"),
            )
            with pika.BlockingConnection(params) as conn:
                ch = conn.channel()
                ch.queue_declare("tls-q", exclusive=True)
                ch.confirm_delivery()
                ch.basic_publish("", "tls-q", b"secret")
                return ch.basic_get("tls-q", auto_ack=True)[2]

        assert await asyncio.to_thread(scenario) == b"secret"
    finally:
        await close_env(env)
