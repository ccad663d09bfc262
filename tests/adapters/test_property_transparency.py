"""Deliver exactly what was sent (issue 47): the gateway adds no trace context to any delivery.

- MQTT 5 subscribers (aiomqtt and paho-mqtt) get exactly the User Properties a publisher sent, in
  their order, repeated names and a `traceparent` among them in its place: published over MQTT,
  over AMQP (aio-pika headers, through the MQTT exchange `amq.topic`), gRPC (user properties and
  `trace_context`) and CloudEvents (`traceparent` attribute); a message sent without a trace context
  arrives without one.
- aio-pika's own `test_incoming_message_info`, against the gateway: a received message's info
  (headers `{'foo': 'bar'}` included) equals exactly what was published.

One in-process gateway (tests/support.py `running_gateway`) per test, ephemeral ports."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime

import aio_pika
import aiomqtt
import grpc
import httpx
import paho.mqtt.client as paho
import pytest
from aio_pika.abc import DeliveryMode, MessageInfo
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2 as s
from adapters.grpc.generated import service_pb2_grpc
from tests.adapters.grpc.support import msg
from tests.adapters.mqtt.support import V5
from tests.support import T, running_gateway, wait_until

pytestmark = pytest.mark.timeout(90)

TOPIC = "tp"
TP = {p: f"00-{c * 32}-{c * 16}-01" for p, c in (("mqtt", "a"), ("amqp", "b"), ("grpc", "c"), ("http", "d"))}
MD = (("x-mq-client-id", "transparency@1@0@grpc"), ("x-mq-language", "PYTHON"))


@pytest.fixture
async def gw(tmp_path):
    async with running_gateway(
        str(tmp_path / "data"), ("mqtt", "amqp", "http", "grpc"), default_queues=1
    ) as g:
        await g.processor.create_topic(TOPIC, 1)
        yield g


def port(gw, name: str) -> int:
    return next(a for a in gw.adapters if a.name == name).bound_port


def address(gw, name: str) -> str:
    return next(a for a in gw.adapters if a.name == name).address


class PahoSubscriber:
    """A paho-mqtt 5 client on its own network thread: the messages it got, by payload."""

    def __init__(self, mqtt_port: int, topic: str) -> None:
        self.got: dict[bytes, list[tuple[str, str]] | None] = {}
        self.subscribed = threading.Event()
        c = self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"p-{uuid.uuid4().hex[:8]}",
                                 protocol=paho.MQTTv5)  # fmt: skip
        c.on_message = lambda _c, _u, m: self.got.__setitem__(
            m.payload, getattr(m.properties, "UserProperty", None)
        )
        c.on_subscribe = lambda *_: self.subscribed.set()
        c.on_connect = lambda cl, *_: cl.subscribe(topic, qos=1)
        c.connect("127.0.0.1", mqtt_port)
        c.loop_start()

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


async def publish_everything(gw) -> dict[bytes, list[tuple[str, str]] | None]:
    """One message per case, each over its protocol; the User Properties an MQTT 5 subscriber must
    get for it (None: none at all)."""
    want: dict[bytes, list[tuple[str, str]] | None] = {}
    async with aiomqtt.Client("127.0.0.1", port(gw, "mqtt"), protocol=V5) as pub:
        cases = {
            b"mqtt-traced": [("z", "1"), ("traceparent", TP["mqtt"]), ("a", "2"), ("z", "3")],
            b"mqtt-plain": [("a", "2"), ("c", "3")],
            b"mqtt-odd": [("traceparent", "not-a-trace-context"), ("k", "v")],  # (kept as sent)
            b"mqtt-none": None,
        }
        for body, ups in cases.items():
            props = None
            if ups is not None:
                props = Properties(PacketTypes.PUBLISH)
                props.UserProperty = ups
            await pub.publish(f"{TOPIC}/mqtt", body, qos=1, properties=props)
        want |= cases

    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port(gw, 'amqp')}/", timeout=T)
    async with conn:
        ch = await conn.channel()
        mqtt_exchange = await ch.get_exchange("amq.topic")
        headers = {
            b"amqp-traced": {"z": "1", "traceparent": TP["amqp"], "a": "2"},
            b"amqp-plain": {"foo": "bar"},
        }
        for body, h in headers.items():
            await mqtt_exchange.publish(aio_pika.Message(body, headers=h), routing_key=f"{TOPIC}.amqp")
            want[body] = sorted(h.items())  # (aio-pika's pamqp writes a table's keys sorted: the wire order)

    async with grpc.aio.insecure_channel(address(gw, "grpc")) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        r = await stub.SendMessage(
            s.SendMessageRequest(
                messages=[
                    msg(TOPIC, b"grpc-traced", trace_context=TP["grpc"], user={"site": "north"}),
                    msg(TOPIC, b"grpc-plain"),
                    msg(TOPIC, b"grpc-props", user={"site": "north", "zone": "b"}),
                ]
            ),
            metadata=MD,
        )
        assert r.status.code == d.OK, r.status
        # (a map: its user properties have no order; the trace context comes after them)
        want[b"grpc-traced"] = [("site", "north"), ("traceparent", TP["grpc"])]
        want[b"grpc-plain"] = None
        want[b"grpc-props"] = [("site", "north"), ("zone", "b")]

    async with httpx.AsyncClient(base_url=f"http://{address(gw, 'http')}", timeout=T) as http:
        for body, extra in ((b"http-traced", {"traceparent": TP["http"]}), (b"http-plain", {})):
            event = {"specversion": "1.0", "id": body.decode(), "source": "/t", "type": "t.e", **extra}
            r = await http.post(
                f"/topics/{TOPIC}/events",
                content=body,
                headers={f"ce-{k}": v for k, v in event.items()}
                | {"content-type": "application/octet-stream"},
            )
            assert r.status_code in (200, 202), r.text
        want[b"http-traced"] = [("traceparent", TP["http"])]
        want[b"http-plain"] = None
    return want


async def test_mqtt5_subscribers_get_exactly_the_user_properties_sent(gw):
    paho_sub = PahoSubscriber(port(gw, "mqtt"), f"{TOPIC}/#")
    try:
        async with aiomqtt.Client("127.0.0.1", port(gw, "mqtt"), protocol=V5) as sub:
            await sub.subscribe(f"{TOPIC}/#", qos=1)
            assert await asyncio.to_thread(paho_sub.subscribed.wait, T)
            want = await publish_everything(gw)
            by_aiomqtt: dict[bytes, list[tuple[str, str]] | None] = {}
            async with asyncio.timeout(T):
                async for m in sub.messages:
                    by_aiomqtt[m.payload] = getattr(m.properties, "UserProperty", None)
                    if len(by_aiomqtt) == len(want):
                        break
            await wait_until(lambda: len(paho_sub.got) == len(want))
    finally:
        paho_sub.close()
    assert unordered_maps(by_aiomqtt) == unordered_maps(want)
    assert paho_sub.got == by_aiomqtt  # (the same PUBLISH bytes)
    # and in order, where the publisher's properties have one (all but a gRPC map's)
    assert {k: v for k, v in by_aiomqtt.items() if k != b"grpc-props"} == {
        k: v for k, v in want.items() if k != b"grpc-props"
    }


def unordered_maps(got: dict[bytes, list[tuple[str, str]] | None]) -> dict:
    """`got`, with the User Properties of gRPC messages (a protobuf map: no order) sorted."""
    return {k: sorted(v) if v is not None and k.startswith(b"grpc") else v for k, v in got.items()}


async def test_aio_pika_incoming_message_info_is_exactly_what_was_published(gw):
    """aio-pika 10's `test_incoming_message_info` (tests/test_amqp.py), against the gateway."""
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port(gw, 'amqp')}/", timeout=T)
    async with conn:
        ch = await conn.channel()
        routing_key = uuid.uuid4().hex
        exchange = await ch.declare_exchange("direct", auto_delete=True)
        queue = await ch.declare_queue(f"test_connection{uuid.uuid4().hex[:8]}", auto_delete=True)
        await queue.bind(exchange, routing_key)
        body = uuid.uuid4().hex.encode()
        info = MessageInfo(
            app_id="test",
            body_size=len(body),
            content_encoding="text",
            content_type="application/json",
            correlation_id="1",
            delivery_mode=DeliveryMode.PERSISTENT,
            expiration=1.5,
            headers={"foo": "bar"},
            message_id=uuid.uuid4().hex,
            priority=0,
            reply_to="test",
            timestamp=datetime.fromtimestamp(int(time.time()), tz=UTC),
            type="0",
            user_id="guest",
        )
        sent = aio_pika.Message(
            body=body,
            headers={"foo": "bar"},
            content_type="application/json",
            content_encoding="text",
            delivery_mode=DeliveryMode.PERSISTENT,
            priority=0,
            correlation_id="1",
            reply_to="test",
            expiration=1.5,
            message_id=info["message_id"],
            timestamp=info["timestamp"],
            type="0",
            user_id="guest",
            app_id="test",
        )
        await exchange.publish(sent, routing_key)
        incoming = await queue.get(timeout=T)
        await incoming.ack()
        info["routing_key"] = incoming.routing_key
        info["redelivered"] = incoming.redelivered
        info["exchange"] = incoming.exchange
        info["delivery_tag"] = incoming.delivery_tag
        info["consumer_tag"] = incoming.consumer_tag
        info["cluster_id"] = incoming.cluster_id
        assert incoming.body == body
        assert incoming.headers == {"foo": "bar"}
        assert incoming.info() == info


