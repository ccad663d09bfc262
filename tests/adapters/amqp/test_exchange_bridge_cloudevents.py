"""CloudEvents <-> AMQP through the exchanges (adapters/amqp/bridge.py), in a real Gateway: an event
POSTed with the cloudevents SDK reaches a queue bound to `amq.topic` by pattern, and a message an AMQP
application publishes to a store topic's exchange is pulled as a CloudEvent."""

from __future__ import annotations

import aio_pika
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from tests.adapters.amqp.support import get_message
from tests.adapters.cloudevents.support import T, close_gateway, open_gateway


@pytest.fixture
async def gw(tmp_path):
    env = await open_gateway(str(tmp_path / "data"), protocols=("http", "amqp"), amqp_port=0)
    amqp = next(a for a in env.gw.adapters if a.name == "amqp")
    env.amqp_url = f"amqp://guest:guest@127.0.0.1:{amqp.bound_port}/"
    await env.p.create_topic("webhooks")
    yield env
    await close_gateway(env)


async def test_cloudevents_post_reaches_a_queue_bound_by_pattern(gw):
    conn = await aio_pika.connect(gw.amqp_url, timeout=T)
    async with conn:
        ch = await conn.channel()
        hooks = await ch.declare_queue("hooks-worker", durable=True)
        await hooks.bind("amq.topic", "webhooks.#")
        other = await ch.declare_queue("other-worker", durable=True)
        await other.bind("amq.topic", "other.#")
        event = CloudEvent(
            {"id": "e-1", "source": "/shop", "type": "order.created", "datacontenttype": "application/json"},
            b'{"order": 7}',
        )
        msg = to_binary_event(event)
        r = await gw.client.post("/topics/webhooks/events", headers=dict(msg.headers), content=msg.body)
        assert r.status_code == 202, r.text
        m = await get_message(hooks)
        assert m.body == b'{"order": 7}'
        assert (m.exchange, m.routing_key) == ("amq.topic", "webhooks")
        assert m.headers["ce.id"] == "e-1" and m.headers["ce.type"] == "order.created"
        await m.ack()
        # `other.#` never matched: its first message is one published for it afterwards
        await ch.default_exchange.publish(aio_pika.Message(b"mine"), routing_key="other-worker")
        assert (await get_message(other)).body == b"mine"


async def test_amqp_publish_to_a_topics_exchange_is_pulled_as_a_cloudevent(gw):
    conn = await aio_pika.connect(gw.amqp_url, timeout=T)
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange("webhooks")  # every store topic is an exchange
        await ex.publish(
            aio_pika.Message(b"shipped", content_type="text/plain", headers={"region": "eu"}),
            routing_key="eu.shipped",
        )
    r = await gw.client.post(
        "/topics/webhooks/subscriptions/billing/pop",
        json={"max_events": 10, "wait_ms": int(T * 1000)},
        headers={"accept": "application/cloudevents+json"},
    )
    assert r.status_code == 200, r.text
    ev = r.json()
    # stored with the MQTT path of the routing key (docs/amqp.md), so it reads as an MQTT publish
    assert (ev["subject"], ev["type"], ev["source"]) == (
        "webhooks/eu/shipped",
        "mqtt.publish",
        "/gateway/mqtt/webhooks",
    )
    assert (ev["data"], ev["datacontenttype"]) == ("shipped", "text/plain")
