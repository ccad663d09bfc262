"""MqttAdapter end to end over real sockets: aiomqtt (3.1.1 and 5.0), paho-mqtt and a raw codec
client, against an in-process Store + MessagingProcessor."""

from __future__ import annotations

import asyncio
import threading

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt.codec import (
    PINGREQ,
    Connect,
    Disconnect,
    PropertyId,
    Publish,
    Subscribe,
    Subscription,
    Will,
    encode_connect,
    encode_disconnect,
    encode_puback,
    encode_publish,
    encode_pubrel,
    encode_subscribe,
)
from adapters.mqtt.codec.packets import Pingresp, Pubcomp, Pubrec, Suback
from adapters.mqtt.retained import RETAINED_TOPIC
from messaging_processor import Message
from tests.adapters.mqtt.support import CTX, V3, V5, VERSIONS, Raw, T, next_message
from tests.support import wait_until

# ------------------------------------------------------------------ QoS round trips


@pytest.mark.parametrize("version", VERSIONS)
async def test_qos_0_1_2_round_trip(env, version):
    async with env.client(version) as sub, env.client(version) as pub:
        await sub.subscribe("dev/+/telemetry", qos=2)
        for qos in (0, 1, 2):
            await pub.publish("dev/42/telemetry", f"m{qos}".encode(), qos=qos)
            m = await next_message(sub)
            assert (str(m.topic), m.payload, m.qos) == ("dev/42/telemetry", f"m{qos}".encode(), qos)


@pytest.mark.parametrize("version", VERSIONS)
async def test_granted_qos_is_min_of_publish_and_subscription(env, version):
    async with env.client(version) as sub, env.client(version) as pub:
        await sub.subscribe("cap/#", qos=1)
        await pub.publish("cap/x", b"two", qos=2)
        m = await next_message(sub)
        assert (m.payload, m.qos) == (b"two", 1)
        await pub.publish("cap/x", b"zero", qos=0)
        m = await next_message(sub)
        assert (m.payload, m.qos) == (b"zero", 0)


async def test_paho_client_round_trip(env):
    got: list[tuple[str, bytes, int]] = []
    arrived = threading.Event()
    subscribed = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="paho-1", protocol=paho.MQTTv311)

    def on_message(client, userdata, msg):
        got.append((msg.topic, msg.payload, msg.qos))
        arrived.set()

    c.on_message = on_message
    c.on_subscribe = lambda *a: subscribed.set()
    c.on_connect = lambda client, *a: client.subscribe("paho/#", qos=1)
    c.connect("127.0.0.1", env.port)
    c.loop_start()
    try:
        assert await asyncio.to_thread(subscribed.wait, T)
        info = c.publish("paho/t", b"from paho", qos=1)
        await asyncio.to_thread(info.wait_for_publish, T)
        assert info.is_published()
        assert await asyncio.to_thread(arrived.wait, T)
        assert got == [("paho/t", b"from paho", 1)]
    finally:
        c.disconnect()
        c.loop_stop()


async def test_inbound_qos2_duplicate_is_stored_once(env):
    raw, _ = await Raw.connect(env, "q2", version=4)
    for dup in (False, True):
        raw.send(encode_publish("once/a", b"exactly", 2, 7, dup=dup, version=4))
        ack = await raw.recv()
        assert isinstance(ack, Pubrec) and ack.packet_id == 7
    raw.send(encode_pubrel(7, version=4))
    comp = await raw.recv()
    assert isinstance(comp, Pubcomp) and comp.packet_id == 7
    got = await env.processor.pop(CTX, "g-once", "once", max_messages=32)
    assert [d.message.body for d in got] == [b"exactly"]
    await raw.close()


# ------------------------------------------------------------------ mapping to the store


