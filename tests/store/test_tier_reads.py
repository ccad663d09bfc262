"""The one rule of reads through the tier's cache (store/tier_reads.py): a read that keeps meeting
new ranges progresses however many it fetches; one whose fetched range keeps leaving the cache
fails with TieredStorageUnavailable after MAX_REFETCHES; without a tier it fails at once."""

from __future__ import annotations

import pytest

from store.errors import TieredRangeNotCached, TieredStorageUnavailable
from store.tier_reads import MAX_REFETCHES, TierFetches, read_through


class Cache:
    """A read of ranges 0..n-1 that misses the first range not in `have`; `evict` takes a fetched
    range out again after each fetch (a cache too small for the read)."""

    def __init__(self, n: int, evict: int | None = None) -> None:
        self.n, self.evict = n, evict
        self.have: set[int] = set()
        self.fetches: list[int] = []

    def read(self, tag: str) -> str:
        for r in range(self.n):
            if r not in self.have:
                raise TieredRangeNotCached(r, 1)
        return tag

    async def fetch(self, miss: TieredRangeNotCached) -> None:
        self.fetches.append(miss.offset)
        self.have.add(miss.offset)
        if self.evict is not None:
            self.have.discard(self.evict)


async def test_many_new_ranges_progress():
    c = Cache(20)
    assert await read_through(c.read, c.fetch, "done") == "done"
    assert c.fetches == list(range(20))  # more ranges than any retry bound: each fetched once


async def test_no_miss_no_fetch():
    c = Cache(0)
    assert await read_through(c.read, c.fetch, "x") == "x"
    assert c.fetches == []


async def test_a_range_that_keeps_leaving_the_cache_fails():
    c = Cache(2, evict=0)  # fetching range 1 evicts range 0: the read can never hold both
    with pytest.raises(TieredStorageUnavailable, match="keeps leaving the cache"):
        await read_through(c.read, c.fetch, "x")
    assert c.fetches.count(0) == MAX_REFETCHES  # the first fetch and the refetches before giving up


async def test_without_a_tier():
    c = Cache(1)
    with pytest.raises(TieredStorageUnavailable, match="tiered storage is off"):
        await read_through(c.read, None, "x")


async def test_one_account_per_read():
    """A loop that does more than read between tries (pop) keeps one TierFetches."""
    c = Cache(1)
    fetches = TierFetches()
    for _ in range(MAX_REFETCHES):
        await fetches.fetch(TieredRangeNotCached(7, 1), c.fetch)
    with pytest.raises(TieredStorageUnavailable):
        await fetches.fetch(TieredRangeNotCached(7, 1), c.fetch)
    assert c.fetches == [7] * MAX_REFETCHES
