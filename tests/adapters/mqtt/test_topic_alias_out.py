"""Server-to-client topic aliases (5.0): a client that allows them (Topic Alias Maximum in CONNECT)
gets the topic and a new alias on a topic's first PUBLISH and an empty topic with the alias after;
when all are taken the least recently used alias is rebound; a client that allows none never gets
one. Checked on the bytes of a raw socket, with paho (which passes the empty topic and the alias
property through: paho-mqtt 2.2 does not resolve inbound aliases), and on the sans-IO table."""

from __future__ import annotations

import asyncio
import threading

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt.codec import (
    OutboundAliases,
    PropertyId,
    Publish,
    Subscribe,
    Subscription,
    encode_puback,
    encode_subscribe,
)
from adapters.mqtt.codec.packets import Suback
from tests.adapters.mqtt.support import V5, Env, Raw, T

TAM = PropertyId.TOPIC_ALIAS_MAXIMUM
ALIAS = PropertyId.TOPIC_ALIAS


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """One whole MQTT packet as sent (fixed header included)."""
    head = await asyncio.wait_for(reader.readexactly(1), T)
    n, shift, length = 0, 0, b""
    while True:
        b = await asyncio.wait_for(reader.readexactly(1), T)
        length += b
        n |= (b[0] & 0x7F) << shift
        shift += 7
        if not b[0] & 0x80:
            break
    return head + length + await asyncio.wait_for(reader.readexactly(n), T)


def wire_topic(frame: bytes) -> str:
    """The topic name of a PUBLISH exactly as on the wire (empty when only the alias names it)."""
    i = 1
    while frame[i] & 0x80:
        i += 1
    tl = int.from_bytes(frame[i + 1 : i + 3], "big")
    return frame[i + 3 : i + 3 + tl].decode()


async def raw_subscriber(env: Env, alias_max: int | None, filt: str, qos: int = 0) -> Raw:
    props = {TAM: alias_max} if alias_max is not None else {}
    raw, ack = await Raw.connect(env, "ta-" + filt.split("/")[0], 5, properties=props)
    assert ack.reason_code == 0
    raw.send(encode_subscribe(Subscribe(1, [Subscription(filt, qos)]), V5))
    assert isinstance(await raw.recv(), Suback)
    return raw


async def publish(env: Env, topics: list[str]) -> None:
    async with env.client(V5) as pub:
        for i, t in enumerate(topics):
            await pub.publish(t, b"p%d" % i, qos=1)


async def receive(raw: Raw, n: int, alias_max: int) -> list[tuple[str, str, int | None, bytes]]:
    """(wire topic, topic resolved by a client-side decoder, alias, payload) of n PUBLISHes; QoS 1
    ones are acknowledged."""
    dec = raw.dec  # past the CONNACK; it resolves aliases as an alias-aware client does
    dec.topic_alias_maximum = alias_max
    out = []
    while len(out) < n:
        frame = await read_frame(raw.reader)
        dec.feed(frame)
        p = dec.next_packet()
        assert isinstance(p, Publish), p
        out.append((wire_topic(frame), p.topic, p.properties.get(ALIAS), bytes(p.payload)))
        if p.qos:
            raw.send(encode_puback(p.packet_id, 0, V5))
    return out


async def test_second_message_on_a_topic_carries_only_the_alias(env):
    raw = await raw_subscriber(env, 8, "al1/#", qos=1)
    await publish(env, ["al1/a/long/topic", "al1/a/long/topic", "al1/b", "al1/a/long/topic"])
    got = await receive(raw, 4, 8)
    assert got == [
        ("al1/a/long/topic", "al1/a/long/topic", 1, b"p0"),
        ("", "al1/a/long/topic", 1, b"p1"),
        ("al1/b", "al1/b", 2, b"p2"),
        ("", "al1/a/long/topic", 1, b"p3"),
    ]
    await raw.close()