async def test_mqtt_publish_is_popped_by_processor_with_properties(env):
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "application/json"
    props.ResponseTopic = "replies/1"
    props.CorrelationData = b"\x00\x01corr"
    props.PayloadFormatIndicator = 1
    props.UserProperty = [("k", "v1"), ("k", "v2")]
    async with env.client(V5) as pub:
        await pub.publish("fleet/7/gps", b'{"lat":1}', qos=1, retain=False, properties=props)
    got = await env.processor.pop(CTX, "spark", "fleet", max_messages=8)
    assert len(got) == 1
    m = got[0].message
    assert m.topic == "fleet" and m.body == b'{"lat":1}'
    p = m.properties
    assert p["mqtt.topic"] == "fleet/7/gps" and p["mqtt.qos"] == "1" and "mqtt.retain" not in p
    assert p["mqtt.content_type"] == "application/json"
    assert p["mqtt.response_topic"] == "replies/1"
    assert p["mqtt.correlation_data"] == "AAFjb3Jy"
    assert p["mqtt.payload_format"] == "1"
    assert p["mqtt.user_properties"] == '[["k","v1"],["k","v2"]]'


async def test_mqtt5_properties_survive_the_round_trip(env):
    props = Properties(PacketTypes.PUBLISH)
    props.ContentType = "text/plain"
    props.CorrelationData = b"cid"
    props.UserProperty = [("a", "1")]
    props.MessageExpiryInterval = 60
    async with env.client(V5) as sub, env.client(V5) as pub:
        await sub.subscribe("rt/x", qos=1)
        await pub.publish("rt/x", b"p", qos=1, properties=props)
        m = await next_message(sub)
        assert m.properties.ContentType == "text/plain"
        assert m.properties.CorrelationData == b"cid"
        # the user properties exactly as sent: no trace context added (MQTT-3.3.2-17, issue 47)
        assert m.properties.UserProperty == [("a", "1")]
        assert 55 <= m.properties.MessageExpiryInterval <= 60


async def test_store_topic_is_sanitized_first_level(env):
    async with env.client(V3) as pub:
        await pub.publish("my topic:é/a", b"x", qos=1)
    got = await env.processor.pop(CTX, "g", "my_topic__", max_messages=8)
    assert [d.message.properties["mqtt.topic"] for d in got] == ["my topic:é/a"]


async def test_message_from_another_protocol_reaches_mqtt_subscriber(env):
    async with env.client(V3) as sub:
        await sub.subscribe("orders/#", qos=1)
        await env.processor.send(CTX, [Message("orders", b"tagged", tag="created")], auto_create=True)
        m = await next_message(sub)
        assert (str(m.topic), m.payload, m.qos) == ("orders/created", b"tagged", 1)
        await env.processor.send(CTX, [Message("orders", b"plain")])
        m = await next_message(sub)
        assert (str(m.topic), m.payload, m.qos) == ("orders", b"plain", 1)  # "orders/#" matches "orders"


async def test_history_before_subscribe_is_not_replayed(env):
    async with env.client(V3) as pub:
        await pub.publish("hist/a", b"old", qos=1)
        async with env.client(V3) as sub:
            await sub.subscribe("hist/a", qos=1)
            await pub.publish("hist/a", b"new", qos=1)
            assert (await next_message(sub)).payload == b"new"


async def test_clean_sessions_read_by_offset_with_no_pop_or_ack(env):
    """The fan-out of clean sessions tails the store topic: no pop state, nothing acked."""
    pops, acks = env.store.metrics["pops"], env.store.metrics["acks"]
    async with env.client(V5) as pub, env.client(V3) as sub1, env.client(V5) as sub2:
        await sub1.subscribe("tail/#", qos=1)
        await sub2.subscribe("tail/+/x", qos=0)
        for i in range(20):
            await pub.publish(f"tail/{i % 3}/x", b"%d" % i, qos=1)
        got1 = [(await next_message(sub1)).payload for _ in range(20)]
        got2 = [(await next_message(sub2)).payload for _ in range(20)]
    assert sorted(got1) == sorted(got2) == sorted(b"%d" % i for i in range(20))
    for q in range(3):  # one publisher's messages to one path keep their order
        mine = [b"%d" % i for i in range(q, 20, 3)]
        assert [p for p in got1 if p in mine] == mine
    assert (env.store.metrics["pops"], env.store.metrics["acks"]) == (pops, acks)
    assert env.store.inflight_count(env.adapter.broker.group, "tail") == 0


