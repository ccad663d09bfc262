"""Transient declarations of proxies on other hosts (messaging_processor/ownership.py,
adapters/amqp/declaration_sync.py `_reap`): a proxy that starts keeps those whose owner's lease
moves and removes, once the leases were watched, those whose owner's lease stands still. Two
proxies over one store in this process, as in test_shared_bindings.py; the records declared through
the first (aio-pika) are then made another host's by rewriting their owner, and another
host's proxy beats its lease through the same key-value table."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets

import aio_pika

from adapters.amqp import AmqpAdapter
from adapters.amqp.mapping import store_name
from adapters.amqp.records import BINDINGS_NS, EXCHANGES_NS, LEASES_NS, QUEUES_NS, Records, vkey
from messaging_processor import ProcessorError
from tests.adapters.amqp.support import Env, another_proxy
from tests.support import T

LIVE, DEAD = "live-host/101/5", "dead-host/202/6"


def starting_proxy(env: Env, beat_s: float) -> contextlib.AbstractAsyncContextManager[AmqpAdapter]:
    """Another proxy over env's store, its leases beating (and watched) every `beat_s`."""

    def setup(adapter: AmqpAdapter) -> None:
        adapter.broker.leases.interval_s, adapter.broker.leases.ttl_s = beat_s, 3 * beat_s

    return another_proxy(env, setup)


async def own(env: Env, ns: str, key: str, owner: str) -> None:
    """Rewrite a record's owner: the record of a proxy on another host."""
    rec = json.loads(await env.processor.kv_get(ns, key))
    rec["owner"] = owner
    await env.processor.kv_put(ns, key, json.dumps(rec).encode())


async def topic_exists(env: Env, topic: str) -> bool:
    try:
        await env.processor.get_topic(topic)
    except ProcessorError:
        return False
    return True


async def test_other_hosts_transient_declarations_stay_while_their_lease_moves(env: Env):
    conn = await env.connect()
    ch = await conn.channel()
    for tag in ("live", "dead"):
        ex = await ch.declare_exchange(f"ex-{tag}", durable=False)
        q = await ch.declare_queue(f"q-{tag}", durable=False)
        await q.bind(ex, "k")
        await ch.default_exchange.publish(aio_pika.Message(b"kept"), f"q-{tag}")
    await conn.close()
    for tag, owner in (("live", LIVE), ("dead", DEAD)):
        await own(env, QUEUES_NS, vkey("/", f"q-{tag}"), owner)
        await own(env, EXCHANGES_NS, vkey("/", f"ex-{tag}"), owner)
    await env.processor.kv_put(LEASES_NS, DEAD, b"stale")  # a process that died: its lease stays

    async def beat() -> None:  # the proxy on the live host
        while True:
            await env.processor.kv_put(LEASES_NS, LIVE, secrets.token_bytes(8))
            await asyncio.sleep(0.05)

    beating = asyncio.ensure_future(beat())
    try:
        async with starting_proxy(env, beat_s=0.1) as proxy:
            registry = proxy.broker.registry
            assert registry.reaping is not None  # another host's records: their leases are watched
            vh = registry.vhosts["/"]
            assert vh.queues["q-live"].remote and vh.queues["q-dead"].remote  # meanwhile: running
            await asyncio.wait_for(asyncio.shield(registry.reaping), T)
            kv = env.processor
            assert await kv.kv_get(QUEUES_NS, vkey("/", "q-live")) is not None
            assert await kv.kv_get(EXCHANGES_NS, vkey("/", "ex-live")) is not None
            assert await topic_exists(env, store_name("/", "q-live"))
            assert await kv.kv_get(QUEUES_NS, vkey("/", "q-dead")) is None
            assert await kv.kv_get(EXCHANGES_NS, vkey("/", "ex-dead")) is None
            assert not await topic_exists(env, store_name("/", "q-dead"))
            bound = {
                (b[0], b[2]) for b in map(Records.parse_binding, dict(await kv.kv_scan(BINDINGS_NS)).values())
            }
            assert bound == {("ex-live", "q-live")}  # (source, destination)
            assert "q-dead" not in vh.queues and "ex-dead" not in vh.exchanges
            client = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{proxy.bound_port}/", timeout=T)
            try:
                q = await (await client.channel()).declare_queue("q-live", passive=True)
                assert q.declaration_result.message_count == 1  # its message kept
            finally:
                await client.close()
    finally:
        beating.cancel()
