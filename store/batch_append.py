"""Batch records: messages of one topic and queue stored as one commit log record per up to
`BATCH_MAX_BYTES` of them (codec.py), each keeping its queue offset, consume queue entry and index
entries (`Store.append_many`, when `one_queue` says they may share records).

`BatchPlacer` is handed what it uses of the append path (appending.py `Appender`): the catalog,
the commit log, the message id factory, the round-robin positions, the segment size, the metrics,
the group commit writer, the future that stands in for a batch's earlier records, and the mapping
of a sealed queue's id (`writable`). Pure Python: the compiled append path places single records."""

from __future__ import annotations

import asyncio
import functools
import operator
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from itertools import chain, repeat
from typing import Protocol

from . import codec
from .catalog import Catalog
from .commitlog import CommitLog
from .consumequeue import ENTRY, ConsumeQueue
from .errors import MessageTooLarge
from .index import ID32, KIND_ID, MessageIndex
from .message import AppendResult, Message, entry_hash
from .writer import GroupCommitWriter, Record

_crc32 = zlib.crc32
_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)

BATCH_MAX_BYTES = 4 * 1024 * 1024  # a batch record holds at most this much (more: several records)


_OPTIONAL_FIELDS = operator.attrgetter("tag", "keys", "properties", "born_host", "message_group")


@functools.cache
def _packer(one: struct.Struct, count: int) -> struct.Struct:
    """A struct of `count` times `one`'s fields (queue or index entries of a batch, packed at once)."""
    return struct.Struct("<" + one.format.lstrip("<") * count)


class _BatchResults:
    """The results of a batch record's messages, made on demand (most callers use few of them)."""

    __slots__ = ("ids", "topic", "qid", "qoff", "clo", "poss", "sizes", "now")

    def __init__(
        self,
        ids: list[str],
        topic: str,
        qid: int,
        qoff: int,
        clo: int,
        poss: list[int],
        sizes: list[int],
        now: int,
    ) -> None:
        self.ids, self.topic, self.qid, self.qoff, self.clo = ids, topic, qid, qoff, clo
        self.poss, self.sizes, self.now = poss, sizes, now

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[AppendResult]:
        topic, qid, qoff, clo, now = self.topic, self.qid, self.qoff, self.clo, self.now
        for k, (mid, p, size) in enumerate(zip(self.ids, self.poss, self.sizes, strict=True)):
            yield _new_tuple(AppendResult, (mid, topic, qid, qoff + k, clo + p, size, now))

    def __getitem__(self, k: int | slice) -> AppendResult | list[AppendResult]:
        if isinstance(k, slice):
            return list(self)[k]
        k = range(len(self.ids))[k]  # (negative indices, IndexError)
        p = self.poss[k]
        return AppendResult(
            self.ids[k], self.topic, self.qid, self.qoff + k, self.clo + p, self.sizes[k], self.now
        )


def one_queue(msgs: Sequence[Message], compacted: set[str]) -> bool:
    """Whether the messages can share batch records: one topic (not a system one) and one queue
    choice (the same `queue_id` and message group, no other order key), not a compacted one (its records go to
    their key's queue). (Held messages, delayed or transactional, never get here: `append_many` sends those
    one record each.)"""
    first = msgs[0]
    topic, qid, group = first.topic, first.queue_id, first.message_group
    if topic[0] == "%" or topic in compacted:
        return False
    if qid < 0 and not group and any(m.order_key for m in msgs):
        return False  # each order key (a path) goes to its own queue (appending.py `Appender.place`)
    return all(m.topic == topic and m.queue_id == qid and m.message_group == group for m in msgs)


class IdFactory(Protocol):
    """appending.py `MessageIdFactory`: a new message id per call of `next`."""

    next: Callable[[], str]


