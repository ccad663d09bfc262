"""The official RocketMQ 5 Python client <-> AMQP through the exchanges (adapters/amqp/bridge.py),
in a real Gateway: a Producer's messages reach an AMQP queue bound to the topic's exchange, and an
AMQP publish to a topic's exchange is received by a SimpleConsumer. The client runs in a subprocess
(tests/adapters/grpc/official_client.py)."""

from __future__ import annotations

import importlib.util

import aio_pika
import pytest

from tests.adapters.amqp.support import get_message
from tests.adapters.cloudevents.support import T, close_gateway, open_gateway
from tests.adapters.grpc.test_official_client import run_client

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("rocketmq") is None, reason="rocketmq-python-client is not installed"
)


@pytest.fixture
async def gw(tmp_path):
    env = await open_gateway(
        str(tmp_path / "data"), protocols=("http", "amqp", "grpc"), amqp_port=0, grpc_port=0
    )
    amqp = next(a for a in env.gw.adapters if a.name == "amqp")
    env.grpc = next(a for a in env.gw.adapters if a.name == "grpc").address
    env.amqp_url = f"amqp://guest:guest@127.0.0.1:{amqp.bound_port}/"
    await env.p.create_topic("orders", queues=2)
    yield env
    await close_gateway(env)


async def test_official_producer_reaches_a_queue_bound_to_the_topics_exchange(gw):
    conn = await aio_pika.connect(gw.amqp_url, timeout=T)
    async with conn:
        ch = await conn.channel()
        tagged = await ch.declare_queue("orders-taga", durable=True)
        await tagged.bind("orders", "TagA")  # the topic's exchange: routing key = tag
        other = await ch.declare_queue("orders-tagb", durable=True)
        await other.bind("orders", "TagB")
        everything = await ch.declare_queue("orders-all", durable=True)
        await everything.bind("amq.topic", "orders.#")  # the MQTT exchange: <topic>.<tag>
        res = await run_client("send", gw.grpc, "orders", "unused")
        assert len(res["sent"]) == 3
        for q, rk, exchange in ((tagged, "TagA", "orders"), (everything, "orders.TagA", "amq.topic")):
            got = []
            for _ in range(3):
                m = await get_message(q)
                got.append(m)
                await m.ack()
            got.sort(key=lambda m: m.body)
            assert [m.body for m in got] == [b"hello-0", b"hello-1", b"hello-2"]
            assert sorted(m.message_id for m in got) == sorted(res["sent"])  # the client's ids
            for i, m in enumerate(got):
                assert (m.exchange, m.routing_key) == (exchange, rk)
                assert m.headers["seq"] == str(i)  # user properties are headers
            assert await q.get(fail=False) is None
        assert await other.get(fail=False) is None


async def test_amqp_publish_to_a_topics_exchange_reaches_a_simple_consumer(gw):
    conn = await aio_pika.connect(gw.amqp_url, timeout=T)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange("orders")  # every store topic is an exchange
        for i in range(3):
            await ex.publish(
                aio_pika.Message(
                    f"order-{i}".encode(),
                    content_type="application/json",
                    correlation_id=f"c-{i}",
                    headers={"region": "eu", "n": i},
                ),
                routing_key="created",
            )
    res = await run_client("receive", gw.grpc, "orders", "billing")
    got = sorted(res["got"], key=lambda m: m["body"])
    assert [m["body"] for m in got] == ["order-0", "order-1", "order-2"]
    for i, m in enumerate(got):
        assert m["tag"] == "created"  # routing key -> tag
        # headers are user properties; content type and correlation id readable copies
        assert (m["props"]["region"], m["props"]["n"]) == ("eu", str(i))
        assert m["props"]["amqp.content_type"] == "application/json"
        assert m["props"]["amqp.correlation_id"] == f"c-{i}"
        assert m["attempt"] == 1