# ------------------------------------------------------------------ subscriptions


async def test_wildcards_and_dollar_topics(env):
    async with (
        env.client(V5) as pub,
        env.client(V5) as hash_all,
        env.client(V5) as plus,
        env.client(V5) as sys_sub,
    ):
        await hash_all.subscribe("#", qos=1)
        await plus.subscribe("a/+/c", qos=1)
        await sys_sub.subscribe("$dollar/#", qos=1)  # ($SYS is the gateway's own: test_sys_and_events.py)
        await pub.publish("$dollar/load", b"sys", qos=1)
        await pub.publish("a/b/d", b"abd", qos=1)
        await pub.publish("a/b/c", b"abc", qos=1)
        assert (await next_message(sys_sub)).payload == b"sys"
        assert (await next_message(plus)).payload == b"abc"  # a/b/d skipped
        # "#" does not match $dollar/load: the first it sees is a/b/d.
        assert [(await next_message(hash_all)).payload for _ in range(2)] == [b"abd", b"abc"]


async def test_root_wildcard_covers_store_topics_created_later(env):
    async with env.client(V3) as sub, env.client(V3) as pub:
        await sub.subscribe("+/late", qos=1)
        await pub.publish("brandnew/late", b"via mqtt", qos=1)
        assert (await next_message(sub)).payload == b"via mqtt"
        await env.processor.create_topic("otherproto")
        await env.processor.send(CTX, [Message("otherproto", b"via send", tag="late")])
        m = await next_message(sub)
        assert (str(m.topic), m.payload) == ("otherproto/late", b"via send")


async def test_unsubscribe_stops_delivery(env):
    async with env.client(V5) as sub, env.client(V5) as pub:
        await sub.subscribe("u/1", qos=1)
        await sub.subscribe("u/2", qos=1)
        await sub.unsubscribe("u/1")
        await pub.publish("u/1", b"gone", qos=1)
        await pub.publish("u/2", b"marker", qos=1)
        assert (await next_message(sub)).payload == b"marker"


async def test_receive_maximum_queues_beyond_the_window(env):
    raw, _ = await Raw.connect(env, "rm", properties={PropertyId.RECEIVE_MAXIMUM: 1})
    raw.send(encode_subscribe(Subscribe(1, [Subscription("rm/t", 1)]), 5))
    assert isinstance(await raw.recv(), Suback)
    await env.processor.send(CTX, [Message("rm", f"m{i}".encode(), tag="t") for i in range(3)])
    first = await raw.recv()
    assert isinstance(first, Publish) and first.qos == 1
    session = env.adapter.broker.sessions["rm"]
    await wait_until(lambda: len(session.queue) == 2)
    assert len(session.inflight) == 1
    bodies = [first.payload]
    pid = first.packet_id
    for _ in range(2):
        raw.send(encode_puback(pid, version=5))
        nxt = await raw.recv()
        assert isinstance(nxt, Publish)
        bodies.append(nxt.payload)
        pid = nxt.packet_id
    assert sorted(bodies) == [b"m0", b"m1", b"m2"]
    await raw.close()


async def test_message_that_expires_while_queued_for_the_window_is_dropped(env):
    """5.0 3.3.2-5/-6: a message waiting beyond the client's Receive Maximum is dropped once its
    Message Expiry Interval has passed, and one sent later carries only what is left of it."""
    raw, _ = await Raw.connect(env, "rmx", properties={PropertyId.RECEIVE_MAXIMUM: 1})
    raw.send(encode_subscribe(Subscribe(1, [Subscription("rmx/#", 1)]), 5))
    assert isinstance(await raw.recv(), Suback)
    session = env.adapter.broker.sessions["rmx"]
    short, long = Properties(PacketTypes.PUBLISH), Properties(PacketTypes.PUBLISH)
    short.MessageExpiryInterval = 1
    long.MessageExpiryInterval = 60
    async with env.client(V5) as pub:
        await pub.publish("rmx/a", b"first", qos=1)
        first = await raw.recv()
        assert isinstance(first, Publish) and first.payload == b"first"
        await pub.publish("rmx/b", b"short-lived", qos=1, properties=short)
        await pub.publish("rmx/c", b"long-lived", qos=1, properties=long)
        await wait_until(lambda: len(session.queue) == 2)
    await asyncio.sleep(2.1)  # the queued messages age: the 1 s one expires, 2 s of 60 pass
    raw.send(encode_puback(first.packet_id, version=5))
    nxt = await raw.recv()
    assert isinstance(nxt, Publish) and nxt.payload == b"long-lived"
    assert nxt.properties[PropertyId.MESSAGE_EXPIRY_INTERVAL] <= 58
    raw.send(encode_puback(nxt.packet_id, version=5))
    await wait_until(lambda: not session.inflight and not session.queue)
    await raw.close()


