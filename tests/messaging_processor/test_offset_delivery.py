"""Delivery by offset (issue 30, `OffsetDeliveryLoop`): reads from the group's committed offsets,
bounds what is in flight, leaves out what `wants` refuses, commits per queue the first offset not
done (periodically and at stop, only forward), and stops reading at a message it could not deliver;
a new loop resumes from the commit: at least once, nothing lost."""

from __future__ import annotations

import asyncio

import pytest

from messaging_processor import (
    ClientContext,
    Message,
    OffsetDeliveryLoop,
)

pytestmark = pytest.mark.timeout(60)
CTX = ClientContext("test", client_id="c1")


async def until(cond, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


def loop_of(p, handler, **kw) -> OffsetDeliveryLoop:
    kw.setdefault("commit_interval_s", 0.05)
    kw.setdefault("long_poll_ms", 200)
    return OffsetDeliveryLoop(p, CTX, "g", "t", handler, **kw)


async def test_delivers_in_order_within_the_bound_and_commits_what_is_done(proc) -> None:
    p, store = proc
    await p.send(CTX, [Message("t", b"%d" % i) for i in range(10)])
    store.commit_offset("g", "t", 0, 0)
    held: list[asyncio.Future] = []
    got: list[bytes] = []
    peak = 0

    def handler(m: Message) -> asyncio.Future[bool]:  # answered when the test says so
        nonlocal peak
        got.append(m.body)
        f = asyncio.get_running_loop().create_future()
        held.append(f)
        peak = max(peak, sum(not x.done() for x in held))
        return f

    lp = loop_of(p, handler, max_inflight=3).start()
    await until(lambda: len(got) == 3)
    await asyncio.sleep(0.1)
    assert len(got) == 3 and peak == 3  # no more than max_inflight outstanding
    held[1].set_result(True)  # done out of order: the commit stays at the first not done
    await asyncio.sleep(0.15)
    assert store.committed_offset("g", "t", 0) == 0
    held[0].set_result(True)
    await until(lambda: store.committed_offset("g", "t", 0) == 2)
    while len(got) < 10:
        for f in held:
            if not f.done():
                f.set_result(True)
        await asyncio.sleep(0.01)
    for f in held:
        if not f.done():
            f.set_result(True)
    await until(lambda: store.committed_offset("g", "t", 0) == 10)
    assert got == [b"%d" % i for i in range(10)]
    assert store.inflight_count("g", "t") == 0  # never popped
    await lp.stop()


async def test_wants_leaves_messages_out_and_the_commit_passes_them(proc) -> None:
    p, store = proc
    store.commit_offset("g", "t", 0, 0)
    await p.send(CTX, [Message("t", b"%d" % i) for i in range(6)])
    got: list[bytes] = []

    def handler(m: Message) -> bool:
        got.append(m.body)
        return True

    lp = loop_of(p, handler, wants=lambda m: int(m.body) % 2 == 0).start()
    await until(lambda: store.committed_offset("g", "t", 0) == 6)
    assert got == [b"0", b"2", b"4"]
    await lp.stop()


async def test_a_message_not_delivered_stops_reading_and_comes_again_from_the_commit(proc) -> None:
    p, store = proc
    store.commit_offset("g", "t", 0, 0)
    await p.send(CTX, [Message("t", b"%d" % i) for i in range(5)])
    got: list[bytes] = []

    def refuses_2(m: Message) -> bool:
        got.append(m.body)
        return m.body != b"2"

    lp = loop_of(p, refuses_2, max_inflight=1).start()
    await until(lambda: not lp.running)
    await lp.stop()
    assert got == [b"0", b"1", b"2"]  # nothing read after the refusal
    assert store.committed_offset("g", "t", 0) == 2
    again: list[bytes] = []

    def takes(m: Message) -> bool:
        again.append(m.body)
        return True

    lp = loop_of(p, takes).start()
    await until(lambda: store.committed_offset("g", "t", 0) == 5)
    assert again == [b"2", b"3", b"4"]
    await lp.stop()


async def test_stop_commits_what_is_done_and_not_what_is_cancelled(proc) -> None:
    p, store = proc
    store.commit_offset("g", "t", 0, 0)
    await p.send(CTX, [Message("t", b"%d" % i) for i in range(3)])
    got: list[bytes] = []

    def handler(m: Message) -> bool | asyncio.Future[bool]:
        got.append(m.body)
        if m.body == b"1":
            return asyncio.get_running_loop().create_future()  # never acked by its client
        return True

    lp = loop_of(p, handler, commit_interval_s=60).start()  # only the final commit
    await until(lambda: len(got) == 3)
    await lp.stop(drain_timeout=0.1)
    assert store.committed_offset("g", "t", 0) == 1


async def test_a_queue_never_committed_is_read_from_its_start(proc) -> None:
    p, store = proc
    await p.send(CTX, [Message("t", b"old")])
    got: list[bytes] = []

    def handler(m: Message) -> bool:
        got.append(m.body)
        return True

    lp = loop_of(p, handler).start()
    await until(lambda: store.committed_offset("g", "t", 0) == 1)
    assert got == [b"old"]
    await lp.stop()


async def test_max_inflight_bytes_bounds_what_is_read_ahead(proc) -> None:
    """With a byte bound the first read takes one message, then about the bytes left by the mean
    size: never the whole count window of large messages at once."""
    p, store = proc
    store.commit_offset("g", "t", 0, 0)
    await p.send(CTX, [Message("t", bytes(1000)) for _ in range(20)])
    held: list[asyncio.Future] = []

    def handler(m: Message) -> asyncio.Future[bool]:
        f = asyncio.get_running_loop().create_future()
        held.append(f)
        return f

    lp = loop_of(p, handler, max_inflight=256, max_inflight_bytes=2500).start()
    await until(lambda: len(held) >= 2)
    await asyncio.sleep(0.2)
    assert len(held) <= 3 and lp.inflight == len(held)  # 2,500 bytes: 2 (+1 always allowed)
    while len(held) < 20:
        for f in held:
            if not f.done():
                f.set_result(True)
        await asyncio.sleep(0.01)
        assert sum(not f.done() for f in held) <= 3
    for f in held:
        if not f.done():
            f.set_result(True)
    await until(lambda: store.committed_offset("g", "t", 0) == 20)
    await lp.stop()


async def test_stop_during_a_periodic_commit_still_commits_every_queue(proc) -> None:
    """stop() cancels a periodic commit stopped between two queues; its final commit still covers
    every queue (the cancelled one had already taken the "progress to commit" flag)."""
    p, store = proc
    await p.create_topic("t2", queues=2)
    for q in (0, 1):
        store.commit_offset("g", "t2", q, 0)
    await p.send(CTX, [Message("t2", b"x", queue_id=q) for q in (0, 1)])
    commit = p.commit_offset
    calls: list[int] = []
    blocked = asyncio.Event()

    async def first_blocks(ctx, group, topic, queue_id, offset) -> None:
        calls.append(queue_id)
        if len(calls) == 1:
            blocked.set()
            await asyncio.Event().wait()  # until stop() cancels the periodic commit
        await commit(ctx, group, topic, queue_id, offset)

    p.commit_offset = first_blocks
    lp = OffsetDeliveryLoop(p, CTX, "g", "t2", lambda m: True, commit_interval_s=0.01, long_poll_ms=200)
    lp.start()
    await asyncio.wait_for(blocked.wait(), 10)
    await lp.stop()
    assert [store.committed_offset("g", "t2", q) for q in (0, 1)] == [1, 1]


async def test_a_caught_up_loop_parks_without_a_task_and_wakes_on_a_send(proc) -> None:
    """An idle reader (an idle persistent-session device) holds no task while caught up: the
    store's watch starts reading again when the topic gets a record, and stop ends the watch."""
    p, store = proc
    await p.send(CTX, [Message("t", b"a")])
    store.commit_offset("g", "t", 0, 0)
    got: list[bytes] = []
    lp = loop_of(p, lambda m: got.append(m.body) or True, long_poll_ms=60_000).start()
    await until(lambda: got == [b"a"] and lp._task is None)
    assert lp.running  # parked, not ended
    assert not [t for t in asyncio.all_tasks() if "offset delivery" in t.get_name()]
    loop = asyncio.get_running_loop()
    made: list[str] = []
    loop.set_task_factory(
        lambda lo, coro, **kw: made.append(coro.__qualname__) or asyncio.Task(coro, loop=lo, **kw)
    )
    try:
        await p.send(CTX, [Message("t", b"b")])
        await until(lambda: got == [b"a", b"b"])  # long before the 60 s long poll would have ended
    finally:
        loop.set_task_factory(None)
    assert not [n for n in made if "OffsetDeliveryLoop" in n]  # read and handed out in the watch's callback
    assert lp._task is None and lp.running
    await lp.stop()
    assert not lp.running and "t" not in store._waiters
    await p.send(CTX, [Message("t", b"c")])
    await asyncio.sleep(0.05)
    assert got == [b"a", b"b"] and store.committed_offset("g", "t", 0) == 2
