"""Bindings shared by the proxies of one store (registry.sync_bindings), with two AMQP "proxies" in
one process: each its own MessagingProcessor (so its own cache of known topics) and AmqpAdapter
over the same store, as two workers or CLUSTER proxies are. Proxy B does not poll (its interval is
an hour), so what it learns, it learns at an exchange.declare or when a send finds a queue's topic
gone: the test does not depend on timing. Real clients: aio-pika."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest

from adapters.amqp import AmqpAdapter
from adapters.amqp.mapping import store_name
from adapters.amqp.records import GENERATIONS, META_NS
from messaging_processor import MessagingProcessor, ProcessorError
from tests.adapters.amqp.support import Env, another_proxy, get_message
from tests.support import T


def quiet_proxy(env: Env) -> contextlib.AbstractAsyncContextManager[AmqpAdapter]:
    """Another proxy over env's store that never polls for bindings."""
    return another_proxy(env, lambda adapter: setattr(adapter.broker.registry, "sync_interval_s", 3600))


@pytest.fixture
async def proxy_b(env: Env):
    """A second proxy over env's store that never polls for bindings."""
    async with quiet_proxy(env) as adapter:
        yield adapter


async def connect(port: int) -> aio_pika.abc.AbstractConnection:
    return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=T)


@contextlib.asynccontextmanager
async def clients(env: Env, proxy_b: AmqpAdapter) -> AsyncIterator[tuple[Any, Any]]:
    """A connection to proxy A (env's adapter) and one to proxy B."""
    a = await connect(env.port)
    b = await connect(proxy_b.bound_port)
    try:
        yield a, b
    finally:
        await b.close()
        await a.close()


async def topic_gone(processor: MessagingProcessor, topic: str) -> None:
    """Until `topic` no longer exists (an exclusive queue is dropped after its owner's close)."""
    deadline = time.monotonic() + T
    while time.monotonic() < deadline:
        try:
            await processor.get_topic(topic)
        except ProcessorError:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"topic {topic} still exists")


async def test_a_publisher_on_another_proxy_routes_by_bindings_made_here(env: Env, proxy_b: AmqpAdapter):
    """RabbitMQ's pub/sub across proxies: the subscriber's exclusive queue and a durable queue are
    bound through proxy A; a publisher on proxy B declares the exchange and publishes (confirmed,
    and in a transaction): both queues get every message."""
    async with clients(env, proxy_b) as (sub, pub):
        ch = await sub.channel()
        fan = await ch.declare_exchange("fan", aio_pika.ExchangeType.FANOUT, durable=False)
        mine = await ch.declare_queue("", exclusive=True)
        kept = await ch.declare_queue("kept", durable=True)
        await mine.bind(fan)
        await kept.bind(fan)
        pch = await pub.channel()
        pfan = await pch.declare_exchange("fan", aio_pika.ExchangeType.FANOUT, durable=False)
        await pfan.publish(aio_pika.Message(b"confirmed"), "", mandatory=True)  # a return would raise
        tch = await pub.channel(publisher_confirms=False)
        tfan = await tch.declare_exchange("fan", aio_pika.ExchangeType.FANOUT, durable=False)
        tx = tch.transaction()
        await tx.select()
        await tfan.publish(aio_pika.Message(b"in-tx"), "")
        await tx.commit()
        for q in (mine, kept):
            got = [(await get_message(q)).body for _ in range(2)]
            assert sorted(got) == [b"confirmed", b"in-tx"], q.name


async def test_a_queue_deleted_through_another_proxy_is_dropped_from_its_publishes(
    env: Env, proxy_b: AmqpAdapter
):
    """Proxy B still routes to an exclusive queue that proxy A deleted (its owner closed) when B
    publishes before it saw the change: the send finds the queue's topic gone, B re-reads the
    bindings and stores the other copies. The publish is confirmed (not nacked), and a transaction
    commits (not 500 INTERNAL_ERROR)."""
    async with clients(env, proxy_b) as (keeper, pub):
        kch = await keeper.channel()
        fan = await kch.declare_exchange("fan2", aio_pika.ExchangeType.FANOUT, durable=True)
        kept = await kch.declare_queue("kept2", durable=True)
        await kept.bind(fan)
        pch = await pub.channel()
        tch = await pub.channel(publisher_confirms=False)
        for publish_through in ("confirm", "tx"):
            owner = await connect(env.port)
            och = await owner.channel()
            mine = await och.declare_queue("", exclusive=True)
            await mine.bind("fan2")
            pfan = await pch.declare_exchange("fan2", aio_pika.ExchangeType.FANOUT, durable=True)  # learns it
            await pfan.publish(aio_pika.Message(b"before"), "")
            assert (await get_message(mine)).body == b"before"
            await owner.close()
            await topic_gone(env.processor, store_name("/", mine.name))
            if publish_through == "confirm":
                await pfan.publish(aio_pika.Message(b"after"), "")  # DeliveryError if nacked
            else:
                tx = tch.transaction()
                await tx.select()
                tfan = await tch.get_exchange("fan2", ensure=False)
                await tfan.publish(aio_pika.Message(b"after"), "")
                await tx.commit()  # ChannelClosed (500) if the send failed
            assert [(await get_message(kept)).body for _ in range(2)] == [b"before", b"after"]
            queues = proxy_b.broker.vhosts["/"].queues
            assert mine.name not in queues  # B's bindings are in step again