async def test_queue_goes_on_past_a_message_too_big_for_the_client(env):
    """A queued message over the client's Maximum Packet Size is skipped (5.0 3.1.2.25) and the
    next queued one is sent, although the skipped one never took a place in the window."""
    props = {PropertyId.RECEIVE_MAXIMUM: 1, PropertyId.MAXIMUM_PACKET_SIZE: 256}
    raw, _ = await Raw.connect(env, "rmbig", properties=props)
    raw.send(encode_subscribe(Subscribe(1, [Subscription("rmbig/#", 1)]), 5))
    assert isinstance(await raw.recv(), Suback)
    session = env.adapter.broker.sessions["rmbig"]
    async with env.client(V5) as pub:
        await pub.publish("rmbig/a", b"first", qos=1)
        first = await raw.recv()
        assert isinstance(first, Publish) and first.payload == b"first"
        await pub.publish("rmbig/b", b"x" * 1000, qos=1)
        await pub.publish("rmbig/c", b"after", qos=1)
        await wait_until(lambda: len(session.queue) == 2)
    raw.send(encode_puback(first.packet_id, version=5))
    nxt = await raw.recv()
    assert isinstance(nxt, Publish) and nxt.payload == b"after"
    await raw.close()


async def test_outbound_qos2_flow_with_raw_client(env):
    raw, _ = await Raw.connect(env, "out2")
    raw.send(encode_subscribe(Subscribe(1, [Subscription("o2/#", 2)]), 5))
    assert isinstance(await raw.recv(), Suback)
    async with env.client(V5) as pub:
        await pub.publish("o2/x", b"q2", qos=2)
    p = await raw.recv()
    assert isinstance(p, Publish) and p.qos == 2 and p.payload == b"q2"
    raw.send(bytes((0x50, 2)) + p.packet_id.to_bytes(2, "big"))  # PUBREC
    rel = await raw.recv()
    assert rel.packet_id == p.packet_id and type(rel).__name__ == "Pubrel"
    raw.send(bytes((0x70, 2)) + p.packet_id.to_bytes(2, "big"))  # PUBCOMP
    raw.send(PINGREQ)
    assert isinstance(await raw.recv(), Pingresp)
    assert env.adapter.broker.sessions["out2"].inflight == {}
    await raw.close()


async def test_inbound_topic_alias_is_resolved(env):
    async with env.client(V3) as sub:
        await sub.subscribe("alias/#", qos=1)
        raw, ack = await Raw.connect(env, "aliaser")
        assert ack.properties.get(PropertyId.TOPIC_ALIAS_MAXIMUM, 0) >= 1
        raw.send(
            encode_publish(
                "alias/long/path", b"first", 1, 1, version=5, properties={PropertyId.TOPIC_ALIAS: 1}
            )
        )
        raw.send(encode_publish("", b"second", 1, 2, version=5, properties={PropertyId.TOPIC_ALIAS: 1}))
        for _ in range(2):
            assert type(await raw.recv()).__name__ == "Puback"
        got = [await next_message(sub) for _ in range(2)]
        assert [(str(m.topic), m.payload) for m in got] == [
            ("alias/long/path", b"first"),
            ("alias/long/path", b"second"),
        ]
        await raw.close()


# ------------------------------------------------------------------ retained messages


