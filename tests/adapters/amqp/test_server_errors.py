"""Reply codes and error handling: channel errors close the channel only (the connection stays
usable), connection errors close the connection, framing garbage closes that connection only;
authentication through processor.authorize; heartbeats."""

from __future__ import annotations

import asyncio
import struct

import aio_pika
import aiormq
import pika
import pytest
from aio_pika import ExchangeType, Message

from adapters.amqp.codec import (
    HEARTBEAT,
    PROTOCOL_HEADER,
    BasicAck,
    ChannelClose,
    ChannelCloseOk,
    ChannelOpen,
    ChannelOpenOk,
    ConfirmSelect,
    ConfirmSelectOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionTune,
    QueueDeclare,
    QueueDeclareOk,
    encode_method,
    encode_publish,
    encode_table,
)
from messaging_processor import Action
from tests.adapters.amqp.support import Raw, T, collect, get_message


async def test_conflicting_queue_declare_gives_406_and_the_connection_stays_usable(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await ch.declare_queue("conf", durable=True, arguments={"x-message-ttl": 1000})
        for kwargs in (
            {"durable": True, "arguments": {"x-message-ttl": 2000}},
            {"durable": False, "arguments": {"x-message-ttl": 1000}},
            {"durable": True},
            {"durable": True, "arguments": {"x-message-ttl": 1000, "x-queue-type": "quorum"}},
        ):
            bad = await conn.channel()
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as e:
                await bad.declare_queue("conf", **kwargs)
            assert "inequivalent arg" in str(e.value)
            assert bad.is_closed
        # same arguments (and other, not compared, ones) are fine; the first channel still works
        q = await ch.declare_queue("conf", durable=True, arguments={"x-message-ttl": 1000, "x-custom": 1})
        await ch.default_exchange.publish(Message(b"still ok"), routing_key="conf")
        assert (await get_message(q)).body == b"still ok"


async def test_invalid_arguments_and_reserved_names(env):
    async with await env.connect() as conn:
        for kwargs, exc in (
            (
                {"name": "neg", "arguments": {"x-message-ttl": -1}},
                aiormq.exceptions.ChannelPreconditionFailed,
            ),
            (
                {"name": "ov", "arguments": {"x-overflow": "explode"}},
                aiormq.exceptions.ChannelPreconditionFailed,
            ),
            ({"name": "amq.mine"}, aiormq.exceptions.ChannelAccessRefused),
        ):
            ch = await conn.channel()
            with pytest.raises(exc):
                await ch.declare_queue(**kwargs)
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await ch.declare_exchange("amq.custom", ExchangeType.DIRECT)
        ch = await conn.channel()
        await ch.declare_exchange("typed", ExchangeType.DIRECT)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await ch.declare_exchange("typed", ExchangeType.FANOUT)
        ch = await conn.channel()
        assert (await ch.declare_exchange("amq.topic", passive=True)).name == "amq.topic"


async def test_not_found_errors_are_404(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue("missing", passive=True)
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_exchange("missing-ex", passive=True)
        ch = await conn.channel()
        q = await ch.declare_queue("present", exclusive=True)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await q.bind("missing-ex", "k")
        ch = await conn.channel(publisher_confirms=False)
        await (await ch.get_underlay_channel()).basic_publish(b"x", exchange="missing-ex", routing_key="k")
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue("present", passive=True)


async def test_exclusive_queue_is_locked_for_other_connections_and_deleted_with_its_owner(env):
    owner = await env.connect()
    ch = await owner.channel()
    await ch.declare_queue("mine", exclusive=True)
    async with await env.connect() as other:
        och = await other.channel()
        with pytest.raises(aiormq.exceptions.ChannelLockedResource):
            await och.declare_queue("mine", passive=True)
        await owner.close()
        broker = env.adapter.broker
        for _ in range(200):
            if "mine" not in broker.vhosts["/"].queues:
                break
            await asyncio.sleep(0.01)
        och = await other.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await och.declare_queue("mine", passive=True)


async def test_auto_delete_queue_goes_with_its_last_consumer(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("ad", auto_delete=True)
        tag = await q.consume(collect([]), no_ack=True)
        await q.cancel(tag)
        broker = env.adapter.broker
        for _ in range(200):
            if "ad" not in broker.vhosts["/"].queues:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
            await ch.declare_queue("ad", passive=True)


async def test_delete_if_unused_if_empty_and_exchange_if_unused(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("busy")
        await ch.default_exchange.publish(Message(b"x"), routing_key="busy")
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await (await ch.get_underlay_channel()).queue_delete("busy", if_empty=True)
        ch = await conn.channel()
        ex = await ch.declare_exchange("used", ExchangeType.DIRECT)
        q = await ch.declare_queue("busy", passive=True)
        await q.bind(ex, "k")
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await (await ch.get_underlay_channel()).exchange_delete("used", if_unused=True)
        ch = await conn.channel()
        await (await ch.get_underlay_channel()).exchange_delete("used")
        assert (await (await ch.get_underlay_channel()).queue_delete("busy")).message_count == 1
        assert (await (await ch.get_underlay_channel()).queue_delete("busy")).message_count == 0  # idempotent


async def test_unknown_delivery_tag_is_406(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await (await ch.get_underlay_channel()).basic_ack(42)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as e:
            await ch.declare_queue("after", exclusive=True)
        assert "unknown delivery tag 42" in str(e.value)


async def test_confirm_and_tx_do_not_mix(env):
    async with await env.connect() as conn:
        ch = await conn.channel(publisher_confirms=True)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await (await ch.get_underlay_channel()).tx_select()


# ------------------------------------------------------------------ raw frames


async def test_garbage_bytes_close_only_that_connection(env):
    async with await env.connect() as good:
        gch = await good.channel()
        q = await gch.declare_queue("survivor", exclusive=True)
        raw = await Raw.open(env)
        raw.send(b"GET / HTTP/1.1\r\n\r\n")
        assert await raw.read_raw_until_eof() == PROTOCOL_HEADER  # the spec's answer, then EOF
        raw2 = await Raw.connect(env)
        raw2.send(b"\x01\x00\x01\x00\x00\x00\x05garbage!")  # bad frame end
        events = await raw2.recv_until_eof()
        assert events and events[-1].method.reply_code == 501
        await gch.default_exchange.publish(Message(b"fine"), routing_key="survivor")
        assert (await get_message(q)).body == b"fine"


async def test_oversized_frame_closes_the_connection_with_501(env):
    raw = await Raw.connect(env, frame_max=4096)
    raw.method(1, ChannelOpen())
    assert isinstance((await raw.recv()).method, ChannelOpenOk)
    raw.send(encode_publish(1, "", "q", None, b"x" * 10000, frame_max=0))
    events = await raw.recv_until_eof()
    assert isinstance(events[-1].method, ConnectionClose) and events[-1].method.reply_code == 501
    async with await env.connect() as conn:  # the server still serves others
        assert not conn.is_closed


async def test_channel_errors_and_connection_errors_over_raw_frames(env):
    raw = await Raw.connect(env)
    raw.method(1, ChannelOpen())
    assert isinstance((await raw.recv()).method, ChannelOpenOk)
    # 404 on channel 1: channel.close, answered with close-ok; the channel number is reusable
    raw.method(1, QueueDeclare("nope", passive=True))
    ev = await raw.recv()
    assert isinstance(ev.method, ChannelClose) and ev.method.reply_code == 404
    assert (ev.method.class_id, ev.method.method_id) == (50, 10)
    raw.method(1, BasicAck(1))  # ignored while closing
    raw.method(1, ChannelCloseOk())
    raw.method(1, ChannelOpen())
    assert isinstance((await raw.recv()).method, ChannelOpenOk)
    raw.method(1, QueueDeclare("ok-q", exclusive=True))
    assert isinstance((await raw.recv()).method, QueueDeclareOk)
    # a method on a channel that was never opened: 504 CHANNEL_ERROR closes the connection
    raw.method(7, QueueDeclare("x"))
    ev = await raw.recv()
    assert isinstance(ev.method, ConnectionClose) and ev.method.reply_code == 504
    raw.method(0, ConnectionCloseOk())
    assert await raw.recv_until_eof() == []


async def test_second_channel_open_and_immediate_publish_are_connection_errors(env):
    raw = await Raw.connect(env)
    raw.method(1, ChannelOpen())
    await raw.recv()
    raw.method(1, ChannelOpen())
    ev = await raw.recv()
    assert isinstance(ev.method, ConnectionClose) and ev.method.reply_code == 504
    raw2 = await Raw.connect(env)
    raw2.method(1, ChannelOpen())
    await raw2.recv()
    raw2.send(encode_publish(1, "", "q", None, b"x", immediate=True))
    ev = await raw2.recv()
    assert isinstance(ev.method, ConnectionClose) and ev.method.reply_code == 540


async def test_unknown_method_and_unknown_exchange_type(env):
    raw = await Raw.connect(env)
    raw.send(struct.pack(">BHIHH", 1, 0, 4, 10, 99) + b"\xce")
    ev = await raw.recv()
    assert isinstance(ev.method, ConnectionClose) and ev.method.reply_code == 540
    async with await env.connect() as conn:
        ch = await conn.channel()
        with pytest.raises(aiormq.exceptions.ConnectionCommandInvalid):
            underlay = await ch.get_underlay_channel()
            await underlay.exchange_declare("weird", exchange_type="x-consistent-hash")


async def test_publish_confirm_multiple_over_raw_frames(env):
    raw = await Raw.connect(env)
    raw.method(1, ChannelOpen())
    await raw.recv()
    from adapters.amqp.codec import ConfirmSelect, ConfirmSelectOk

    raw.method(1, ConfirmSelect())
    assert isinstance((await raw.recv()).method, ConfirmSelectOk)
    raw.method(1, QueueDeclare("raw-c", exclusive=True))
    await raw.recv()
    raw.send(b"".join(encode_publish(1, "", "raw-c", None, b"%d" % i) for i in range(50)))
    acked = 0
    while acked < 50:
        ev = await raw.recv()
        assert isinstance(ev.method, BasicAck), ev
        assert ev.method.delivery_tag > acked
        acked = ev.method.delivery_tag
    assert acked == 50


# ------------------------------------------------------------------ authentication and heartbeats


async def test_plain_and_amqplain_credentials_reach_the_authorizer(env):
    seen = []

    def authorizer(identity, action, resource):
        seen.append((identity.username, identity.secret, identity.mechanism, action, resource.kind))
        return identity.secret == "good"

    env.processor.authorizer = authorizer
    conn = await aio_pika.connect(f"amqp://alice:good@127.0.0.1:{env.port}/", timeout=T)
    await conn.close()
    assert ("alice", "good", "plain", Action.CONNECT, "cluster") in seen
    assert ("alice", "good", "plain", Action.CONNECT, "vhost") in seen
    with pytest.raises(aiormq.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(f"amqp://alice:bad@127.0.0.1:{env.port}/", timeout=T)
    raw = await Raw.open(env)
    raw.send(PROTOCOL_HEADER)
    await raw.recv()
    from adapters.amqp.codec import ConnectionStartOk

    table = encode_table({"LOGIN": "bob", "PASSWORD": "good"})[4:]
    raw.method(0, ConnectionStartOk({}, "AMQPLAIN", table))
    assert isinstance((await raw.recv()).method, ConnectionTune)
    assert ("bob", "good", "amqplain", Action.CONNECT, "cluster") in seen
    raw2 = await Raw.open(env)
    raw2.send(PROTOCOL_HEADER)
    await raw2.recv()
    raw2.method(0, ConnectionStartOk({}, "PLAIN", b"\x00bob\x00bad"))
    events = await raw2.recv_until_eof()
    assert events[-1].method.reply_code == 403


async def test_pika_access_refused_is_reported(env):
    env.processor.authorizer = lambda i, a, r: i.username != "mallory"
    params = pika.ConnectionParameters(
        "127.0.0.1", env.port, credentials=pika.PlainCredentials("mallory", "x"), connection_attempts=1
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as e:
        await asyncio.to_thread(pika.BlockingConnection, params)
    assert "403" in str(e.value) and "ACCESS_REFUSED" in str(e.value)


async def test_heartbeats_are_sent_and_a_silent_client_is_dropped(env):
    from adapters.amqp.codec import ConnectionOpen, ConnectionStartOk, ConnectionTuneOk, Heartbeat

    raw = await Raw.open(env)
    raw.send(PROTOCOL_HEADER)
    await raw.recv()
    raw.method(0, ConnectionStartOk({}, "PLAIN", b"\x00guest\x00guest"))
    tune = (await raw.recv()).method
    assert tune.heartbeat == 60
    raw.method(0, ConnectionTuneOk(tune.channel_max, tune.frame_max, 1))
    raw.method(0, ConnectionOpen("/"))
    await raw.recv()
    ev = await raw.recv(timeout=3)
    assert isinstance(ev, Heartbeat)
    # no frames from us for 2 x 1 s: the server closes the socket (sending only heartbeats before)
    rest = await raw.read_raw_until_eof(timeout=5)
    assert rest == HEARTBEAT * (len(rest) // len(HEARTBEAT))
    assert raw.reader.at_eof()


async def test_frames_before_open_and_bad_frame_max(env):
    from adapters.amqp.codec import ConnectionStartOk, ConnectionTuneOk

    raw = await Raw.open(env)
    raw.send(PROTOCOL_HEADER)
    await raw.recv()
    raw.method(0, ConnectionStartOk({}, "PLAIN", b"\x00guest\x00guest"))
    tune = (await raw.recv()).method
    raw.method(0, ConnectionTuneOk(tune.channel_max, tune.frame_max * 2, 0))
    events = await raw.recv_until_eof()
    assert events[-1].method.reply_code == 530
    raw = await Raw.open(env)
    raw.send(PROTOCOL_HEADER)
    await raw.recv()
    raw.send(encode_method(1, ChannelOpen()))
    events = await raw.recv_until_eof()
    assert events[-1].method.reply_code == 503
    raw = await Raw.open(env)
    raw.send(PROTOCOL_HEADER)
    await raw.recv()
    raw.method(0, ConnectionStartOk({}, "EXTERNAL", b""))
    events = await raw.recv_until_eof()
    assert events[-1].method.reply_code == 503


async def test_body_larger_than_the_limit_closes_only_the_channel_with_406(env):
    """As RabbitMQ above its max message size: channel.close 406 PRECONDITION_FAILED for the
    basic.publish (the body is read and dropped, not stored); the connection and its other channels
    carry on."""
    raw = await Raw.connect(env)
    raw.method(1, ChannelOpen())
    await raw.recv()
    raw.method(2, ChannelOpen())
    await raw.recv()
    raw.method(2, QueueDeclare("after-big", exclusive=True))
    assert isinstance((await raw.recv()).method, QueueDeclareOk)
    big = env.processor.limits.max_body_size + 1
    raw.send(encode_publish(1, "", "after-big", None, b"x" * big, frame_max=131072))
    ev = await raw.recv()
    assert isinstance(ev.method, ChannelClose) and ev.method.reply_code == 406
    assert (ev.channel, ev.method.class_id, ev.method.method_id) == (1, 60, 40)
    assert str(big) in ev.method.reply_text
    raw.method(1, ChannelCloseOk())
    raw.method(2, ConfirmSelect())
    assert isinstance((await raw.recv()).method, ConfirmSelectOk)
    raw.send(encode_publish(2, "", "after-big", None, b"small"))
    ack = await raw.recv()
    assert (ack.channel, type(ack.method), ack.method.delivery_tag) == (2, BasicAck, 1)
    assert (await env.processor.get_topic("after-big")).messages == 1  # the big body was not stored


async def test_connection_close_from_client_is_answered(env):
    raw = await Raw.connect(env)
    raw.method(0, ConnectionClose(200, "bye", 0, 0))
    ev = await raw.recv()
    assert isinstance(ev.method, ConnectionCloseOk)
    assert await raw.recv_until_eof() == []


async def test_stop_closes_connections_with_320_after_in_flight_publishes(tmp_path):
    from tests.adapters.amqp.support import open_env

    env = await open_env(str(tmp_path / "data"))
    conn = await env.connect()
    ch = await conn.channel()
    await ch.declare_queue("drain", durable=True)
    closed = asyncio.get_running_loop().create_future()
    conn.close_callbacks.add(lambda _c, exc: closed.done() or closed.set_result(exc))
    await ch.default_exchange.publish(Message(b"last"), routing_key="drain")
    await env.adapter.stop(1.0)
    exc = await asyncio.wait_for(closed, T)
    assert isinstance(exc, aiormq.exceptions.ConnectionClosed) and exc.args[0] == 320
    assert not env.adapter.listening
    info = await env.processor.get_topic("drain")
    assert info.messages == 1
    await env.processor.close()
    await env.store.close()
