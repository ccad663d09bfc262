"""Reads: messages by commit log offset, id or key; offset-based reads of one queue (4.x pull
consumers, Spark) and its raw entries for bulk readers; and the offsets a group commits."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from . import codec
from .catalog import Catalog
from .commitlog import CommitLog
from .consumer import ConsumerProgress
from .filters import ALL, Filter
from .index import MessageIndex
from .message import Message

log = logging.getLogger("store")


class Reader:
    def __init__(
        self, commitlog: CommitLog, index: MessageIndex, catalog: Catalog, progress: ConsumerProgress
    ) -> None:
        self.commitlog = commitlog
        self.index = index
        self.catalog = catalog
        self.progress = progress

    def get_message(self, commitlog_offset: int, size: int | None = None) -> Message:
        """The message stored at a commit log offset."""
        if size is None:
            size = codec.record_size_at(self.commitlog.read(commitlog_offset, 4), 0)
        buf = self.commitlog.read(commitlog_offset, size)
        codec.check(buf, 0, len(buf))
        return codec.decode(buf, 0, commitlog_offset)

    def get_by_id(self, message_id: str) -> list[Message]:
        return [m for m in self._live(self.index.by_id(message_id)) if m.message_id == message_id]

    def get_by_key(self, key: str) -> list[Message]:
        return [m for m in self._live(self.index.by_key(key)) if key in m.keys]

    def _live(self, offsets: Iterable[int]) -> list[Message]:
        """The messages at these offsets still stored and still retained by their topic (per-topic
        retention moves a queue's min offset past records whose segment stays: retention.py)."""
        low, cqs = self.commitlog.min_offset, self.catalog.cqs
        out = []
        for m in [self.get_message(o) for o in offsets if o >= low]:
            cq = cqs.get((m.topic, m.queue_id))
            if cq is None or m.queue_offset >= cq.min_offset or cq.compacted is not None:
                out.append(m)
        return out

    def read(
        self,
        topic: str,
        queue_id: int,
        start: int,
        end: int | None = None,
        max_messages: int = 32,
        filter: Filter = ALL,
    ) -> list[Message]:
        """Messages with queue offsets in [start, end) (clamped to what is stored), at most max_messages.

        Replayable: the same arguments return the same messages while they are retained.
        """
        cq = self.catalog.queue(topic, queue_id)
        start = max(start, cq.min_offset)
        end = cq.max_offset if end is None else min(end, cq.max_offset)
        out: list[Message] = []
        hashes = filter.hashes
        skip = filter.skip
        off = start
        while off < end and len(out) < max_messages:
            n = min(end - off, 256)
            for clo, size, th, _ts in cq.entries(off, n):
                if (hashes is None or th in hashes) and (skip is None or not skip(th)):
                    m = self.commitlog.read_message(clo, size)
                    if m is not None and filter.matches(m):
                        out.append(m)
                        if len(out) >= max_messages:
                            return out
            off += n
        return out

    def tail(self, topic: str, positions: dict[int, int], max_messages: int) -> list[Message]:
        """Up to `max_messages` messages of `topic` at or after each queue's position (queue id ->
        next offset; a queue missing from `positions` is read from its first retained offset), the
        oldest first across queues (by commit log offset: the order they were stored in, so a
        publisher's messages spread over queues round robin come out in order, and no busy queue
        starves the others). Records compaction removed are passed over."""
        read = self.commitlog.read_message
        picks = self._tail_picks(topic, positions, max_messages)
        return [m for clo, size in picks if (m := read(clo, size)) is not None]

    def tail_records(
        self, topic: str, positions: dict[int, int], max_messages: int
    ) -> list[tuple[int, bytes]]:
        """`tail`, as (commit log offset, record) pairs: each record's bytes as stored (checked:
        length, magic, CRC), not decoded. A store node sends them on as they are
        (cluster/store_wire.py)."""
        read = self.commitlog.read_record
        picks = self._tail_picks(topic, positions, max_messages)
        return [(clo, r) for clo, size in picks if (r := read(clo, size))]

    def _tail_picks(self, topic: str, positions: dict[int, int], max_messages: int) -> list[tuple[int, int]]:
        """(commit log offset, size) of what `tail` reads, in commit log order."""
        picked: list[tuple[int, int]] = []
        qs = self.catalog.readable(topic)
        for cq in qs:
            off = max(positions.get(cq.queue_id, 0), cq.min_offset)
            end = cq.max_offset
            got = 0
            while off < end and got < max_messages:
                n = min(end - off, max_messages - got)
                for clo, size, _th, _ts in cq.entries(off, n):
                    if size:
                        picked.append((clo, size))
                        got += 1
                off += n
        if len(qs) > 1:
            picked.sort()
        return picked[:max_messages]

    # Raw range reads for bulk consumers (the gateway's read API for Spark): record bytes instead of
    # one decoded Message per record. Record layout: store/codec.py and docs/store.md.
    def queue_entries(
        self, topic: str, queue_id: int, start: int, end: int, max_entries: int
    ) -> tuple[int, Iterable]:
        """(first offset, entries) of one queue in [start, end) clamped to what is stored: at most
        `max_entries` (commit log offset, size, tag hash, store time) tuples, lazily."""
        cq = self.catalog.queue(topic, queue_id)
        first = max(start, cq.min_offset)
        return first, cq.entries(first, max(0, min(max_entries, min(end, cq.max_offset) - first)))

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after `timestamp_ms`."""
        return self.catalog.queue(topic, queue_id).offset_for_timestamp(timestamp_ms)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Offset-based consumers: everything below `offset` is consumed by `group`."""
        self.catalog.group(group)
        cq = self.catalog.queue(topic, queue_id)
        offset = max(min(offset, cq.max_offset), 0)
        self.progress.committed(self.progress.get(group, topic), queue_id, offset)

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's consumed-up-to offset for a queue (-1 when it never consumed it)."""
        st = self.progress.states.get((group, topic))
        if st is None or queue_id not in st.queues:
            return -1
        return st.queues[queue_id].ack_wm

    def backlog(self, group: str, topic: str) -> int:
        """Messages of `topic` not yet acked by `group`."""
        qs = self.catalog.readable(topic)
        st = self.progress.states.get((group, topic))
        if st is None:
            return sum(cq.max_offset - cq.min_offset for cq in qs)
        return st.backlog({cq.queue_id: cq.max_offset for cq in qs})

    def inflight_count(self, group: str, topic: str) -> int:
        st = self.progress.states.get((group, topic))
        return 0 if st is None else sum(len(q.inflight) for q in st.queues.values())
