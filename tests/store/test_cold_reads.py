"""Cold reads (store/cold_reads.py, issue 51 item 4): which offset reads are cold, the step a cold
raw read takes, and the bounded number of cold reads at once. (A tiered range: tests/store/
test_tiering.py reads one back through the cold path; bench/cold_read_bench.py measures the live
tail's latency beside a cold reader.)"""

from __future__ import annotations

import asyncio

from messaging_processor.store_client import LocalStoreClient
from store import Message
from store.errors import TieredRangeNotCached

BODY = b"x" * 1000


async def _filled(make_store, n: int = 200, **config):
    config.setdefault("cold_read_lag_bytes", 64 * 1024)
    config.setdefault("cold_read_chunk_bytes", 8 * 1024)
    config.setdefault("cold_read_buffer_bytes", 16 * 1024)
    s = await make_store(**config)
    s.create_topic("t", queues=1)
    for _ in range(n):
        await s.append(Message("t", BODY))
    return s


async def test_reads_far_behind_the_log_end_are_cold_and_the_tail_is_not(make_store):
    s = await _filled(make_store)
    cold = s.cold
    assert cold.is_cold("t", 0, 0)  # ~200 KB behind the end, past the 64 KiB lag
    assert not cold.is_cold("t", 0, 199)  # the newest record
    assert not cold.is_cold("t", 0, 200)  # nothing there yet: a tail read
    assert not cold.is_cold("nope", 0, 0)


async def test_a_cold_raw_read_takes_one_step_and_reading_on_gets_everything(make_store):
    s = await _filled(make_store)
    client = LocalStoreClient(s)
    whole = await client.read("t", 0, 0, None, 1000)
    assert len(whole) == 200

    first = await client.read_raw("t", 0, 0, 10_000, 10_000, 1 << 30)
    assert 0 < len(first) < 200 and int(first.sizes.sum()) <= 8 * 1024  # one step of at most a chunk
    at, got, steps = 0, 0, 0
    while at < 200:
        raw = await client.read_raw("t", 0, at, 10_000, 10_000, 1 << 30)
        assert raw.first == at and len(raw)
        got += len(raw)
        at += len(raw)
        steps += 1
    assert got == 200 and steps > 1
    reads_before = s.cold.reads
    tail = await client.read_raw("t", 0, 199, 10_000, 10_000, 1 << 30)
    assert len(tail) == 1 and s.cold.reads == reads_before  # the live tail does not queue for a turn


async def test_no_more_cold_reads_at_once_than_the_buffer_holds(make_store):
    s = await _filled(make_store, n=1)  # 16 KiB buffer / 8 KiB chunks: 2 places
    cold = s.cold
    assert cold.places == 2
    release = asyncio.Event()
    active = peak = 0
    missed: set[int] = set()

    def read(i: int) -> int:
        if i not in missed:  # each read misses the tier's cache once, then fetches
            missed.add(i)
            raise TieredRangeNotCached(i, 1)
        return i

    async def fetch(_miss: TieredRangeNotCached) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await release.wait()
        active -= 1

    readers = [asyncio.ensure_future(cold.read(read, fetch, i)) for i in range(6)]
    while active < 2:  # the two places taken; the other four wait their turn
        await asyncio.sleep(0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert active == 2 and len(missed) == 2
    release.set()
    assert sorted(await asyncio.gather(*readers)) == list(range(6))
    assert peak == 2 and cold.reads == 6
