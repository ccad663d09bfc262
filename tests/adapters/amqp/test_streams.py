"""Stream queues (`x-queue-type: stream`, adapters/amqp/streams.py) with aio-pika and pika: a
replayable view of the queue's store topic, read from `x-stream-offset` (first, last, next, a
numeric offset, a timestamp, an interval), messages that entered through MQTT, gRPC and AMQP
before the queue was declared, consumers that do not compete, prefetch, and RabbitMQ's errors."""

from __future__ import annotations

import asyncio
import datetime

import aio_pika
import aiomqtt
import pytest
from aio_pika.exceptions import ChannelPreconditionFailed

from adapters.grpc.generated import definition_pb2 as d
from tests.adapters.amqp.support import close_env, open_env, open_env_with_mqtt_and_grpc
from tests.adapters.grpc.support import msg, send
from tests.support import T

STREAM = {"x-queue-type": "stream"}


@pytest.fixture
async def env(tmp_path):
    e = await open_env_with_mqtt_and_grpc(str(tmp_path / "data"))
    yield e
    await close_env(e)


async def _noop(_m) -> None:
    return None


async def stream(ch, name: str) -> aio_pika.abc.AbstractQueue:
    return await ch.declare_queue(name, durable=True, arguments=STREAM)


async def publish(ch, rk: str, *bodies: bytes) -> None:
    for b in bodies:
        await ch.default_exchange.publish(aio_pika.Message(b), routing_key=rk)


async def take(q, n: int, offset, *, ack: bool = True) -> list:
    """The first `n` deliveries of a new consumer reading from `offset`."""
    out: list = []
    async with q.iterator(arguments={"x-stream-offset": offset}) as it:
        async with asyncio.timeout(T):
            async for m in it:
                out.append(m)
                if ack:
                    await m.ack()
                if len(out) == n:
                    break
    return out


async def test_first_reads_what_mqtt_grpc_and_amqp_stored_before_the_declaration(env):
    async with aiomqtt.Client("127.0.0.1", env.mqtt_port, identifier="dev1") as dev:
        await dev.publish("telemetry/dev1/temp", b"mqtt-1", qos=1)
        await dev.publish("telemetry/dev2/temp", b"mqtt-2", qos=1)
    r = await send(env.stub, msg("telemetry", b"grpc-1", tag="dev3"))
    assert r.status.code == d.Code.OK, r.status
    conn = await env.connect()
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        topic_ex = await ch.get_exchange("telemetry")  # the store topic's exchange: stored on it
        await topic_ex.publish(aio_pika.Message(b"amqp-1"), routing_key="dev4.temp")
        await ch.set_qos(prefetch_count=10)
        q = await stream(ch, "telemetry")  # a stream over the existing topic
        await publish(ch, "telemetry", b"amqp-2")  # after the declaration, routed to the queue
        got = await take(q, 5, "first")
        assert [m.body for m in got] == [b"mqtt-1", b"mqtt-2", b"grpc-1", b"amqp-1", b"amqp-2"]
        assert got[0].routing_key == "telemetry.dev1.temp"
        offsets = [m.headers["x-stream-offset"] for m in got]
        assert len(set(offsets)) == 5, offsets  # (MQTT's topic has several store queues: interleaved)
        # numeric offset 0: every store queue of the topic from its start, for another consumer
        assert [m.body for m in await take(q, 5, 0)] == [m.body for m in got]


async def test_next_last_numeric_timestamp_and_interval(env):
    conn = await env.connect()
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.set_qos(prefetch_count=50)
        q = await stream(ch, "events")
        await publish(ch, "events", *(b"m%d" % i for i in range(5)))
        assert [m.headers["x-stream-offset"] for m in await take(q, 5, "first")] == [0, 1, 2, 3, 4]
        assert [m.body for m in await take(q, 2, 3)] == [b"m3", b"m4"]
        assert [m.body for m in await take(q, 1, "last")] == [b"m4"]
        long_ago = datetime.datetime(2001, 1, 1, tzinfo=datetime.UTC)
        assert [m.body for m in await take(q, 5, long_ago)] == [b"m%d" % i for i in range(5)]
        assert [m.body for m in await take(q, 5, "1h")] == [b"m%d" % i for i in range(5)]
        # next and a future timestamp: only what comes after the consumer started
        got: dict[str, list] = {"next": [], "future": []}
        future = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
        both = asyncio.Event()

        def on(key):
            async def handler(m) -> None:
                got[key].append(m.body)
                await m.ack()
                if got["next"] and got["future"]:
                    both.set()

            return handler

        await q.consume(on("next"), arguments={"x-stream-offset": "next"})
        await q.consume(on("future"), arguments={"x-stream-offset": future})
        while datetime.datetime.now(datetime.UTC) < future:  # the new message is stored after `future`
            await asyncio.sleep(0.05)
        await publish(ch, "events", b"new")
        await asyncio.wait_for(both.wait(), T)
        assert got == {"next": [b"new"], "future": [b"new"]}


