"""Feature tests of the store's public API: filtering, lookup, offsets, pop/ack, long polling,
retries and DLQ, FIFO, delay, transactions, retention, limits, flush policies, full disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import zlib

import pytest

from store import (
    ALL,
    Filter,
    InvalidReceiptHandle,
    Message,
    MessageTooLarge,
    MessageType,
    RetryPolicy,
    StoreError,
    StoreFullError,
    TopicNotFound,
    TransactionNotFound,
)
from store.message import entry_hash, now_ms, path_hash, tag_hash
from store.raw_range import read_range
from tests.store.support import HERE, ROOT, append, bodies, install_clock, read_all, read_queue, wait_until

pytestmark = pytest.mark.timeout(60)


# ============================================================================ topics, groups, lock
async def test_topics_groups_and_dir_lock(make_store, tmp_path):
    s = await make_store()
    s.create_topic("t1", queues=3, retention_ms=1000)
    s.create_group("g1", max_attempts=5, retry=RetryPolicy(100, 3.0, 900))
    assert [t.name for t in s.topics()] == ["t1"]
    assert s.queue_count("t1") == 3
    assert [(g.name, g.max_attempts, g.retry.initial_ms) for g in s.groups()] == [("g1", 5, 100)]
    with pytest.raises(StoreError):
        await make_store()  # same data dir: locked
    with pytest.raises(TopicNotFound):
        s.read("nope", 0, 0)
    with pytest.raises(TopicNotFound):
        await s.pop("g1", "nope")
    await s.append(Message("auto", b"x"))  # auto-created with default_queues
    assert s.queue_count("auto") == 4
    s.delete_topic("auto")
    with pytest.raises(TopicNotFound):
        s.read("auto", 0, 0)
    with pytest.raises(ValueError):
        s.create_topic("bad name!")
    await s.close()
    s2 = await make_store()  # metadata persists
    assert [t.name for t in s2.topics()] == ["t1"]
    assert s2.topics()[0].retention_ms == 1000
    assert s2.groups()[0].max_attempts == 5


# ============================================================================ filtering
async def test_tag_filter_pop_and_read(make_store):
    s = await make_store()
    s.create_topic("t", queues=2)
    tags = ["A", "B", "C", "", "A", "C", "B"]
    for i, tag in enumerate(tags):
        await s.append(Message("t", f"{i}".encode(), tag=tag))
    popped = await s.pop("gAB", "t", max_messages=32, filter=Filter.from_expression("A || B"))
    assert sorted(p.message.tag for p in popped) == ["A", "A", "B", "B"]
    assert await s.pop("gAB", "t", filter=Filter.from_expression("A || B")) == []
    # another group, other filter: independent progress
    popped_c = await s.pop("gC", "t", filter=Filter.from_expression(" C "))
    assert sorted(p.message.body for p in popped_c) == [b"2", b"5"]
    assert Filter.from_expression("*") is ALL and Filter.from_expression("") is ALL
    # read with a filter (replayable, per queue)
    got = [m.body for q in range(2) for m in s.read("t", q, 0, filter=Filter(tags=frozenset({"C"})))]
    assert sorted(got) == [b"2", b"5"]
    # predicate filter over properties
    await s.append(Message("p", b"yes", properties={"k": "v"}))
    await s.append(Message("p", b"no", properties={"k": "w"}))
    pred = Filter(predicate=lambda m: m.properties.get("k") == "v")
    assert [p.message.body for p in await s.pop("gp", "p", filter=pred)] == [b"yes"]


async def test_skip_filter_passes_paths_over_unread_and_their_appends_wake_no_pop(make_store):
    s = await make_store()
    s.create_topic("t", queues=1)
    passed: set[int] = set()
    seen: list[bytes] = []

    def keep(m: Message) -> bool:
        seen.append(m.body)  # every message the store read for the predicate
        path = m.properties.get("mqtt.topic")
        if path == "a/keep":
            return True
        if path and not m.tag:
            passed.add(path_hash(path))
        return False

    f = Filter(predicate=keep, skip=passed.__contains__)
    for i, (path, tag) in enumerate(
        [("a/drop", ""), ("a/drop", ""), ("a/keep", ""), ("a/drop", ""), ("", "T")]
    ):
        await s.append(
            Message("t", f"{i}".encode(), tag=tag, properties={"mqtt.topic": path} if path else {})
        )
    assert [p.message.body for p in await s.pop("g", "t", max_messages=32, filter=f)] == [b"2"]
    assert seen == [b"0", b"2", b"4"]  # the 2nd and 3rd `a/drop` were passed over unread
    stored = [
        (th, m)
        for (_, _, th, _), m in zip(
            s._catalog.queue("t", 0).entries(0, 5), read_queue(s, "t", 0), strict=True
        )
    ]
    assert [th for th, _ in stored] == [entry_hash(m) for _, m in stored]
    assert len(read_range(s, "t", 0, 0, 5, 100, 1 << 20)) == 5  # the read API's int64 arrays hold them
    assert stored[0][0] == path_hash("a/drop") >= 1 << 62 and stored[4][0] == tag_hash("T") < 1 << 33
    # a long poll is not woken by a passed-over path, and is by a kept one
    task = asyncio.create_task(s.pop("g", "t", wait_ms=5000, filter=f))
    await asyncio.sleep(0.05)
    await s.append(Message("t", b"5", properties={"mqtt.topic": "a/drop"}))
    await asyncio.sleep(0.3)
    assert not task.done()
    await s.append(Message("t", b"6", properties={"mqtt.topic": "a/keep"}))
    assert [p.message.body for p in await asyncio.wait_for(task, 3)] == [b"6"]
    assert b"5" not in seen
    with pytest.raises(ValueError, match="predicate"):
        Filter(skip=passed.__contains__)


# ============================================================================ lookup
async def test_lookup_by_id_key_and_offset(make_store):
    s = await make_store()
    r1 = await s.append(Message("t", b"one", keys=("k1", "shared")))
    r2 = await s.append(Message("t", b"two", keys=("k2", "shared"), message_id="MYID"))
    assert r2.message_id == "MYID"
    assert [m.body for m in s.get_by_id(r1.message_id)] == [b"one"]
    assert [m.body for m in s.get_by_key("k2")] == [b"two"]
    assert sorted(m.body for m in s.get_by_key("shared")) == [b"one", b"two"]
    assert s.get_by_key("nokey") == [] and s.get_by_id("0" * 32) == []
    m = s.get_message(r2.commitlog_offset)
    assert (m.body, m.keys, m.message_id, m.queue_offset) == (
        b"two",
        ("k2", "shared"),
        "MYID",
        r2.queue_offset,
    )
    await s.close()
    s = await make_store()  # the index survives a reopen
    assert [m.body for m in s.get_by_id(r1.message_id)] == [b"one"]
    assert sorted(m.body for m in s.get_by_key("shared")) == [b"one", b"two"]


async def test_append_many_in_order_durable_and_mixed_types(make_store):
    s = await make_store()
    msgs = [Message("t", f"m{i}".encode(), queue_id=i % 2) for i in range(50)]
    msgs.append(Message("t", b"later", deliver_at=now_ms() + 3_600_000))
    rs = await s.append_many(msgs)
    assert [r.topic for r in rs] == ["t"] * 51  # the delayed one answers with its real topic
    assert [m.body for m in read_queue(s, "t", 0)] == [f"m{i}".encode() for i in range(0, 50, 2)]
    assert [r.queue_offset for r in rs[:50:2]] == list(range(25))
    with pytest.raises(MessageTooLarge):  # checked before anything is queued
        await s.append_many([Message("t", b"ok"), Message("t", b"x" * (s._parts.appender.max_size + 1))])
    assert s.max_offset("t", 0) == 25 and s.max_offset("t", 1) == 25
    await s.close()
    s = await make_store()  # durable: all there after a reopen
    assert len(read_queue(s, "t", 0)) + len(read_queue(s, "t", 1)) == 50


async def test_append_many_places_nothing_when_a_message_cannot_be_redirected(make_store):
    """A delayed (or transactional) message is redirected before any record of its batch is
    placed: when its real topic does not exist, the whole batch fails and nothing is stored."""
    s = await make_store(auto_create_topics=False)
    s.create_topic("t", queues=1)
    later = now_ms() + 3_600_000
    with pytest.raises(TopicNotFound):
        await s.append_many([Message("t", b"first"), Message("nope", b"later", deliver_at=later)])
    assert s.max_offset("t", 0) == 0
    rs = await s.append_many([Message("t", b"now"), Message("t", b"later", deliver_at=later)])
    assert [r.topic for r in rs] == ["t", "t"] and rs[0].queue_offset == 0
    assert [m.body for m in read_queue(s, "t", 0)] == [b"now"]


async def test_records_are_readable_once_written_and_answered_once_durable(make_store):
    """Under `sync`, consumers may take a record before its fsync (as in RocketMQ); its appender
    hears only after. The consume queue file gets its entry only with the first checkpoint after
    the record is durable (a queue file never points past what a crash keeps)."""
    s = await make_store(checkpoint_interval_ms=3_600_000)
    s.create_topic("v", queues=1)
    w = s._parts.writer
    held: list[list[str]] = []
    real_request = w.fsync.request
    w.fsync.request = held.append  # hold the next sync
    appended = asyncio.ensure_future(s.append(Message("v", b"early")))
    popped = await s.pop("g", "v", max_messages=1, invisible_time_ms=60_000, wait_ms=10_000)
    assert [p.message.body for p in popped] == [b"early"] and held, "not readable before its sync"
    assert not appended.done(), "the appender was answered before its sync"
    cq = s.cqs[("v", 0)]
    await s._parts.checkpoints.checkpoint()
    assert os.stat(cq.path).st_size == 0, "a checkpoint wrote the entry of a record not yet durable"
    w.fsync.request = real_request
    real_request(held.pop())
    r = await asyncio.wait_for(appended, 10)
    assert r.queue_offset == 0
    await s._parts.checkpoints.checkpoint()
    assert os.stat(cq.path).st_size > 0
    s.ack(popped[0].receipt_handle)
    assert s.backlog("g", "v") == 0


async def test_message_fields_roundtrip(make_store):
    s = await make_store()
    msg = Message(
        "t",
        bytes(range(256)),
        tag="T",
        keys=("a", "b"),
        properties={"x": "1", "ü": "ß"},
        born_host="h:1",
        born_timestamp=12345,
    )
    r = await s.append(msg)
    m = s.read("t", r.queue_id, r.queue_offset)[0]
    assert (m.body, m.tag, m.keys, m.properties, m.born_host, m.born_timestamp) == (
        msg.body,
        "T",
        ("a", "b"),
        {"x": "1", "ü": "ß"},
        "h:1",
        12345,
    )
    assert (m.message_id, m.store_timestamp, m.commitlog_offset, m.size) == (
        r.message_id,
        r.store_timestamp,
        r.commitlog_offset,
        r.size,
    )


# ============================================================================ offsets
async def test_offsets_read_ranges_search_and_commit(make_store):
    s = await make_store()
    s.create_topic("t", queues=1)
    first = [await s.append(Message("t", f"a{i}".encode())) for i in range(5)]
    while now_ms() <= first[-1].store_timestamp:  # the next batch gets a later timestamp
        await asyncio.sleep(0.001)
    t_mid = now_ms()
    second = [await s.append(Message("t", f"b{i}".encode())) for i in range(5)]
    assert [r.queue_offset for r in first + second] == list(range(10))
    assert (s.min_offset("t", 0), s.max_offset("t", 0)) == (0, 10)
    everything = bodies(s.read("t", 0, 0))
    assert everything == [f"a{i}".encode() for i in range(5)] + [f"b{i}".encode() for i in range(5)]
    assert bodies(s.read("t", 0, 3, 7)) == everything[3:7]
    assert bodies(s.read("t", 0, 3, 7)) == everything[3:7]  # replayable
    assert bodies(s.read("t", 0, 2, max_messages=3)) == everything[2:5]
    assert s.read("t", 0, 10) == [] and s.read("t", 0, 50) == [] and s.read("t", 0, 5, 5) == []
    assert bodies(s.read("t", 0, -5, 2)) == everything[:2]
    assert [m.queue_offset for m in s.read("t", 0, 4, 6)] == [4, 5]
    with pytest.raises(ValueError):
        s.read("t", 1, 0)
    # search by store timestamp
    assert s.search_offset("t", 0, 0) == 0
    assert s.search_offset("t", 0, t_mid) == 5
    assert s.search_offset("t", 0, now_ms() + 60_000) == 10
    # committed offsets
    assert s.committed_offset("g", "t", 0) == -1
    s.commit_offset("g", "t", 0, 4)
    assert s.committed_offset("g", "t", 0) == 4
    assert s.backlog("g", "t") == 6
    assert s.backlog("other", "t") == 10
    popped = await s.pop("g", "t", max_messages=32)  # pop continues from the committed offset
    assert [p.message.queue_offset for p in popped] == list(range(4, 10))
    s.commit_offset("g2", "t", 0, 99)  # clamped to max_offset
    assert s.committed_offset("g2", "t", 0) == 10
    s.commit_offset("g3", "t", 0, 7)
    s.commit_offset("g3", "t", 0, 3)  # may move backwards (reset)
    assert s.committed_offset("g3", "t", 0) == 3
    await s.close()
    s = await make_store()
    assert (
        s.committed_offset("g", "t", 0),
        s.committed_offset("g2", "t", 0),
        s.committed_offset("g3", "t", 0),
    ) == (4, 10, 3)
    assert bodies(s.read("t", 0, 3, 7)) == everything[3:7]


# ============================================================================ pop / ack
async def test_pop_across_queues_and_ack(make_store):
    s = await make_store()
    s.create_topic("t", queues=4)
    res = [await s.append(Message("t", f"{i}".encode())) for i in range(12)]
    assert sorted({r.queue_id for r in res}) == [0, 1, 2, 3]
    a = await s.pop("g", "t", max_messages=5)
    b = await s.pop("g", "t", max_messages=32)
    got = [p.message.body for p in a + b]
    assert len(a) == 5 and len(got) == 12 and len(set(got)) == 12
    assert {p.message.queue_id for p in a + b} == {0, 1, 2, 3}
    assert all(p.reconsume_times == 0 and p.invisible_until > now_ms() for p in a + b)
    assert s.inflight_count("g", "t") == 12 and s.backlog("g", "t") == 12
    for p in a + b:
        s.ack(p.receipt_handle)
    assert s.inflight_count("g", "t") == 0 and s.backlog("g", "t") == 0
    assert await s.pop("g", "t") == []
    with pytest.raises(ValueError):
        await s.pop("g", "t", max_messages=0)


async def test_invalid_receipt_handles(make_store):
    s = await make_store()
    await s.append(Message("t", b"x"))
    (p,) = await s.pop("g", "t")
    for bad in ("garbage", "", "zz 0 0 t g", "ffff 0 0 t g", "1 0 0 t other"):
        with pytest.raises(InvalidReceiptHandle):
            s.ack(bad)
    s.ack(p.receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        s.ack(p.receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        s.change_invisible_time(p.receipt_handle, 100)
    with pytest.raises(InvalidReceiptHandle):
        s.nack(p.receipt_handle)
    with pytest.raises(InvalidReceiptHandle):
        await s.forward_to_dlq(p.receipt_handle)


async def test_acked_stay_acked_and_inflight_stay_inflight_across_reopen(make_store):
    s = await make_store()
    for i in range(6):
        await s.append(Message("t", f"{i}".encode()))
    popped = await s.pop("g", "t", max_messages=6, invisible_time_ms=60_000)
    for p in popped[:3]:
        s.ack(p.receipt_handle)
    await s.close()
    s = await make_store()
    assert s.inflight_count("g", "t") == 3 and s.backlog("g", "t") == 3
    assert await s.pop("g", "t") == []
    for p in popped[:3]:
        with pytest.raises(InvalidReceiptHandle):
            s.ack(p.receipt_handle)
    s.change_invisible_time(popped[3].receipt_handle, 0)  # old handles are still valid
    s.ack(popped[4].receipt_handle)
    again = await s.pop("g", "t")
    assert [(p.message.body, p.reconsume_times) for p in again] == [(popped[3].message.body, 1)]


# ============================================================================ long polling
async def test_long_poll_returns_as_soon_as_a_message_arrives(make_store):
    s = await make_store()
    s.create_topic("t", queues=2)
    t0 = time.monotonic()
    task = asyncio.create_task(s.pop("g", "t", wait_ms=5000))
    await asyncio.sleep(0.1)  # let the pop park
    assert not task.done()
    t_append = time.monotonic()
    await s.append(Message("t", b"hello"))
    got = await asyncio.wait_for(task, 3)
    assert [p.message.body for p in got] == [b"hello"]
    assert time.monotonic() - t_append < 1.0 and time.monotonic() - t0 < 2.0


async def test_long_poll_ignores_non_matching_tags(make_store):
    s = await make_store()
    s.create_topic("t", queues=2)
    f = Filter.from_expression("TagA")
    t0 = time.monotonic()
    task = asyncio.create_task(s.pop("g", "t", wait_ms=3000, filter=f))
    await asyncio.sleep(0.05)
    await s.append(Message("t", b"b1", tag="TagB"))
    await asyncio.sleep(0.4)
    assert not task.done()  # a TagB message did not end the wait
    await s.append(Message("t", b"a1", tag="TagA"))
    got = await asyncio.wait_for(task, 3)
    elapsed = time.monotonic() - t0
    assert [p.message.body for p in got] == [b"a1"]
    assert 0.4 <= elapsed < 2.5
    # nothing matching at all: the wait runs to its end and returns nothing
    t0 = time.monotonic()
    task = asyncio.create_task(s.pop("g", "t", wait_ms=500, filter=f))
    await asyncio.sleep(0.05)
    await s.append(Message("t", b"b2", tag="TagB"))
    assert await asyncio.wait_for(task, 3) == []
    assert time.monotonic() - t0 >= 0.45


@pytest.mark.parametrize("how", ["change_invisible_time", "nack"])
async def test_long_poll_wakes_for_a_retry_deadline_set_during_the_wait(make_store, how):
    """A message made visible again (after 200 ms) while a long poll waits is handed to that poll
    at its new deadline, not when the poll's wait_ms runs out."""
    s = await make_store()
    s.create_group("g", retry=RetryPolicy(initial_ms=200, multiplier=1.0, max_ms=200))
    await s.append(Message("t", b"x"))
    (p,) = await s.pop("g", "t", invisible_time_ms=30_000)
    task = asyncio.create_task(s.pop("g", "t", wait_ms=2500))
    await asyncio.sleep(0.05)  # let the pop park
    t0 = time.monotonic()
    if how == "nack":
        s.nack(p.receipt_handle)
    else:
        s.change_invisible_time(p.receipt_handle, 200)
    got = await asyncio.wait_for(task, 6)
    assert [x.message.body for x in got] == [b"x"]
    assert time.monotonic() - t0 < 1.5, f"returned after {time.monotonic() - t0:.2f} s"


