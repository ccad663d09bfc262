"""Tiered storage (store/tiering.py) against a real S3-compatible server (moto's, in a subprocess):
closed segments upload and leave the disk, reads of them (offset reads, pops, by id, raw ranges)
return exactly what they did before; a kill -9 mid-upload resumes; an unreachable object store
leaves local traffic alone and fails tiered reads with UNAVAILABLE until it returns; retention
deletes tiered objects."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time

import pytest

from cluster.replication import _read_chunk as replication_chunk
from messaging_processor.errors import ErrorKind, store_error
from messaging_processor.store_client import LocalStoreClient
from store import Message, Store, StoreConfig
from store.errors import StoreError, TieredRangeNotCached, TieredStorageUnavailable
from store.message import now_ms
from store.raw_range import read_range
from tests.store.s3server import S3Server, start_s3
from tests.store.support import ROOT

SEG = 1 << 20
PART = 256 * 1024  # 4 parts per segment
DAY_MS = 86_400_000
_buckets = itertools.count()


@pytest.fixture(scope="module")
def s3():
    server = start_s3(min_part_size=1024)
    yield server
    server.stop()


@pytest.fixture
def bucket(s3: S3Server) -> str:
    name = f"tier-test-{os.getpid()}-{next(_buckets)}"
    s3.create_bucket(name)
    return name


def config(data_dir: str, endpoint: str, bucket: str, **kw: object) -> StoreConfig:
    base = dict(
        data_dir=data_dir,
        segment_size=SEG,
        tier_endpoint=endpoint,
        tier_bucket=bucket,
        tier_prefix="node1/",
        tier_part_size=PART,
        tier_interval_ms=3_600_000,  # passes run when the test says (tier_now)
        tier_timeout_ms=1000,
        compaction_process=False,
        retention_check_interval_ms=3_600_000,
    )
    base.update(kw)
    return StoreConfig(**base)


def body(i: int) -> bytes:
    return f"m{i:06d}|".encode() + bytes([i % 251]) * 2000


async def fill(store: Store, topic: str, n: int, start: int = 0) -> list[str]:
    """Append n messages (about 2 KiB each); returns their ids in order."""
    ids = []
    for lo in range(start, start + n, 100):
        msgs = [Message(topic, body(i), keys=(f"k{i}",)) for i in range(lo, min(lo + 100, start + n))]
        ids += [r.message_id for r in await store.append_many(msgs)]
    return ids


def closed(store: Store) -> int:
    """How many segments are closed (the active one is never tiered)."""
    return store.commitlog.write_pos // SEG


def local_segments(store: Store) -> list[int]:
    return sorted(int(n) for n in os.listdir(store.commitlog.dir) if n.isdigit())


def objects(s3: S3Server, bucket: str) -> list[str]:
    return sorted(o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket).get("Contents", []))


def view(msgs: list[Message]) -> list[tuple]:
    return [(m.message_id, m.body, m.keys, m.queue_id, m.queue_offset, m.commitlog_offset) for m in msgs]


async def test_tiered_segments_read_back_exactly(tmp_path, s3, bucket):
    store = await Store.open(config(str(tmp_path / "d"), s3.endpoint, bucket))
    try:
        store.create_topic("t", queues=2)
        ids = await fill(store, "t", 1800)  # about 3.6 segments
        before = {q: store.read("t", q, 0, None, 10_000) for q in range(2)}
        raw_before = read_range(store, "t", 0, 0, 10_000, 10_000, 1 << 30)
        chunk_before = store.read_log_chunk(0, 1 << 16)  # what a replica is sent
        assert sum(map(len, before.values())) == 1800

        assert await store.tier_now() == 0  # younger than tier_after (24h)
        n = closed(store)
        assert n >= 3
        assert await store.tier_now(now_ms() + 2 * DAY_MS) == n
        assert local_segments(store) == [n * SEG]
        assert store.commitlog.min_offset == 0 and store.commitlog.local_min_offset == n * SEG
        assert objects(s3, bucket) == [f"node1/commitlog/{b * SEG:020d}.seg" for b in range(n)]
        head = s3.client().head_object(Bucket=bucket, Key=f"node1/commitlog/{0:020d}.seg")
        assert head["ContentLength"] == SEG and len(head["Metadata"]["sha256"]) == 64
        assert not os.listdir(tmp_path / "d" / "tier" / "uploading")
        assert store.min_offset("t", 0) == 0  # tiering is not retention

        # a pop from a cold cache fetches what it needs and hands out every message once
        popped = []
        while len(popped) < 1800:
            got = await store.pop("g", "t", 32, 60_000)
            assert got
            popped += [p.message.message_id for p in got]
        assert sorted(popped) == sorted(ids)

        with pytest.raises(TieredRangeNotCached):
            store._tier.cache.drop_segment(0)
            store.read("t", 0, 0, 1)  # not a KeyError: a reader must not skip it

        client = LocalStoreClient(store)
        for q in range(2):
            assert view(await client.read("t", q, 0, None, 10_000)) == view(before[q])
        first = before[0][0]
        assert view(await client.get_by_id(first.message_id)) == view([first])
        assert view([await client.get_message(first.commitlog_offset)]) == view([first])
        # a cold raw read takes a step at a time (store/cold_reads.py); read on, as the read API does
        records, at = [], 0
        while at < len(raw_before):
            raw = await client.read_raw("t", 0, at, 10_000, 10_000, 1 << 30)
            assert raw.first == at and 0 < len(raw) <= len(raw_before) - at
            records += [raw.data[a : a + n] for a, n in zip(raw.starts, raw.sizes, strict=True)]
            at += len(raw)
        assert records == [
            raw_before.data[a : a + n] for a, n in zip(raw_before.starts, raw_before.sizes, strict=True)
        ]
        assert store.cold.reads > 1
        store._tier.cache.drop_segment(0)
        assert await replication_chunk(store, 0, 1 << 16) == chunk_before
    finally:
        await store.close()

    # reopened: recovery counts tiered segments as stored, reads still serve them
    store = await Store.open(config(str(tmp_path / "d"), s3.endpoint, bucket))
    try:
        assert store.min_offset("t", 0) == 0 and store.commitlog.min_offset == 0
        client = LocalStoreClient(store)
        assert view(await client.read("t", 1, 0, None, 10_000)) == view(before[1])
    finally:
        await store.close()
    with pytest.raises(StoreError, match="object storage"):
        await Store.open(StoreConfig(data_dir=str(tmp_path / "d"), segment_size=SEG))


async def test_tier_after_local_size(tmp_path, s3, bucket):
    store = await Store.open(config(str(tmp_path / "d"), s3.endpoint, bucket, tier_after_bytes=2 * SEG))
    try:
        store.create_topic("t", queues=1)
        await fill(store, "t", 1800)
        n = closed(store)
        assert await store.tier_now() == n - 1  # the newest 2 MiB (the active segment and one more) stay
        assert local_segments(store) == [(n - 1) * SEG, n * SEG]
    finally:
        await store.close()


CHILD = """
import asyncio, sys, time
sys.path.insert(0, {root!r})
from store import Store, StoreConfig
from store.message import now_ms
from tests.store.test_tiering import config, fill

