"""Exclusive queues read by offset (issue 30, item 1): their deliveries are kept in memory by the
owning process (LocalFeed), not as pop state in the store, with RabbitMQ's semantics intact:
requeue before new messages with the redelivered flag, competing consumers on the owner's
channels, a closed channel's unacked messages going to another channel, basic.get, purge and
message counts, dead-lettering of rejected messages; the queue's progress reaches the store."""

from __future__ import annotations

import asyncio

import aio_pika
from aio_pika import Message

from tests.adapters.amqp.support import T, collect
from tests.support import wait_until


def store_queue(env, name: str):
    return env.adapter.broker.vhosts["/"].queues[name]


async def publish(ch, queue: str, bodies: list[bytes]) -> None:
    for b in bodies:
        await ch.default_exchange.publish(Message(b), routing_key=queue)


async def test_unacked_deliveries_of_an_exclusive_queue_leave_no_pop_state_and_progress_is_committed(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=10)
        q = await ch.declare_queue("", exclusive=True)
        sq = store_queue(env, q.name)
        assert sq.feed is not None
        await publish(ch, q.name, [b"%d" % i for i in range(20)])
        got: list = []
        await q.consume(collect(got))
        await wait_until(lambda: len(got) == 10)
        backlog, inflight = await env.processor.backlog(sq.group, sq.topic)
        assert (backlog, inflight) == (20, 0)  # 10 held by the client, none popped in the store
        await got[-1].ack(multiple=True)
        await wait_until(lambda: len(got) == 20)
        await got[-1].ack(multiple=True)
        assert [m.body for m in got] == [b"%d" % i for i in range(20)]

        async def committed() -> bool:
            return (await env.processor.backlog(sq.group, sq.topic))[0] == 0

        async with asyncio.timeout(T):
            while not await committed():
                await asyncio.sleep(0.05)


async def test_requeued_message_comes_first_redelivered_and_a_rejected_one_is_gone(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        await ch.set_qos(prefetch_count=1)
        q = await ch.declare_queue("", exclusive=True)
        await publish(ch, q.name, [b"m1", b"m2"])
        got: asyncio.Queue = asyncio.Queue()
        await q.consume(got.put)
        first = await asyncio.wait_for(got.get(), T)
        assert (first.body, first.redelivered) == (b"m1", False)
        await first.nack(requeue=True)
        again = await asyncio.wait_for(got.get(), T)
        assert (again.body, again.redelivered) == (b"m1", True)
        await again.reject(requeue=False)
        second = await asyncio.wait_for(got.get(), T)
        assert (second.body, second.redelivered) == (b"m2", False)
        await second.ack()
        declared = await ch.declare_queue(q.name, passive=True)
        assert declared.declaration_result.message_count == 0
        assert got.empty()


async def test_consumers_on_the_owners_channels_compete_and_a_closed_channels_unacked_go_to_the_other(env):
    async with await env.connect() as conn:
        ch1, ch2 = await conn.channel(), await conn.channel()
        await ch1.set_qos(prefetch_count=5)
        await ch2.set_qos(prefetch_count=1)
        q = await ch1.declare_queue("", exclusive=True)
        held: list = []
        await q.consume(collect(held))  # on ch1: holds 5, acks none
        await publish(ch1, q.name, [b"%d" % i for i in range(30)])
        await wait_until(lambda: len(held) == 5)
        got: list = []

        async def ack_it(m) -> None:
            got.append(m)
            await m.ack()

        q2 = await ch2.get_queue(q.name, ensure=False)
        await q2.consume(ack_it)
        await wait_until(lambda: len(got) == 25)
        await ch1.close()  # its 5 unacked go to ch2's consumer
        await wait_until(lambda: len(got) == 30)
        assert sorted(int(m.body) for m in held + got[:25]) == list(range(30))  # each once
        assert [m.body for m in got[25:]] == [m.body for m in held]
        assert all(m.redelivered for m in got[25:]) and not any(m.redelivered for m in got[:25])


async def test_basic_get_purge_and_message_counts_of_an_exclusive_queue(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        q = await ch.declare_queue("", exclusive=True)
        await publish(ch, q.name, [b"a", b"b", b"c", b"d", b"e"])
        assert (await ch.declare_queue(q.name, passive=True)).declaration_result.message_count == 5
        m = await q.get(timeout=T)
        assert m.body == b"a"
        assert m.message_count == 4
        assert await q.purge() is not None
        assert (await ch.declare_queue(q.name, passive=True)).declaration_result.message_count == 0
        await m.nack(requeue=True)  # the one held outlived the purge, as in RabbitMQ
        again = await q.get(timeout=T)
        assert (again.body, again.redelivered) == (b"a", True)
        await again.ack()
        assert await q.get(fail=False) is None


async def test_a_rejected_message_of_an_exclusive_queue_is_dead_lettered(env):
    async with await env.connect() as conn:
        ch = await conn.channel()
        dlq = await ch.declare_queue("excl-dlq", durable=True)
        q = await ch.declare_queue(
            "",
            exclusive=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "excl-dlq"},
        )
        assert store_queue(env, q.name).feed is not None
        await publish(ch, q.name, [b"bad"])
        m = await q.get(timeout=T)
        await m.reject(requeue=False)
        dead = await asyncio.wait_for(_get(dlq), T)
        assert dead.body == b"bad"
        assert dead.headers["x-death"][0]["reason"] == "rejected"


async def _get(queue: aio_pika.abc.AbstractQueue):
    while True:
        m = await queue.get(fail=False)
        if m is not None:
            return m
        await asyncio.sleep(0.02)