# ============================================================================ invisible time, nack, DLQ
async def test_change_invisible_time(make_store):
    s = await make_store()
    await s.append(Message("t", b"x"))
    (p,) = await s.pop("g", "t", invisible_time_ms=30_000)
    h2 = s.change_invisible_time(p.receipt_handle, 150)
    assert h2 != p.receipt_handle
    with pytest.raises(InvalidReceiptHandle):
        s.ack(p.receipt_handle)  # superseded
    assert await s.pop("g", "t") == []
    t0 = time.monotonic()
    (again,) = await s.pop("g", "t", wait_ms=3000, invisible_time_ms=200)
    assert time.monotonic() - t0 >= 0.1
    assert again.message.body == b"x" and again.reconsume_times == 1
    with pytest.raises(InvalidReceiptHandle):
        s.ack(h2)  # superseded by the redelivery
    # extending: not redelivered within the original invisible time
    h3 = s.change_invisible_time(again.receipt_handle, 5000)
    assert await s.pop("g", "t", wait_ms=400) == []
    s.ack(h3)
    assert s.inflight_count("g", "t") == 0
    with pytest.raises(ValueError):
        s.change_invisible_time(h3, -1)


async def test_expired_message_is_redelivered(make_store):
    s = await make_store()
    await s.append(Message("t", b"x"))
    (p,) = await s.pop("g", "t", invisible_time_ms=200)
    assert await s.pop("g", "t") == []
    (p2,) = await s.pop("g", "t", wait_ms=3000, invisible_time_ms=200)
    assert p2.message.body == b"x" and p2.reconsume_times == 1
    assert now_ms() >= p.invisible_until
    with pytest.raises(InvalidReceiptHandle):
        s.ack(p.receipt_handle)
    s.ack(p2.receipt_handle)
    assert await s.pop("g", "t", wait_ms=300) == []


