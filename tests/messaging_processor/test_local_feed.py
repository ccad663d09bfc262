"""LocalFeed (issue 30, item 1): pop/ack kept in memory over offset reads, for a queue only this
process reads. Concurrent pops hand each message out once; a requeue ends a waiting pop and comes
back with its attempt counted; progress is committed (the first offset not done); after close
pops fail."""

from __future__ import annotations

import asyncio

import pytest

from messaging_processor import (
    ClientContext,
    ErrorKind,
    LocalFeed,
    Message,
)
from messaging_processor.errors import ProcessorError

pytestmark = pytest.mark.timeout(60)
CTX = ClientContext("test", client_id="c1")


@pytest.fixture
async def two_queues(proc):
    """`proc` with topic `t` grown to two queues, and group `t`."""
    p, store = proc
    await p.resize_topic("t", 2)
    await p.create_group("t")
    return p, store


def feed_of(p) -> LocalFeed:
    return LocalFeed(p, CTX, "t", "t", commit_interval_s=0.05)


async def pop(f: LocalFeed, n: int = 32, wait_ms: int = 0):
    return await f.pop(CTX, "t", "t", max_messages=n, long_poll_ms=wait_ms)


async def test_concurrent_pops_hand_each_message_out_once(two_queues) -> None:
    p, _ = two_queues
    f = feed_of(p)
    waiting = [asyncio.create_task(pop(f, 3, 5_000)) for _ in range(4)]
    await asyncio.sleep(0.05)  # (let them reach the store's wait: they read from the same positions)
    await p.send(CTX, [Message("t", b"%d" % i) for i in range(12)])
    got = []
    while len(got) < 12:
        for batch in await asyncio.wait_for(asyncio.gather(*waiting), 10):
            got += [d.message.body for d in batch]
        waiting = [asyncio.create_task(pop(f, 3, 200))]
    assert sorted(got) == sorted(b"%d" % i for i in range(12))
    await f.close()


async def test_a_requeue_ends_a_waiting_pop_and_comes_back_as_a_second_attempt(two_queues) -> None:
    p, _ = two_queues
    f = feed_of(p)
    await p.send(CTX, [Message("t", b"only")])
    (d,) = await pop(f)
    waiting = asyncio.create_task(pop(f, wait_ms=20_000))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await f.change_invisible_time(CTX, d.receipt_handle, 0)
    (again,) = await asyncio.wait_for(waiting, 5)
    assert (again.message.body, again.delivery_attempt) == (b"only", 2)
    with pytest.raises(ProcessorError) as e:
        await f.ack(CTX, d.receipt_handle)  # the first handle was settled by the requeue
    assert e.value.kind is ErrorKind.INVALID_RECEIPT_HANDLE
    await f.close()


async def test_progress_committed_is_the_first_offset_not_done(two_queues) -> None:
    p, _ = two_queues
    f = feed_of(p)
    await p.send(CTX, [Message("t", b"%d" % i, queue_id=0) for i in range(5)])
    ds = await pop(f)
    assert [d.message.queue_offset for d in ds] == [0, 1, 2, 3, 4]
    assert await f.ready() == 0
    errors = await f.ack_many(CTX, [ds[0].receipt_handle, ds[1].receipt_handle, ds[3].receipt_handle])
    assert errors == [None, None, None]
    await f.commit()
    assert await p.committed_offset("t", "t", 0) == 2  # offset 2 is not done
    await f.ack(CTX, ds[2].receipt_handle)
    await f.ack(CTX, ds[4].receipt_handle)
    await f.commit()
    assert await p.committed_offset("t", "t", 0) == 5
    await f.close()
    with pytest.raises(ProcessorError):
        await pop(f)
