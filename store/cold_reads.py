"""Cold reads: offset reads of old data (a tiered range, or one far behind the log's end) kept
apart from the live tail, so that a job reading months back does not slow today's consumers.

Everything of a LOCAL store runs on one event loop, and a bulk read of old data does its work on
it: a range of 16 MiB of tiered records is 16 block reads from the tier's cache, their joins and
copies, and, for blocks not cached, fetches that make the read start over. A live subscriber's
next delivery waits behind all of that. So a cold read (`ColdReads.read`):

- takes at most `cold_read_chunk_bytes` (256 KiB) of records at a time (its caller reads on: the
  read API loops until its range is done, and so does the Spark source), so one step holds the
  loop for a fraction of a millisecond;
- runs only with one of `cold_read_buffer_bytes // cold_read_chunk_bytes` (4) places: cold reads
  beyond that wait their turn, and what cold reads hold in memory at once stays within the budget;
- yields to the loop after each step, so the live tail's callbacks run between two of them.

The object store GETs of tiered blocks run on the tier's own small pool of threads
(`tier_fetch_threads`, tiering.py), not the loop's default executor that other work shares.
A read is cold when the queue entry it starts at points below the local commit log (tiered) or
more than `cold_read_lag_bytes` behind the log's end (likely no longer in the page cache)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from .tier_reads import Fetch, read_through

if TYPE_CHECKING:
    from .catalog import Catalog
    from .commitlog import CommitLog
    from .config import StoreConfig

T = TypeVar("T")


class ColdReads:
    """Which reads are cold, and the gate they pass (see the module docstring)."""

    def __init__(self, config: StoreConfig, catalog: Catalog, commitlog: CommitLog) -> None:
        self.catalog = catalog
        self.commitlog = commitlog
        self.chunk_bytes = config.cold_read_chunk_bytes
        self.lag_bytes = config.cold_read_lag_bytes
        self.places = max(1, config.cold_read_buffer_bytes // self.chunk_bytes)
        self._gate: asyncio.Semaphore | None = None  # (made on first use, in the store's loop)
        self.reads = 0  # cold reads done (tests, stats)

    def is_cold(self, topic: str, queue_id: int, start: int) -> bool:
        """Whether an offset read of `topic`/`queue_id` from `start` reads old data."""
        cq = self.catalog.cqs.get((topic, queue_id))
        if cq is None or cq.compacted is not None:
            return False
        start = max(start, cq.min_offset)
        if start >= cq.max_offset:
            return False
        clo = cq.entry(start)[0]
        cl = self.commitlog
        return clo < cl.local_min_offset or cl.write_pos - clo > self.lag_bytes

    def step(
        self, topic: str, queue_id: int, start: int, max_records: int, max_bytes: int
    ) -> tuple[int, int]:
        """What one cold step of a raw range read takes: (records, bytes), at most `chunk_bytes`
        and about as many records as fit in it (by the first one's size: the queue entries a step
        parses cost as much as the bytes it copies)."""
        max_bytes = min(max_bytes, self.chunk_bytes)
        cq = self.catalog.cqs.get((topic, queue_id))
        if cq is not None and cq.min_offset <= start < cq.max_offset:
            size = cq.entry(start)[1]
            max_records = min(max_records, max(1, 2 * max_bytes // max(size, 1)))
        return max_records, max_bytes

    async def read(self, read: Callable[..., T], fetch: Fetch | None, *args: object) -> T:
        """`read(*args)` through the tier's cache (tier_reads.py), as a cold read: in its turn,
        then a yield to the loop. The caller caps what `read` takes at `chunk_bytes`."""
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.places)
        async with self._gate:
            out = await read_through(read, fetch, *args)
            self.reads += 1
            await asyncio.sleep(0)  # the live tail's callbacks run before the next cold step
        return out