async def test_nack_uses_group_back_off(make_store):
    s = await make_store()
    s.create_group("g", max_attempts=10, retry=RetryPolicy(initial_ms=250, multiplier=2.0, max_ms=450))
    await s.append(Message("t", b"x"))
    (p,) = await s.pop("g", "t", invisible_time_ms=30_000)
    t0 = time.monotonic()
    s.nack(p.receipt_handle)
    assert await s.pop("g", "t") == []
    (p2,) = await s.pop("g", "t", wait_ms=3000, invisible_time_ms=30_000)
    d1 = time.monotonic() - t0
    assert 0.2 <= d1 < 2 and p2.reconsume_times == 1
    t0 = time.monotonic()
    s.nack(p2.receipt_handle)  # attempt 2: 500 ms capped at 450
    (p3,) = await s.pop("g", "t", wait_ms=3000, invisible_time_ms=30_000)
    d2 = time.monotonic() - t0
    assert 0.4 <= d2 < 2 and p3.reconsume_times == 2


async def test_dlq_after_max_attempts(make_store):
    s = await make_store()
    s.create_group("g", max_attempts=2)
    r = await s.append(Message("t", b"poison", tag="T", keys=("k",), properties={"p": "1"}))
    await s.append(Message("t", b"fine"))
    first = await s.pop("g", "t", invisible_time_ms=150)
    for p in first:
        if p.message.body == b"fine":
            s.ack(p.receipt_handle)
    (p2,) = await s.pop("g", "t", wait_ms=3000, invisible_time_ms=150)
    assert p2.message.body == b"poison" and p2.reconsume_times == 1
    # second delivery expires too: the next pop moves it to the DLQ instead of a third delivery
    assert await s.pop("g", "t", wait_ms=500, invisible_time_ms=150) == []
    dlq = read_all(s, "%DLQ%g")
    assert len(dlq) == 1
    d = dlq[0]
    assert d.body == b"poison" and d.tag == "T" and d.keys == ("k",)
    assert d.properties["ORIGIN_TOPIC"] == "t"
    assert d.properties["ORIGIN_MESSAGE_ID"] == r.message_id
    assert d.properties["RECONSUME_TIMES"] == "2"
    assert d.properties["p"] == "1"
    assert s.inflight_count("g", "t") == 0 and s.backlog("g", "t") == 0
    with pytest.raises(InvalidReceiptHandle):
        s.ack(p2.receipt_handle)
    assert s.metrics["dlq"] == 1
    # the DLQ topic is consumable like any topic
    (dp,) = await s.pop("ops", "%DLQ%g")
    assert dp.message.body == b"poison"


