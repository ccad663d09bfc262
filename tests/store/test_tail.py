"""Tail reads (`Store.tail`): offset reads of a whole topic for subscribers that do not compete.
No pop state, nothing to ack; the caller keeps the positions."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import pytest

from store import Message, TopicNotFound, codec


def advance(positions: dict[int, int], msgs: list[Message]) -> None:
    for m in msgs:
        positions[m.queue_id] = m.queue_offset + 1


async def test_reads_from_the_positions_and_leaves_no_pop_state(make_store):
    s = await make_store()
    s.create_topic("t", 4)
    s.create_group("g")
    old = await s.append_many([Message("t", b"old%d" % i, queue_id=i % 4) for i in range(8)])
    positions = {q: s.max_offset("t", q) for q in range(4)}  # from now: the old ones are not read
    assert await s.tail("t", dict(positions), 16) == []
    new = await s.append_many([Message("t", b"new%d" % i, queue_id=i % 4) for i in range(8)])
    got = await s.tail("t", positions, 16)
    assert sorted(m.body for m in got) == sorted(b"new%d" % i for i in range(8))
    assert {m.message_id for m in got} == {r.message_id for r in new}
    advance(positions, got)
    assert await s.tail("t", positions, 16) == []
    # A queue missing from the positions is read from its first retained offset.
    got = await s.tail("t", {0: 4, 1: 4, 2: 4}, 16)
    assert sorted(m.body for m in got) == [b"new3", b"new7", b"old3", b"old7"]
    # Nothing was handed out: a pop group still sees every message.
    assert s.backlog("g", "t") == 16 and s.inflight_count("g", "t") == 0
    assert {m.message_id for m in await s.tail("t", {}, 100)} == {r.message_id for r in old + new}


async def test_oldest_first_across_queues_at_most_max_messages(make_store):
    s = await make_store()
    s.create_topic("t", 4)
    sent = [await s.append(Message("t", b"%d" % i)) for i in range(40)]  # round robin over 4 queues
    assert len({r.queue_id for r in sent}) == 4
    positions: dict[int, int] = {}
    got: list[Message] = []
    while batch := await s.tail("t", positions, 7):
        assert len(batch) <= 7
        assert [m.commitlog_offset for m in batch] == sorted(m.commitlog_offset for m in batch)
        advance(positions, batch)
        got += batch
    assert [m.body for m in got] == [b"%d" % i for i in range(40)]  # the order they were stored in
    with pytest.raises(ValueError):
        await s.tail("t", positions, 0)


async def test_long_poll_wakes_on_an_append_and_times_out_empty(make_store):
    s = await make_store()
    s.create_topic("t", 2)
    positions = {0: 0, 1: 0}
    waiting = asyncio.ensure_future(s.tail("t", positions, 8, wait_ms=10_000))
    await asyncio.sleep(0)
    assert not waiting.done()
    await s.append(Message("t", b"wake", queue_id=1))
    got = await asyncio.wait_for(waiting, 2)
    assert [m.body for m in got] == [b"wake"] and got[0].queue_id == 1
    advance(positions, got)
    t0 = time.monotonic()
    assert await s.tail("t", positions, 8, wait_ms=150) == []
    assert time.monotonic() - t0 >= 0.14


async def test_a_deleted_topic_is_topic_not_found(make_store):
    s = await make_store()
    with pytest.raises(TopicNotFound):
        await s.tail("missing", {}, 8)
    s.create_topic("gone", 1)
    s.delete_topic("gone")
    with pytest.raises(TopicNotFound):
        await s.tail("gone", {}, 8)


async def test_records_compaction_removed_are_passed_over(make_store):
    seg = 64 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("c", 1, compacted=True)
    for rnd in range(50):
        for k in range(2):
            await s.append(Message("c", b"%d-%d" % (k, rnd), keys=(f"k{k}",)))
    while s.commitlog.write_pos // seg == 0:  # close the segment, so that compaction covers it
        await s.append(Message("filler", b"f" * 20_000))
    await s._parts.checkpoints.checkpoint()
    await s.compact()
    positions: dict[int, int] = {}
    got: list[bytes] = []
    for _ in range(3):  # 98 removed records ahead of the 2 kept ones: no call is stuck behind them
        batch = await s.tail("c", positions, 5)
        advance(positions, batch)
        got += [m.body for m in batch]
    assert got == [b"0-49", b"1-49"]


async def test_tail_records_are_the_stored_records_of_what_tail_reads(make_store):
    """`tail_records` (what a store node sends on undecoded) picks what `tail` picks, in the same
    order, as the commit log's own bytes: plain records and the inner records of a batch record."""
    s = await make_store()
    s.create_topic("t", 4)
    await s.append(Message("t", b"plain"))
    props = {"mqtt.topic": "a/b", "x": "Grüße"}
    await s.append(Message("t", b"tagged", tag="TagA", keys=("k1", "k2"), properties=props))
    batch = await s.append_many([Message("t", b"batch%d" % i, queue_id=2) for i in range(5)])
    head = s.commitlog.read(batch[0].commitlog_offset - codec.BATCH_HEADER_SIZE, codec.BATCH_HEADER_SIZE)
    assert head[8] == codec.MAGIC_BATCH  # one batch record holds the five
    positions = {2: 1}  # the first of the batch already read
    msgs = await s.tail("t", dict(positions), 100)
    records = await s.tail_records("t", dict(positions), 100)
    assert [m.body for m in msgs] == [b"plain", b"tagged"] + [b"batch%d" % i for i in range(1, 5)]
    assert [clo for clo, _ in records] == [m.commitlog_offset for m in msgs]
    assert [codec.decode(rec, 0, clo) for clo, rec in records] == msgs
    assert all(rec == s.commitlog.read(clo, len(rec)) for clo, rec in records)
    assert len(await s.tail_records("t", positions, 3)) == 3
    end = {q: s.max_offset("t", q) for q in range(4)}
    waiting = asyncio.ensure_future(s.tail_records("t", end, 8, wait_ms=10_000))
    await asyncio.sleep(0)
    assert not waiting.done()
    r = await s.append(Message("t", b"wake"))
    [(clo, rec)] = await asyncio.wait_for(waiting, 2)
    assert clo == r.commitlog_offset and codec.decode(rec, 0, clo).body == b"wake"