async def test_full_table_rebinds_the_least_recently_used_alias(env):
    raw = await raw_subscriber(env, 2, "al2/#")
    await publish(env, ["al2/a", "al2/b", "al2/a", "al2/c", "al2/a", "al2/b"])
    got = await receive(raw, 6, 2)
    assert [(w, t, a) for w, t, a, _ in got] == [
        ("al2/a", "al2/a", 1),
        ("al2/b", "al2/b", 2),
        ("", "al2/a", 1),
        ("al2/c", "al2/c", 2),  # b was the least recently used: its alias now names c
        ("", "al2/a", 1),
        ("al2/b", "al2/b", 2),  # c's alias given to b again, with the topic
    ]
    await raw.close()


async def test_no_alias_without_a_topic_alias_maximum(env):
    for alias_max in (None, 0):
        raw = await raw_subscriber(env, alias_max, f"al3{alias_max}/#")
        topic = f"al3{alias_max}/x"
        await publish(env, [topic, topic, topic])
        got = await receive(raw, 3, 0)
        assert got == [(topic, topic, None, b"p%d" % i) for i in range(3)]
        await raw.close()


class PahoSub:
    """A paho 5.0 subscriber in its network thread, collecting (topic, alias property, payload)."""

    def __init__(self, port: int, alias_max: int | None) -> None:
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv5)
        self.got: list[tuple[str, int | None, bytes]] = []
        self.changed = threading.Condition()
        self.subscribed = threading.Event()
        self.c.on_message = self._on_message
        self.c.on_subscribe = lambda *a: self.subscribed.set()
        props = None
        if alias_max is not None:
            props = Properties(PacketTypes.CONNECT)
            props.TopicAliasMaximum = alias_max
        self.c.connect("127.0.0.1", port, properties=props)
        self.c.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        with self.changed:
            self.got.append((msg.topic, getattr(msg.properties, "TopicAlias", None), msg.payload))
            self.changed.notify_all()

    def subscribe(self, filt: str) -> None:
        self.c.subscribe(filt, qos=1)
        assert self.subscribed.wait(T), "no SUBACK"

    def wait(self, n: int) -> list[tuple[str, int | None, bytes]]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.got) >= n, T), self.got
        return self.got[:n]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


async def test_paho_receives_aliased_publishes(env):
    sub = PahoSub(env.port, 4)
    try:
        await asyncio.to_thread(sub.subscribe, "al4/#")
        await publish(env, ["al4/dev/1", "al4/dev/1", "al4/dev/2", "al4/dev/1"])
        got = await asyncio.to_thread(sub.wait, 4)
    finally:
        sub.close()
    assert [(t, a) for t, a, _ in got] == [("al4/dev/1", 1), ("", 1), ("al4/dev/2", 2), ("", 1)]
    names: dict[int, str] = {}  # what an alias-aware client does with them
    resolved = []
    for t, a, p in got:
        if t:
            names[a] = t
        resolved.append((names[a], p))
    assert resolved == [
        (t, b"p%d" % i) for i, t in enumerate(["al4/dev/1", "al4/dev/1", "al4/dev/2", "al4/dev/1"])
    ]


async def test_paho_without_a_maximum_gets_whole_topics(env):
    sub = PahoSub(env.port, None)
    try:
        await asyncio.to_thread(sub.subscribe, "al5/#")
        await publish(env, ["al5/x", "al5/x"])
        got = await asyncio.to_thread(sub.wait, 2)
    finally:
        sub.close()
    assert got == [("al5/x", None, b"p0"), ("al5/x", None, b"p1")]


def test_alias_table_reuses_forgotten_numbers_before_evicting():
    t = OutboundAliases(2)
    assert t.assign("a") == (1, False)
    assert t.assign("b") == (2, False)
    assert t.assign("c") == (1, False)  # a evicted (least recently used)
    t.forget("c")  # its PUBLISH was not sent
    assert t.assign("d") == (1, False)  # number 1 again, not a clash with b's 2
    assert t.assign("b") == (2, True)
    assert len(t) == 2
