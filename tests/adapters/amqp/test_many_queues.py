"""Queues at scale (issue 48 item 5): declared durable bound queues hold no file descriptor while
idle (an AMQP queue's store topic has one consume queue, opened on use), and they, their bindings
and their messages survive a restart."""

from __future__ import annotations

import contextlib
import os

from aio_pika import ExchangeType, Message

from tests.adapters.amqp.support import close_env, get_message, open_env

QUEUES = 300


def cq_fds() -> int:
    """Descriptors of this process open on consume queue files."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}").endswith(".cq")
    return n


async def test_idle_declared_queues_hold_no_descriptors_and_survive_a_restart(tmp_path):
    data = str(tmp_path / "data")
    before = cq_fds()
    env = await open_env(data)
    try:
        async with await env.connect() as conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.declare_exchange("many", ExchangeType.DIRECT, durable=True)
            for i in range(QUEUES):
                q = await ch.declare_queue(f"many-{i}", durable=True)
                await q.bind(ex, f"k{i}")
            assert cq_fds() - before < 20, "a declared queue keeps its file open"
            for i in (0, QUEUES // 2, QUEUES - 1):
                await ex.publish(Message(f"m{i}".encode(), delivery_mode=2), routing_key=f"k{i}")
        assert [t for t in env.store.topic_configs.values() if t.name.startswith("many-")][0].queues == 1
    finally:
        await close_env(env)
    assert cq_fds() == before
    env = await open_env(data)
    try:
        assert cq_fds() - before < 20, "recovery keeps the queue files open"
        async with await env.connect() as conn:
            ch = await conn.channel()
            for i in (0, QUEUES // 2, QUEUES - 1):
                q = await ch.declare_queue(f"many-{i}", passive=True)
                got = await get_message(q)
                assert got.body == f"m{i}".encode()
                await got.ack()
            ex = await ch.get_exchange("many")
            await ex.publish(Message(b"after", delivery_mode=2), routing_key="k7")
            got = await get_message(await ch.declare_queue("many-7", passive=True))
            assert got.body == b"after"
    finally:
        await close_env(env)