@pytest.mark.parametrize("version", VERSIONS)
async def test_retained_set_deliver_clear(env, version):
    async with env.client(version) as pub:
        await pub.publish("home/lamp", b"on", qos=1, retain=True)
        await pub.publish("home/door", b"shut", qos=2, retain=True)
        async with env.client(version) as sub:
            await sub.subscribe("home/+", qos=1)
            got = {}
            for _ in range(2):
                m = await next_message(sub)
                got[str(m.topic)] = (m.payload, m.retain, m.qos)
            assert got == {"home/lamp": (b"on", True, 1), "home/door": (b"shut", True, 1)}
            # Live messages carry retain = 0.
            await pub.publish("home/lamp", b"off", qos=1, retain=True)
            m = await next_message(sub)
            assert (m.payload, m.retain) == (b"off", False)
        assert await env.processor.latest(RETAINED_TOPIC, "home/lamp") is not None
        await pub.publish("home/lamp", b"", qos=1, retain=True)
        assert await env.processor.latest(RETAINED_TOPIC, "home/lamp") is None
        async with env.client(version) as sub:
            await sub.subscribe("home/lamp", qos=1)
            await pub.publish("home/lamp", b"marker", qos=1)
            m = await next_message(sub)
            assert (m.payload, m.retain) == (b"marker", False)


async def test_retain_handling_2_sends_no_retained(env):
    async with env.client(V5) as pub:
        await pub.publish("rh/a", b"kept", qos=1, retain=True)
        async with env.client(V5) as sub:
            opts = aiomqtt.SubscribeOptions if hasattr(aiomqtt, "SubscribeOptions") else None
            from paho.mqtt.subscribeoptions import SubscribeOptions

            assert opts is None or opts is SubscribeOptions
            await sub.subscribe("rh/a", options=SubscribeOptions(qos=1, retainHandling=2))
            await pub.publish("rh/a", b"live", qos=1)
            m = await next_message(sub)
            assert (m.payload, m.retain) == (b"live", False)


# ------------------------------------------------------------------ wills, takeover, keep-alive


async def test_will_on_abnormal_close_not_on_normal_disconnect(env):
    async with env.client(V3) as watcher:
        await watcher.subscribe("wills/#", qos=1)
        polite, _ = await Raw.connect(env, "polite", version=4, will=Will("wills/polite", b"bye", 1))
        polite.send(encode_disconnect(0, 4))
        assert await polite.recv_until_eof() == []
        rude, _ = await Raw.connect(env, "rude", version=4, will=Will("wills/rude", b"lost", 1))
        rude.abort()
        m = await next_message(watcher)
        assert (str(m.topic), m.payload) == ("wills/rude", b"lost")


async def test_v5_disconnect_with_will_message_publishes_will(env):
    async with env.client(V5) as watcher:
        await watcher.subscribe("w5/#", qos=1)
        c, _ = await Raw.connect(env, "w5", will=Will("w5/x", b"asked", 1))
        c.send(encode_disconnect(0x04, 5))
        await c.recv_until_eof()
        m = await next_message(watcher)
        assert (str(m.topic), m.payload) == ("w5/x", b"asked")


async def test_session_takeover_disconnects_the_first(env):
    async with env.client(V5) as watcher:
        await watcher.subscribe("takeover/#", qos=1)
        first, _ = await Raw.connect(env, "same-id", will=Will("takeover/will", b"first gone", 0))
        second, ack = await Raw.connect(env, "same-id")
        assert ack.reason_code == 0
        packets = await first.recv_until_eof()
        assert len(packets) == 1 and isinstance(packets[0], Disconnect) and packets[0].reason_code == 0x8E
        assert (await next_message(watcher)).payload == b"first gone"
        assert env.adapter.broker.sessions["same-id"] is not None
        second.send(PINGREQ)
        assert isinstance(await second.recv(), Pingresp)
        await second.close()


