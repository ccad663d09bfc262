"""The latest record per key of one queue, as the store's compaction keeps it (sans-IO, pyarrow only):
what `.option("compacted", "latest")` of the gateway source returns (docs/analytics.md).

A record's key is its first message key (`keys[0]`), else its `mqtt.topic` property, else its
`ce.partitionkey` property (the CloudEvents partitioning extension, which the telemetry job sets on
its state events). Records of one key land in one queue of a compacted topic, so the latest record
of a key is the one with the highest offset in that queue. An empty body is a tombstone: a key
whose latest record is one is left out, and so are records without a key.

Compaction runs in the background over closed segments, so a read still sees superseded records and
tombstones; folding batch by batch keeps memory to one row per distinct key plus one batch. Written
with pyarrow compute (group_by / take) instead of Python loops because a queue may hold millions of
rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

KEY_PROPERTIES = ("mqtt.topic", "ce.partitionkey")  # after keys[0], in this order
_KEY = "__compaction_key"
_ROW = "__compaction_row"


def record_keys(batch: pa.RecordBatch | pa.Table) -> pa.Array:
    """The key of each row of `batch` (a batch of the source's schema): null when it has none."""
    keys = batch.column("keys")
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    has_key = pc.fill_null(pc.greater(pc.list_value_length(keys), 0), False)
    key = pc.list_element(pc.if_else(has_key, keys, pa.scalar([None], keys.type)), 0)
    props = batch.column("properties")
    if isinstance(props, pa.ChunkedArray):
        props = props.combine_chunks()
    for name in KEY_PROPERTIES:
        key = pc.coalesce(key, pc.map_lookup(props, name, "first"))
    return key


class LatestPerKey:
    """Folds record batches of one queue, given in offset order, into its latest record per key."""

    def __init__(self) -> None:
        self._kept: pa.Table | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        """Fold in the next batch (offsets above every batch added before)."""
        if not batch.num_rows:
            return
        t = pa.Table.from_batches([batch]).append_column(_KEY, record_keys(batch))
        t = t.filter(pc.is_valid(t.column(_KEY)))
        if self._kept is not None:
            t = pa.concat_tables([self._kept, t])
        rows = t.append_column(_ROW, pa.array(np.arange(t.num_rows, dtype=np.int64)))
        last = rows.group_by(_KEY, use_threads=False).aggregate([(_ROW, "max")]).column(f"{_ROW}_max")
        self._kept = t.take(last.take(pc.sort_indices(last)))  # rows in offset order

    def result(self, max_rows: int = 4096) -> Iterator[pa.RecordBatch]:
        """The latest record of each key whose latest is not a tombstone, in offset order."""
        if self._kept is None:
            return
        t = self._kept.drop_columns([_KEY])
        t = t.filter(pc.fill_null(pc.greater(pc.binary_length(t.column("body")), 0), False))
        yield from t.combine_chunks().to_batches(max_chunksize=max_rows)


def latest_per_key(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches` of one queue (offset order) reduced to the latest live record per key."""
    fold = LatestPerKey()
    for b in batches:
        fold.add(b)
    yield from fold.result()
