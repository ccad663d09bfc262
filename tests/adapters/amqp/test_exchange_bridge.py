"""AMQP <-> MQTT and gRPC through the MQTT exchange (`amq.topic` in vhost "/", RabbitMQ's MQTT plugin
convention, adapters/amqp/bridge.py) and the exchange of each store topic: aiomqtt publishes reach
aio-pika / pika queues bound with `*` / `#` patterns, AMQP publishes to amq.topic reach MQTT
subscribers, with their properties; gRPC sends to topic T reach queues bound to exchange T, and
AMQP publishes to exchange T reach MQTT and gRPC consumers of T."""

from __future__ import annotations

import asyncio

import aio_pika
import aiomqtt
import grpc
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.grpc import GrpcAdapter
from adapters.grpc.generated import definition_pb2 as d
from adapters.grpc.generated import service_pb2_grpc
from adapters.mqtt import MqttAdapter
from messaging_processor import ProcessorError
from tests.adapters.amqp.support import close_env, get_message, open_env, open_env_with_mqtt_and_grpc
from tests.adapters.grpc.support import msg, receive, send
from tests.support import T

V5 = aiomqtt.ProtocolVersion.V5


@pytest.fixture
async def env(tmp_path):
    e = await open_env_with_mqtt_and_grpc(str(tmp_path / "data"))
    yield e
    await close_env(e)


def mqtt_client(env, name: str) -> aiomqtt.Client:
    return aiomqtt.Client("127.0.0.1", env.mqtt_port, identifier=name, protocol=V5)


async def bound_queue(ch, name: str, *patterns: str, exchange: str = "amq.topic"):
    q = await ch.declare_queue(name, durable=True)
    for p in patterns:
        await q.bind(exchange, p)
    return q


async def test_mqtt_publish_reaches_queues_bound_by_pattern(env):
    conn = await env.connect()
    async with conn:
        ch = await conn.channel()
        q_tel = await bound_queue(ch, "telemetry-worker", "plant1.*.telemetry")
        q_all = await bound_queue(ch, "audit", "#")
        q_p2 = await bound_queue(ch, "plant2-worker", "plant2.#")
        props = Properties(PacketTypes.PUBLISH)
        props.ContentType = "application/json"
        props.CorrelationData = b"corr-1"
        props.UserProperty = [("site", "north")]
        async with mqtt_client(env, "dev7") as dev:
            await dev.publish("plant1/dev7/telemetry", b'{"t": 21.5}', qos=1, properties=props)
            m = await get_message(q_tel)
            assert m.body == b'{"t": 21.5}'
            assert (m.exchange, m.routing_key) == ("amq.topic", "plant1.dev7.telemetry")
            assert m.content_type == "application/json"
            assert m.correlation_id == "corr-1"
            assert m.headers["site"] == "north" and m.headers["mqtt.topic"] == "plant1/dev7/telemetry"
            await m.ack()
            m = await get_message(q_all)
            assert m.routing_key == "plant1.dev7.telemetry"
            await m.ack()
            # a later message that plant2.# matches is the first one of its queue: plant1's never came
            await dev.publish("plant2/dev1/telemetry", b"p2", qos=1)
            m = await get_message(q_p2)
            assert (m.body, m.routing_key) == (b"p2", "plant2.dev1.telemetry")
            await m.ack()
            # and each queue got each message once
            await dev.publish("plant1/dev8/telemetry", b"second", qos=1)
            m = await get_message(q_tel)
            assert m.body == b"second"
            await m.ack()
            assert [(await get_message(q_all)).body for _ in range(2)] == [b"p2", b"second"]


async def test_pika_queue_bound_with_hash_gets_one_paths_messages_in_order(env):
    def setup() -> None:
        with env.blocking() as c:
            ch = c.channel()
            ch.queue_declare("pika-audit", durable=True)
            ch.queue_bind("pika-audit", "amq.topic", "sensors.#")

    await asyncio.to_thread(setup)
    async with mqtt_client(env, "s1") as dev:
        for i in range(5):
            await dev.publish("sensors/s1/temp", str(i).encode(), qos=1)

    def consume() -> list[tuple[str, bytes]]:
        out = []
        with env.blocking() as c:
            ch = c.channel()
            for method, _props, body in ch.consume("pika-audit", inactivity_timeout=T):
                assert method is not None, "timed out"
                ch.basic_ack(method.delivery_tag)
                out.append((method.routing_key, body))
                if len(out) == 5:
                    break
            ch.cancel()
        return out

    got = await asyncio.to_thread(consume)
    assert got == [("sensors.s1.temp", str(i).encode()) for i in range(5)]