async def test_forward_to_dlq(make_store):
    s = await make_store()
    await s.append(Message("t", b"bad"))
    (p,) = await s.pop("g", "t")
    res = await s.forward_to_dlq(p.receipt_handle, reason="cannot parse")
    assert res.topic == "%DLQ%g"
    (d,) = read_all(s, "%DLQ%g")
    assert d.body == b"bad" and d.properties["DLQ_REASON"] == "cannot parse"
    assert d.properties["RECONSUME_TIMES"] == "1"
    with pytest.raises(InvalidReceiptHandle):
        s.ack(p.receipt_handle)
    assert s.inflight_count("g", "t") == 0 and s.backlog("g", "t") == 0
    assert await s.pop("g", "t") == []


async def test_forward_to_dlq_twice_concurrently_moves_one_copy(make_store):
    """A receipt handle is resolved once: two concurrent forward_to_dlq calls must not make two copies."""
    s = await make_store()
    await s.append(Message("t", b"bad"))
    (p,) = await s.pop("g", "t")
    out = await asyncio.gather(
        s.forward_to_dlq(p.receipt_handle), s.forward_to_dlq(p.receipt_handle), return_exceptions=True
    )
    assert sum(isinstance(o, InvalidReceiptHandle) for o in out) == 1, out
    assert len(read_all(s, "%DLQ%g")) == 1


# ============================================================================ FIFO
def _groups_on_distinct_queues(n_queues: int) -> tuple[str, str]:
    names = [f"grp{i}" for i in range(100)]
    a = names[0]
    b = next(n for n in names if zlib.crc32(n.encode()) % n_queues != zlib.crc32(a.encode()) % n_queues)
    return a, b


async def test_fifo_groups_one_in_flight_each(make_store):
    s = await make_store()
    s.create_topic("f", queues=4)
    g1, g2 = _groups_on_distinct_queues(4)
    for i in range(3):
        await s.append(Message("f", f"{g1}-{i}".encode(), message_group=g1, msg_type=MessageType.FIFO))
    for i in range(2):
        await s.append(Message("f", f"{g2}-{i}".encode(), message_group=g2, msg_type=MessageType.FIFO))
    first = await s.pop("c", "f", max_messages=32, invisible_time_ms=200)
    assert sorted(p.message.body for p in first) == [f"{g1}-0".encode(), f"{g2}-0".encode()]
    assert await s.pop("c", "f", max_messages=32) == []  # both groups busy
    by_body = {p.message.body: p for p in first}
    s.ack(by_body[f"{g1}-0".encode()].receipt_handle)
    (nxt,) = await s.pop("c", "f", max_messages=32, invisible_time_ms=30_000)
    assert nxt.message.body == f"{g1}-1".encode()
    # g2-0 is not acked: it comes back (in order) before g2-1
    (re,) = await s.pop("c", "f", max_messages=32, wait_ms=3000, invisible_time_ms=30_000)
    assert re.message.body == f"{g2}-0".encode() and re.reconsume_times == 1
    assert await s.pop("c", "f", max_messages=32) == []
    s.ack(re.receipt_handle)
    s.ack(nxt.receipt_handle)
    rest = await s.pop("c", "f", max_messages=32)
    assert sorted(p.message.body for p in rest) == [f"{g1}-2".encode(), f"{g2}-1".encode()]
    for p in rest:
        assert p.message.message_group in (g1, g2)


