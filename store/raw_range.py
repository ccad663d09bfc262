"""Raw range reads of one queue: the commit log bytes of its records, without decoding them.

The read API's column-wise decoder (gateway/http/read_records.py) turns these bytes into Arrow
batches, which is what lets the Spark source keep up with Spark's own file readers. The consume
queue gives each entry's commit log position and size; records lying close together (at most
`MAX_GAP` apart, in one segment) are read with one `pread` per span. Reads run on the calling
thread (the event loop), like `Store.read`'s."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported on first use: the store opens without it
    import numpy as np

    from .store import Store

MAX_GAP = 16 * 1024  # records of other queues up to this size between two records are read over


@dataclass(slots=True)
class RawRange:
    """Records of consecutive queue offsets `first`, `first + 1`, ...: record i is
    `data[starts[i] : starts[i] + sizes[i]]`, or no longer stored (retention) when `starts[i]`
    is -1. Each record still has to be checked (length, magic, queue id and offset, CRC32) as
    `Store.read` checks it."""

    first: int
    data: bytes
    starts: np.ndarray  # int64 per record
    sizes: np.ndarray  # int64 per record

    def __len__(self) -> int:
        return len(self.starts)


def read_range(
    store: Store, topic: str, queue_id: int, start: int, end: int, max_records: int, max_bytes: int
) -> RawRange:
    """Up to `max_records` records (about `max_bytes`, at least one) of the queue with offsets in
    [start, end) clamped to what is stored (none: an empty range). TopicNotFound and the store's
    other errors pass through."""
    import numpy as np

    first, entries_it = store.queue_entries(topic, queue_id, start, end, max_records)
    # (commit log offset, size, tag hash, store time) per entry, without keeping a tuple per
    # entry alive (thousands of live tuples per chunk set off the cyclic GC over the heap)
    flat = np.fromiter(itertools.chain.from_iterable(entries_it), dtype=np.int64)
    if not len(flat):
        empty = np.zeros(0, dtype=np.int64)
        return RawRange(first, b"", empty, empty)
    entries = flat.reshape(-1, 4)
    clos, sizes = entries[:, 0].copy(), entries[:, 1].copy()
    take, groups = _plan(clos, sizes, store.segment_size, max_bytes)
    clos, sizes = clos[:take], sizes[:take]
    data, starts = _read_groups(store, clos, sizes, groups)
    return RawRange(first, data, starts, sizes)


def _plan(
    clos: np.ndarray, sizes: np.ndarray, seg_size: int, max_bytes: int
) -> tuple[int, list[tuple[int, int]]]:
    """How many of the entries to read now (about `max_bytes` of commit log) and how: groups
    (first, last) of entry indices read with one pread each. Neighbours at most MAX_GAP apart in
    one segment share a group (the bytes between them are read over)."""
    import numpy as np

    n = len(clos)
    if n > 1 and bool((clos[1:] >= clos[:-1]).all()):  # (equal: a record compaction removed, size 0)
        gaps = clos[1:] - (clos[:-1] + sizes[:-1])
        join = (gaps >= 0) & (gaps <= MAX_GAP) & (clos[1:] // seg_size == clos[:-1] // seg_size)
        cost = sizes.copy()
        cost[1:] += np.where(join, gaps, 0)
        take = min(n, max(1, int(np.searchsorted(np.cumsum(cost), max_bytes, side="right"))))
        join = join[: take - 1]
    else:  # one entry, or not in commit log order: one pread per record
        take = min(n, max(1, int(np.searchsorted(np.cumsum(sizes), max_bytes, side="right"))))
        join = np.zeros(max(take - 1, 0), dtype=bool)
    cuts = np.flatnonzero(~join) + 1  # entry indices where a new group starts
    first = np.concatenate(([0], cuts)).tolist()
    last = (np.concatenate((cuts, [take])) - 1).tolist()
    return take, list(zip(first, last, strict=True))


def _read_groups(
    store: Store, clos: np.ndarray, sizes: np.ndarray, groups: list[tuple[int, int]]
) -> tuple[bytes, np.ndarray]:
    """The bytes of each group's span, concatenated, and each entry's start in them (-1: the
    record is no longer stored)."""
    import numpy as np

    parts: list[bytes] = []
    starts = np.full(len(clos), -1, dtype=np.int64)
    at = 0
    for a, b in groups:
        lo = int(clos[a])
        try:
            data = store.read_log(lo, int(clos[b] + sizes[b]) - lo)
        except KeyError:  # removed by retention meanwhile: what is left, one record at a time
            for k in range(a, b + 1):
                try:
                    data = store.read_log(int(clos[k]), int(sizes[k]))
                except KeyError:
                    continue
                parts.append(data)
                starts[k] = at
                at += len(data)
        else:
            parts.append(data)
            starts[a : b + 1] = clos[a : b + 1] - lo + at
            at += len(data)
    return b"".join(parts), starts
