"""The MQTT connection state machine (session.py behind server.py's MqttProtocol) driven over a fake
transport, the way uvicorn tests its protocols: client packets encoded with the codec go in through
`data_received`, what the server writes is collected from `transport.write` and checked as bytes or
decoded with a client-side Decoder. No sockets; underneath is a real in-process Store and
MessagingProcessor, so stores, fan-out and persistent sessions run for real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from adapters.mqtt import MqttAdapter
from adapters.mqtt.codec import (
    PINGREQ,
    PINGRESP,
    Connack,
    Connect,
    Decoder,
    PropertyId,
    Publish,
    ReasonCode,
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
from adapters.mqtt.codec.packets import Pubcomp, Pubrec, Suback
from adapters.mqtt.server import MqttProtocol
from adapters.mqtt.session import CLOSED, CONNECTED, Session
from messaging_processor import ClientContext
from tests.adapters.mqtt.support import STORE
from tests.support import Core, FakeTransport, T

PEER = ("192.0.2.7", 50123)
CTX = ClientContext("test", client_id="transport-test")


class Client:
    """One connection as seen from the client side of the fake transport."""

    def __init__(self, adapter: MqttAdapter, version: int) -> None:
        self.adapter = adapter
        self.version = version
        self.protocol = MqttProtocol(adapter)
        self.transport = FakeTransport(self.protocol, PEER)
        self.protocol.connection_made(self.transport)
        self.dec = Decoder("client", version=version)
        self._pos = 0  # bytes of transport.data consumed

    @property
    def session(self) -> Session:
        assert self.protocol.session is not None
        return self.protocol.session

    def send(self, *packets: bytes) -> None:
        self.protocol.data_received(b"".join(packets))

    async def _until(self, cond: Callable[[], bool]) -> None:
        async def wait() -> None:
            while not cond():
                assert not self.transport.closing, f"closed; written: {bytes(self.transport.data)!r}"
                self.transport.changed.clear()
                await self.transport.changed.wait()

        await asyncio.wait_for(wait(), T)

    async def expect_bytes(self, expected: bytes) -> None:
        """The next bytes written are exactly `expected` (possibly over several writes)."""
        end = self._pos + len(expected)
        data = self.transport.data
        await self._until(lambda: len(data) >= end or self.transport.closing)
        assert bytes(data[self._pos : end]) == expected
        self.dec.feed(bytes(data[self._pos : end]))
        self._pos = end
        while self.dec.next_packet() is not None:
            pass

    async def recv(self) -> Any:
        """The next packet written, or None once the transport closed with nothing more."""
        while True:
            p = self.dec.next_packet()
            if p is not None:
                return p
            data = self.transport.data
            if self._pos < len(data):
                self.dec.feed(bytes(data[self._pos :]))
                self._pos = len(data)
                continue
            if self.transport.closing:
                return None
            self.transport.changed.clear()
            await asyncio.wait_for(self.transport.changed.wait(), T)

    async def connect(self, client_id: str, **kw: Any) -> Connack:
        self.send(encode_connect(Connect(client_id, self.version, **kw)))
        ack = await self.recv()
        assert isinstance(ack, Connack), ack
        return ack

    async def closed(self) -> None:
        """Wait until the transport was closed and the protocol told."""
        await asyncio.wait_for(self.transport.lost.wait(), T)
        assert self.session.state == CLOSED


class Broker:
    """The gateway core (tests/support.py) with an MqttAdapter whose broker runs and whose listener
    never starts; `client()` connects one Client to it."""

    def __init__(self, core: Core, adapter: MqttAdapter) -> None:
        self.store = core.store
        self.processor = core.processor
        self.adapter = adapter
        self.clients: list[Client] = []

    def client(self, version: int = 5) -> Client:
        c = Client(self.adapter, version)
        self.clients.append(c)
        return c

    async def settled(self) -> None:
        """Wait for what closed sessions left running (detach, dropped subscriptions, wills)."""
        tasks = self.adapter.broker.registry._tasks
        while tasks:
            await asyncio.wait_for(asyncio.gather(*list(tasks), return_exceptions=True), T)


@pytest.fixture
async def core(tmp_path) -> AsyncIterator[Broker]:
    core = await Core.open(str(tmp_path / "data"), **STORE)
    adapter = MqttAdapter(core.processor, "127.0.0.1", 0, topic_scan_interval=0.1)  # never listens here
    await adapter.broker.start()
    core.on_close(adapter.broker.close)
    c = Broker(core, adapter)
    try:
        yield c
    finally:
        await core.close()
    assert [x.transport.late_writes for x in c.clients] == [0] * len(c.clients)


async def subscribed(core: Broker, filt: str, qos: int = 1, version: int = 5) -> Client:
    sub = core.client(version)
    await sub.connect("sub-" + filt.replace("/", "-").replace("#", "all").replace("+", "any"))
    sub.send(encode_subscribe(Subscribe(1, [Subscription(filt, qos)]), version))
    ack = await sub.recv()
    assert isinstance(ack, Suback) and ack.reason_codes == [qos]
    return sub


# ------------------------------------------------------------------ CONNECT


async def test_connect_311_writes_connack_and_registers_the_session(core):
    c = core.client(4)
    c.send(encode_connect(Connect("dev-1", 4, keep_alive=30)))
    await c.expect_bytes(b"\x20\x02\x00\x00")  # CONNACK, no session present, accepted
    s = c.session
    assert s.state == CONNECTED and s.client_id == "dev-1" and s.keep_alive == 30
    assert s.remote == "192.0.2.7:50123"  # peername through get_extra_info
    assert core.adapter.broker.registry.sessions["dev-1"] is s
    assert c.protocol in core.adapter.connections


async def test_connect_v5_assigns_a_client_id_and_announces_limits(core):
    c = core.client(5)
    ack = await c.connect("")
    assert ack.reason_code == 0 and not ack.session_present
    props = ack.properties
    assigned = props[PropertyId.ASSIGNED_CLIENT_IDENTIFIER]
    assert assigned.startswith("auto-") and c.session.client_id == assigned
    assert core.adapter.broker.registry.sessions[assigned] is c.session
    assert props[PropertyId.TOPIC_ALIAS_MAXIMUM] == 64
    assert props[PropertyId.MAXIMUM_PACKET_SIZE] == core.adapter.broker.max_packet_size
    assert props[PropertyId.SHARED_SUBSCRIPTION_AVAILABLE] == 1


async def test_a_second_connection_takes_the_client_id_over(core):
    first, second = core.client(5), core.client(5)
    await first.connect("same")
    ack = await second.connect("same")
    assert ack.reason_code == 0
    await first.expect_bytes(encode_disconnect(ReasonCode.SESSION_TAKEN_OVER, 5))
    await first.closed()
    assert core.adapter.broker.registry.sessions["same"] is second.session
    assert second.session.state == CONNECTED and first.protocol not in core.adapter.connections


# ------------------------------------------------------------------ PUBLISH


async def test_publish_qos1_gets_puback_once_stored(core):
    c = core.client(4)
    await c.connect("pub-1")
    c.send(encode_publish("plant/3/temp", b"21.5", 1, 7, version=4))
    await c.expect_bytes(b"\x40\x02\x00\x07")  # PUBACK 7
    got = await core.processor.pop(CTX, "g-check", "plant", max_messages=8)
    assert [(d.message.body, d.message.properties["mqtt.topic"]) for d in got] == [(b"21.5", "plant/3/temp")]


async def test_replies_keep_the_order_of_their_requests(core):
    """Two QoS 1 PUBLISHes (acked after the store) then a PINGREQ (answerable at once), in one read:
    the PINGRESP waits behind the PUBACKs."""
    c = core.client(4)
    await c.connect("order")
    c.send(
        encode_publish("o/a", b"1", 1, 1, version=4),
        encode_publish("o/a", b"2", 1, 2, version=4),
        PINGREQ,
    )
    await c.expect_bytes(encode_puback(1) + encode_puback(2) + PINGRESP)


async def test_inbound_qos2_is_stored_once_and_released(core):
    c = core.client(5)
    await c.connect("q2")
    for dup in (False, True):  # the retransmission before PUBREL is not stored again
        c.send(encode_publish("q2/x", b"once", 2, 9, dup=dup, version=5))
        rec = await c.recv()
        assert isinstance(rec, Pubrec) and rec.packet_id == 9 and rec.reason_code == 0
    assert c.session.awaiting_rel == {9}
    c.send(encode_pubrel(9, version=5))
    comp = await c.recv()
    assert isinstance(comp, Pubcomp) and comp.packet_id == 9 and comp.reason_code == 0
    assert c.session.awaiting_rel == set()
    got = await core.processor.pop(CTX, "g-q2", "q2", max_messages=8)
    assert [d.message.body for d in got] == [b"once"]


# ------------------------------------------------------------------ SUBSCRIBE and delivery


async def test_subscribe_gets_suback_then_deliveries(core):
    sub = core.client(5)
    await sub.connect("watcher")
    sub.send(encode_subscribe(Subscribe(3, [Subscription("sensors/+/t", 1)]), 5))
    await sub.expect_bytes(b"\x90\x04\x00\x03\x00\x01")  # SUBACK 3, no properties, granted QoS 1
    pub = core.client(4)
    await pub.connect("sensor-1")
    pub.send(encode_publish("sensors/1/t", b"7", 1, 1, version=4))
    await pub.expect_bytes(encode_puback(1))
    p = await sub.recv()
    assert isinstance(p, Publish)
    assert (p.topic, p.payload, p.qos, p.retain) == ("sensors/1/t", b"7", 1, False)
    assert set(sub.session.inflight) == {p.packet_id}
    sub.send(encode_puback(p.packet_id, version=5))
    assert sub.session.inflight == {}


# ------------------------------------------------------------------ errors and closing


async def test_malformed_packet_v5_disconnects_0x81_and_closes(core):
    c = core.client(5)
    await c.connect("bad5")
    c.send(b"\x00\x00")  # reserved packet type 0
    await c.expect_bytes(bytes((0xE0, 2, ReasonCode.MALFORMED_PACKET, 0)))
    await c.closed()
    assert await c.recv() is None  # nothing after the DISCONNECT
    assert "bad5" not in core.adapter.broker.registry.sessions
    assert c.protocol not in core.adapter.connections


async def test_malformed_packet_311_closes_without_a_reply(core):
    c = core.client(4)
    await c.connect("bad4")
    c.send(b"\xf0\x00")  # reserved packet type 15
    await c.closed()
    assert await c.recv() is None
    assert "bad4" not in core.adapter.broker.registry.sessions


async def test_a_packet_before_connect_closes_the_connection(core):
    c = core.client(4)
    c.send(encode_publish("early/x", b"no", 0, version=4))
    await c.closed()
    assert bytes(c.transport.data) == b""
    assert core.adapter.broker.registry.sessions == {}


async def test_keep_alive_expiry_disconnects_0x8d_and_publishes_the_will(core):
    sub = await subscribed(core, "wills/#")
    c = core.client(5)
    await c.connect("sleepy", keep_alive=1, will=Will("wills/sleepy", b"gone", 1))
    # 1.5 x keep-alive without a packet: the server gives up on the client
    await c.expect_bytes(encode_disconnect(ReasonCode.KEEP_ALIVE_TIMEOUT, 5))
    await c.closed()
    p = await sub.recv()
    assert isinstance(p, Publish) and (p.topic, p.payload) == ("wills/sleepy", b"gone")


async def test_pingreq_keeps_a_connection_alive(core):
    c = core.client(4)
    await c.connect("pinger", keep_alive=1)
    for _ in range(3):  # 3 x 0.6 s > 1.5 s: only the PINGREQs keep it open
        await asyncio.sleep(0.6)  # the client's idle time (no event to wait for)
        c.send(PINGREQ)
        await c.expect_bytes(PINGRESP)
    assert c.session.state == CONNECTED and not c.transport.closing


@pytest.mark.parametrize(
    ("reason", "will_sent"),
    [pytest.param(0, False, id="normal"), pytest.param(0x04, True, id="with-will")],
)
async def test_disconnect_closes_and_decides_the_will(core, reason, will_sent):
    sub = await subscribed(core, "bye/#")
    c = core.client(5)
    await c.connect("leaver", will=Will("bye/leaver", b"will", 1))
    c.send(encode_disconnect(reason, 5))
    await c.closed()
    assert await c.recv() is None  # the server writes nothing back to a DISCONNECT
    await core.settled()
    pub = core.client(4)
    await pub.connect("after")
    pub.send(encode_publish("bye/leaver", b"sentinel", 1, 1, version=4))  # same path: same queue
    await pub.expect_bytes(encode_puback(1))
    payloads = []
    while not payloads or payloads[-1] != b"sentinel":
        p = await sub.recv()
        assert isinstance(p, Publish), p
        payloads.append(p.payload)
        sub.send(encode_puback(p.packet_id, version=5))
    assert payloads == ([b"will", b"sentinel"] if will_sent else [b"sentinel"])


async def test_v5_disconnect_cannot_extend_a_session_that_ends(core):
    c = core.client(5)
    await c.connect("no-extend")  # Session Expiry Interval 0
    c.send(encode_disconnect(0, 5, {PropertyId.SESSION_EXPIRY_INTERVAL: 60}))
    await c.expect_bytes(encode_disconnect(ReasonCode.PROTOCOL_ERROR, 5))
    await c.closed()


async def test_peer_reset_publishes_the_will(core):
    sub = await subscribed(core, "lost/#")
    c = core.client(4)
    await c.connect("fragile", will=Will("lost/fragile", b"reset", 1))
    c.transport.peer_reset()
    assert c.session.state == CLOSED and "fragile" not in core.adapter.broker.registry.sessions
    p = await sub.recv()
    assert isinstance(p, Publish) and (p.topic, p.payload) == ("lost/fragile", b"reset")


async def test_server_shutdown_disconnects_v5_0x8b_and_v311_silently(core):
    c5, c4 = core.client(5), core.client(4)
    await c5.connect("s5")
    await c4.connect("s4")
    await core.adapter.broker.close()
    await c5.expect_bytes(encode_disconnect(ReasonCode.SERVER_SHUTTING_DOWN, 5))
    await c5.closed()
    await c4.closed()
    assert await c4.recv() is None  # 3.1.1 has no server DISCONNECT


# ------------------------------------------------------------------ persistent sessions


async def test_persistent_session_resumes_with_what_arrived_meanwhile(core):
    sei = {PropertyId.SESSION_EXPIRY_INTERVAL: 60}
    c = core.client(5)
    ack = await c.connect("keeper", clean_start=False, properties=sei)
    assert not ack.session_present
    c.send(encode_subscribe(Subscribe(1, [Subscription("inbox/#", 1)]), 5))
    assert (await c.recv()).reason_codes == [1]
    c.send(encode_disconnect(0, 5))
    await c.closed()
    await core.settled()
    assert core.adapter.broker.registry.states["keeper"].attached is None
    pub = core.client(4)
    await pub.connect("mailer")
    pub.send(encode_publish("inbox/1", b"while-away", 1, 1, version=4))
    await pub.expect_bytes(encode_puback(1))
    again = core.client(5)
    ack = await again.connect("keeper", clean_start=False, properties=sei)
    assert ack.session_present
    p = await again.recv()
    assert isinstance(p, Publish) and (p.topic, p.payload, p.qos) == ("inbox/1", b"while-away", 1)
    again.send(encode_puback(p.packet_id, version=5))
    assert again.session.inflight == {}