async def test_fifo_wait_wakes_on_ack(make_store):
    s = await make_store()
    s.create_topic("f", queues=1)
    for i in range(2):
        await s.append(Message("f", f"{i}".encode(), message_group="G", msg_type=MessageType.FIFO))
    (p,) = await s.pop("c", "f", max_messages=32, invisible_time_ms=30_000)
    task = asyncio.create_task(s.pop("c", "f", max_messages=32, wait_ms=5000))
    await asyncio.sleep(0.05)
    assert not task.done()
    t0 = time.monotonic()
    s.ack(p.receipt_handle)
    got = await asyncio.wait_for(task, 3)
    assert [x.message.body for x in got] == [b"1"] and time.monotonic() - t0 < 1.0


# ============================================================================ delay
async def test_delayed_message_appears_after_deliver_at(make_store):
    s = await make_store()
    s.create_topic("t", queues=2)
    deliver_at = now_ms() + 1500  # room for a stalled machine before the "not yet" checks below
    r = await s.append(Message("t", b"later", deliver_at=deliver_at, keys=("dk",)))
    assert r.topic == "t"
    await s.append(Message("t", b"now"))
    assert bodies(read_all(s, "t")) == [b"now"]
    popped = await s.pop("g", "t", max_messages=32)
    assert [p.message.body for p in popped] == [b"now"]
    (p,) = await s.pop("g", "t", wait_ms=5000)
    assert now_ms() >= deliver_at
    assert p.message.body == b"later" and p.message.topic == "t" and p.message.keys == ("dk",)
    assert "__REAL_TOPIC" not in p.message.properties
    assert sorted(bodies(read_all(s, "t"))) == [b"later", b"now"]
    # a deliver_at in the past is delivered at once
    await s.append(Message("t", b"past", deliver_at=now_ms() - 1000))
    assert b"past" in bodies(read_all(s, "t"))


async def test_delay_survives_reopen_and_is_delivered_once(make_store):
    s = await make_store()
    s.create_topic("t", queues=1)
    deliver_at = now_ms() + 700
    await s.append(Message("t", b"d1", deliver_at=deliver_at))
    await s.append(Message("t", b"d2", deliver_at=deliver_at + 5000))
    await s.close()
    s = await make_store()
    if now_ms() < deliver_at - 50:
        assert read_all(s, "t") == []
    (p,) = await s.pop("g", "t", wait_ms=5000)
    assert p.message.body == b"d1" and now_ms() >= deliver_at
    await s.close()
    s = await make_store()  # delivered before the reopen: not delivered again
    assert bodies(read_all(s, "t")) == [b"d1"]
    assert await s.pop("g", "t", wait_ms=300) == []


# ============================================================================ transactions
async def test_transaction_commit_and_rollback(make_store):
    s = await make_store()
    s.create_topic("t", queues=1)
    r1 = await s.append(Message("t", b"tx1", msg_type=MessageType.TRANSACTION, keys=("k1",)))
    r2 = await s.append(Message("t", b"tx2", msg_type=MessageType.TRANSACTION))
    assert r1.topic == "t"
    assert read_all(s, "t") == [] and await s.pop("g", "t") == []
    res = await s.end_transaction(r1.commitlog_offset, commit=True)
    assert res is not None and res.topic == "t"
    (m,) = read_all(s, "t")
    assert m.body == b"tx1" and m.keys == ("k1",) and m.msg_type == MessageType.NORMAL
    assert m.message_id == r1.message_id
    assert await s.end_transaction(r2.message_id, commit=False) is None
    with pytest.raises(TransactionNotFound):
        await s.end_transaction(r1.commitlog_offset, commit=True)
    with pytest.raises(TransactionNotFound):
        await s.end_transaction(r2.message_id, commit=True)
    with pytest.raises(TransactionNotFound):
        await s.end_transaction("NO-SUCH-ID", commit=True)
    with pytest.raises(TransactionNotFound):
        await s.end_transaction(123456789, commit=True)
    normal = await s.append(Message("t", b"plain"))
    with pytest.raises(TransactionNotFound):
        await s.end_transaction(normal.commitlog_offset, commit=True)
    assert bodies(read_all(s, "t")) == [b"tx1", b"plain"]
    # an open transaction survives a reopen; resolution after it
    r3 = await s.append(Message("t", b"tx3", msg_type=MessageType.TRANSACTION))
    await s.close()
    s = await make_store()
    assert bodies(read_all(s, "t")) == [b"tx1", b"plain"]
    with pytest.raises(TransactionNotFound):
        await s.end_transaction(r1.commitlog_offset, commit=True)
    await s.end_transaction(r3.message_id, commit=True)
    assert bodies(read_all(s, "t")) == [b"tx1", b"plain", b"tx3"]


async def test_transaction_resolved_concurrently_only_once(make_store):
    """Two concurrent commits (or a commit racing a rollback) must resolve a transaction once."""
    s = await make_store()
    s.create_topic("t", queues=1)
    r = await s.append(Message("t", b"tx", msg_type=MessageType.TRANSACTION))
    out = await asyncio.gather(
        s.end_transaction(r.commitlog_offset, True),
        s.end_transaction(r.commitlog_offset, True),
        return_exceptions=True,
    )
    assert sum(isinstance(o, TransactionNotFound) for o in out) == 1, out
    assert bodies(read_all(s, "t")) == [b"tx"]
    r = await s.append(Message("t", b"tx-rolled-back", msg_type=MessageType.TRANSACTION))
    out = await asyncio.gather(
        s.end_transaction(r.commitlog_offset, True),
        s.end_transaction(r.commitlog_offset, False),
        return_exceptions=True,
    )
    assert sum(isinstance(o, TransactionNotFound) for o in out) == 1, out
    delivered = b"tx-rolled-back" in bodies(read_all(s, "t"))
    assert delivered == (not isinstance(out[0], TransactionNotFound))


