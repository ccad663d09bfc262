"""Retention, per topic, in two steps (docs/store.md "Retention"):

- **Visibility** (`expire`): in each topic's queues the records past the topic's age limit
  (`retention_ms`; in a tiered segment `tier_retention_ms` when set) or beyond its size limit
  (`retention_bytes`, newest first, by segment) become unreadable: the queue's min offset moves
  past them, as RocketMQ's consume queue minimum does, whatever else their segment holds.
- **Deletion** (`apply`): the commit log is shared by topics, so whole segments are deleted,
  oldest first, once every topic with data in one is past its limit there. Tiered segments
  (tiering.py) are decided alike, with the tier limits: their manifest entries go, their objects
  follow.

`SegmentStats` holds what both decide from: per segment and topic, the bytes and the newest store
timestamp."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .catalog import Catalog
from .commitlog import CommitLog
from .config import HALF_TOPIC, SCHEDULE_TOPIC, StoreConfig, TopicConfig
from .consumequeue import ConsumeQueue
from .index import MessageIndex
from .message import now_ms

if TYPE_CHECKING:
    import asyncio

    from .scheduling import DelayedMessages, Transactions

HELD_TOPICS = frozenset((SCHEDULE_TOPIC, HALF_TOPIC))  # kept by the store itself until due or resolved
NO_CUT = -(1 << 62)  # a store time no record is older than


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
        """Expire what each topic no longer keeps (`expire`), then delete whole old segments past
        every contained topic's age/size limit; returns how many segments went."""
        now = now_ms() if now is None else now
        self.expire(now)
        seg_size = self.config.segment_size
        stats = self.segments.by_base
        topic_configs = self.catalog.topic_configs
        active = self.commitlog.write_pos - self.commitlog.write_pos % seg_size
        bases = sorted(b for b in stats if b < active)
        expired_by_size = self._expired_by_size()
        tiered_below = self._tiered_below()
        default = self.config.retention_ms
        delete_before = None
        for b in bases:
            ok = True
            for topic, (_nbytes, ts) in stats[b].items():
                tc = topic_configs.get(topic)
                if tc is not None and tc.compacted:
                    continue  # its records outlive the segment in their generation (the floor below)
                keep_ms = tc.keep_ms(default, b < tiered_below) if tc else default
                if now - ts <= keep_ms and (b, topic) not in expired_by_size:
                    ok = False
                    break
            if not ok:
                break
            delete_before = b + seg_size
        if delete_before:
            await self.delays.move(delete_before, now)
        low = self.held_floor()
        if low is not None and delete_before is not None:
            delete_before = min(delete_before, low - low % seg_size)
        if not delete_before:
            return 0
        return await self.delete_before(delete_before)

    def held_floor(self) -> int | None:
        """The lowest commit log offset the store itself still reads (None: none): undelivered
        delayed messages (those not moved: due now, being delivered, or the move failed),
        unresolved half messages (they live seconds: no need to move them) and a compacted topic's
        records not yet compacted. Nothing from its segment on is deleted, nor tiered."""
        held = self.delays.held() + self.transactions.held()
        floor = self.uncompacted_floor()
        if floor is not None:
            held.append(floor)
        return min(held) if held else None

    def _tiered_below(self) -> int:
        """Segments below this commit log offset are tiered (0: tiering is off)."""
        return self.commitlog.local_min_offset if self.commitlog.tier is not None else 0

    def _expired_by_size(self) -> set[tuple[int, str]]:
        """(segment base, topic) pairs beyond the topic's `retention_bytes` (counting its newer
        segments' bytes first)."""
        stats, topic_configs = self.segments.by_base, self.catalog.topic_configs
        newer: dict[str, int] = {}
        out: set[tuple[int, str]] = set()
        for b in sorted(stats, reverse=True):
            for topic, (nbytes, _ts) in stats[b].items():
                tc = topic_configs.get(topic)
                if tc and tc.retention_bytes is not None and newer.get(topic, 0) >= tc.retention_bytes:
                    out.add((b, topic))
                newer[topic] = newer.get(topic, 0) + nbytes
        return out

    def expire(self, now: int | None = None) -> int:
        """Per-topic retention as visibility, for topics with limits of their own: in each of its
        queues, the records older than its `retention_ms` (a tiered record: its
        `tier_retention_ms` when set) or in a segment beyond its `retention_bytes` become
        unreadable (the queue's min offset moves past them; it never moves back). Compacted topics
        and the store's held messages keep their own rules. Runs at open and with each `apply`;
        returns how many records went. Only topics whose oldest segment began before their limit
        are looked at (a few entry reads a queue)."""
        now = now_ms() if now is None else now
        stats = self.segments.by_base
        seg_size = self.config.segment_size
        size_cut: dict[str, int] = {}
        for b, topic in self._expired_by_size():
            size_cut[topic] = max(size_cut.get(topic, 0), b + seg_size)
        since: dict[str, int] = {}  # topic -> when the oldest segment holding it began (about)
        began = 0
        for b in sorted(stats):
            per_topic = stats[b]
            for topic in per_topic:
                since.setdefault(topic, began)
            began = max([began, *(ts for _n, ts in per_topic.values())])
        tiered_below = self._tiered_below()
        gone = 0
        for topic, t0 in since.items():
            tc = self.catalog.topic_configs.get(topic)
            if tc is None or tc.compacted or topic in HELD_TOPICS or not _own_limits(tc):
                continue  # (the store's default retention acts by whole segments, in `apply`)
            local_cut = now - tc.retention_ms if tc.retention_ms is not None else NO_CUT
            tier_cut = local_cut
            if tiered_below and tc.tier_retention_ms is not None:
                tier_cut = now - tc.tier_retention_ms
            size_clo = size_cut.get(topic, 0)
            if t0 >= max(local_cut, tier_cut) and not size_clo:
                continue  # nothing of it can be past its limits yet
            for cq in self.catalog.readable(topic):
                gone += _expire_queue(cq, size_clo, tiered_below, tier_cut, local_cut)
        return gone

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