async def test_a_path_passed_over_is_routed_once_a_binding_wants_it(env):
    """Paths no binding matches are passed over unread (their hashes kept per topic); a new
    binding clears that memory, so the path's next message reaches the new queue."""
    conn = await env.connect()
    async with conn:
        ch = await conn.channel()
        q1 = await bound_queue(ch, "dev1-worker", "plant3.dev1.telemetry")
        bridge = env.adapter.broker.bridge
        async with mqtt_client(env, "fleet") as dev:
            await dev.publish("plant3/dev2/telemetry", b"unwanted", qos=1)
            await dev.publish("plant3/dev1/telemetry", b"wanted-1", qos=1)
            assert (await get_message(q1)).body == b"wanted-1"
            # dev2's path hash is kept: its next messages are not read
            await asyncio.wait_for(_until(lambda: bridge.passed.get("plant3")), T)
            q2 = await bound_queue(ch, "dev2-worker", "plant3.dev2.*")
            await asyncio.wait_for(_until(lambda: not bridge.passed["plant3"]), T)
            await dev.publish("plant3/dev2/telemetry", b"wanted-2", qos=1)
            m = await get_message(q2)
            assert (m.body, m.routing_key) == (b"wanted-2", "plant3.dev2.telemetry")
            assert await q2.get(fail=False) is None  # the message before the binding is not copied
            assert await q1.get(fail=False) is None


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.01)


async def test_amqp_publish_to_amq_topic_reaches_mqtt_and_bound_queues_once(env):
    async with mqtt_client(env, "dev7") as dev:
        await dev.subscribe("plant1/+/cmd", qos=1)
        conn = await env.connect()
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await bound_queue(ch, "cmd-log", "plant1.#")
            ex = await ch.get_exchange("amq.topic")
            for i in (1, 2):
                await ex.publish(
                    aio_pika.Message(
                        f"reboot-{i}".encode(),
                        content_type="text/plain",
                        correlation_id=f"c{i}",
                        headers={"issuer": "ops"},
                    ),
                    routing_key="plant1.dev7.cmd",
                )
            got = []
            async with asyncio.timeout(T):
                async for m in dev.messages:
                    got.append(m)
                    if len(got) == 2:
                        break
            assert [(str(m.topic), m.payload, m.qos) for m in got] == [
                ("plant1/dev7/cmd", b"reboot-1", 1),
                ("plant1/dev7/cmd", b"reboot-2", 1),
            ]
            p = got[0].properties
            assert p.ContentType == "text/plain"
            assert p.CorrelationData == b"c1"
            assert ("issuer", "ops") in p.UserProperty
            # the bound queue got each publish once (the routing loop of topic plant1 skips them)
            a, b = await get_message(q), await get_message(q)
            assert [a.body, b.body] == [b"reboot-1", b"reboot-2"]
            assert (a.routing_key, a.correlation_id, a.headers) == (
                "plant1.dev7.cmd",
                "c1",
                {"issuer": "ops"},
            )
            await b.ack(multiple=True)
            assert (await ch.declare_queue("cmd-log", passive=True)).declaration_result.message_count == 0


async def test_unroutable_mandatory_publish_to_amq_topic_is_stored_for_mqtt(env):
    """A publish to amq.topic with no bound queue is still stored for MQTT: not returned."""
    conn = await env.connect()
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange("amq.topic")
        await ex.publish(aio_pika.Message(b"x"), routing_key="lonely.path", mandatory=True)
    info = await env.processor.get_topic("lonely")
    assert info.messages == 1


