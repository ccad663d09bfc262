"""Across protocols: MQTT publishes reach a webhook as valid CloudEvents; events POSTed over HTTP
reach MQTT subscribers and processor consumers with their attributes as properties."""

from __future__ import annotations

import asyncio
import json

import aiomqtt
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from messaging_processor import ClientContext
from tests.adapters.cloudevents.support import T, wait_until

pytestmark = pytest.mark.asyncio(loop_scope="module")
V5 = aiomqtt.ProtocolVersion.V5
CTX = ClientContext("test")


def mqtt_client(env, name: str) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", env.mqtt.bound_port, identifier=name, protocol=V5)


async def test_mqtt_publish_arrives_at_a_webhook_as_a_cloudevent(env, receiver):
    r = await env.client.post(
        "/subscriptions", json={"topic": env.topic, "sink": receiver.url(), "delivery": {"handshake": False}}
    )
    sub = r.json()

    async def active():
        return (await env.client.get(f"/subscriptions/{sub['id']}")).json()["status"]["state"] == "active"

    await wait_until(active)
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "application/json"
    path = f"{env.topic}/42/telemetry"
    async with mqtt_client(env, "dev-42") as c:
        await c.publish(path, b'{"temp":21.5}', qos=1, properties=props)
    (post,) = await receiver.wait_posts(1)
    ev = post.event()  # parsed by the cloudevents SDK
    assert ev.get_specversion() == "1.0" and ev.get_id()
    assert ev.get_type() == "mqtt.publish" and ev.get_subject() == path
    assert ev.get_source() == f"/gateway/mqtt/{env.topic}"
    assert ev.get_datacontenttype() == "application/json" and ev.get_data() == {"temp": 21.5}
    assert ev.get_time() is not None
    stored = await env.p.pop(CTX, "check", env.topic, long_poll_ms=1000)
    assert ev.get_id() == stored[0].message.message_id


async def test_posted_event_reaches_mqtt_subscriber_and_processor_consumer(env):
    ce = CloudEvent(
        {
            "type": "io.example.cmd",
            "source": "/ops",
            "id": "cmd-1",
            "datacontenttype": "application/json",
            "prio": "high",
        },
        {"action": "reboot"},
    )
    msg = to_binary_event(ce)
    async with mqtt_client(env, "listener") as sub:
        await sub.subscribe(f"{env.topic}/#", qos=1)
        r = await env.client.post(env.url, headers=msg.headers, content=msg.body)
        assert r.status_code == 202

        async def first():
            async for m in sub.messages:
                return m

        m = await asyncio.wait_for(first(), T)
    assert str(m.topic) == env.topic and json.loads(m.payload) == {"action": "reboot"}
    (d,) = await env.p.pop(CTX, "grpc-like-consumer", env.topic, long_poll_ms=1000)
    p = d.message.properties
    assert d.message.body == msg.body
    assert (p["ce.id"], p["ce.source"], p["ce.type"], p["ce.prio"]) == (
        "cmd-1",
        "/ops",
        "io.example.cmd",
        "high",
    )
    assert p["ce.datacontenttype"] == "application/json"
