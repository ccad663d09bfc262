"""Acks in batches (issue 30): `Store.ack_many` / `MessagingProcessor.ack_many` settle several
deliveries with one store call, each handle with its own result; a DeliveryLoop sends the acks of the
deliveries settled in one event-loop iteration (an AMQP `multiple` ack, a burst of PUBACKs) as one
`ack_many`."""

from __future__ import annotations

import asyncio

import pytest

from messaging_processor import (
    ClientContext,
    DeliveryLoop,
    ErrorKind,
    LocalStoreClient,
    Message,
    MessagingProcessor,
    Outcome,
    ProcessorError,
)
from messaging_processor.tracing import recorder_for
from store import Store, StoreConfig
from store.errors import InvalidReceiptHandle

pytestmark = pytest.mark.timeout(60)
CTX = ClientContext("test", client_id="c1")


@pytest.fixture
async def proc(tmp_path):
    store = await Store.open(StoreConfig(data_dir=str(tmp_path / "data"), segment_size=1 << 20))
    client = LocalStoreClient(store)
    p = MessagingProcessor(client, auto_create_topics=True, tracer=recorder_for(client, 3_600_000))
    await p.start()
    yield p, store
    await p.close()
    await store.close()


async def test_store_ack_many_acks_each_valid_handle_and_reports_the_others(proc) -> None:
    p, store = proc
    await p.send(CTX, [Message("jobs", b"%d" % i) for i in range(5)])
    popped = await store.pop("g", "jobs", 5, 60_000)
    handles = [d.receipt_handle for d in popped]
    store.ack(handles[1])  # acked before: its handle no longer works
    results = store.ack_many([handles[0], handles[1], "not a handle", *handles[2:]])
    assert [r is None for r in results] == [True, False, False, True, True, True]
    assert all(isinstance(r, InvalidReceiptHandle) for r in results if r is not None)
    assert store.backlog("g", "jobs") == 0  # the good ones are acked in spite of the bad ones
    assert store.metrics["acks"] == 5


async def test_processor_ack_many_maps_errors_counts_and_traces(proc) -> None:
    p, _ = proc
    sent = await p.send(CTX, [Message("jobs", b"%d" % i) for i in range(3)])
    ds = await p.pop(CTX, "g", "jobs", max_messages=3, invisible_time_ms=60_000)
    errors = await p.ack_many(CTX, [ds[0].receipt_handle, "0 0 0 jobs g", ds[2].receipt_handle])
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], ProcessorError) and errors[1].kind is ErrorKind.INVALID_RECEIPT_HANDLE
    assert p.metrics.acks["test"] == 2
    assert p.metrics.errors[("test", "ack", "invalid_receipt_handle")] == 1
    assert await p.ack_many(CTX, []) == []
    await p.tracer.flush()
    by_id = {d.message.message_id: d for d in ds}
    for r in (sent[0], sent[2]):
        t = await p.tracer.trace(r.message_id)
        assert [e["event"] for e in t["events"]] == ["received", "stored", "delivered", "acked"]
    t = await p.tracer.trace(sent[1].message_id)
    assert [e["event"] for e in t["events"]] == ["received", "stored", "delivered"]
    assert set(by_id) == {r.message_id for r in sent}


async def test_a_delivery_loop_acks_what_is_settled_in_one_iteration_with_one_call(proc, monkeypatch) -> None:
    p, store = proc
    n = 20
    await p.send(CTX, [Message("burst", b"%d" % i) for i in range(n)])
    calls: list[int] = []
    ack_many = p.ack_many

    async def counting(ctx, handles):
        calls.append(len(handles))
        return await ack_many(ctx, handles)

    monkeypatch.setattr(p, "ack_many", counting)
    release = asyncio.Event()
    started = 0

    async def handler(d) -> Outcome:
        nonlocal started
        started += 1
        await release.wait()  # every delivery is settled in the same iteration (an AMQP multiple ack)
        return Outcome.ACK

    loop = DeliveryLoop(p, CTX, "g", "burst", handler, max_inflight=n, batch=n, long_poll_ms=100)
    loop.start()
    try:
        async with asyncio.timeout(10):
            while started < n:
                await asyncio.sleep(0.01)
            release.set()
            while store.backlog("g", "burst"):
                await asyncio.sleep(0.01)
    finally:
        await loop.stop()
    assert sum(calls) == n and calls == [n]  # one store call for the whole burst
    assert p.metrics.acks["test"] == n


async def test_a_failed_batch_leaves_every_message_to_be_redelivered(proc, monkeypatch) -> None:
    p, store = proc
    await p.send(CTX, [Message("flaky", b"%d" % i) for i in range(4)])

    async def failing(ctx, handles):
        raise ProcessorError(ErrorKind.UNAVAILABLE, "store unreachable")

    monkeypatch.setattr(p, "ack_many", failing)
    release = asyncio.Event()
    settled = 0

    async def handler(d) -> Outcome:
        nonlocal settled
        await release.wait()
        settled += 1
        return Outcome.ACK

    loop = DeliveryLoop(p, CTX, "g", "flaky", handler, max_inflight=4, batch=4, long_poll_ms=100)
    loop.start()
    try:
        async with asyncio.timeout(10):
            while loop.inflight < 4:
                await asyncio.sleep(0.01)
            release.set()
            while settled < 4 or loop.inflight:
                await asyncio.sleep(0.01)
    finally:
        await loop.stop()
    assert store.backlog("g", "flaky") == 4  # none acked: each comes back after its invisible time
    assert store.inflight_count("g", "flaky") == 4