async def test_a_queue_named_like_the_topic_is_stored_once(env):
    """Queue `plant9` (store topic plant9) bound to amq.topic: MQTT and the queue read one message."""
    async with mqtt_client(env, "dev9") as dev:
        await dev.subscribe("plant9/#", qos=1)
        conn = await env.connect()
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await bound_queue(ch, "plant9", "plant9.#")
            ex = await ch.get_exchange("amq.topic")
            await ex.publish(aio_pika.Message(b"one"), routing_key="plant9.dev1.cmd")
            m = await get_message(q)
            assert (m.body, m.routing_key) == (b"one", "plant9.dev1.cmd")
            await m.ack()
            async with asyncio.timeout(T):
                async for mm in dev.messages:
                    assert (str(mm.topic), mm.payload) == ("plant9/dev1/cmd", b"one")
                    break
            assert (await env.processor.get_topic("plant9")).messages == 1


async def test_grpc_send_reaches_a_queue_bound_to_the_topics_exchange(env):
    await env.processor.create_topic("orders")
    r = await send(env.stub, msg("orders", b"before", tag="eu.new"))  # before the binding: not routed
    assert r.status.code == d.Code.OK, r.status
    conn = await env.connect()
    async with conn:
        ch = await conn.channel()
        q = await bound_queue(ch, "eu-orders", "eu.*", exchange="orders")
        r = await send(
            env.stub,
            msg("orders", b"skip", tag="us.new"),
            msg("orders", b"o-1", tag="eu.new", user={"customer": "c9"}),
        )
        assert r.status.code == d.Code.OK, r.status
        m = await get_message(q)
        assert (m.body, m.exchange, m.routing_key) == (b"o-1", "orders", "eu.new")
        assert m.headers["customer"] == "c9"
        await m.ack()
        # the first message of the queue was the matching one sent after the binding: one more proves
        # nothing else is queued
        await send(env.stub, msg("orders", b"o-2", tag="eu.paid"))
        assert (await get_message(q)).body == b"o-2"


async def test_amqp_publish_to_the_topics_exchange_reaches_mqtt_and_grpc(env):
    await env.processor.create_topic("orders")
    async with mqtt_client(env, "sub-orders") as sub:
        await sub.subscribe("orders/eu/#", qos=1)
        conn = await env.connect()
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.get_exchange("orders")  # passive declare: the store topic's exchange
            await ex.publish(
                aio_pika.Message(b"o-7", content_type="application/json", correlation_id="k7"),
                routing_key="eu.new",
            )
        async with asyncio.timeout(T):
            async for m in sub.messages:
                assert (str(m.topic), m.payload) == ("orders/eu/new", b"o-7")
                assert (m.properties.ContentType, m.properties.CorrelationData) == ("application/json", b"k7")
                break
    st, msgs, _ = await receive(env.stub, "billing", "orders", poll_ms=2000)
    assert st.code == d.Code.OK and [(x.body, x.system_properties.tag) for x in msgs] == [(b"o-7", "eu.new")]
    assert (await env.processor.get_topic("orders")).messages == 1


async def test_publish_to_an_unknown_exchange_is_still_not_found(env):
    conn = await env.connect()
    async with conn:
        ch = await conn.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await ch.get_exchange("no-such-topic")

    def raw_publish() -> int:
        import pika.exceptions

        with env.blocking() as c:
            ch = c.channel()
            ch.confirm_delivery()
            try:
                ch.basic_publish("no-such-topic", "k", b"x")
            except pika.exceptions.ChannelClosedByBroker as e:
                return e.reply_code
            return 0

    assert await asyncio.to_thread(raw_publish) == 404


async def test_declaring_a_store_topics_exchange_is_equivalent_whatever_the_flags(env):
    await env.processor.create_topic("orders")
    conn = await env.connect()
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.declare_exchange("orders", aio_pika.ExchangeType.TOPIC, durable=True)
        await ch.declare_exchange("orders", aio_pika.ExchangeType.TOPIC, durable=False)
        await ex.publish(aio_pika.Message(b"x"), routing_key="eu.new")
    assert (await env.processor.get_topic("orders")).messages == 1