def _own_limits(tc: TopicConfig) -> bool:
    return tc.retention_ms is not None or tc.retention_bytes is not None or tc.tier_retention_ms is not None


def _expire_queue(cq: ConsumeQueue, size_clo: int, tiered_below: int, tier_cut: int, local_cut: int) -> int:
    """Move `cq`'s min offset past its oldest records while they are expired: in a segment beyond
    the size limit (commit log offset below `size_clo`), or stored before `tier_cut` (tiered: below
    `tiered_below`) or `local_cut` (local). Store timestamps and commit log offsets increase along a
    queue, so each rule expires a prefix. How many records went."""
    lo, hi = cq.min_offset, cq.max_offset
    if lo >= hi or cq.compacted is not None:
        return 0
    clo, _size, _th, ts = cq.entry(lo)
    if clo >= size_clo and ts >= (tier_cut if clo < tiered_below else local_cut):
        return 0  # its oldest record is kept (the common case: one entry read)
    p = cq.first_at(size_clo, lo) if size_clo else lo
    t_end = cq.first_at(tiered_below, p) if tiered_below else p
    p = _first_stored_at(cq, p, t_end, tier_cut)
    if p == t_end:
        p = _first_stored_at(cq, p, hi, local_cut)
    if p > cq.min_offset:
        gone = p - cq.min_offset
        cq.min_offset = p
        return gone
    return 0


def _first_stored_at(cq: ConsumeQueue, lo: int, hi: int, ts: int) -> int:
    """The first queue offset in [lo, hi) stored at or after `ts` (hi when none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if cq.entry(mid)[3] >= ts:
            hi = mid
        else:
            lo = mid + 1
    return lo
