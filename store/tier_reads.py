"""Reading through the tier's cache: the one rule every reader of tiered ranges follows.

A synchronous read below the local commit log range raises `TieredRangeNotCached` when a block it
needs is not in the tier's cache (tiering.py). The reader then fetches that range (`fetch`: ranged
GETs into the cache) and reads again from its start. Reads make progress through ever new ranges,
so how many *different* ranges one read fetches is not bounded; what ends it is a range it already
fetched missing again `MAX_REFETCHES` times: its blocks are evicted before it can use them (what it
spans does not fit `tier_cache_bytes`, or other readers keep pushing it out), and it fails with
TieredStorageUnavailable ("read less at a time") instead of looping. A pop's scan resumes at the
queue that missed, an offset read's caller reads less, so every reader that follows this rule
either progresses or fails, never spins.

`TierFetches` is one read's account of what it fetched (for loops that do more than read between
tries: pop, forward_to_dlq); `read_through(read, fetch, *args)` is the whole loop for a plain read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from .errors import TieredRangeNotCached, TieredStorageUnavailable

MAX_REFETCHES = 3  # misses of a range this read already fetched before it gives up

T = TypeVar("T")
Fetch = Callable[[TieredRangeNotCached], Awaitable[None]]


class TierFetches:
    """The ranges one read fetched and how often one of them missed again."""

    __slots__ = ("fetched", "again")

    def __init__(self) -> None:
        self.fetched: set[int] = set()
        self.again = 0

    async def fetch(self, miss: TieredRangeNotCached, fetch: Fetch | None) -> None:
        """Bring `miss`'s range into the cache before the read tries again, or raise
        TieredStorageUnavailable: no tier to fetch from, the object store failed, or ranges this
        read fetched keep leaving the cache."""
        if fetch is None:
            raise TieredStorageUnavailable(f"tiered range {miss.offset} not cached (tiered storage is off)")
        if miss.offset in self.fetched:
            self.again += 1
            if self.again >= MAX_REFETCHES:
                raise TieredStorageUnavailable(
                    f"tiered range {miss.offset} keeps leaving the cache: read less at a time"
                )
        self.fetched.add(miss.offset)
        await fetch(miss)


async def read_through(read: Callable[..., T], fetch: Fetch | None, *args: object) -> T:
    """`read(*args)`, a synchronous read of the store, fetching each tiered range it misses and
    reading again (the module's rule)."""
    try:
        return read(*args)  # (the common case: no miss, no object made)
    except TieredRangeNotCached as first:
        miss = first
    fetches = TierFetches()
    while True:
        await fetches.fetch(miss, fetch)
        try:
            return read(*args)
        except TieredRangeNotCached as again:
            miss = again
