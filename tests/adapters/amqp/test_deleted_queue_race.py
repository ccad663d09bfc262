"""A publish routed to a queue that another proxy deleted a moment ago, through a proxy that has
not heard of it yet (`gateway start --workers`: the replacement of a killed worker deletes the dead
worker's exclusive queues while the live worker still routes to them). The send of that publish's
copies finds the deleted queue's topic gone; the proxy drops that copy and stores the others, each
once. Before, it sent the other copies again although the failed send had stored them: the live
queue got the message twice (tests/gateway/test_workers.py
`test_amqp_kill9_of_a_worker_spares_the_other_workers_exclusive_queues`, once in a parallel run).

Two AMQP proxies over one store, in one process, as two workers: each its own MessagingProcessor
(its own cache of known topics) and AmqpAdapter; proxy B never polls for bindings, so it learns the
deletion only when its send fails: the test does not depend on timing. The store is reached either
as the workers reach it, through a store node on a Unix socket (a send of several topics goes as one
request per topic, each stored or refused as a whole), or in process (LOCAL mode's Store, which
places a batch in order and stops at the missing topic)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable

import aio_pika
import pytest

from adapters.amqp import AmqpAdapter
from adapters.amqp.mapping import store_name
from cluster.proxy import WORKER_NODE, open_worker_store
from cluster.store_node import StoreNode, StoreNodeConfig
from messaging_processor import MessagingProcessor
from messaging_processor.store_client import LocalStoreClient, StoreClient
from tests.adapters.amqp.support import Env, get_message
from tests.support import T

from .test_shared_bindings import topic_gone


@contextlib.asynccontextmanager
async def store_clients(env: Env, kind: str) -> AsyncIterator[Callable[[], Awaitable[StoreClient]]]:
    """A factory of StoreClients over env's store: `worker` ones through a store node on a Unix
    socket (as `gateway start --workers`), `local` ones in process."""
    if kind == "local":

        async def local() -> StoreClient:
            return LocalStoreClient(env.store)

        yield local
        return
    sock_dir = tempfile.mkdtemp(prefix="amqp-race-", dir="/tmp")  # (a Unix socket path is short)
    path = f"{sock_dir}/store.sock"
    node = StoreNode(StoreNodeConfig(name=WORKER_NODE, unix_path=path), env.store)
    await node.start()
    try:
        yield lambda: open_worker_store(path)
    finally:
        await node.stop(0)
        shutil.rmtree(sock_dir, ignore_errors=True)


@contextlib.asynccontextmanager
async def proxy(make_client: Callable[[], Awaitable[StoreClient]], quiet: bool) -> AsyncIterator[AmqpAdapter]:
    """A proxy (processor and AmqpAdapter) over a new StoreClient; `quiet`: it never polls for bindings."""
    client = await make_client()
    processor = MessagingProcessor(client)
    await processor.start()
    adapter = AmqpAdapter(processor, "127.0.0.1", 0)
    if quiet:
        adapter.broker.registry.sync_interval_s = 3600
    await adapter.start()
    try:
        yield adapter
    finally:
        await adapter.stop(1.0)
        await processor.close()
        if not isinstance(client, LocalStoreClient):
            await client.close()  # type: ignore[attr-defined]


async def connect(port: int) -> aio_pika.abc.AbstractConnection:
    return await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=T)


@pytest.mark.parametrize("kind", ["worker", "local"])
async def test_a_publish_to_a_queue_deleted_elsewhere_stores_the_other_copies_once(env: Env, kind: str):
    """As the kill -9 workers test: a live exclusive queue on proxy B (the live worker) and another
    one on proxy A (the killed worker's), both bound to one fanout exchange; B routes to both and
    has sent to both (it knows both topics). A's queue is deleted (its owner closed; the killed
    worker's replacement deletes it the same way); B publishes before it heard of it: the live queue
    holds the message once."""
    async with (
        store_clients(env, kind) as make_client,
        proxy(make_client, quiet=False) as proxy_a,
        proxy(make_client, quiet=True) as proxy_b,
    ):
        live = await connect(proxy_b.bound_port)
        gone = await connect(proxy_a.bound_port)
        try:
            lch = await live.channel()
            fan = await lch.declare_exchange("k9-fan", aio_pika.ExchangeType.FANOUT, durable=True)
            mine = await lch.declare_queue("", exclusive=True)
            await mine.bind(fan)
            gch = await gone.channel()
            theirs = await gch.declare_queue("", exclusive=True)
            await theirs.bind("k9-fan")
            pch = await live.channel()
            # B learns A's binding; the live queue's copy comes first (LOCAL mode's Store stores it
            # before it fails on the other)
            pfan = await pch.declare_exchange("k9-fan", aio_pika.ExchangeType.FANOUT, durable=True)
            routed = proxy_b.broker.vhosts["/"].exchanges["k9-fan"].match("", b"")
            assert [q.name for q in routed] == [mine.name, theirs.name]
            await pfan.publish(aio_pika.Message(b"before"), "", mandatory=True)
            assert (await get_message(theirs)).body == b"before"
            await gone.close()
            await topic_gone(proxy_a.processor, store_name("/", theirs.name))
            await pfan.publish(aio_pika.Message(b"after"), "", mandatory=True)  # DeliveryError if nacked
            got = [(await get_message(mine)).body for _ in range(2)]
            assert got == [b"before", b"after"]
            assert await mine.get(fail=False) is None, "a copy was stored twice"
            assert theirs.name not in proxy_b.broker.vhosts["/"].queues  # B's bindings are in step
        finally:
            await live.close()
            await gone.close()