async def test_a_publish_racing_a_queue_deletion_elsewhere_leaves_no_orphan_topic(
    env: Env, proxy_b: AmqpAdapter
):
    """Proxy B routes to an exclusive queue it never sent to (so its processor does not know the
    queue's topic) after proxy A deleted the queue: the copy for it is dropped, the publish is
    confirmed with the other queue's copy stored, and the deleted queue's topic is not created
    again (before, the send created it: a topic nobody would ever read or delete)."""
    async with clients(env, proxy_b) as (keeper, pub):
        kch = await keeper.channel()
        fan = await kch.declare_exchange("fan3", aio_pika.ExchangeType.FANOUT, durable=True)
        kept = await kch.declare_queue("kept3", durable=True)
        await kept.bind(fan)
        owner = await connect(env.port)
        mine = await (await owner.channel()).declare_queue("", exclusive=True)
        await mine.bind("fan3")
        pch = await pub.channel()
        pfan = await pch.declare_exchange("fan3", aio_pika.ExchangeType.FANOUT, durable=True)  # B learns both
        assert mine.name in proxy_b.broker.vhosts["/"].queues
        await owner.close()
        topic = store_name("/", mine.name)
        await topic_gone(env.processor, topic)
        await pfan.publish(aio_pika.Message(b"after"), "")  # DeliveryError if nacked
        assert (await get_message(kept)).body == b"after"
        with pytest.raises(ProcessorError):
            await env.processor.get_topic(topic)


async def test_a_publish_to_an_exchange_declared_through_another_proxy_needs_no_declare(
    env: Env, proxy_b: AmqpAdapter
):
    """A producer that only publishes (the topology was declared elsewhere, as often): proxy B
    looks the exchange and its bindings up in the shared records. Before, that was 404 NOT_FOUND
    and closed the channel whenever the producer reached another proxy or worker."""
    async with clients(env, proxy_b) as (sub, pub):
        ch = await sub.channel()
        ex = await ch.declare_exchange("orders", aio_pika.ExchangeType.DIRECT, durable=True)
        q = await ch.declare_queue("orders-eu", durable=True)
        await q.bind(ex, "eu")
        pch = await pub.channel()
        pex = await pch.get_exchange("orders", ensure=False)  # no exchange.declare
        await pex.publish(aio_pika.Message(b"o1"), "eu", mandatory=True)  # a return would raise
        assert (await get_message(q)).body == b"o1"
        assert not pch.is_closed


async def test_a_publish_through_the_default_exchange_finds_a_queue_declared_through_another_proxy(
    env: Env, proxy_b: AmqpAdapter
):
    """RabbitMQ's work queue with a producer that does not declare the queue: proxy B looks the
    queue up in the shared records (an exclusive queue of another connection too, as RabbitMQ
    allows). Before, B did not know the queue: the publish was unroutable and the message lost."""
    async with clients(env, proxy_b) as (sub, pub):
        ch = await sub.channel()
        work = await ch.declare_queue("work", durable=True)
        mine = await ch.declare_queue("", exclusive=True)
        pch = await pub.channel(on_return_raises=True)
        for q in (work, mine):
            await pch.default_exchange.publish(aio_pika.Message(b"job"), q.name, mandatory=True)
            assert (await get_message(q)).body == b"job"
        with pytest.raises(aio_pika.exceptions.DeliveryError):  # a queue nobody declared: returned
            await pch.default_exchange.publish(aio_pika.Message(b"lost"), "nobody", mandatory=True)


