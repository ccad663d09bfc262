"""One identity and ACL model across protocols: a message an AMQP user allowed on `orders`
publishes reaches an MQTT subscriber allowed on `orders/#`, and not one whose rules do not allow it
(its `#` subscription is granted for the paths it may read, and `orders` is not one of them)."""

from __future__ import annotations

import aio_pika
import aiomqtt
import pytest

from adapters.amqp import AmqpAdapter
from adapters.mqtt import MqttAdapter
from tests.adapters.mqtt.support import next_message
from tests.support import Core, T


@pytest.fixture
async def gw(tmp_path):
    core = await Core.open(str(tmp_path / "data"), auth=True, default_queues=2)
    mqtt = await core.add(MqttAdapter(core.processor, "127.0.0.1", 0, topic_scan_interval=0.1))
    amqp = await core.add(AmqpAdapter(core.processor, "127.0.0.1", 0))
    sec = core.security
    for name in ("shop", "reader", "other"):
        await sec.add_user(name, password=f"{name}-pw")
    d = sec.directory
    await d.add_rule("user:shop", "topic", "orders", ("publish", "subscribe", "admin"), False)
    await d.add_rule("user:reader", "topic", "orders/#", ("subscribe",), False)
    await d.add_rule("user:other", "topic", "other/#", ("subscribe", "publish"), False)
    yield core, mqtt.bound_port, amqp.bound_port
    await core.close()


async def test_amqp_publish_reaches_only_the_mqtt_subscriber_allowed_to_read_it(gw) -> None:
    core, mqtt_port, amqp_port = gw
    reader = aiomqtt.Client(
        "127.0.0.1", mqtt_port, identifier="reader-1", username="reader", password="reader-pw"
    )
    other = aiomqtt.Client(
        "127.0.0.1", mqtt_port, identifier="other-1", username="other", password="other-pw"
    )
    async with reader, other:
        await reader.subscribe("orders/#", qos=1)
        await other.subscribe("#", qos=1)  # granted: `other/#` may match; each path is checked
        conn = await aio_pika.connect(f"amqp://shop:shop-pw@127.0.0.1:{amqp_port}/", timeout=T)
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            await ch.declare_queue("orders", durable=True)
            await ch.default_exchange.publish(
                aio_pika.Message(b"order-1", delivery_mode=2), routing_key="orders"
            )
        got = await next_message(reader)
        assert got.payload == b"order-1" and str(got.topic) == "orders"
        # The fan-out wrote the order to every matching session's socket before the reader got it;
        # a marker the other subscriber may read, published now, comes later on the same socket: so
        # if the first thing `other` receives is the marker, the order was not delivered to it.
        async with aiomqtt.Client(
            "127.0.0.1", mqtt_port, identifier="other-pub", username="other", password="other-pw"
        ) as pub:
            await pub.publish("other/marker", b"marker", qos=1)
        first = await next_message(other)
        assert (str(first.topic), first.payload) == ("other/marker", b"marker")
    assert core.processor.metrics.acl_denials[("mqtt", "subscribe")] >= 1
