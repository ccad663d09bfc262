"""Logic queues: a topic grows and shrinks in place (docs/store.md, "Logic queues").

No message moves; offsets keep increasing per queue; a shrink seals the queues it leaves out
(readable until retention empties them); a message group's (an MQTT path's) later messages wait
for its earlier ones in its previous queue; the change survives a restart."""

from __future__ import annotations

import zlib

import pytest

from store import Message
from store.message import PATH_PROPERTY, now_ms

pytestmark = pytest.mark.timeout(60)


def _group_in(queue: int, queues: int) -> str:
    """A message group name that hashes to `queue` of `queues`."""
    for i in range(100_000):
        g = f"g{i}"
        if zlib.crc32(g.encode()) % queues == queue:
            return g
    raise AssertionError("no such group")


async def _drain(s, group: str, topic: str, n: int | None = None) -> list:
    """Pop and ack until nothing is left (or `n` messages): the messages in delivery order."""
    out = []
    while True:
        got = await s.pop(group, topic, max_messages=64, invisible_time_ms=30_000)
        if not got:
            return out
        for p in got:
            out.append(p.message)
            s.ack(p.receipt_handle)
        if n is not None and len(out) >= n:
            return out


async def test_grow_keeps_offsets_and_new_queues_take_messages(make_store):
    s = await make_store()
    s.create_topic("t", queues=4)
    for i in range(40):
        await s.append(Message("t", f"a{i}".encode()))
    before = [s.max_offset("t", q) for q in range(4)]
    assert sum(before) == 40
    t = s.resize_topic("t", 16)
    assert (t.queues, t.readable) == (16, 16)
    assert s.queue_count("t") == 16
    for i in range(160):
        await s.append(Message("t", f"b{i}".encode()))
    after = [s.max_offset("t", q) for q in range(16)]
    assert all(after[q] >= before[q] for q in range(4))  # offsets only grow
    assert all(after[q] > 0 for q in range(4, 16))  # the new queues take messages
    got = await _drain(s, "c", "t")
    assert sorted(m.body for m in got) == sorted(
        [f"a{i}".encode() for i in range(40)] + [f"b{i}".encode() for i in range(160)]
    )


async def test_shrink_seals_queues_until_retention_empties_them(make_store):
    seg = 64 * 1024
    s = await make_store(segment_size=seg)
    s.create_topic("t", queues=8)
    for i in range(80):
        await s.append(Message("t", f"a{i}".encode()))
    ends = [s.max_offset("t", q) for q in range(8)]
    t = s.resize_topic("t", 2)
    assert (t.queues, t.readable) == (2, 8)  # 2..7 are sealed: readable, not writable
    for i in range(20):
        r = await s.append(Message("t", f"b{i}".encode()))
        assert r.queue_id in (0, 1)
    # a client's stale route: a sealed queue's id goes to a writable one (as RocketMQ's broker)
    r = await s.append(Message("t", b"stale", queue_id=5))
    assert r.queue_id == 5 % 2
    with pytest.raises(ValueError):
        await s.append(Message("t", b"nowhere", queue_id=8))
    assert [s.max_offset("t", q) for q in range(2, 8)] == ends[2:]  # nothing new in sealed queues
    assert len(await _drain(s, "c", "t")) == 101  # a group consumes the sealed queues too
    s.trim_sealed()
    assert s.queue_count("t") == 8  # consumed, but still there for offset reads (replay)
    assert [len(s.read("t", q, 0, None, 1000)) for q in range(2, 8)] == ends[2:]
    # retention empties them (new messages fill segments past the old ones): they leave the list
    for i in range(400):
        await s.append(Message("t", b"c%d" % i + b"." * 400))
    assert await s.apply_retention(now=now_ms() + 100 * 86_400_000) > 0
    s.trim_sealed()
    assert s.queue_count("t") == 2 and s.topic("t").readable == 2
    assert len(await _drain(s, "c", "t")) > 0
    s.resize_topic("t", 8)  # back: the re-added queues continue their offsets
    for i in range(80):
        await s.append(Message("t", f"d{i}".encode()))
    for q in range(2, 8):
        assert s.min_offset("t", q) == ends[q] < s.max_offset("t", q)
        msgs = s.read("t", q, 0, None, 1000)
        assert msgs and msgs[0].queue_offset == ends[q]
        assert all(m.body.startswith(b"d") for m in msgs)
    assert len(await _drain(s, "c", "t")) == 80  # the group goes on from where it was


async def test_message_group_order_holds_across_a_grow_and_a_shrink(make_store):
    s = await make_store()
    s.create_topic("t", queues=4)
    # a group whose queue changes both times: queue 5 of 16, queue 1 of 4
    g = _group_in(5, 16)
    seq = 0

    async def send(n: int) -> None:
        nonlocal seq
        for _ in range(n):
            await s.append(Message("t", str(seq).encode(), message_group=g))
            seq += 1

    await send(5)
    # one of them in flight when the topic grows: nothing else of the group may be handed out
    first = await s.pop("c", "t", max_messages=1, invisible_time_ms=30_000)
    assert [p.message.body for p in first] == [b"0"]
    s.resize_topic("t", 16)
    await send(5)
    assert await s.pop("c", "t", max_messages=32, invisible_time_ms=30_000) == []
    s.ack(first[0].receipt_handle)
    order = [int(m.body) for m in await _drain(s, "c", "t", n=4)]
    s.resize_topic("t", 4)
    await send(5)
    order += [int(m.body) for m in await _drain(s, "c", "t")]
    assert order == list(range(1, 15))  # no reorder, nothing lost, nothing twice


async def test_mqtt_path_order_and_a_new_group_after_a_change(make_store):
    s = await make_store()
    s.create_topic("t", queues=2)
    path = "dev/7/temp"
    props = {PATH_PROPERTY: path}
    for i in range(10):
        r = await s.append(Message("t", str(i).encode(), properties=dict(props), order_key=path))
        assert r.queue_id == zlib.crc32(path.encode()) % 2  # the store places an order key's messages
    s.resize_topic("t", 7)
    for i in range(10, 20):
        await s.append(Message("t", str(i).encode(), properties=dict(props), order_key=path))
    # pops of one at a time, round robin over queues: the new queue's messages wait for the old one
    order = []
    while len(order) < 20:
        got = await s.pop("c", "t", max_messages=1, invisible_time_ms=30_000)
        assert got, order
        order.append(int(got[0].message.body))
        s.ack(got[0].receipt_handle)
    assert order == list(range(20))


async def test_resize_survives_a_restart(make_store, tmp_path):
    s = await make_store(data_dir=str(tmp_path / "d"))
    s.create_topic("t", queues=6)
    for i in range(30):
        await s.append(Message("t", str(i).encode()))
    s.resize_topic("t", 3)
    await s.close()
    s = await make_store(data_dir=str(tmp_path / "d"))
    t = s.topic("t")
    assert (t.queues, t.readable, len(t.epochs)) == (3, 6, 1)
    assert len(await _drain(s, "c", "t")) == 30


async def test_compacted_topics_keep_their_queue_count(make_store):
    s = await make_store()
    s.create_topic("k", queues=4, compacted=True)
    with pytest.raises(ValueError, match="compacted"):
        s.resize_topic("k", 8)
    assert s.topic("k").queues == 4