async def test_the_mqtt_exchange_is_configurable(tmp_path):
    e = await open_env(str(tmp_path / "data"), mqtt_exchange="mqtt.bridge")
    try:
        conn = await e.connect()
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.get_exchange("mqtt.bridge")  # pre-declared (topic)
            await ex.publish(aio_pika.Message(b"via-custom"), routing_key="site3.dev1.cmd")
            amq = await ch.get_exchange("amq.topic")  # now a plain AMQP exchange: no route, nothing stored
            await amq.publish(aio_pika.Message(b"plain"), routing_key="site4.dev1.cmd")
        assert (await e.processor.get_topic("site3")).messages == 1
        with pytest.raises(ProcessorError):
            await e.processor.get_topic("site4")
    finally:
        await close_env(e)


async def test_a_durable_binding_to_amq_topic_keeps_routing_after_a_restart(tmp_path):
    data = str(tmp_path / "data")
    for round_, path in enumerate(("plant5/a/x", "plant5/a/y")):
        e = await open_env(data)
        try:
            mqtt = await e.core.add(MqttAdapter(e.processor, "127.0.0.1", 0, topic_scan_interval=0.1))
            conn = await e.connect()
            async with conn:
                ch = await conn.channel()
                if round_ == 0:
                    q = await bound_queue(ch, "plant5-worker", "plant5.#")
                else:
                    q = await ch.declare_queue("plant5-worker", passive=True)
                async with aiomqtt.Client("127.0.0.1", mqtt.bound_port, identifier="d5", protocol=V5) as dev:
                    await dev.publish(path, path.encode(), qos=1)
                m = await get_message(q)
                assert (m.body, m.routing_key) == (path.encode(), path.replace("/", "."))
                await m.ack()
        finally:
            await close_env(e)


async def test_a_durable_binding_to_a_topics_exchange_keeps_routing_after_a_restart(tmp_path):
    data = str(tmp_path / "data")
    for round_ in range(2):
        e = await open_env(data)
        try:
            if round_ == 0:
                await e.processor.create_topic("orders")
            g = await e.core.add(GrpcAdapter(e.processor, host="127.0.0.1", port=0))
            channel = grpc.aio.insecure_channel(g.address)
            e.core.on_close(channel.close)
            stub = service_pb2_grpc.MessagingServiceStub(channel)
            conn = await e.connect()
            async with conn:
                ch = await conn.channel()
                if round_ == 0:
                    q = await bound_queue(ch, "eu-orders", "eu.*", exchange="orders")
                else:
                    q = await ch.declare_queue("eu-orders", passive=True)
                await send(stub, msg("orders", f"order-{round_}".encode(), tag=f"eu.r{round_}"))
                m = await get_message(q)
                assert (m.body, m.exchange, m.routing_key) == (
                    f"order-{round_}".encode(),
                    "orders",
                    f"eu.r{round_}",
                )
                await m.ack()
        finally:
            await close_env(e)


async def test_message_expiry_and_per_message_ttl_map_both_ways(env):
    """MQTT 5 Message Expiry -> the copy's `expiration` (ms left) and per-message TTL of the bound
    queue; an AMQP `expiration` -> the MQTT Message Expiry Interval (RabbitMQ's MQTT plugin maps
    them the same way)."""
    await env.processor.create_topic("plant6")
    conn = await env.connect()
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await bound_queue(ch, "expiring-worker", "plant6.*.telemetry")
        async with mqtt_client(env, "dev6") as dev:
            await dev.subscribe("plant6/+/cmd", qos=1)
            for body, seconds in ((b"short", 1), (b"long", 600)):
                props = Properties(PacketTypes.PUBLISH)
                props.MessageExpiryInterval = seconds
                await dev.publish("plant6/dev6/telemetry", body, qos=1, properties=props)
            long_copy = None
            async with asyncio.timeout(T):
                while long_copy is None:  # the short one is dropped once its second is over
                    m = await get_message(q)
                    if m.body == b"long":
                        long_copy = m
                    else:
                        assert m.body == b"short" and 0 < m.expiration <= 1  # (aio-pika: seconds)
            assert 590 < long_copy.expiration <= 600
            await long_copy.ack()
            ex = await ch.get_exchange("amq.topic")
            await ex.publish(aio_pika.Message(b"reboot", expiration=30), routing_key="plant6.dev6.cmd")
            async with asyncio.timeout(T):
                m = await anext(aiter(dev.messages))
            assert m.payload == b"reboot" and 0 < m.properties.MessageExpiryInterval <= 30