async def test_consumers_do_not_compete_and_acks_remove_nothing(env):
    conn = await env.connect()
    async with conn:
        ch1 = await conn.channel(publisher_confirms=True)
        ch2 = await conn.channel()
        await ch1.set_qos(prefetch_count=10)
        await ch2.set_qos(prefetch_count=10)
        q1 = await stream(ch1, "fan")
        q2 = await ch2.get_queue("fan")
        await publish(ch1, "fan", b"a", b"b", b"c")
        first, second = await asyncio.gather(take(q1, 3, "first"), take(q2, 3, "first"))
        assert [m.body for m in first] == [m.body for m in second] == [b"a", b"b", b"c"]
        # a rejected or nacked delivery is not delivered again; the stream keeps every message
        got = await take(q1, 1, "first", ack=False)
        await got[0].reject(requeue=True)
        assert [m.body for m in await take(q1, 3, "first")] == [b"a", b"b", b"c"]
        declared = await ch1.declare_queue("fan", durable=True, arguments=STREAM)
        assert declared.declaration_result.message_count == 3


async def test_prefetch_bounds_the_unacked_deliveries(env):
    conn = await env.connect()
    async with conn:
        ch = await conn.channel(publisher_confirms=True)
        await ch.set_qos(prefetch_count=2)
        q = await stream(ch, "bounded")
        await publish(ch, "bounded", *(b"m%d" % i for i in range(5)))
        got: asyncio.Queue = asyncio.Queue()
        await q.consume(got.put, arguments={"x-stream-offset": "first"})
        a, b = await asyncio.wait_for(got.get(), T), await asyncio.wait_for(got.get(), T)
        assert [a.body, b.body] == [b"m0", b"m1"]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(got.get(), 0.3)  # a third is held back: two are unacked
        await a.ack()
        c = await asyncio.wait_for(got.get(), T)
        assert c.body == b"m2"
        assert got.empty()


async def test_misuse_gets_rabbitmqs_errors(env):
    conn = await env.connect()
    async with conn:
        for kw, text in (
            ({"durable": False}, "invalid property 'non-durable'"),
            ({"durable": True, "exclusive": True}, "invalid property 'exclusive'"),
            ({"durable": True, "auto_delete": True}, "invalid property 'auto-delete'"),
            (
                {"durable": True, "arguments": {**STREAM, "x-message-ttl": 10}},
                "invalid arg 'x-message-ttl'",
            ),
        ):
            ch = await conn.channel()
            kw.setdefault("arguments", STREAM)
            with pytest.raises(ChannelPreconditionFailed, match=text):
                await ch.declare_queue("bad", **kw)
        ch = await conn.channel()
        q = await stream(ch, "strict")
        with pytest.raises(ChannelPreconditionFailed, match="consumer prefetch count is not set"):
            await q.consume(_noop)
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=1)
        q = await ch.get_queue("strict")
        with pytest.raises(ChannelPreconditionFailed, match="x-stream-offset"):
            await q.consume(_noop, arguments={"x-stream-offset": "sometime"})
    for attempt in ("get", "no_ack"):
        conn = await env.connect()
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=1)
            q = await ch.get_queue("strict")
            with pytest.raises(aio_pika.exceptions.ConnectionClosed, match="not supported by stream queues"):
                if attempt == "get":
                    await q.get()
                else:
                    await q.consume(_noop, no_ack=True)


async def test_pika_reads_a_stream_from_an_offset(env):
    def run() -> tuple[list, list]:
        with env.blocking() as c:
            ch = c.channel()
            ch.queue_declare("pika-stream", durable=True, arguments=STREAM)
            ch.confirm_delivery()
            for i in range(4):
                ch.basic_publish("", "pika-stream", b"p%d" % i)
            ch.basic_qos(prefetch_count=10)

            def read(offset) -> list:
                out = []
                for method, props, body in ch.consume(
                    "pika-stream", inactivity_timeout=T, arguments={"x-stream-offset": offset}
                ):
                    assert method is not None, "timed out"
                    ch.basic_ack(method.delivery_tag)
                    out.append((props.headers["x-stream-offset"], body))
                    if body == b"p3":
                        break
                ch.cancel()
                return out

            return read("first"), read(2)

    first, from_two = await asyncio.to_thread(run)
    assert first == [(i, b"p%d" % i) for i in range(4)]
    assert from_two == [(2, b"p2"), (3, b"p3")]


async def test_a_stream_replays_after_a_restart(tmp_path):
    data = str(tmp_path / "data")
    env = await open_env(data)
    try:
        conn = await env.connect()
        async with conn:
            ch = await conn.channel(publisher_confirms=True)
            await stream(ch, "kept")
            await publish(ch, "kept", b"k0", b"k1")
    finally:
        await close_env(env)
    env = await open_env(data)
    try:
        conn = await env.connect()
        async with conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=5)
            q = await ch.get_queue("kept")  # passive: the stream as recorded
            got = await take(q, 2, "first")
            assert [(m.body, m.headers["x-stream-offset"]) for m in got] == [(b"k0", 0), (b"k1", 1)]
            with pytest.raises(aio_pika.exceptions.ConnectionClosed, match="basic.get not supported"):
                await q.get()
    finally:
        await close_env(env)
