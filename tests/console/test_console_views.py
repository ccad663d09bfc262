"""The message browser's "how a consumer sees it" views, in Chromium, against real consumers: one
message each from MQTT 5 (aiomqtt), CloudEvents (the SDK's binary mode over httpx) and AMQP
(aio-pika) on one topic; an aiomqtt subscriber, an aio-pika consumer and a CloudEvents pull
consumer receive all three, and what the console shows for each protocol is what that consumer got."""

from __future__ import annotations

import calendar

import aio_pika
import aiomqtt
import httpx
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.console.support import Console, Shots, address, needs_chromium
from tests.support import T, running_gateway

pytestmark = [pytest.mark.timeout(90), needs_chromium]

TOPIC = "plant"
AMQP_PROPERTIES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


def mqtt_seen(m: aiomqtt.Message) -> dict:
    """What the subscriber got, in the console's MQTT view terms (property names in snake case)."""
    out: dict = {"topic": str(m.topic), "qos": m.qos}
    props = m.properties
    for name in ("ContentType", "ResponseTopic", "PayloadFormatIndicator", "MessageExpiryInterval"):
        if hasattr(props, name):
            out["".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")] = getattr(
                props, name
            )
    if hasattr(props, "UserProperty"):
        out["user_property"] = [list(kv) for kv in props.UserProperty]
    return out


def amqp_seen(m: aio_pika.abc.AbstractIncomingMessage) -> dict:
    """What the consumer got: exchange, routing key and every property it set."""
    props = {}
    for name in AMQP_PROPERTIES:
        v = getattr(m, name)
        if v is None:
            continue
        if name == "timestamp":
            v = calendar.timegm(v.utctimetuple())
        elif name == "delivery_mode":
            v = int(v)
        elif name == "expiration":
            v = str(int(v * 1000))
        props[name] = v
    return {"exchange": m.exchange, "routing_key": m.routing_key, "properties": props}


async def test_protocol_views_equal_what_real_consumers_receive(tmp_path, browser):
    async with running_gateway(str(tmp_path / "data"), ("http", "mqtt", "amqp"), default_queues=1) as gw:
        await gw.processor.create_topic(TOPIC, 1)
        (mhost, mport), (ahost, aport), (hhost, hport) = (address(gw, n) for n in ("mqtt", "amqp", "http"))
        base = f"http://{hhost}:{hport}"
        amqp = await aio_pika.connect(f"amqp://guest:guest@{ahost}:{aport}/")
        ch = await amqp.channel()
        queue = await ch.declare_queue(TOPIC, durable=True)  # AMQP queue `plant` is store topic `plant`
        sub = aiomqtt.Client(mhost, mport, identifier="watcher", protocol=aiomqtt.ProtocolVersion.V5)
        async with sub, httpx.AsyncClient(base_url=base, timeout=T) as http:
            await sub.subscribe(f"{TOPIC}/#", qos=2)
            # 1. MQTT 5 with a content type and user properties (order kept)
            props = Properties(PacketTypes.PUBLISH)
            props.ContentType = "application/json"
            props.UserProperty = [("site", "north"), ("line", "3")]
            async with aiomqtt.Client(
                mhost, mport, identifier="press-7", protocol=aiomqtt.ProtocolVersion.V5
            ) as dev:
                await dev.publish(f"{TOPIC}/press7/temp", b'{"t": 21.5}', qos=1, properties=props)
            # 2. a CloudEvent with its own id, source and an extension
            ev = CloudEvent(
                {"type": "io.example.reading", "source": "/sensors/7", "id": "ev-1", "prio": "high"},
                {"t": 22.5},
            )
            msg = to_binary_event(ev)
            r = await http.post(f"/topics/{TOPIC}/events", headers=msg.headers, content=msg.body)
            assert r.status_code == 202, r.text
            # 3. AMQP with headers and properties, through the default exchange to queue `plant`
            await ch.default_exchange.publish(
                aio_pika.Message(
                    b"from amqp",
                    headers={"foo": "bar", "n": "7"},
                    content_type="text/plain",
                    message_id="m-3",
                    correlation_id="c-3",
                    app_id="line-3",
                ),
                routing_key=TOPIC,
            )

            mqtt_got: dict[bytes, dict] = {}
            async for m in sub.messages:
                mqtt_got[m.payload] = mqtt_seen(m)
                if len(mqtt_got) == 3:
                    break
            amqp_got: dict[bytes, dict] = {}
            async with queue.iterator(timeout=T) as it:
                async for m in it:
                    amqp_got[m.body] = amqp_seen(m)
                    await m.ack()
                    if len(amqp_got) == 3:
                        break
            r = await http.post(f"/topics/{TOPIC}/subscriptions/ce-pull/pop", json={"max_events": 10})
            assert r.status_code == 200, r.text
            ce_got: dict[str, dict] = {}  # by id
            for e in r.json():
                for k in ("data", "data_base64", "receipthandle"):
                    e.pop(k, None)
                ce_got[e["id"]] = e
        await amqp.close()

        page = await browser.new_page(viewport={"width": 1280, "height": 1400})
        c = Console(page, base, Shots(tmp_path))
        await c.open(f"messages?topic={TOPIC}&count=10", "message-views")
        shown = await page.locator("#message-list .message").evaluate_all(
            """els => els.map(e => ({
                body: e.querySelector('pre.body').textContent,
                views: Object.fromEntries([...e.querySelectorAll('pre.view')].map(
                    v => [v.dataset.protocol, JSON.parse(v.textContent)])),
            }))"""
        )
        assert c.errors == []
    views = {s["body"].encode(): s["views"] for s in shown}
    assert len(views) == 3
    mqtt_body, ce_body, amqp_body = b'{"t": 21.5}', msg.body, b"from amqp"
    assert set(views) == {mqtt_body, ce_body, amqp_body}
    # what each real consumer received, message by message
    for body, v in views.items():
        got = amqp_got[body]["properties"]
        for name, default in (("headers", {}), ("priority", 0)):  # aio-pika's when none was sent
            if name not in v["amqp"]["properties"] and got.get(name) == default:
                del got[name]
        assert v["mqtt"] == mqtt_got[body], body
        assert v["amqp"] == amqp_got[body], body
        assert v["cloudevents"] == ce_got.pop(v["cloudevents"]["id"]), body
    assert ce_got == {}  # the pull consumer got these three, no other
    # the defects the issue named: the original CloudEvents id and source, the MQTT source, AMQP headers
    assert (views[ce_body]["cloudevents"]["id"], views[ce_body]["cloudevents"]["source"]) == (
        "ev-1",
        "/sensors/7",
    )
    assert views[mqtt_body]["cloudevents"]["source"] == f"/gateway/mqtt/{TOPIC}"
    assert views[amqp_body]["amqp"]["properties"]["headers"]["foo"] == "bar"
    assert views[mqtt_body]["amqp"]["properties"]["headers"]["mqtt.topic"] == f"{TOPIC}/press7/temp"
    assert views[mqtt_body]["mqtt"]["user_property"][:2] == [["site", "north"], ["line", "3"]]