class BatchPlacer:
    """Places batch records for the writer (see the module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        commitlog: CommitLog,
        ids: IdFactory,
        rr: dict[str, int],
        seg_size: int,
        metrics: dict[str, int],
        writer: GroupCommitWriter,
        done: asyncio.Future,
        writable: Callable[[str, int, int], int],
    ) -> None:
        self.catalog = catalog
        self.commitlog = commitlog
        self.ids = ids
        self.rr = rr  # next queue per topic (round robin), shared with single appends
        self.seg_size = seg_size
        self.metrics = metrics
        self.writer = writer
        self.done = done
        self._writable = writable

    def place(self, msgs: Sequence[Message], now: int, fut: asyncio.Future) -> Sequence[AppendResult]:
        """Store messages of one topic and queue as batch records (codec.py): one commit log record
        per up to `BATCH_MAX_BYTES` of them instead of one each. Every message keeps its queue
        offset, consume queue entry and index entries (pointing at its record inside the batch), so
        reads, pops and acks stay per message. The queue is the messages' `queue_id`, else their
        message group's, else the next in round robin for the whole batch."""
        first = msgs[0]
        topic = first.topic
        qs = self.catalog.topic_queues.get(topic) or self.catalog.queues(topic)
        qid = first.queue_id
        if qid < 0:
            if first.message_group:
                qid = zlib.crc32(first.message_group.encode()) % len(qs)
            else:
                qid = self.rr.get(topic, 0) % len(qs)
                self.rr[topic] = (qid + 1) % len(qs)
        elif qid >= len(qs):
            qid = self._writable(topic, qid, len(qs))
        cq = qs[qid]
        next_id = self.ids.next
        encode = codec.encode
        entry = ENTRY.pack
        id32 = ID32.pack
        index_entry = MessageIndex.encode
        th_of = entry_hash
        cl = self.commitlog
        seg_size = self.seg_size
        limit = min(BATCH_MAX_BYTES, seg_size - codec.MIN_RECORD)
        head_size = codec.BATCH_HEADER_SIZE
        out: list[AppendResult] = []
        recs: list[Record] = []
        try:
            i, n = 0, len(msgs)
            plain = not any(
                map(any, map(_OPTIONAL_FIELDS, msgs))
            )  # (C iterators: no Python frame per message)
            if plain:
                runs: list = []
                while i < n:
                    i = self._place_plain_run(msgs, i, cq, qid, now, fut, runs, recs)
                return runs[0] if len(runs) == 1 else list(chain.from_iterable(runs))
            while i < n:
                # The next run of messages that fits one batch record, placed where the record
                # should land (the log's end: moved below in the rare case it starts a segment).
                first_i = i
                start = cl.write_pos
                pos = start + head_size
                qoff = cq.next_offset
                parts: list[bytes] = []
                entries: list[bytes] = []
                idx: list[bytes] = []
                mids: list[str] = []  # messages indexed by id only (the common case) ...
                poss: list[int] = []  # ... and where they are
                keyed: list[tuple[str, tuple[str, ...], int]] = []  # the others
                hashes: set[int] = set()
                total = head_size
                while i < n:
                    msg = msgs[i]
                    mid = msg.message_id or next_id()
                    mb = mid.encode()
                    keys = msg.keys
                    rec = encode(msg, qid, qoff, now, mid, msg.born_timestamp or now)
                    th = th_of(msg)
                    size = len(rec)
                    if total + size > limit:
                        if parts:
                            break
                        raise MessageTooLarge(f"a record of {size} bytes does not fit a batch record")
                    parts.append(rec)
                    entries.append(entry(pos, size, th, now))
                    if keys or len(mb) != 32:
                        idx.append(index_entry(mid, keys, pos))
                        keyed.append((mid, keys, pos))
                    else:
                        idx.append(id32(KIND_ID, 32, mb, pos))
                        mids.append(mid)
                        poss.append(pos)
                    hashes.add(th)
                    out.append(_new_tuple(AppendResult, (mid, topic, qid, qoff, pos, size, now)))
                    pos += size
                    total += size
                    qoff += 1
                    i += 1
                if start % seg_size + total <= seg_size:
                    cl.write_pos = start + total
                    clo, filler = start, b""
                else:  # it starts the next segment: every position moves there
                    clo, pad = cl.reserve(total)
                    filler = pad or b""
                    shift = clo - start
                    entries, idx, mids, poss, keyed = [], [], [], [], []
                    for k in range(len(out) - len(parts), len(out)):
                        r = out[k]
                        msg = msgs[first_i + k - (len(out) - len(parts))]
                        at = r.commitlog_offset + shift
                        out[k] = r._replace(commitlog_offset=at)
                        entries.append(entry(at, r.size, th_of(msg), now))
                        idx.append(index_entry(r.message_id, msg.keys, at))
                        keyed.append((r.message_id, msg.keys, at))
                cq.next_offset = qoff
                last = out[-1]
                recs.append(
                    self._batch_record(
                        cq,
                        parts,
                        filler,
                        clo,
                        (last.message_id, last.queue_offset, total, now),
                        b"".join(entries),
                        b"".join(idx),
                        fut if i == n else self.done,
                        [mids, poss, keyed],
                        hashes,
                    )
                )
        finally:
            if recs:
                self.writer.put(recs)
        return out

    def _place_plain_run(
        self,
        msgs: Sequence[Message],
        i: int,
        cq: ConsumeQueue,
        qid: int,
        now: int,
        fut: asyncio.Future,
        out: list[_BatchResults],
        recs: list[Record],
    ) -> int:
        """`place` for messages with no optional field (no tag, keys, properties, born host
        or group; the common case): the records are encoded in one lean loop, and their queue and
        index entries packed at once from C iterators. Places one batch record from `msgs[i]` on;
        returns the index of the first message left."""
        topic = cq.topic
        tb = topic.encode()
        lt = len(tb)
        next_id = self.ids.next
        head = codec.HEAD.pack
        prefix = codec.PREFIX.pack
        magic = codec.MAGIC_MESSAGE
        crc32 = _crc32
        cl = self.commitlog
        seg_size = self.seg_size
        limit = min(BATCH_MAX_BYTES, seg_size - codec.MIN_RECORD)
        head_size = codec.BATCH_HEADER_SIZE
        n = len(msgs)
        qoff0 = qoff = cq.next_offset
        parts: list[bytes] = []
        mids: list[str] = []
        mbs: list[bytes] = []
        poss: list[int] = []  # position of each record after the batch header
        rel = head_size
        while i < n:
            msg = msgs[i]
            mid = msg.message_id or next_id()
            mb = mid.encode()
            body = msg.body
            payload = (
                head(
                    magic,
                    msg.msg_type,
                    0,
                    qid,
                    qoff,
                    now,
                    msg.born_timestamp or now,
                    msg.deliver_at,
                    lt,
                    0,
                    0,
                    0,
                    len(mb),
                    0,
                    0,
                    len(body),
                )
                + tb
                + mb
                + body
            )
            size = len(payload) + 8
            if rel + size > limit:
                if parts:
                    break
                raise MessageTooLarge(f"a record of {size} bytes does not fit a batch record")
            parts.append(prefix(size, crc32(payload)) + payload)
            mids.append(mid)
            mbs.append(mb)
            poss.append(rel)
            rel += size
            qoff += 1
            i += 1
        count = len(parts)
        start = cl.write_pos
        if start % seg_size + rel <= seg_size:
            cl.write_pos = start + rel
            clo, filler = start, b""
        else:  # it starts the next segment
            clo, pad = cl.reserve(rel)
            filler = pad or b""
        if set(map(len, mbs)) != {32}:  # (client ids of another length: the general entry)
            idx = b"".join(MessageIndex.encode(m, (), clo + p) for m, p in zip(mids, poss, strict=True))
            keyed = [(m, (), clo + p) for m, p in zip(mids, poss, strict=True)]
            mids, at = [], []
        else:
            keyed = []
            at = list(map(clo.__add__, poss))
            idx = _packer(ID32, count).pack(*chain.from_iterable(zip(repeat(KIND_ID), repeat(32), mbs, at)))
        sizes = list(map(operator.sub, poss[1:] + [rel], poss))
        entries = _packer(ENTRY, count).pack(
            *chain.from_iterable(zip(map(clo.__add__, poss), sizes, repeat(0), repeat(now)))
        )
        cq.next_offset = qoff
        results = _BatchResults(mids or [k[0] for k in keyed], topic, qid, qoff0, clo, poss, sizes, now)
        out.append(results)  # (`place` flattens them unless there is only this one)
        recs.append(
            self._batch_record(
                cq,
                parts,
                filler,
                clo,
                (results.ids[-1], qoff - 1, rel, now),
                entries,
                idx,
                fut if i == n else self.done,
                [mids, at, keyed],
                {0},
            )
        )
        return i

    def _batch_record(
        self,
        cq: ConsumeQueue,
        parts: list[bytes],
        filler: bytes,
        clo: int,
        last: tuple[str, int, int, int],
        entries: bytes,
        idx: bytes,
        fut: asyncio.Future,
        ids: list,
        hashes: set[int],
    ) -> Record:
        """The writer's record of one batch record at `clo` holding `parts` (after `filler`, the
        padding of the previous segment): `last` is (last message id, last queue offset, size,
        store time); `ids` what `on_readable` indexes ([ids, positions, keyed])."""
        inner = b"".join(parts)
        data = filler + codec.encode_batch_head(inner, len(parts)) + inner
        mid, qoff, size, now = last
        whole = _new_tuple(AppendResult, (mid, cq.topic, cq.queue_id, qoff, clo, size, now))
        self.metrics["appends"] += len(parts) - 1  # (on_durable counts one per record)
        self.metrics["batch_records"] = self.metrics.get("batch_records", 0) + 1
        return _new_tuple(Record, (clo - len(filler), data, cq, entries, idx, fut, whole, ids, hashes))
