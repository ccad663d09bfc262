"""aio-pika's RPC patterns (their reply queue is server-named and auto-delete: it is gone after the
last basic.cancel, and RPC.close still unbinds and deletes it, which RabbitMQ answers with
unbind-ok / delete-ok), the same sequence with pika on separate channels, and AMQP's own maximum
message size (`amqp_max_body_size`, 16 MiB by default as RabbitMQ 4) through a real Gateway."""

from __future__ import annotations

import asyncio
import os

import aio_pika
import pika
import pika.exceptions
import pytest
from aio_pika.patterns import RPC, JsonRPC

from gateway.cli import build_parser, settings_from_args
from gateway.config import MIB, ConfigError, Settings, load
from gateway.server import Gateway
from messaging_processor import ClientContext, ErrorKind, ProcessorError
from store import Message
from tests.support import T


def run(env, fn):
    """Run a blocking pika scenario in a thread while the gateway serves in this loop."""
    return asyncio.to_thread(fn, env)


# ---------------------------------------------------------------------------------- RPC patterns
@pytest.mark.parametrize("pattern", [RPC, JsonRPC], ids=["RPC", "JsonRPC"])
async def test_aio_pika_rpc_pattern_calls_and_closes(env, pattern):
    """Server and client on their own connections; both close the pattern (cancel, unbind and
    delete of the auto-deleted reply queue) and their channels stay open."""
    server_conn, client_conn = await env.connect(), await env.connect()
    try:
        server = await pattern.create(await server_conn.channel(), auto_delete=True)
        client = await pattern.create(await client_conn.channel(), auto_delete=True)

        async def multiply(*, x: int, y: int) -> int:
            return x * y

        async def fail(*, why: str) -> None:
            raise ValueError(why)

        await server.register("calc.multiply", multiply, auto_delete=True)
        await server.register("calc.fail", fail, auto_delete=True)
        assert await asyncio.wait_for(client.proxy.calc.multiply(x=6, y=7), T) == 42
        results = await asyncio.wait_for(
            asyncio.gather(*(client.call("calc.multiply", {"x": i, "y": i}) for i in range(20))), T
        )
        assert results == [i * i for i in range(20)]
        with pytest.raises(Exception, match="nope"):
            await asyncio.wait_for(client.call("calc.fail", {"why": "nope"}), T)
        reply_queue = client.result_queue.name
        assert reply_queue.startswith("amq.gen-")

        await server.unregister(multiply)
        await client.close()
        await server.close()
        assert not client.channel.is_closed and not server.channel.is_closed
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):  # the reply queue is gone
            await (await client_conn.channel()).declare_queue(reply_queue, passive=True)
    finally:
        await client_conn.close()
        await server_conn.close()


async def test_pika_unbind_and_delete_after_the_auto_delete_queue_went(env):
    """The mechanism under aio-pika's RPC.close, with pika: a server-named auto-delete queue
    declared and bound on one channel, consumed on another, a request with reply_to published on a
    third; after the consumer's cancel the queue is gone, and queue.unbind, exchange.unbind of a
    missing destination and queue.delete still succeed (RabbitMQ: idempotent) on the first channel."""

    def scenario(env):
        with env.blocking() as conn:
            declare, consume, publish = conn.channel(), conn.channel(), conn.channel()
            declare.exchange_declare("rpc.dlx.pika", "headers", auto_delete=True)
            q = declare.queue_declare("", auto_delete=True).method.queue
            assert q.startswith("amq.gen-")
            args = {"From": q, "x-match": "any"}
            declare.queue_bind(q, "rpc.dlx.pika", "", arguments=args)
            got: list[tuple[str, bytes]] = []

            def on_reply(ch, method, props, body):
                got.append((props.correlation_id, body))

            tag = consume.basic_consume(q, on_reply, auto_ack=True)
            publish.confirm_delivery()
            publish.basic_publish("", q, b"pong", pika.BasicProperties(correlation_id="c1", reply_to=q))
            while not got:
                conn.process_data_events(time_limit=T)
            assert got == [("c1", b"pong")]
            consume.basic_cancel(tag)  # the last consumer: the queue is deleted
            assert declare.queue_unbind(q, "rpc.dlx.pika", "", arguments=args).method.NAME == (
                "Queue.UnbindOk"
            )
            assert declare.exchange_unbind("no-such-destination", "rpc.dlx.pika", "k").method.NAME == (
                "Exchange.UnbindOk"
            )
            assert declare.queue_delete(q).method.message_count == 0
            assert declare.is_open and conn.is_open
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                conn.channel().queue_declare(q, passive=True)
            assert e.value.reply_code == 404
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:  # no queue to mean by ""
                conn.channel().queue_unbind("", "rpc.dlx.pika", "")
            assert e.value.reply_code == 404 and "no previously declared queue" in e.value.reply_text
            assert declare.is_open

    await run(env, scenario)


