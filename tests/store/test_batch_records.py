"""Batch records: `append_many` of one topic and queue stores one commit log record holding the
messages (store/codec.py), while offsets, reads, pops, acks, invisible times and lookups by id and
key stay per message; recovery and replication walk into the batch."""

from __future__ import annotations

import os

import pytest

from store import Message, codec
from store.replication import CorruptChunk, parse_chunk

SEG = 1 << 20


def _batch(n: int, topic: str = "t", tag: str = "") -> list[Message]:
    return [
        Message(topic, f"m{i}".encode() * 8, tag=tag or ("A" if i % 2 else "B"), keys=(f"k{i}",))
        for i in range(n)
    ]


def _records(store) -> list[tuple[int, int]]:
    """(offset, magic) of every top-level record of the commit log."""
    out = []
    cl = store.commitlog
    pos, end = cl.min_offset, cl.write_pos
    while pos < end:
        head = cl.read(pos, codec.PREFIX.size + 1)
        size = codec.record_size_at(head, 0)
        out.append((pos, head[8]))
        pos += size
    return out


async def test_a_batch_of_64_is_one_record_with_per_message_offsets(make_store):
    store = await make_store(segment_size=SEG)
    store.create_topic("t", queues=4)
    results = await store.append_many(_batch(64))
    assert store.metrics["batch_records"] == 1
    assert [m for _o, m in _records(store)] == [codec.MAGIC_BATCH]
    qid = results[0].queue_id
    assert {r.queue_id for r in results} == {qid}
    assert [r.queue_offset for r in results] == list(range(64))
    assert store.max_offset("t", qid) == 64
    got = store.read("t", qid, 0, 64, 100)
    assert [m.body for m in got] == [m.body for m in _batch(64)]
    assert [m.queue_offset for m in got] == list(range(64))
    # lookups by id and key find messages inside the batch
    assert store.get_by_id(results[17].message_id)[0].body == b"m17" * 8
    assert store.get_by_key("k40")[0].queue_offset == 40


async def test_pop_returns_the_whole_batch_and_acks_stay_per_message(make_store):
    store = await make_store(segment_size=SEG)
    store.create_topic("t", queues=2)
    await store.append_many(_batch(64))
    popped = await store.pop("g", "t", max_messages=64, invisible_time_ms=60_000)
    assert len(popped) == 64
    for p in popped[::2]:
        store.ack(p.receipt_handle)
    for p in popped[1::2]:
        store.change_invisible_time(p.receipt_handle, 0)
    again = await store.pop("g", "t", max_messages=64, invisible_time_ms=60_000)
    assert sorted(p.message.queue_offset for p in again) == list(range(1, 64, 2))
    assert all(p.message.reconsume_times == 1 for p in again)
    for p in again:
        store.ack(p.receipt_handle)
    assert store.backlog("g", "t") == 0


async def test_tag_filters_see_each_message_of_a_batch(make_store):
    from store import Filter

    store = await make_store(segment_size=SEG)
    store.create_topic("t", queues=1)
    await store.append_many(_batch(64))
    popped = await store.pop("g", "t", max_messages=64, filter=Filter.from_expression("A"))
    assert sorted(p.message.queue_offset for p in popped) == list(range(1, 64, 2))


async def test_batches_survive_reopen_and_a_rebuild_from_the_commit_log(make_store, tmp_path):
    data = str(tmp_path / "data")
    store = await make_store(data_dir=data, segment_size=SEG)
    store.create_topic("t", queues=3)
    sent = []
    for j in range(30):  # ~30 * 64 * 60 bytes: crosses segments
        msgs = [Message("t", b"x" * 500 + bytes([j, i]), keys=(f"z{j}-{i}",)) for i in range(64)]
        sent += await store.append_many(msgs)
    await store.close()
    # lose the consume queues and the index: everything is rebuilt from the log, batches included
    import shutil

    shutil.rmtree(os.path.join(data, "consumequeue"))
    shutil.rmtree(os.path.join(data, "index"))
    os.remove(os.path.join(data, "checkpoint.json"))
    store = await make_store(data_dir=data, segment_size=SEG)
    assert sum(store.max_offset("t", q) for q in range(3)) == len(sent)
    for r in sent[::97]:
        m = store.read("t", r.queue_id, r.queue_offset, r.queue_offset + 1)[0]
        assert m.message_id == r.message_id
        assert store.get_by_id(r.message_id)[0].queue_offset == r.queue_offset