async def test_transaction_check_callback(make_store):
    s = await make_store(transaction_timeout_ms=300, transaction_check_interval_ms=50)
    s.create_topic("t", queues=1)
    checked: list = []
    called = asyncio.Event()

    async def checker(msg):
        checked.append((msg.message_id, msg.body, msg.properties.get("TRANSACTION_CHECK_TIMES"), now_ms()))
        await s.end_transaction(msg.message_id, commit=True)
        called.set()

    s.transaction_checker = checker
    r = await s.append(Message("t", b"unresolved", msg_type=MessageType.TRANSACTION))
    await asyncio.wait_for(called.wait(), 5)
    assert len(checked) == 1
    mid, body, times, when = checked[0]
    assert (mid, body, times) == (r.message_id, b"unresolved", "1")
    assert when >= r.store_timestamp + 300
    assert bodies(read_all(s, "t")) == [b"unresolved"]
    with pytest.raises(TransactionNotFound):
        await s.end_transaction(r.message_id, commit=False)


async def test_transaction_unresolved_after_max_checks_is_rolled_back(make_store):
    s = await make_store(
        transaction_timeout_ms=100, transaction_check_interval_ms=50, transaction_max_checks=2
    )
    s.create_topic("t", queues=1)
    calls: list[str] = []
    s.transaction_checker = lambda msg: calls.append(
        msg.properties["TRANSACTION_CHECK_TIMES"]
    )  # sync checker
    r = await s.append(Message("t", b"orphan", msg_type=MessageType.TRANSACTION))

    def resolved() -> bool:
        q = s.progress.get("%SYS_TXN%", "%HALF%").queue(0)
        return r.queue_offset < q.ack_wm or r.queue_offset in q.done

    assert await wait_until(resolved, timeout=5)
    assert calls == ["1", "2"]
    with pytest.raises(TransactionNotFound):
        await s.end_transaction(r.message_id, commit=True)
    assert read_all(s, "t") == []


# ============================================================================ retention
async def _fill(s, topic: str, n: int, size: int = 1000, **kw) -> list:
    return [
        await s.append(Message(topic, f"{i:06d}".encode() + b"x" * size, keys=(f"{topic}-{i}",), **kw))
        for i in range(n)
    ]