# ---------------------------------------------------------------------------------- body sizes
@pytest.fixture
async def gateway(tmp_path):
    g = Gateway(Settings(data_dir=str(tmp_path / "data"), flush="async", protocols="amqp", amqp_port=0))
    await g.start()
    try:
        yield g
    finally:
        await g.stop()


def url(g: Gateway) -> str:
    (amqp,) = g.adapters
    return f"amqp://guest:guest@127.0.0.1:{amqp.bound_port}/"


async def test_16_mib_message_round_trips_byte_exact_and_other_protocols_keep_4_mib(gateway):
    body = os.urandom(16 * MIB)
    conn = await aio_pika.connect(url(gateway), timeout=T)
    try:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue("big-bodies")
        await ch.default_exchange.publish(aio_pika.Message(body), "big-bodies", timeout=T)
        async with q.iterator() as it:
            async with asyncio.timeout(T):
                async for m in it:
                    await m.ack()
                    break
        assert len(m.body) == len(body) and m.body == body
    finally:
        await conn.close()
    p = gateway.processor
    assert p.limits.max_body_size == 4 * MIB  # the other protocols' limit is unchanged
    with pytest.raises(ProcessorError) as e:
        await p.send(ClientContext("grpc"), [Message("big-bodies", b"x" * (4 * MIB + 1))])
    assert e.value.kind == ErrorKind.BODY_TOO_LARGE


async def test_body_over_the_amqp_limit_is_406_and_the_connection_stays_usable(gateway):
    conn = await aio_pika.connect(url(gateway), timeout=T)
    try:
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("after-too-big")
        too_big = 16 * MIB + 1
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed) as e:
            await ch.default_exchange.publish(aio_pika.Message(b"x" * too_big), "after-too-big", timeout=T)
        assert f"message size {too_big} is larger than configured max size {16 * MIB}" in str(e.value)
        ch2 = await conn.channel(publisher_confirms=True)
        await ch2.default_exchange.publish(aio_pika.Message(b"small"), "after-too-big", timeout=T)
        q = await ch2.declare_queue("after-too-big", passive=True)
        m = await q.get(timeout=T)
        assert m.body == b"small"
        assert await q.get(fail=False) is None  # the refused body was not stored
        await m.ack()
    finally:
        await conn.close()


def test_amqp_max_body_size_setting():
    assert Settings().amqp_max_body_size == 16 * MIB
    assert load(env={"GATEWAY_AMQP_MAX_BODY_SIZE": "1000"}).amqp_max_body_size == 1000
    args = build_parser().parse_args(["start", "--amqp-max-body-size", "2000"])
    s = settings_from_args(args, {})
    assert (s.amqp_max_body_size, s.largest_body_size) == (2000, 4 * MIB)
    assert Settings(amqp_max_body_size=64 * MIB).largest_body_size == 64 * MIB
    with pytest.raises(ConfigError, match="amqp_max_body_size"):
        Settings(amqp_max_body_size=0)