async def main():
    store = await Store.open(config({data!r}, {endpoint!r}, {bucket!r}))
    store.create_topic("t", queues=1)
    await fill(store, "t", 900)
    print("FILLED", store.commitlog.write_pos // (1 << 20), flush=True)
    def after_part(base, n):
        if n == 2:
            print("PART", base, n, flush=True)
            time.sleep(60)
    store._tier.after_part = after_part
    await store.tier_now(now_ms() + 2 * 86_400_000)

asyncio.run(main())
"""


async def test_kill_during_upload_resumes(tmp_path, s3, bucket):
    data = str(tmp_path / "d")
    code = CHILD.format(root=str(ROOT), data=data, endpoint=s3.endpoint, bucket=bucket)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        lines = []
        deadline = time.monotonic() + 30
        while not lines or not lines[-1].startswith("PART"):
            line = await asyncio.to_thread(child.stdout.readline)
            assert line and time.monotonic() < deadline, lines
            lines.append(line.strip())
        os.kill(child.pid, signal.SIGKILL)
        n = int(lines[0].split()[1])  # closed segments
    finally:
        child.kill()
        child.wait()
    # killed after 2 of the first segment's 4 parts: nothing completed, nothing deleted locally
    assert lines[-1] == "PART 0 2"
    assert os.listdir(os.path.join(data, "tier", "uploading")) == [f"{0:020d}.json"]
    assert os.path.exists(os.path.join(data, "commitlog", f"{0:020d}"))
    assert objects(s3, bucket) == []

    store = await Store.open(config(data, s3.endpoint, bucket))
    try:
        parts: list[tuple[int, int]] = []
        store._tier.after_part = lambda base, n: parts.append((base, n))
        assert await store.tier_now(now_ms() + 2 * DAY_MS) == n
        assert [p for b, p in parts if b == 0] == [3, 4]  # parts 1 and 2 were kept from before
        assert [p for b, p in parts if b == SEG] == [1, 2, 3, 4]
        assert local_segments(store) == [n * SEG]
        msgs = await LocalStoreClient(store).read("t", 0, 0, None, 10_000)
        assert [m.body for m in msgs] == [body(i) for i in range(900)]
    finally:
        await store.close()


async def test_unreachable_object_store(tmp_path, s3, bucket):
    store = await Store.open(config(str(tmp_path / "d"), s3.endpoint, bucket))
    client = LocalStoreClient(store)
    try:
        store.create_topic("t", queues=1)
        await fill(store, "t", 900)
        before = view(store.read("t", 0, 0, None, 10_000))
        n = closed(store)
        assert await store.tier_now(now_ms() + 2 * DAY_MS) == n
        s3.pause()
        try:
            # local traffic goes on: appends, and pops of local data
            store.create_topic("local", queues=1)
            await fill(store, "local", 600, start=5000)  # closes the active segment
            got = await store.pop("g", "local", 32, 60_000)
            assert [p.message.body for p in got] == [body(i) for i in range(5000, 5032)]
            # uploads fail and are retried later; the segment stays local
            t0 = time.monotonic()
            assert await store.tier_now(now_ms() + 2 * DAY_MS) == 0
            assert store.tier_stats()["tier_reachable"] == 0
            assert closed(store) > n and n * SEG in local_segments(store)
            # a read of a tiered range fails with a clear error, UNAVAILABLE to the processor
            with pytest.raises(TieredStorageUnavailable, match="tiered storage unreachable") as e:
                await client.read("t", 0, 0, None, 10)
            assert store_error(e.value).kind is ErrorKind.UNAVAILABLE
            assert time.monotonic() - t0 < 20
        finally:
            s3.resume()
        assert view(await client.read("t", 0, 0, None, 10_000)) == before
        assert await store.tier_now(now_ms() + 2 * DAY_MS) == closed(store) - n
        assert store.tier_stats()["tier_reachable"] == 1
    finally:
        await store.close()


async def test_retention_deletes_tiered_objects(tmp_path, s3, bucket):
    store = await Store.open(config(str(tmp_path / "d"), s3.endpoint, bucket))
    try:
        store.create_topic("t", queues=1, retention_ms=DAY_MS)
        await fill(store, "t", 1800)
        n = closed(store)
        assert await store.tier_now(now_ms() + 2 * DAY_MS) == n
        assert len(objects(s3, bucket)) == n
        assert await store.apply_retention(now_ms() + 3 * DAY_MS) == n
        assert store.commitlog.min_offset == n * SEG
        assert store.min_offset("t", 0) > 0
        await store.tier_now()
        assert objects(s3, bucket) == []
        assert store.tier_stats()["tiered_segments"] == 0
        # the topic's own retention hides the rest too (the active segment stays, unreadable)
        assert await LocalStoreClient(store).read("t", 0, 0, None, 10_000) == []
        assert store.min_offset("t", 0) == store.max_offset("t", 0) == 1800
    finally:
        await store.close()


async def test_a_small_cache_still_serves_everything(tmp_path, s3, bucket):
    """Eviction under reads that span more than the cache holds: pops and reads still return every
    message once, and the cache stays within its bound."""
    store = await Store.open(config(str(tmp_path / "d"), s3.endpoint, bucket, tier_cache_bytes=2 * SEG))
    try:
        store.create_topic("t", queues=4)
        ids = await fill(store, "t", 1800)
        before = {q: view(store.read("t", q, 0, None, 10_000)) for q in range(4)}
        assert await store.tier_now(now_ms() + 2 * DAY_MS) == closed(store)
        popped: list[str] = []
        while len(popped) < len(ids):
            got = await store.pop("g", "t", 64, 60_000)
            assert got
            popped += [p.message.message_id for p in got]
            assert store.tier_stats()["tier_cache_bytes"] <= 2 * SEG
        assert sorted(popped) == sorted(ids)
        client = LocalStoreClient(store)
        for q in range(4):  # 4.x pull-sized reads, each within what the cache holds
            got = []
            while len(got) < len(before[q]):
                got += view(await client.read("t", q, len(got), None, 32))
            assert got == before[q]
        with pytest.raises(TieredStorageUnavailable, match="keeps leaving the cache"):
            await client.read("t", 0, 0, None, 10_000)  # spans more than the cache holds
        assert await store.pop("g", "t", 64, 60_000) == []
    finally:
        await store.close()
