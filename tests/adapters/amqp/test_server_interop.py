"""A message published over AMQP is consumable over MQTT and through the processor (what the gRPC
adapter calls), and the reverse. Rule (docs/amqp.md): queue Q is store topic Q, so anything any
protocol writes to store topic Q is in queue Q, and Q's messages are on topic Q for everyone."""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest
from aio_pika import ExchangeType, Message

from adapters.mqtt import MqttAdapter
from messaging_processor import Message as StoreMessage
from messaging_processor.tracing import derived_traceparent
from tests.adapters.amqp.support import CTX, T, get_message


@pytest.fixture
async def mqtt(env):
    adapter = MqttAdapter(env.processor, "127.0.0.1", 0, topic_scan_interval=0.1)
    await adapter.start()
    yield adapter
    await adapter.stop(1.0)


async def next_mqtt(client: aiomqtt.Client) -> aiomqtt.Message:
    async def first():
        async for m in client.messages:
            return m

    return await asyncio.wait_for(first(), T)


async def test_amqp_publish_is_delivered_to_mqtt_subscribers(env, mqtt):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("sensors", durable=True)
        await q.bind("amq.topic", "sensors.#")
        async with aiomqtt.Client("127.0.0.1", mqtt.bound_port, identifier="sub-1") as sub:
            await sub.subscribe("sensors/#", qos=1)
            await ch.default_exchange.publish(Message(b"t=21"), routing_key="sensors")
            m = await next_mqtt(sub)
            assert (str(m.topic), m.payload) == ("sensors", b"t=21")
            ex = await ch.get_exchange("amq.topic")
            await ex.publish(Message(b"t=22"), routing_key="sensors.room1")
            m = await next_mqtt(sub)
            # amq.topic is the MQTT exchange: routing key sensors.room1 is MQTT path sensors/room1
            assert (str(m.topic), m.payload) == ("sensors/room1", b"t=22")
        # the AMQP queue has both too (MQTT reads with its own group)
        assert [(await get_message(q)).body for _ in range(2)] == [b"t=21", b"t=22"]


async def test_mqtt_publish_is_consumed_from_the_amqp_queue_of_its_store_topic(env, mqtt):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("telemetry", durable=True)
        async with aiomqtt.Client("127.0.0.1", mqtt.bound_port, identifier="pub-1") as pub:
            await pub.publish("telemetry/dev1/temp", b"22.5", qos=1)
        m = await get_message(q)
        assert m.body == b"22.5"
        assert (m.exchange, m.routing_key) == ("", "telemetry.dev1.temp")
        assert m.headers["mqtt.topic"] == "telemetry/dev1/temp" and m.headers["mqtt.qos"] == "1"
        assert m.delivery_mode == 2 and m.message_id
        await m.ack()


async def test_amqp_publish_is_popped_by_another_consumer_group(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("orders", durable=True)
        ex = await ch.declare_exchange("shop", ExchangeType.DIRECT)
        await q.bind(ex, "created")
        await ex.publish(Message(b"order-1", content_type="application/json", correlation_id="c1"), "created")
        ds = await env.processor.pop(CTX, "grpc-billing", "orders", max_messages=4, long_poll_ms=2000)
        assert len(ds) == 1
        d = ds[0]
        assert (d.message.body, d.message.tag) == (b"order-1", "created")
        assert d.message.properties["amqp.exchange"] == "shop"
        assert d.message.properties["amqp.content_type"] == "application/json"
        assert d.message.properties["amqp.correlation_id"] == "c1"
        await env.processor.ack(CTX, d.receipt_handle)
        # the AMQP queue is its own group: it still has the message
        assert (await get_message(q)).body == b"order-1"


async def test_processor_send_is_consumed_over_amqp(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("payments", durable=True)
        [r] = await env.processor.send(
            CTX, [StoreMessage("payments", b"from grpc", tag="paid", keys=("k1",), properties={"a": "b"})]
        )
        m = await get_message(q)
        assert (m.body, m.routing_key, m.exchange) == (b"from grpc", "paid", "")
        # its properties as headers; no trace context derived from its id (issue 47)
        assert m.headers == {"a": "b"} and derived_traceparent(r.message_id) is not None
        assert not m.redelivered
        await m.ack()
        assert (await q.declare()).message_count == 0
