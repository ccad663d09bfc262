"""The AMQP connection and channel state machine (session.py, channel.py behind server.py's
AmqpProtocol) driven over a fake transport, the way uvicorn tests its protocols: client frames
encoded with the codec go in through `data_received`, what the server writes is collected from
`transport.write` and decoded with a client-side Decoder. No sockets (the adapter's listener is
never started); underneath is a real in-process Store and MessagingProcessor."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.amqp import AmqpAdapter
from adapters.amqp.codec import (
    PROTOCOL_HEADER,
    BasicAck,
    BasicConsume,
    BasicConsumeOk,
    BasicDeliver,
    BasicGet,
    BasicGetOk,
    BasicQos,
    BasicQosOk,
    ChannelClose,
    ChannelCloseOk,
    ChannelOpen,
    ChannelOpenOk,
    ConfirmSelect,
    ConfirmSelectOk,
    ConnectionBlocked,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ConnectionUnblocked,
    Decoder,
    Message,
    Method,
    QueueDeclare,
    QueueDeclareOk,
    ReplyCode,
    encode_method,
    encode_publish,
)
from adapters.amqp.server import AmqpProtocol
from adapters.amqp.session import CLOSED, CLOSING, OPEN, Connection
from tests.adapters.amqp.support import store_kw
from tests.support import Core, FakeTransport, T

PEER = ("192.0.2.9", 40123)


class Client:
    """One client over a FakeTransport: sends encoded frames, decodes what the server wrote."""

    def __init__(self, adapter: AmqpAdapter) -> None:
        self.protocol = AmqpProtocol(adapter)
        self.transport = FakeTransport(self.protocol, PEER)
        self.protocol.connection_made(self.transport)
        self.dec = Decoder("client", expect_header=False, frame_max=0)
        self.seen = 0  # bytes of transport.data fed to the decoder

    @property
    def conn(self) -> Connection:
        assert self.protocol.conn is not None
        return self.protocol.conn

    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def method(self, channel: int, m: Any) -> None:
        self.send(encode_method(channel, m))

    async def recv(self) -> Method | Message | None:
        """The next frame the server wrote (None: the transport is closed and all was read)."""
        t = self.transport
        async with asyncio.timeout(T):
            while True:
                ev = self.dec.next_event()
                if ev is not None:
                    return ev
                if len(t.data) > self.seen:
                    self.dec.feed(bytes(t.data[self.seen :]))
                    self.seen = len(t.data)
                    continue
                if t.closing:
                    return None
                t.changed.clear()
                await t.changed.wait()

    async def expect(self, channel: int, kind: type) -> Any:
        """The next frame, which must be method `kind` on `channel`; its method."""
        ev = await self.recv()
        assert isinstance(ev, Method | Message) and ev.channel == channel, ev
        assert isinstance(ev.method, kind), ev
        return ev.method

    async def rest(self) -> list[Method | Message]:
        """Every frame until the transport is closed."""
        out = []
        while (ev := await self.recv()) is not None:
            out.append(ev)
        return out

    async def handshake(self, client_properties: dict[str, Any] | None = None) -> None:
        self.send(PROTOCOL_HEADER)
        await self.expect(0, ConnectionStart)
        props = client_properties or {"product": "fake"}
        self.method(0, ConnectionStartOk(props, "PLAIN", b"\x00guest\x00guest"))
        tune = await self.expect(0, ConnectionTune)
        self.method(0, ConnectionTuneOk(tune.channel_max, tune.frame_max, 0))
        self.method(0, ConnectionOpen("/"))
        await self.expect(0, ConnectionOpenOk)

    async def open_channel(self, n: int = 1) -> None:
        self.method(n, ChannelOpen())
        await self.expect(n, ChannelOpenOk)


@pytest.fixture
async def adapter(tmp_path) -> AsyncIterator[AmqpAdapter]:
    core = await Core.open(str(tmp_path / "data"), **store_kw())
    a = AmqpAdapter(core.processor)  # its listener is never started: no socket anywhere
    await a.broker.start()
    core.on_close(lambda: a.stop(0.5))
    yield a
    await core.close()


async def client(adapter: AmqpAdapter, client_properties: dict[str, Any] | None = None) -> Client:
    c = Client(adapter)
    await c.handshake(client_properties)
    return c


# ------------------------------------------------------------------ handshake


async def test_protocol_header_gets_connection_start(adapter):
    c = Client(adapter)
    assert c.transport.data == b""  # the server waits for the client's header
    c.send(PROTOCOL_HEADER)
    start = await c.expect(0, ConnectionStart)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == b"PLAIN AMQPLAIN" and start.locales == b"en_US"
    assert start.server_properties["capabilities"]["publisher_confirms"] is True
    assert not c.transport.closing and c.conn.state != OPEN


async def test_pipelined_start_ok_tune_ok_and_open_get_tune_then_open_ok(adapter):
    c = Client(adapter)
    c.send(PROTOCOL_HEADER)
    await c.expect(0, ConnectionStart)
    # all three in one read: tune-ok and open wait while the login is being authorized
    c.send(
        encode_method(0, ConnectionStartOk({}, "PLAIN", b"\x00guest\x00guest"))
        + encode_method(0, ConnectionTuneOk(2047, 65536, 0))
        + encode_method(0, ConnectionOpen("/"))
    )
    tune = await c.expect(0, ConnectionTune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    await c.expect(0, ConnectionOpenOk)
    assert c.conn.state == OPEN
    assert c.conn.frame_max == 65536 and c.conn.heartbeat == 0
    assert c.conn.ctx.identity.username == "guest"


async def test_a_foreign_protocol_header_gets_ours_and_the_transport_closes(adapter):
    c = Client(adapter)
    c.send(b"GET / HTTP/1.1\r\n\r\n")
    assert c.transport.closing  # at once, within data_received
    await asyncio.wait_for(c.transport.lost.wait(), T)
    assert bytes(c.transport.data) == PROTOCOL_HEADER
    assert c.transport.closing and c.conn.state == CLOSED
    assert c.protocol not in adapter.connections


async def test_client_connection_close_gets_close_ok_and_the_transport_closes(adapter):
    c = await client(adapter)
    c.method(0, ConnectionClose(200, "bye"))
    assert [ev.method for ev in await c.rest()] == [ConnectionCloseOk()]
    await asyncio.wait_for(c.transport.lost.wait(), T)
    assert c.conn.state == CLOSED and c.protocol not in adapter.connections
    assert c.transport.late_writes == 0


# ------------------------------------------------------------------ channels, declare, publish


async def test_channel_open_and_queue_declare(adapter):
    c = await client(adapter)
    await c.open_channel(1)
    c.method(1, QueueDeclare("orders", durable=True))
    ok = await c.expect(1, QueueDeclareOk)
    assert (ok.queue, ok.message_count, ok.consumer_count) == ("orders", 0, 0)
    # the queue is a store topic of the same name (docs/amqp.md), created by the declaration
    assert (await adapter.processor.get_topic("orders")).name == "orders"
    c.method(1, QueueDeclare("", exclusive=True))  # server-named
    assert (await c.expect(1, QueueDeclareOk)).queue.startswith("amq.gen-")


async def test_publishes_with_confirms_are_acked_once_stored(adapter):
    c = await client(adapter)
    await c.open_channel(1)
    c.method(1, ConfirmSelect())
    await c.expect(1, ConfirmSelectOk)
    c.method(1, QueueDeclare("confirmed"))
    await c.expect(1, QueueDeclareOk)
    c.send(b"".join(encode_publish(1, "", "confirmed", None, b"m%d" % i) for i in range(5)))
    # one read, one store send: one ack for all five
    assert await c.expect(1, BasicAck) == BasicAck(5, True)
    c.method(1, QueueDeclare("confirmed", passive=True))
    assert (await c.expect(1, QueueDeclareOk)).message_count == 5
    c.method(1, BasicGet("confirmed", no_ack=True))
    ev = await c.recv()
    assert isinstance(ev, Message) and isinstance(ev.method, BasicGetOk)
    assert ev.body == b"m0" and ev.method.message_count == 4


async def test_too_many_publishes_in_flight_pause_reading_until_stored(adapter):
    adapter.broker.max_inflight_publishes = 4
    c = await client(adapter)
    await c.open_channel(1)
    c.method(1, ConfirmSelect())
    await c.expect(1, ConfirmSelectOk)
    c.method(1, QueueDeclare("paced"))
    await c.expect(1, QueueDeclareOk)
    c.send(b"".join(encode_publish(1, "", "paced", None, b"x") for _ in range(10)))
    assert c.transport.paused and c.transport.pauses == 1  # at once, before anything is stored
    assert await c.expect(1, BasicAck) == BasicAck(10, True)
    assert not c.transport.paused and c.transport.resumes == 1


async def test_consume_delivers_and_ack_settles_in_the_store(adapter):
    p = adapter.processor
    acked = asyncio.Event()
    real_ack = p.ack_many

    async def ack_many(*args: Any, **kw: Any) -> Any:
        r = await real_ack(*args, **kw)
        acked.set()
        return r

    p.ack_many = ack_many  # type: ignore[method-assign]
    c = await client(adapter)
    await c.open_channel(1)
    c.method(1, QueueDeclare("work"))
    await c.expect(1, QueueDeclareOk)
    c.method(1, BasicQos(0, 10, False))
    await c.expect(1, BasicQosOk)
    c.method(1, BasicConsume("work", "c1"))
    assert (await c.expect(1, BasicConsumeOk)).consumer_tag == "c1"
    c.send(encode_publish(1, "", "work", None, b"job"))
    ev = await c.recv()
    assert isinstance(ev, Message) and isinstance(ev.method, BasicDeliver)
    assert (ev.method.consumer_tag, ev.method.delivery_tag, ev.method.redelivered) == ("c1", 1, False)
    assert ev.body == b"job" and ev.method.routing_key == "work"
    assert (await p.backlog("work", "work"))[1] == 1  # in flight until acked
    c.method(1, BasicAck(1))
    await asyncio.wait_for(acked.wait(), T)
    assert await p.backlog("work", "work") == (0, 0)


async def test_writes_of_one_loop_tick_are_one_transport_write(adapter):
    c = await client(adapter)
    before = c.transport.writes
    c.send(b"".join(encode_method(n, ChannelOpen()) for n in (1, 2, 3)))
    for n in (1, 2, 3):
        await c.expect(n, ChannelOpenOk)
    assert c.transport.writes == before + 1


# ------------------------------------------------------------------ errors


async def test_a_channel_error_closes_only_that_channel(adapter):
    c = await client(adapter)
    await c.open_channel(1)
    c.method(1, QueueDeclare("missing", passive=True))
    close = await c.expect(1, ChannelClose)
    assert (close.reply_code, close.class_id, close.method_id) == (ReplyCode.NOT_FOUND, 50, 10)
    c.method(1, QueueDeclare("ignored"))  # the channel is closing: ignored until close-ok
    c.method(1, ChannelCloseOk())
    await c.open_channel(1)  # the number is free again
    c.method(1, QueueDeclare("after"))
    assert (await c.expect(1, QueueDeclareOk)).queue == "after"
    assert "ignored" not in adapter.broker.vhosts["/"].queues
    assert not c.transport.closing and c.conn.state == OPEN


async def test_a_method_on_an_unopened_channel_is_504_and_close_ok_closes_the_transport(adapter):
    c = await client(adapter)
    c.method(5, QueueDeclare("x"))
    close = await c.expect(0, ConnectionClose)
    assert close.reply_code == ReplyCode.CHANNEL_ERROR
    assert c.conn.state == CLOSING and not c.transport.closing  # waits for the client's close-ok
    c.method(0, ConnectionCloseOk())
    assert await c.rest() == []
    await asyncio.wait_for(c.transport.lost.wait(), T)
    assert c.conn.state == CLOSED


async def test_a_bad_frame_closes_the_connection_with_501_and_its_exclusive_queues_go(adapter):
    c = await client(adapter)
    await c.open_channel(1)
    c.method(1, QueueDeclare("mine", exclusive=True))
    await c.expect(1, QueueDeclareOk)
    c.send(b"\x01\x00\x01\x00\x00\x00\x05garbage!")  # a method frame whose frame-end octet is wrong
    assert c.transport.closing  # at once: the byte stream lost sync, no close-ok is waited for
    events = await c.rest()
    assert len(events) == 1 and isinstance(events[0].method, ConnectionClose)
    assert events[0].method.reply_code == ReplyCode.FRAME_ERROR
    await asyncio.wait_for(c.transport.lost.wait(), T)
    assert c.conn.state == CLOSED and c.protocol not in adapter.connections
    assert c.transport.late_writes == 0
    # another connection may now declare "mine" (while its owner lived: 405 RESOURCE_LOCKED)
    other = await client(adapter)
    await other.open_channel(1)
    other.method(1, QueueDeclare("mine", exclusive=True))
    assert (await other.expect(1, QueueDeclareOk)).queue == "mine"


async def test_connection_blocked_while_the_store_refuses_writes(adapter):
    caps = {"capabilities": {"connection.blocked": True}}
    before = await client(adapter, caps)
    plain = await client(adapter)  # no connection.blocked capability: told nothing
    adapter.broker.blocking.block("store full")
    assert (await before.expect(0, ConnectionBlocked)).reason == "store full"
    during = await client(adapter, caps)  # opened while blocked: told right after open-ok
    assert (await during.expect(0, ConnectionBlocked)).reason == "store full"
    for c in (before, during):  # a second after the last refusal
        await c.expect(0, ConnectionUnblocked)
    plain.method(0, ConnectionClose(200, "bye"))
    assert [ev.method for ev in await plain.rest()] == [ConnectionCloseOk()]