async def test_a_queue_deleted_through_another_proxy_is_forgotten_there(env: Env, proxy_b: AmqpAdapter):
    """Proxy C (which never polls) deletes a queue that a consumer on proxy B consumes and that B
    bound: at B's next queue.declare B forgets it. The consumer gets basic.cancel; the queue
    declared again through B with other flags is a new queue (not 406 PRECONDITION_FAILED against
    the deleted one's flags), and without the deleted one's binding (C deleted its record too)."""
    async with quiet_proxy(env) as proxy_c, clients(env, proxy_b) as (a, b):
        c = await connect(proxy_c.bound_port)
        cch = await c.channel()
        await cch.declare_queue("work", durable=True)
        bch = await b.channel()
        cancelled: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        raw = await bch.get_underlay_channel()
        raw.on_consumer_cancel_callbacks.add(lambda frame: cancelled.set_result(frame.consumer_tag))
        work = await bch.declare_queue("work", durable=True)  # adopted by B
        await work.bind("amq.fanout")

        async def ack(m: aio_pika.abc.AbstractIncomingMessage) -> None:
            await m.ack()

        tag = await work.consume(ack)
        await cch.queue_delete("work")
        await c.close()
        again = await bch.declare_queue("work", durable=False, arguments={"x-max-length": 5})
        assert await asyncio.wait_for(cancelled, T) == tag
        q = proxy_b.broker.vhosts["/"].queues["work"]
        assert (q.durable, q.max_length) == (False, 5)
        ach = await a.channel()
        await ach.default_exchange.publish(aio_pika.Message(b"new"), "work")
        assert (await get_message(again)).body == b"new"
        other = await bch.declare_queue("other", durable=True)
        await other.bind("amq.fanout")
        await bch.declare_queue("other", durable=True)  # B re-reads the bindings
        fan = await bch.get_exchange("amq.fanout", ensure=False)
        await fan.publish(aio_pika.Message(b"fanned"), "")
        assert (await get_message(other)).body == b"fanned"
        assert await again.get(fail=False) is None  # the deleted queue's binding went with it


async def test_an_exchange_deleted_through_another_proxy_is_forgotten_there_with_its_bindings(
    env: Env, proxy_b: AmqpAdapter
):
    """An exchange that proxy B knows, with a queue bound through B, is deleted through proxy C
    (which never polls, so it did not know that binding): B's exchange.declare of it with another
    type makes a new exchange (not 406), and the old binding, deleted with the exchange by C,
    routes nothing to the old queue."""
    async with quiet_proxy(env) as proxy_c, clients(env, proxy_b) as (_, b):
        c = await connect(proxy_c.bound_port)
        try:
            cch = await c.channel()
            await cch.declare_exchange("ex-gone", aio_pika.ExchangeType.DIRECT, durable=True)
            bch = await b.channel()
            old = await bch.declare_queue("bound-before", durable=True)
            await old.bind("ex-gone", "k")  # B learns the exchange
            await cch.exchange_delete("ex-gone")
        finally:
            await c.close()
        ex = await bch.declare_exchange("ex-gone", aio_pika.ExchangeType.FANOUT, durable=True)
        new = await bch.declare_queue("bound-after", durable=True)
        await new.bind(ex)
        ex = await bch.declare_exchange("ex-gone", aio_pika.ExchangeType.FANOUT, durable=True)  # re-reads
        await ex.publish(aio_pika.Message(b"m"), "k")
        assert (await get_message(new)).body == b"m"
        assert await old.get(fail=False) is None  # the publish was routed (above) and not to it
        assert proxy_b.broker.vhosts["/"].exchanges["ex-gone"].type == "fanout"


async def test_a_proxy_re_reads_the_bindings_for_the_others_changes_not_its_own(
    env: Env, proxy_b: AmqpAdapter
):
    """Each proxy writes its own generation of the bindings: its own binds make the others re-read
    the records, not itself (it has them already), so an app declaring many bound queues through
    one proxy does not make it re-read every record before each declaration. A proxy that stops
    deletes its generation; one that starts deletes those of processes that are gone."""
    a, b = env.adapter.broker.registry, proxy_b.broker.registry
    await a.sync_bindings()
    await b.sync_bindings()

    async def generations() -> set[str]:
        return {k for k, _ in await env.processor.kv_scan(META_NS, GENERATIONS)}

    async def bind_through(port: int, queue: str) -> None:
        conn = await connect(port)
        try:
            ch = await conn.channel()
            ex = await ch.declare_exchange("gen-x", aio_pika.ExchangeType.DIRECT, durable=True)
            await (await ch.declare_queue(queue, durable=True)).bind(ex, queue)
        finally:
            await conn.close()

    await bind_through(proxy_b.bound_port, "gen-q")
    assert not await b.sync_bindings()  # its own change
    assert await a.sync_bindings()  # B's change: A re-reads, and routes by it
    assert "gen-q" in env.adapter.broker.vhosts["/"].exchanges["gen-x"]._direct
    assert not await a.sync_bindings()  # nothing new since
    assert b.records.generation_key in await generations()
    assert a.records.generation_key not in await generations()  # A changed nothing
    dead = f"{GENERATIONS}/{socket.gethostname()}/1/0/abcd"  # pid 1 started at another time: gone
    for key in (dead, GENERATIONS):  # (GENERATIONS: the one generation of older versions)
        await env.processor.kv_put(META_NS, key, b"old")
    async with quiet_proxy(env) as proxy_c:
        c = proxy_c.broker.registry
        assert not {dead, GENERATIONS} & await generations()  # removed at C's start
        await bind_through(proxy_c.bound_port, "gen-q2")
        assert c.records.generation_key in await generations()
    assert c.records.generation_key not in await generations()  # deleted at C's stop