async def test_keep_alive_expiry_closes_and_publishes_will(env):
    async with env.client(V3) as watcher:
        await watcher.subscribe("ka/#", qos=1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        idle, _ = await Raw.connect(env, "idle", keep_alive=1, will=Will("ka/idle", b"timed out", 1))
        packets = await idle.recv_until_eof(timeout=5)
        elapsed = loop.time() - t0
        assert 1.4 <= elapsed < 4, elapsed
        assert [type(p) for p in packets] == [Disconnect] and packets[0].reason_code == 0x8D
        assert (await next_message(watcher)).payload == b"timed out"


async def test_pingreq_keeps_the_connection_alive(env):
    c, _ = await Raw.connect(env, "pinger", version=4, keep_alive=1)
    for _ in range(3):
        await asyncio.sleep(0.6)  # below 1.5 x keep-alive between packets: must stay open
        c.send(PINGREQ)
        assert isinstance(await c.recv(), Pingresp)
    await c.close()


# ------------------------------------------------------------------ CONNECT handling


async def test_server_assigned_client_identifier(env):
    c5, ack5 = await Raw.connect(env, "")
    assigned = ack5.properties.get(PropertyId.ASSIGNED_CLIENT_IDENTIFIER)
    assert ack5.reason_code == 0 and assigned and assigned in env.adapter.broker.sessions
    c4, ack4 = await Raw.connect(env, "", version=4)
    assert ack4.reason_code == 0
    await c5.close()
    await c4.close()


async def test_bad_credentials_refused_by_authorizer(env):
    def authorizer(identity, action, resource):
        if identity.mechanism == "internal":  # the proxy's own fan-out pops (see docs/mqtt.md)
            return True
        return identity.username == "dev" and identity.secret == "s3cret"

    env.processor.authorizer = authorizer
    for version, code in ((4, 0x05), (5, 0x87)):
        raw, ack = await Raw.connect(env, f"bad{version}", version=version, username="dev", password=b"wrong")
        assert ack.reason_code == code
        assert await raw.recv_until_eof() == []
    async with env.client(V5, username="dev", password="s3cret") as ok:
        await ok.subscribe("auth/x", qos=1)
        await ok.publish("auth/x", b"allowed", qos=1)
        assert (await next_message(ok)).payload == b"allowed"
    with pytest.raises(aiomqtt.MqttError):
        async with env.client(V3, username="dev", password="nope"):
            pass


async def test_malformed_packets_close_only_their_connection(env):
    async with env.client(V5) as healthy:
        await healthy.subscribe("ok/#", qos=1)
        before = await Raw.open(env)
        before.send(PINGREQ)  # a packet before CONNECT
        assert await before.recv_until_eof() == []
        bad_len, _ = await Raw.connect(env, "bad-len", version=4)
        bad_len.send(b"\x30\xff\xff\xff\xff\x01")  # remaining length longer than 4 bytes
        assert await bad_len.recv_until_eof() == []
        bad5, _ = await Raw.connect(env, "bad5")
        bad5.send(b"\x30\x05\x00\x03\xff\xfe\xfd")  # invalid UTF-8 topic
        packets = await bad5.recv_until_eof()
        assert len(packets) == 1 and isinstance(packets[0], Disconnect) and packets[0].reason_code >= 0x80
        wrong_name = await Raw.open(env)
        wrong_name.send(encode_connect(Connect("x", 4, protocol_name="MQTX")))
        assert await wrong_name.recv_until_eof() == []
        await healthy.publish("ok/still", b"working", qos=1)
        assert (await next_message(healthy)).payload == b"working"


# ------------------------------------------------------------------ shared subscriptions


async def test_shared_subscription_splits_without_duplicates(env):
    props = Properties(PacketTypes.CONNECT)
    props.ReceiveMaximum = 1
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    n = 20
    async with (
        env.client(V5, properties=props) as a,
        env.client(V5, properties=props) as b,
        env.client(V5) as pub,
    ):
        await a.subscribe("$share/workers/jobs/#", qos=1)
        await b.subscribe("$share/workers/jobs/#", qos=1)

        async def collect(name, c):
            async for m in c.messages:
                got[name].append(m.payload)
                if len(got["a"]) + len(got["b"]) >= n:
                    return

        tasks = [asyncio.create_task(collect("a", a)), asyncio.create_task(collect("b", b))]
        for i in range(n):
            await pub.publish(f"jobs/{i % 3}", f"j{i}".encode(), qos=1)
        done, pending = await asyncio.wait(tasks, timeout=T, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        assert done
    assert sorted(got["a"] + got["b"]) == sorted(f"j{i}".encode() for i in range(n))


@pytest.mark.parametrize("version", VERSIONS)
async def test_shared_subscription_takes_turns_on_a_burst(env, version):
    """A burst published at once is spread round robin over the members, not taken by whichever
    member's poll woke first."""
    n = 60
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    async with env.client(version) as a, env.client(version) as b, env.client(version) as pub:
        await a.subscribe("$share/fair/burst/#", qos=1)
        await b.subscribe("$share/fair/burst/#", qos=1)
        everything = asyncio.Event()

        async def collect(name, c):
            async for m in c.messages:
                got[name].append(m.payload)
                if len(got["a"]) + len(got["b"]) >= n:
                    everything.set()

        tasks = [asyncio.create_task(collect("a", a)), asyncio.create_task(collect("b", b))]
        await asyncio.gather(*(pub.publish(f"burst/{i}", f"m{i}".encode(), qos=1) for i in range(n)))
        await asyncio.wait_for(everything.wait(), T)
        for t in tasks:
            t.cancel()
    assert sorted(got["a"] + got["b"]) == sorted(f"m{i}".encode() for i in range(n))
    assert min(len(got["a"]), len(got["b"])) >= n // 3, {k: len(v) for k, v in got.items()}


async def test_shared_members_compete_and_unacked_is_redelivered(env):
    """A member holding an unacked message (receive maximum 1) gets nothing more: the other member
    gets the rest; when the holder drops its connection its message goes to the other member."""
    members = {}
    for name in ("m1", "m2"):
        raw, _ = await Raw.connect(env, name, properties={PropertyId.RECEIVE_MAXIMUM: 1})
        raw.send(encode_subscribe(Subscribe(1, [Subscription("$share/pool/work/+", 1)]), 5))
        assert isinstance(await raw.recv(), Suback)
        members[name] = raw
    n = 6
    await env.processor.send(
        CTX, [Message("work", f"w{i}".encode(), tag="x") for i in range(n)], auto_create=True
    )
    recv = {name: asyncio.create_task(r.recv()) for name, r in members.items()}
    holder = None
    bodies: dict[str, list[bytes]] = {"m1": [], "m2": []}
    while len(bodies["m1"]) + len(bodies["m2"]) < n:
        done, _ = await asyncio.wait(recv.values(), timeout=T, return_when=asyncio.FIRST_COMPLETED)
        assert done
        for name, task in list(recv.items()):
            if task not in done:
                continue
            p = task.result()
            assert isinstance(p, Publish), p
            bodies[name].append(p.payload)
            if holder is None:
                holder = name  # keeps its first message unacked
            else:
                members[name].send(encode_puback(p.packet_id, version=5))
            recv[name] = asyncio.create_task(members[name].recv())
    other = "m2" if holder == "m1" else "m1"
    assert len(bodies[holder]) == 1 and len(bodies[other]) == n - 1
    assert sorted(bodies[holder] + bodies[other]) == sorted(f"w{i}".encode() for i in range(n))
    recv[holder].cancel()
    members[holder].abort()
    p = await recv[other]
    assert isinstance(p, Publish) and p.payload == bodies[holder][0]
    members[other].send(encode_puback(p.packet_id, version=5))
    await members[other].close()


# ------------------------------------------------------------------ gateway wiring


async def test_gateway_starts_the_mqtt_listener(tmp_path):
    from gateway.config import Settings
    from gateway.server import Gateway

    gw = Gateway(Settings(data_dir=str(tmp_path / "gw"), protocols=("mqtt",), mqtt_port=0))
    await gw.start()
    try:
        [adapter] = gw.adapters
        assert adapter.name == "mqtt" and adapter.listening
        port = int(adapter.address.rsplit(":", 1)[1])
        async with aiomqtt.Client("127.0.0.1", port, protocol=V5) as c:
            await c.subscribe("gw/t", qos=1)
            await c.publish("gw/t", b"through the gateway", qos=1)
            assert (await next_message(c)).payload == b"through the gateway"
    finally:
        await gw.stop()
