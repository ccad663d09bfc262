"""Retention per topic (store/retention.py), with real files and, for the tier, a real S3-compatible
server (moto's): a topic with 1-hour retention next to one with 72 hours, their messages in the same
commit log segments. Once the clock (handed to `apply_retention`, not slept) passes the hour, the
first's messages are gone from every read (offset reads, pops, tails, lookups) and from the tier
(its segments' objects deleted), the second's remain; a size limit and a tier limit act alike."""

from __future__ import annotations

import os

import pytest

from messaging_processor.store_client import LocalStoreClient
from store import Message, Store
from store.message import now_ms
from tests.store.s3server import S3Server, start_s3
from tests.store.test_tiering import SEG, config, objects

HOUR = 3_600_000


def body(topic: str, i: int) -> bytes:
    return f"{topic}:{i:06d}|".encode() + b"x" * 2000


async def fill(store: Store, topics: list[str], n: int) -> dict[str, list[str]]:
    """n messages (about 2 KiB) per topic, the topics interleaved in batches of 50; their ids."""
    ids: dict[str, list[str]] = {t: [] for t in topics}
    for lo in range(0, n, 50):
        for t in topics:
            msgs = [Message(t, body(t, i), keys=(f"{t}-{i}",)) for i in range(lo, min(lo + 50, n))]
            ids[t] += [r.message_id for r in await store.append_many(msgs)]
    return ids


def readable(store: Store, topic: str) -> int:
    t = store.topic(topic)
    return sum(store.max_offset(topic, q) - store.min_offset(topic, q) for q in range(t.queues))


async def test_a_short_topic_beside_a_long_one(make_store):
    s = await make_store(segment_size=SEG)
    s.create_topic("short", queues=2, retention_ms=HOUR)
    s.create_topic("long", queues=2, retention_ms=72 * HOUR)
    s.create_topic("small", queues=1, retention_bytes=SEG // 2)
    ids = await fill(s, ["short", "long", "small"], 600)  # ~3.5 MiB: the topics share every segment
    segments = sorted(os.listdir(os.path.join(s.config.data_dir, "commitlog")))
    assert len(segments) >= 4

    assert await s.apply_retention(now=now_ms() + 60_000) == 0  # a minute on: nothing is old yet
    assert readable(s, "short") == 600

    assert await s.apply_retention(now=now_ms() + 2 * HOUR) == 0  # shared segments stay ...
    assert sorted(os.listdir(os.path.join(s.config.data_dir, "commitlog"))) == segments
    # ... but the short topic's messages are gone from every read
    assert readable(s, "short") == 0
    assert s.read("short", 0, 0, None, 1000) == [] and s.read("short", 1, 0, None, 1000) == []
    assert await s.pop("g", "short", 32) == []
    assert await s.tail("short", {}, 128) == []
    assert s.get_by_id(ids["short"][0]) == [] and s.get_by_key("short-599") == []
    # the long topic keeps everything
    assert readable(s, "long") == 600
    got = []
    while len(got) < 600:
        batch = await s.pop("g", "long", 32)
        assert batch
        got += [p.message.message_id for p in batch]
    assert sorted(got) == sorted(ids["long"])
    assert [m.body for m in s.get_by_id(ids["long"][0])] == [body("long", 0)]
    # the size-limited one keeps its newest bytes: its limit, up to its share of one more segment
    small = s.read("small", 0, 0, None, 1000)
    assert small[-1].body == body("small", 599)
    assert SEG // 2 <= sum(m.size for m in small) <= SEG // 2 + SEG // 2 < 600 * 2000
    assert s.min_offset("small", 0) == small[0].queue_offset > 0

    # new messages of the short topic are readable again; its queues' offsets go on
    r = await s.append(Message("short", b"new", queue_id=0))
    assert [m.body for m in s.read("short", 0, 0)] == [b"new"] and r.queue_offset == 300
    # once the long topic is past its limit too, the segments go
    assert await s.apply_retention(now=now_ms() + 100 * HOUR) == s.commitlog.write_pos // SEG
    assert readable(s, "long") == 0


async def test_retention_settings_survive_a_restart(make_store, tmp_path):
    s = await make_store(segment_size=SEG)
    s.create_topic("t", queues=1, retention_ms=HOUR, retention_bytes=10 * SEG, tier_retention_ms=24 * HOUR)
    await s.close()
    s = await make_store(segment_size=SEG)
    t = s.topic("t")
    assert (t.retention_ms, t.retention_bytes, t.tier_retention_ms) == (HOUR, 10 * SEG, 24 * HOUR)
    with pytest.raises(ValueError):
        s.create_topic("t", retention_ms=0)


@pytest.fixture(scope="module")
def s3():
    server = start_s3(min_part_size=1024)
    yield server
    server.stop()


async def test_tiered_topics_by_their_own_retention(tmp_path, s3: S3Server):
    """The short topic's messages fill the first segments alone, then the topics share segments:
    after the hour the short topic's exclusive tier objects are deleted, the shared ones stay for the
    long topic, whose messages still read back from the tier; a topic whose tier limit is longer
    than its local one stays readable from the tier."""
    bucket = "topic-retention"
    s3.create_bucket(bucket)
    store = await Store.open(config(str(tmp_path / "d"), s3.endpoint, bucket, tier_after_ms=60_000))
    try:
        store.create_topic("short", queues=1, retention_ms=HOUR)
        store.create_topic("long", queues=1, retention_ms=72 * HOUR)
        store.create_topic("archive", queues=1, retention_ms=HOUR, tier_retention_ms=72 * HOUR)
        await fill(store, ["short"], 1000)  # ~2 segments of the short topic alone
        alone = store.commitlog.write_pos // SEG  # segments below this hold only it
        before = {t: store.read(t, 0, 0, None, 10_000) for t in ("short",)}
        await fill(store, ["short", "long", "archive"], 500)
        long_before = store.read("long", 0, 0, None, 10_000)
        archive_before = store.read("archive", 0, 0, None, 10_000)
        n = store.commitlog.write_pos // SEG
        assert alone >= 1 and n >= alone + 2 and len(before["short"]) == 1000
        assert await store.tier_now(now_ms() + 2 * 60_000) == n  # every closed segment, tiered
        assert len(objects(s3, bucket)) == n

        assert await store.apply_retention(now_ms() + 2 * HOUR) == alone  # its segments alone go
        await store.tier_now(now_ms() + 2 * HOUR)  # (a pass deletes the objects retention removed)
        assert objects(s3, bucket) == [f"node1/commitlog/{b * SEG:020d}.seg" for b in range(alone, n)]
        client = LocalStoreClient(store)
        assert await client.read("short", 0, 0, None, 10_000) == []
        assert store.min_offset("short", 0) == store.max_offset("short", 0) == 1500
        store.drop_tier_cache()  # the long topic reads back from the object store
        got = await client.read("long", 0, 0, None, 10_000)
        assert [m.message_id for m in got] == [m.message_id for m in long_before]
        assert [m.body for m in got] == [body("long", i) for i in range(500)]
        got = await client.read("archive", 0, 0, None, 10_000)  # tiered: kept by its 72 h tier limit
        assert [m.message_id for m in got] == [m.message_id for m in archive_before]

        # past 72 h the long topic and the archive are past their limits too: the rest goes
        assert await store.apply_retention(now_ms() + 73 * HOUR) == n - alone
        await store.tier_now(now_ms() + 73 * HOUR)
        assert objects(s3, bucket) == []
        assert await client.read("archive", 0, 0, None, 10_000) == []
    finally:
        await store.close()
