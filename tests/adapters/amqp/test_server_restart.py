"""Durability: declarations (exchanges, queues with their arguments, bindings) survive a restart,
transient and exclusive queues do not; every confirmed message of a durable queue survives a
kill -9 of a real `gateway start` process."""

from __future__ import annotations

import asyncio
import contextlib
import signal

import aio_pika
import aiormq
import pytest
from aio_pika import ExchangeType, Message

from tests.adapters.amqp.support import T, close_env, drain, get_message, open_env
from tests.gateway.support import start


async def test_declarations_and_messages_survive_a_restart(tmp_path):
    data = str(tmp_path / "data")
    env = await open_env(data)
    try:
        async with await env.connect() as conn:
            ch = await conn.channel(publisher_confirms=True)
            ex = await ch.declare_exchange("d-topic", ExchangeType.TOPIC, durable=True)
            q = await ch.declare_queue("d-queue", durable=True, arguments={"x-max-length": 100})
            await q.bind(ex, "a.*")
            await ch.declare_exchange("t-ex", ExchangeType.FANOUT, durable=False)
            await ch.declare_queue("t-queue", durable=False)
            await ch.declare_queue("x-queue", durable=True, exclusive=True)
            for i in range(3):
                await ex.publish(Message(f"m{i}".encode(), delivery_mode=2), routing_key="a.b")
            got = await get_message(q)
            assert got.body == b"m0"  # popped, not acked: it comes back after the restart
    finally:
        await close_env(env)
    env = await open_env(data)
    try:
        async with await env.connect() as conn:
            ch = await conn.channel()
            q = await ch.declare_queue("d-queue", passive=True)
            ex = await ch.declare_exchange("d-topic", passive=True)
            await ex.publish(Message(b"after"), routing_key="a.c")  # the binding survived
            msgs = await drain(q, 4)
            assert sorted(m.body for m in msgs) == [b"after", b"m0", b"m1", b"m2"]
            for name in ("t-queue", "x-queue"):
                bad = await conn.channel()
                with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                    await bad.declare_queue(name, passive=True)
            bad = await conn.channel()
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await bad.declare_exchange("t-ex", passive=True)
            bad = await conn.channel()
            with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):  # arguments survived
                await bad.declare_queue("d-queue", durable=True, arguments={"x-max-length": 5})
        exchanges = {k for k, _ in await env.processor.kv_scan("amqp.exchanges")}
        assert any(k.endswith("d-topic") for k in exchanges)
        assert not any(k.endswith("t-ex") for k in exchanges)  # a non-durable one's record is removed
        topics = {t.name for t in await env.processor.list_topics()}
        assert "d-queue" in topics and "t-queue" not in topics and "x-queue" not in topics
    finally:
        await close_env(env)


async def test_confirmed_messages_survive_kill_9_of_the_gateway(tmp_path):
    extra = ("--protocols", "amqp,http", "--amqp-port", "0")
    proc, listeners = await asyncio.to_thread(start, tmp_path, *extra)
    try:
        url = f"amqp://guest:guest@{listeners['amqp']}/"
        confirmed: list[int] = []
        conn = await aio_pika.connect(url, timeout=T)
        ch = await conn.channel(publisher_confirms=True)
        await ch.declare_queue("durable-q", durable=True)

        async def publish(i: int) -> None:
            await ch.default_exchange.publish(
                Message(str(i).encode(), delivery_mode=2), routing_key="durable-q"
            )
            confirmed.append(i)

        async def flood() -> None:
            i = 0
            while True:  # 50 in flight at a time until the gateway dies
                await asyncio.gather(*(publish(i + k) for k in range(50)), return_exceptions=True)
                i += 50

        task = asyncio.ensure_future(flood())
        while len(confirmed) < 300:
            await asyncio.sleep(0.01)
        proc.p.send_signal(signal.SIGKILL)
        await asyncio.to_thread(proc.p.wait, 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        with contextlib.suppress(Exception):  # the connection is gone, whichever way it says so
            await conn.close()
    finally:
        proc.kill()
    proc, listeners = await asyncio.to_thread(start, tmp_path, *extra)
    try:
        url = f"amqp://guest:guest@{listeners['amqp']}/"
        async with await aio_pika.connect(url, timeout=T) as conn:
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=500)
            q = await ch.declare_queue("durable-q", durable=True, passive=True)
            n = (await q.declare()).message_count
            assert n >= len(confirmed)
            got = {int(m.body) for m in await drain(q, n, timeout=30)}
            missing = set(confirmed) - got
            assert not missing, f"{len(missing)} confirmed messages lost: {sorted(missing)[:10]}"
    finally:
        proc.kill()