async def test_retention_by_age(make_store):
    seg = 64 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("t", queues=2)
    res = await _fill(s, "t", 300)  # ~5 segments
    assert len({r.commitlog_offset // seg for r in res}) >= 4
    assert await s.apply_retention() == 0  # nothing is old yet
    n = await s.apply_retention(now=now_ms() + 100 * 86_400_000)
    active = res[-1].commitlog_offset // seg
    assert n == active  # every segment but the active one
    kept = [r for r in res if r.commitlog_offset // seg == active]
    for q in range(2):
        kept_q = [r for r in kept if r.queue_id == q]
        assert s.min_offset("t", q) == kept_q[0].queue_offset
        assert s.max_offset("t", q) == kept_q[-1].queue_offset + 1
        assert s.read("t", q, 0, s.min_offset("t", q)) == []
        assert [m.queue_offset for m in read_queue(s, "t", q)] == [r.queue_offset for r in kept_q]
        assert s.read("t", q, 0)[0].queue_offset == kept_q[0].queue_offset
    assert s.get_by_id(res[0].message_id) == [] and s.get_by_key("t-0") == []
    assert [m.body[:6] for m in s.get_by_key(f"t-{len(res) - 1}")] == [f"{len(res) - 1:06d}".encode()]
    assert len(os.listdir(os.path.join(s.config.data_dir, "commitlog"))) <= 2
    # a group starting now begins at the retained messages
    popped = await s.pop("g", "t", max_messages=1000)
    assert sorted(p.message.queue_offset for p in popped) == sorted(r.queue_offset for r in kept)
    await s.close()
    s = await make_store(segment_size=seg)
    for q in range(2):
        kept_q = [r for r in kept if r.queue_id == q]
        assert s.min_offset("t", q) == kept_q[0].queue_offset
        assert s.read("t", q, 0, kept_q[0].queue_offset) == []
    r = await s.append(Message("t", b"after", queue_id=0))
    assert s.read("t", 0, r.queue_offset)[0].body == b"after"


async def test_retention_by_size(make_store):
    seg = 64 * 1024
    limit = 128 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("big", queues=1, retention_bytes=limit)
    res = await _fill(s, "big", 400)
    n = await s.apply_retention()
    assert n >= 2
    remaining = read_queue(s, "big", 0)
    kept_bytes = sum(m.size for m in remaining)
    assert limit <= kept_bytes <= limit + seg
    assert remaining[-1].queue_offset == res[-1].queue_offset
    assert s.min_offset("big", 0) == remaining[0].queue_offset > 0


async def test_retention_keeps_segments_with_a_young_topic(make_store):
    seg = 64 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("old", queues=1, retention_ms=1)
    s.create_topic("young", queues=1)
    for i in range(200):  # both topics in every segment
        await s.append(Message("old" if i % 2 else "young", b"y" * 1000))
    assert await s.apply_retention(now=now_ms() + 60_000) == 0  # the segments stay (young needs them)
    # but the old topic's own retention hides its messages (visibility: its queue's min offset)
    assert s.min_offset("old", 0) == s.max_offset("old", 0) == 100 and s.read("old", 0, 0) == []
    assert s.min_offset("young", 0) == 0 and len(s.read("young", 0, 0, None, 1000)) == 100
    # once the young topic is old too (the store's default), the segments go
    assert await s.apply_retention(now=now_ms() + 100 * 86_400_000) >= 2
    assert s.min_offset("young", 0) > 0


async def test_retention_keeps_undelivered_delayed_messages(make_store, monkeypatch):
    """A message delayed by 10 days is held in the commit log until it is due: retention (72 h by
    default) must not delete the segment holding it before it is delivered."""
    clock = [now_ms()]
    install_clock(lambda: clock[0], monkeypatch.setattr)
    day = 86_400_000
    s = await make_store(segment_size=64 * 1024)
    s.create_topic("t", queues=1)
    await s.append(Message("t", b"in ten days", deliver_at=clock[0] + 10 * day))
    for _ in range(150):  # a few segments of other data
        await s.append(Message("filler", b"f" * 1000))
    clock[0] += 4 * day
    assert await s.apply_retention() >= 1
    await s.close()
    clock[0] += 6 * day + 1000
    s = await make_store(segment_size=64 * 1024)  # the timer is rebuilt from disk; the message is due
    assert await wait_until(lambda: bool(read_all(s, "t")), timeout=3), "the delayed message was lost"
    assert bodies(read_all(s, "t")) == [b"in ten days"]


async def test_a_crash_during_a_retention_move_still_delivers_the_delayed_message_once(
    make_store, monkeypatch
):
    """Retention copies a held delayed message forward, then marks the old record delivered. A
    crash between the two leaves both pending: the message must still be delivered once."""
    clock = [now_ms()]
    install_clock(lambda: clock[0], monkeypatch.setattr)
    s = await make_store(segment_size=64 * 1024)
    s.create_topic("t", queues=1)
    await s.append(Message("t", b"later", deliver_at=clock[0] + 60_000))
    monkeypatch.setattr(s.progress, "done", lambda *a: None)  # the crash: the mark never happens
    await s._parts.delays.move(s.commitlog.write_pos, clock[0])
    assert [clo > 0 for _w, _q, clo in s._parts.delays.heap] == [True]  # the copy waits now
    await s.close()
    clock[0] += 61_000
    s = await make_store(segment_size=64 * 1024)
    assert await wait_until(
        lambda: not s._parts.delays.heap and not s._parts.delays.delivering and bool(read_all(s, "t"))
    )
    assert bodies(read_all(s, "t")) == [b"later"]


# ============================================================================ limits
async def test_message_too_large(make_store):
    s = await make_store(max_message_size=1000)
    with pytest.raises(MessageTooLarge):
        await s.append(Message("t", b"x" * 1001))
    r = await s.append(Message("t", b"x" * 1000))
    assert s.get_message(r.commitlog_offset).body == b"x" * 1000
    assert r.queue_offset == 0  # the refused message took no queue offset
    assert sum(s.max_offset("t", q) for q in range(4)) == 1


async def test_message_larger_than_a_segment_is_message_too_large(make_store):
    """max_message_size above segment_size: an oversized record must be refused as MessageTooLarge
    (a StoreError), not a bare ValueError from the commit log, and leave the store usable."""
    s = await make_store(segment_size=64 * 1024, max_message_size=1 << 20)
    with pytest.raises(MessageTooLarge):
        await s.append(Message("t", b"x" * (100 * 1024), queue_id=0))
    r = await s.append(Message("t", b"ok", queue_id=0))
    assert r.queue_offset == 0


# ============================================================================ flushing
async def test_group_commit(make_store):
    s = await make_store()
    s.create_topic("t", queues=4)
    before = s.metrics["flushes"]
    res = await asyncio.gather(*[s.append(Message("t", f"{i}".encode())) for i in range(300)])
    flushes = s.metrics["flushes"] - before
    assert 1 <= flushes < 300
    assert len({r.commitlog_offset for r in res}) == 300
    assert len({(r.queue_id, r.queue_offset) for r in res}) == 300
    assert sorted(bodies(read_all(s, "t")), key=int) == [f"{i}".encode() for i in range(300)]


async def test_async_flush_policy(make_store):
    s = await make_store(flush="async", flush_interval_ms=20)
    s.create_topic("t", queues=2)
    seq = [await s.append(Message("t", f"s{i}".encode())) for i in range(50)]
    conc = await asyncio.gather(*[s.append(Message("t", f"c{i}".encode())) for i in range(200)])
    assert len({r.commitlog_offset for r in seq + conc}) == 250
    popped = await s.pop("g", "t", max_messages=10)
    for p in popped:
        s.ack(p.receipt_handle)
    await s.close()
    s = await make_store(flush="async", flush_interval_ms=20)
    stored = bodies(read_all(s, "t"))
    assert sorted(stored) == sorted(
        [f"s{i}".encode() for i in range(50)] + [f"c{i}".encode() for i in range(200)]
    )
    assert s.backlog("g", "t") == 240


# ============================================================================ full disk
def test_store_full_when_a_segment_cannot_be_created(tmp_path):
    """RLIMIT_FSIZE below the segment size: the next segment cannot be written (EFBIG)."""
    data = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, str(HERE / "fsize_writer.py"), str(data)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "CLOSED", proc.stdout[-2000:] + proc.stderr
    acked = [ln.split()[1] for ln in lines if ln.startswith("A ")]
    full = [ln for ln in lines if ln.startswith("FULL ")]
    errors = [ln for ln in lines if ln.startswith("ERR ")]
    assert not errors, errors
    assert full and int(full[0].split()[1]) >= 3  # appends failed with StoreFullError
    assert int(full[0].split()[2]) == 8  # a whole concurrent batch failed too
    assert any(t.startswith("after-") for t in acked)  # appends work again once there is room

    async def check():
        from tests.store.support import open_store

        s = await open_store(data_dir=str(data), segment_size=64 * 1024)
        try:
            stored = [m.body.split(b"|")[0].decode() for m in read_all(s, "full")]
        finally:
            await s.close()
        assert len(stored) == len(set(stored))
        assert sorted(stored) == sorted(acked)

    asyncio.run(check())


def test_refused_batch_straddling_the_file_size_limit_is_not_recovered(tmp_path):
    """A batch refused by a short write inside a segment (EFBIG at RLIMIT_FSIZE): records of it that
    were written completely before the limit must not be recovered after the reopen."""
    data = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, str(HERE / "fsize_writer.py"), str(data), "batches"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "CLOSED" and any(ln.startswith("FULL ") for ln in lines), proc.stdout[-2000:]
    assert not [ln for ln in lines if ln.startswith("ERR ")]
    acked = {ln.split()[1] for ln in lines if ln.startswith("A ")}

    async def check():
        from tests.store.support import open_store

        s = await open_store(data_dir=str(data), segment_size=64 * 1024)
        try:
            stored = [m.body.split(b"|")[0].decode() for m in read_all(s, "full")]
        finally:
            await s.close()
        assert len(stored) == len(set(stored))
        assert acked <= set(stored)
        resurrected = sorted(set(stored) - acked)
        assert not resurrected, f"refused appends stored after reopen: {resurrected}"

    asyncio.run(check())


async def test_min_free_bytes(make_store):
    seg = 64 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("t", queues=2)
    acked = [await s.append(Message("t", f"a{i}".encode() + b"x" * 500)) for i in range(20)]
    s.commitlog.min_free_bytes = 1 << 62  # "the disk is nearly full"
    full = 0
    for i in range(2000):
        try:
            acked.append(await s.append(Message("t", f"b{i}".encode() + b"x" * 500)))
        except StoreFullError:
            full += 1
            if full == 3:
                break
    assert full == 3, "appends never hit StoreFullError"
    with pytest.raises(StoreFullError):  # still full: refused without harm
        await asyncio.gather(*[append(s, Message("t", b"refused")) for _ in range(5)])
    s.commitlog.min_free_bytes = 0
    for i in range(200):
        acked.append(await s.append(Message("t", f"c{i}".encode() + b"x" * 500)))
    assert len({r.commitlog_offset // seg for r in acked}) >= 3
    want = sorted(s.get_message(r.commitlog_offset).body for r in acked)
    await s.close()
    s = await make_store(segment_size=seg)
    stored = sorted(bodies(read_all(s, "t")))
    assert stored == want


async def test_refused_batch_does_not_reappear_after_reopen(make_store):
    """A batch refused with StoreFullError while crossing into a segment that cannot be created:
    none of its records may show up after a reopen (part of the batch fit the old segment)."""
    seg = 64 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("t", queues=1)
    first = await s.append(Message("t", b"ok-0000" + b"x" * 900))
    s.commitlog.min_free_bytes = 1 << 62  # no new segment can be created (nor preallocated)
    per_seg = seg // first.size
    acked = [first] + [
        await s.append(Message("t", f"ok-{i:04d}".encode() + b"x" * 900)) for i in range(1, per_seg - 3)
    ]
    outcome = await asyncio.gather(
        *[append(s, Message("t", f"no-{i:04d}".encode() + b"x" * 900)) for i in range(30)],
        return_exceptions=True,
    )
    refused = [o for o in outcome if isinstance(o, StoreFullError)]
    acked += [o for o in outcome if not isinstance(o, BaseException)]
    assert refused and all(isinstance(o, StoreFullError) or not isinstance(o, BaseException) for o in outcome)
    want = {s.get_message(r.commitlog_offset).body[:7] for r in acked}
    await s.close()
    s = await make_store(segment_size=seg)
    stored = [m.body[:7] for m in read_all(s, "t")]
    assert len(stored) == len(set(stored))
    assert want <= set(stored)
    resurrected = sorted(set(stored) - want)
    assert not resurrected, f"{len(resurrected)} refused appends are stored after reopen: {resurrected}"


async def _fill_until_full(s, seg: int) -> int:
    """Make the store full: no new segment may be allocated; append until that is needed."""
    s.commitlog.min_free_bytes = 1 << 62
    for i in range(4 * seg // 1000):
        try:
            await s.append(Message("filler", b"f" * 1000))
        except StoreFullError:
            return i
    raise AssertionError("the store never became full")


async def test_failed_forward_to_dlq_does_not_strand_the_message(make_store):
    """forward_to_dlq refused with StoreFullError: the message is not dead-lettered, so it must
    still be delivered again (at-least-once), not stay in flight forever."""
    seg = 64 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("t", queues=1)
    await s.append(Message("t", b"victim"))
    (p,) = await s.pop("g", "t", invisible_time_ms=300)
    await _fill_until_full(s, seg)
    with pytest.raises(StoreFullError):
        await s.forward_to_dlq(p.receipt_handle)
    s.commitlog.min_free_bytes = 0
    again = await s.pop("g", "t", wait_ms=2000)
    assert [x.message.body for x in again] == [b"victim"], (
        "message stranded in flight after a failed DLQ forward"
    )
    assert read_all(s, "%DLQ%g") == []


async def test_failed_dlq_move_does_not_strand_the_message(make_store):
    """Past max attempts the move to the DLQ fails (store full): once there is room again the
    message must still reach the DLQ (or be delivered), not stay in flight forever."""
    seg = 64 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("t", queues=1)
    s.create_group("g", max_attempts=1)
    await s.append(Message("t", b"victim"))
    (p,) = await s.pop("g", "t", invisible_time_ms=200)
    await _fill_until_full(s, seg)
    while now_ms() <= p.invisible_until:  # a real deadline: wait it out
        await asyncio.sleep(0.02)
    with contextlib.suppress(StoreFullError):  # the pop may report the failed move
        assert await s.pop("g", "t") == []
    s.commitlog.min_free_bytes = 0
    got = await s.pop("g", "t", wait_ms=1000)
    dlq = read_all(s, "%DLQ%g")
    assert [m.body for m in dlq] + [x.message.body for x in got] == [b"victim"], (
        f"stranded: dlq={len(dlq)}, redelivered={len(got)}, in flight={s.inflight_count('g', 't')}"
    )


async def test_fsync_helper_death_fails_appends_cleanly(make_store):
    import signal as _signal

    from store import StoreError

    s = await make_store(fsync_method="helper")
    await s.append(Message("T", b"before"))
    s._parts.writer.fsync.proc.send_signal(_signal.SIGKILL)
    deadline = asyncio.get_running_loop().time() + 10
    while s._parts.writer.broken is None:  # the loop notices the closed pipe with no sync in flight
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    with pytest.raises(StoreError):
        s.append(Message("T", b"after"))


async def test_preallocate_zero_fills_a_fresh_stores_first_segment_in_the_background(make_store):
    s = await make_store(segment_size=4 << 20)
    path = os.path.join(s.commitlog.dir, f"{0:020d}")
    assert not os.path.exists(path)  # a fresh store: the first append would create it
    s.preallocate()
    t = s.commitlog._prealloc_thread
    assert t is not None
    await asyncio.to_thread(t.join, 10)
    assert os.path.getsize(path) == 4 << 20
    r = await s.append(Message("T", b"after"))
    assert r.commitlog_offset == 0
    assert [m.body for m in s.read("T", r.queue_id, 0, 10)] == [b"after"]
    s.preallocate()  # the segment exists: nothing to do
    assert s.commitlog._prealloc_thread is t


async def test_a_checkpoint_cancelled_while_its_io_is_queued_still_writes_its_entries(tmp_path):
    """close() cancels the periodic checkpoint; if its IO job was still queued behind another one,
    the queue entries it had taken from memory must reach the file anyway (else the final
    checkpoint writes the later entries after a hole of zeros and a reopened store loses them)."""
    import threading

    from store import Store, StoreConfig

    cfg = dict(data_dir=str(tmp_path / "d"), flush="async", segment_size=4 << 20)
    s = await Store.open(StoreConfig(**cfg))
    s.create_topic("T", 1)
    await s.append(Message("T", b"first"))
    busy = threading.Event()
    blocker = s._run_io(busy.wait, 10)  # the IO thread is busy: the checkpoint's job waits in line
    cp = asyncio.ensure_future(s._parts.checkpoints.checkpoint())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    cp.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cp
    await s.append(Message("T", b"second"))
    busy.set()
    await blocker
    await s.close()
    s = await Store.open(StoreConfig(**cfg))
    try:
        assert [m.body for m in s.read("T", 0, 0, 10)] == [b"first", b"second"]
    finally:
        await s.close()