async def test_amqp_headers_keep_their_order_to_amqp_and_mqtt_consumers(gw):
    """pika writes a table in the order of its dict: a `traceparent` between two other headers comes
    back in its place, to an AMQP consumer (the content header as published) and, through the MQTT
    exchange, to an MQTT 5 subscriber (as User Properties in that order); one without gets none."""
    import pika

    headers = {"z": "1", "traceparent": TP["amqp"], "a": "2"}
    amqp_port = port(gw, "amqp")

    def amqp_round_trip() -> list[dict | None]:
        params = pika.ConnectionParameters(
            "127.0.0.1", amqp_port, credentials=pika.PlainCredentials("guest", "guest")
        )
        with pika.BlockingConnection(params) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare("ordered", durable=True)
            ch.basic_publish("", "ordered", b"with", pika.BasicProperties(headers=headers))
            ch.basic_publish("", "ordered", b"without", pika.BasicProperties(content_type="text/plain"))
            ch.basic_publish("amq.topic", f"{TOPIC}.pika", b"to-mqtt", pika.BasicProperties(headers=headers))
            got = []
            for _ in range(2):
                _method, props, _body = ch.basic_get("ordered", auto_ack=True)
                got.append(props.headers)
            return got

    async with aiomqtt.Client("127.0.0.1", port(gw, "mqtt"), protocol=V5) as sub:
        await sub.subscribe(f"{TOPIC}/#", qos=1)
        with_headers, without = await asyncio.to_thread(amqp_round_trip)
        async with asyncio.timeout(T):
            m = await anext(sub.messages)
    assert list(with_headers.items()) == list(headers.items())
    assert without is None
    assert (m.payload, m.properties.UserProperty) == (b"to-mqtt", list(headers.items()))
