"""Retention: whole commit log segments are deleted, oldest first, once every topic with data in
one is past its age (`retention_ms`) or size (`retention_bytes`) limit. `SegmentStats` holds what
that is decided from: per segment and topic, the bytes and the newest store timestamp. Tiered
segments (tiering.py) are decided alike: their manifest entries go, their objects follow."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .catalog import Catalog
from .commitlog import CommitLog
from .config import StoreConfig
from .index import MessageIndex
from .message import now_ms

if TYPE_CHECKING:
    import asyncio

    from .scheduling import DelayedMessages, Transactions


class Checkpoints(Protocol):
    """What retention asks of the checkpointer (`checkpoint.Checkpointer` is it): entries into
    their files, under its lock, before files are rewritten."""

    lock: asyncio.Lock

    async def checkpoint_locked(self) -> None: ...


class SegmentStats:
    """Per segment base offset, per topic: [bytes, newest store timestamp]. Counted when a record
    is durable (and in recovery's replay), recorded in each checkpoint."""

    __slots__ = ("segment_size", "by_base")

    def __init__(self, segment_size: int) -> None:
        self.segment_size = segment_size
        self.by_base: dict[int, dict[str, list[int]]] = {}

    def load(self, saved: dict[str, dict[str, list[int]]]) -> None:
        """From a checkpoint (see `to_json`)."""
        self.by_base = {int(k): v for k, v in saved.items()}

    def to_json(self) -> dict[str, dict[str, list[int]]]:
        return {str(k): v for k, v in list(self.by_base.items())}  # (list: the IO thread calls this)

    def count(self, clo: int, topic: str, size: int, ts: int) -> None:
        """One record."""
        base = clo - clo % self.segment_size
        seg = self.by_base.get(base)
        if seg is None:
            seg = self.by_base[base] = {}
        st = seg.get(topic)
        if st is None:
            seg[topic] = [size, ts]
        else:
            st[0] += size
            if ts > st[1]:
                st[1] = ts

    def add(self, base: int, per_topic: dict[str, list[int]]) -> None:
        """A batch of records of one segment: per topic [bytes, store timestamp of the last]."""
        seg = self.by_base.setdefault(base, {})
        for topic, (nbytes, ts) in per_topic.items():
            st = seg.get(topic)
            if st is None:
                seg[topic] = [nbytes, ts]
            else:
                st[0] += nbytes
                st[1] = ts


class Retention:
    def __init__(
        self,
        config: StoreConfig,
        catalog: Catalog,
        commitlog: CommitLog,
        index: MessageIndex,
        segments: SegmentStats,
        delays: DelayedMessages,
        transactions: Transactions,
        checkpoints: Checkpoints,
        run_io: Callable[..., asyncio.Future],
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.commitlog = commitlog
        self.index = index
        self.segments = segments
        self.delays = delays
        self.transactions = transactions
        self.checkpoints = checkpoints
        self.run_io = run_io
        # compaction.py: the lowest commit log offset of a compacted topic's record not yet copied
        # into its generation (None: none); nothing from its segment on is deleted
        self.uncompacted_floor: Callable[[], int | None] = lambda: None

    async def apply(self, now: int | None = None) -> int:
        """Delete whole old segments past every contained topic's age/size limit; returns how many."""
        now = now_ms() if now is None else now
        seg_size = self.config.segment_size
        stats = self.segments.by_base
        topic_configs = self.catalog.topic_configs
        active = self.commitlog.write_pos - self.commitlog.write_pos % seg_size
        bases = sorted(b for b in stats if b < active)
        # bytes per topic in segments newer than each one, to apply size limits
        newer: dict[str, int] = {}
        expired_by_size: set[tuple[int, str]] = set()
        for b in sorted(stats, reverse=True):
            for topic, (nbytes, _ts) in stats[b].items():
                tc = topic_configs.get(topic)
                if tc and tc.retention_bytes is not None and newer.get(topic, 0) >= tc.retention_bytes:
                    expired_by_size.add((b, topic))
                newer[topic] = newer.get(topic, 0) + nbytes
        delete_before = None
        for b in bases:
            ok = True
            for topic, (_nbytes, ts) in stats[b].items():
                tc = topic_configs.get(topic)
                if tc is not None and tc.compacted:
                    continue  # its records outlive the segment in their generation (the floor below)
                keep_ms = tc.retention_ms if tc and tc.retention_ms is not None else self.config.retention_ms
                if now - ts <= keep_ms and (b, topic) not in expired_by_size:
                    ok = False
                    break
            if not ok:
                break
            delete_before = b + seg_size
        if delete_before:
            await self.delays.move(delete_before, now)
        # never delete undelivered delayed messages (those not moved: due now, being delivered, or
        # the move failed) nor unresolved half messages (they live seconds: no need to move them)
        held = self.delays.held() + self.transactions.held()
        floor = self.uncompacted_floor()
        if floor is not None:
            held.append(floor)
        if held and delete_before is not None:
            low = min(held)
            delete_before = min(delete_before, low - low % seg_size)
        if not delete_before:
            return 0
        return await self.delete_before(delete_before)

    async def delete_before(self, offset: int) -> int:
        """Delete the whole segments that end at or before `offset` (never the one being written),
        then what points into them (segment counts, queue min offsets, index entries); returns how
        many. Retention's deletion, and a replica's, below its primary's log start (tiered
        segments included: tiering.py). Segments go
        first: a crash before the checkpoint leaves what recovery rebuilds from the log."""
        n = await self.run_io(self.commitlog.delete_segments_before, offset)
        tier = self.commitlog.tier
        if tier is not None:  # tiered segments are older: out of the manifest, objects deleted later
            n += await tier.forget_before(offset)
        if not n:
            return 0
        low = self.commitlog.min_offset
        stats = self.segments.by_base
        for b in [b for b in stats if b < low]:
            del stats[b]
        checkpoints = self.checkpoints
        async with checkpoints.lock:
            await checkpoints.checkpoint_locked()  # entries into their files: compaction rewrites files
            for cq in self.catalog.cqs.values():
                cq.set_min_by_commitlog(low)
                if cq.file_offset == cq.max_offset:
                    cq.compact()
            self.index.drop_below(low)
            await checkpoints.checkpoint_locked()
        return n
