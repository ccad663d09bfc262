"""What three checks of the Eclipse Paho interoperability suite (paho.mqtt.testing,
interoperability/client_test5.py) assert, done with paho-mqtt against the gateway (issue 47: the
trace context the gateway used to add to every delivery failed all three):

- `test_user_properties`: User Properties `a=2, c=3` published at QoS 0, 1 and 2 come back exactly
  (MQTT-3.3.2-17: the server forwards them unaltered);
- `test_maximum_packet_size`: a client with Maximum Packet Size 64 gets a message of half that, and
  not one of 64 bytes of payload (the server drops a PUBLISH too large for the client);
- `test_will_message`: a will with User Properties `a=2, c=3`, published when its client goes away
  without DISCONNECT, reaches a subscriber with exactly those."""

from __future__ import annotations

import asyncio
import threading
import uuid

import paho.mqtt.client as paho
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support import T, running_gateway, wait_until

pytestmark = pytest.mark.timeout(60)

USER = [("a", "2"), ("c", "3")]


@pytest.fixture
async def mqtt_port(tmp_path):
    async with running_gateway(str(tmp_path / "data"), ("mqtt",)) as gw:
        yield next(a for a in gw.adapters if a.name == "mqtt").bound_port


class Client:
    """A paho-mqtt 5 client on its own network thread, recording what it receives."""

    def __init__(self, port: int, *, connect: Properties | None = None, **will) -> None:
        self.messages: list[paho.MQTTMessage] = []
        self.connected, self.subscribed = threading.Event(), threading.Event()
        c = self.c = paho.Client(
            paho.CallbackAPIVersion.VERSION2, client_id=f"paho-{uuid.uuid4().hex[:8]}", protocol=paho.MQTTv5
        )
        c.on_message = lambda _c, _u, m: self.messages.append(m)
        c.on_connect = lambda *_: self.connected.set()
        c.on_subscribe = lambda *_: self.subscribed.set()
        if will:
            c.will_set(**will)
        c.connect("127.0.0.1", port, clean_start=True, properties=connect)
        c.loop_start()

    async def ready(self) -> Client:
        assert await asyncio.to_thread(self.connected.wait, T)
        return self

    async def subscribe(self, topic: str) -> None:
        self.c.subscribe(topic, qos=2)
        assert await asyncio.to_thread(self.subscribed.wait, T)

    def publish(
        self, topic: str, payload: bytes, qos: int, user: list[tuple[str, str]] | None = None
    ) -> None:
        props = None
        if user:
            props = Properties(PacketTypes.PUBLISH)
            props.UserProperty = user
        self.c.publish(topic, payload, qos, properties=props)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


async def test_user_properties(mqtt_port):
    c = await Client(mqtt_port).ready()
    try:
        await c.subscribe("TopicA")
        for qos in (0, 1, 2):
            c.publish("TopicA", b"", qos, USER)
        await wait_until(lambda: len(c.messages) == 3)
    finally:
        c.close()
    assert [m.properties.UserProperty for m in c.messages] == [USER] * 3
    assert sorted(m.qos for m in c.messages) == [0, 1, 2]


async def test_maximum_packet_size(mqtt_port):
    maximum = 64
    props = Properties(PacketTypes.CONNECT)
    props.MaximumPacketSize = maximum
    c = await Client(mqtt_port, connect=props).ready()
    try:
        await c.subscribe("TopicA")
        c.publish("TopicA", b"." * (maximum // 2), 0)  # small enough: delivered
        await wait_until(lambda: len(c.messages) == 1)
        c.publish("TopicA", b"." * maximum, 1)  # too big for this client: never delivered
        c.publish("TopicA", b"end", 1)  # (what comes after it is: the big one was passed over)
        await wait_until(lambda: len(c.messages) == 2)
    finally:
        c.close()
    assert [m.payload for m in c.messages] == [b"." * (maximum // 2), b"end"]


async def test_will_message(mqtt_port):
    will = Properties(PacketTypes.WILLMESSAGE)
    will.WillDelayInterval = 0
    will.UserProperty = USER
    a = await Client(mqtt_port, topic="Topic/C", payload=b"will message", qos=0, properties=will).ready()
    b = await Client(mqtt_port).ready()
    try:
        await b.subscribe("Topic/C")
        a.c.loop_stop()
        a.c.socket().close()  # gone without DISCONNECT: the server publishes the will
        await wait_until(lambda: len(b.messages) == 1)
    finally:
        b.close()
    [m] = b.messages
    assert (m.topic, m.payload) == ("Topic/C", b"will message")
    assert m.properties.UserProperty == USER