async def test_a_corrupt_record_is_logged_and_passed_over_by_both_reads(make_store, caplog):
    s = await make_store()
    s.create_topic("t", 1)
    sent = [await s.append(Message("t", b"m%d" % i)) for i in range(3)]
    bad = sent[1]
    seg = s.commitlog.segment_for(bad.commitlog_offset)
    fd = os.open(s.commitlog._path(seg.base), os.O_WRONLY)
    try:  # the record's last body byte: its CRC no longer holds
        os.pwrite(fd, b"X", bad.commitlog_offset - seg.base + bad.size - 1)
    finally:
        os.close(fd)
    with caplog.at_level(logging.ERROR, logger="store"):
        assert [m.body for m in await s.tail("t", {}, 10)] == [b"m0", b"m2"]
        records = await s.tail_records("t", {}, 10)
    assert [codec.decode(rec, 0, clo).body for clo, rec in records] == [b"m0", b"m2"]
    logged = [r.getMessage() for r in caplog.records if "unreadable message" in r.getMessage()]
    assert len(logged) == 2 and all(str(bad.commitlog_offset) in line for line in logged)


async def test_a_watch_fires_once_on_the_next_append_and_not_before(make_store):
    """`Store.watch`: a reader that caught up waits with no task or timer; the next record (not an
    earlier one) calls it back once; an ended watch never fires; a deleted topic fires it."""
    s = await make_store()
    s.create_topic("t", 2)
    await s.append(Message("t", b"before"))
    fired: list[str] = []
    woke = asyncio.Event()

    def cb(name: str):
        def f() -> None:
            fired.append(name)
            woke.set()

        return f

    s.watch("t", cb("a"))
    unwatch_b = s.watch("t", cb("b"))
    await asyncio.sleep(0.05)
    assert fired == []  # the record appended before the watch does not fire it
    unwatch_b()
    await s.append(Message("t", b"x"))
    await asyncio.wait_for(woke.wait(), 5)
    await s.append(Message("t", b"y"))
    await asyncio.sleep(0.05)
    assert fired == ["a"]  # once, and never the ended one
    assert "t" not in s._waiters  # nothing is left behind per topic
    woke.clear()
    s.watch("t", cb("c"))
    s.delete_topic("t")
    await asyncio.wait_for(woke.wait(), 5)
    assert fired == ["a", "c"]
    with pytest.raises(TopicNotFound):
        s.watch("t", cb("d"))