async def test_a_torn_batch_at_the_tail_is_cut_whole(make_store, tmp_path):
    data = str(tmp_path / "data")
    store = await make_store(data_dir=data, segment_size=SEG)
    store.create_topic("t", queues=1)
    await store.append_many(_batch(8))
    second = await store.append_many(_batch(8))
    end = store.commitlog.write_pos
    await store.close()
    # tear the second batch's last bytes (as a crash in the middle of its write would)
    seg = os.path.join(data, "commitlog", sorted(os.listdir(os.path.join(data, "commitlog")))[0])
    with open(seg, "r+b") as f:
        f.seek(end - 5)
        f.write(b"\0\0\0\0\0")
    os.remove(os.path.join(data, "checkpoint.json"))
    store = await make_store(data_dir=data, segment_size=SEG)
    assert store.max_offset("t", 0) == 8  # the whole second batch is gone, the first intact
    assert [m.body for m in store.read("t", 0, 0, 100, 100)] == [m.body for m in _batch(8)]
    assert store.get_by_id(second[0].message_id) == []


def test_parse_chunk_walks_into_a_batch_and_refuses_a_damaged_one():
    inner = [codec.encode(Message("t", b"b%d" % i), 0, i, 1, f"{i:032X}", 1) for i in range(3)]
    joined = b"".join(inner)
    rec = codec.encode_batch_head(joined, 3) + joined
    parsed = parse_chunk(rec, 4096, SEG)
    assert [(at, size) for at, _pos, size in parsed] == [
        (4096 + codec.BATCH_HEADER_SIZE + sum(map(len, inner[:i])), len(inner[i])) for i in range(3)
    ]
    bad = bytearray(rec)
    bad[-1] ^= 1
    with pytest.raises(CorruptChunk):
        parse_chunk(bytes(bad), 4096, SEG)
    wrong_count = codec.encode_batch_head(joined, 4) + joined
    with pytest.raises(CorruptChunk):
        parse_chunk(wrong_count, 4096, SEG)


async def test_mixed_topics_and_held_messages_fall_back_to_one_record_each(make_store):
    store = await make_store(segment_size=SEG)
    store.create_topic("t", queues=1)
    store.create_topic("u", queues=1)
    await store.append_many([Message("t", b"a"), Message("u", b"b"), Message("t", b"c")])
    assert store.metrics.get("batch_records", 0) == 0
    assert [m for _o, m in _records(store)] == [codec.MAGIC_MESSAGE] * 3


async def test_plain_batches_cross_segments_and_reopen_whole(make_store, tmp_path):
    """Messages without optional fields take the lean path (entries packed at once): still whole
    across segment ends, reopen, and lookups by id."""
    data = str(tmp_path / "data")
    store = await make_store(data_dir=data, segment_size=SEG)
    store.create_topic("t", queues=2)
    sent = []
    for j in range(40):
        sent += list(await store.append_many([Message("t", bytes([j]) * 700) for _ in range(64)]))
    assert store.metrics["batch_records"] >= 40
    assert len({r.message_id for r in sent}) == len(sent)
    await store.close()
    store = await make_store(data_dir=data, segment_size=SEG)
    for r in sent[::61]:
        (m,) = store.read("t", r.queue_id, r.queue_offset, r.queue_offset + 1)
        assert (m.message_id, m.commitlog_offset, m.body[:1]) == (
            r.message_id,
            r.commitlog_offset,
            m.body[:1],
        )
        assert store.get_by_id(r.message_id)[0].queue_offset == r.queue_offset
    assert sum(store.max_offset("t", q) for q in range(2)) == len(sent)
