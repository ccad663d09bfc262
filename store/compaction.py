"""Compacted topics: the latest record per key wins, so a topic is a table in stream form.

A topic created with `compacted=True` is written and read like any other, with two differences:
its records are routed to a queue by their key (`compaction_key`: the first message key, else the
MQTT path), and `Compactor` removes older records of a key in the background.

How it works, per queue (RocketMQ 5's compaction topics keep a compaction log per queue the same
way): the commit log is shared by every topic, so a compacted queue's kept records are copied out of
it into a *generation*: `<data>/compacted/<topic>/<queue>/gen-<n>.log` (the records, byte for byte)
and `gen-<n>.map` (one 28-byte consume queue entry per queue offset of the compacted range, the
commit log offset replaced by the record's position in the `.log`, size 0 where a record was
removed). `CURRENT` names the generation in use; a compaction writes a whole new generation from the
previous one plus the queue's records in closed commit log segments, syncs it, then replaces
`CURRENT` (write, fsync, rename): a crash at any point leaves the old generation or the new one,
never a mix, and files of an unfinished one are deleted at the next open.

Reads need no new path: the consume queue serves offsets below its compacted end from the
generation (consumequeue.py), with commit log offsets at or above `COMPACT_BASE` that the commit
log's `read` hands to `Compactor.read`; removed records read as gaps (size 0) that pops and reads skip.
Retention deletes a segment holding a compacted topic's records only once compaction has copied
them (`uncompacted_floor`), and never touches a generation: a key's latest value is kept until a
newer one or its tombstone (an empty body, kept `tombstone_retention_ms`) replaces it.

Written by hand: the store's own files; no library keeps a consume queue's compacted view.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import struct
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

from . import codec
from .catalog import Catalog
from .commitlog import COMPACT_BASE, CommitLog
from .config import StoreConfig
from .consumequeue import ENTRY, ENTRY_SIZE, ConsumeQueue
from .message import PATH_PROPERTY, Message, now_ms

log = logging.getLogger("store")

SLOT_SHIFT = 40  # COMPACT_BASE | slot << SLOT_SHIFT | position in the slot's .log
_POS_MASK = (1 << SLOT_SHIFT) - 1
_READ_CHUNK = 4096  # queue entries read at a time


def compaction_key(msg: Message) -> str | None:
    """The key a compacted topic keeps the latest record of: the first message key, else the MQTT
    path (`mqtt.topic`), else None (such a record is never removed)."""
    if msg.keys:
        return msg.keys[0]
    props = msg.properties
    return props.get(PATH_PROPERTY) if props else None


def key_queue(key: str, queues: int) -> int:
    """The queue a key's records go to in a compacted topic."""
    return zlib.crc32(key.encode()) % queues


class CompactedRange:
    """One queue's current generation: entries for queue offsets [base, upto), read through `slot`."""

    def __init__(
        self, directory: str, gen: int, base: int, upto: int, slot: int, tombstone_ts: int | None = None
    ) -> None:
        self.dir, self.gen, self.base, self.upto, self.slot = directory, gen, base, upto, slot
        self.tombstone_ts = tombstone_ts  # the store time of its oldest tombstone (None: it has none)
        self.addr = COMPACT_BASE | slot << SLOT_SHIFT
        self.log_fd = os.open(os.path.join(directory, f"gen-{gen}.log"), os.O_RDONLY)
        self.map_fd = os.open(os.path.join(directory, f"gen-{gen}.map"), os.O_RDONLY)

    def entry(self, offset: int) -> tuple[int, int, int, int]:
        if offset < self.base:
            return (self.addr, 0, 0, 0)
        pos, size, th, ts = ENTRY.unpack(os.pread(self.map_fd, ENTRY_SIZE, (offset - self.base) * ENTRY_SIZE))
        return (self.addr + pos, size, th, ts)

    def entries(self, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """Entries of [start, end) (within [base, upto))."""
        data = os.pread(self.map_fd, (end - start) * ENTRY_SIZE, (start - self.base) * ENTRY_SIZE)
        addr = self.addr
        return [(addr + p, s, th, ts) for p, s, th, ts in ENTRY.iter_unpack(data)]

    def read(self, pos: int, size: int) -> bytes:
        data = os.pread(self.log_fd, size, pos)
        if len(data) != size:
            raise KeyError(f"compacted record at {pos} of generation {self.gen} is not stored")
        return data

    def close(self) -> None:
        os.close(self.log_fd)
        os.close(self.map_fd)


@dataclass(slots=True)
class CompactionStats:
    """What one compaction pass did."""

    queues: int = 0  # queues compacted
    records_in: int = 0  # records read (the previous generation's and the newly closed ones)
    records_kept: int = 0
    bytes_in: int = 0
    bytes_kept: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class _Plan:
    """A compaction of one queue, prepared in the event loop for the IO thread."""

    cq: ConsumeQueue
    directory: str
    old: CompactedRange | None
    old_live: list[tuple[int, int, int, int, int]]  # (offset, pos, size, th, ts) kept so far
    new_entries: bytes  # the queue's own entries for [old upto, upto)
    start: int  # old upto (or the queue's min offset)
    upto: int
    gen: int


class _KeyMap:
    """Latest queue offset per key of one queue, brought up to date on use."""

    __slots__ = ("latest", "seen")

    def __init__(self) -> None:
        self.latest: dict[str, int] = {}
        self.seen = 0


class Compactor:
    """Compaction of every compacted topic's queues, and latest-value lookups (`latest`)."""

    def __init__(
        self,
        config: StoreConfig,
        catalog: Catalog,
        commitlog: CommitLog,
        run_io: Callable[..., asyncio.Future],
        read_message: Callable[[int, int], Message | None],
        checkpoint: Callable[[], Awaitable[object]],
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.commitlog = commitlog
        self.run_io = run_io
        self.read_message = read_message
        self.checkpoint = checkpoint
        self.root = os.path.join(config.data_dir, "compacted")
        self.slots: dict[int, CompactedRange] = {}
        self._next_slot = 0
        self._keys: dict[tuple[str, int], _KeyMap] = {}
        self.lock = asyncio.Lock()
        self.last = CompactionStats()
        commitlog.compacted_read = self.read

    # ------------------------------------------------------------------ opening
    def attach(self) -> None:
        """At open: give each compacted queue its current generation; delete unfinished ones."""
        if not os.path.isdir(self.root):
            return
        for topic in os.listdir(self.root):
            tdir = os.path.join(self.root, topic)
            tc = self.catalog.topic_configs.get(topic)
            if tc is None or not tc.compacted:
                shutil.rmtree(tdir, ignore_errors=True)  # the topic was deleted
                continue
            for q in os.listdir(tdir):
                if not q.isdigit():
                    continue
                qdir = os.path.join(tdir, q)
                current = _read_current(qdir)
                keep = (
                    set() if current is None else {f"gen-{current['gen']}.log", f"gen-{current['gen']}.map"}
                )
                for name in os.listdir(qdir):
                    if name.startswith("gen-") and name not in keep or name.endswith(".tmp"):
                        os.unlink(os.path.join(qdir, name))
                if current is not None:
                    cq = self.catalog.cq(topic, int(q))
                    self._install(cq, qdir, current)

    def _install(self, cq: ConsumeQueue, directory: str, current: dict) -> None:
        gen, base, upto = current["gen"], current["base"], current["upto"]
        rng = CompactedRange(directory, gen, base, upto, self._next_slot, current.get("tombstone_ts"))
        self.slots[self._next_slot] = rng
        self._next_slot += 1
        old = cq.compacted
        cq.compacted, cq.compacted_upto = rng, upto
        cq.min_offset = max(cq.min_offset, base) if old is not None else base
        if old is not None:
            del self.slots[old.slot]
            old.close()

    def read(self, addr: int, size: int) -> bytes:
        """`CommitLog.read` of an address at or above COMPACT_BASE."""
        rng = self.slots.get((addr - COMPACT_BASE) >> SLOT_SHIFT)
        if rng is None:
            raise KeyError(f"compacted record {addr:#x} is no longer stored")
        return rng.read(addr & _POS_MASK, size)

    def close(self) -> None:
        for rng in self.slots.values():
            rng.close()
        self.slots.clear()

    # ------------------------------------------------------------------ retention's guard
    def uncompacted_floor(self) -> int | None:
        """The lowest commit log offset of a compacted topic's record not yet in a generation
        (None: there is none): retention deletes nothing from its segment on."""
        low: int | None = None
        for (topic, _q), cq in list(self.catalog.cqs.items()):
            tc = self.catalog.topic_configs.get(topic)
            if tc is None or not tc.compacted:
                continue
            first = max(cq.compacted_upto, cq.min_offset)
            if first < cq.max_offset:
                clo = cq.entry(first)[0]
                low = clo if low is None else min(low, clo)
        return low

    # ------------------------------------------------------------------ compaction
    async def run(self, now: int | None = None) -> CompactionStats:
        """Compact every compacted topic's queues over the closed commit log segments."""
        stats = CompactionStats()
        t0 = time.perf_counter()
        async with self.lock:
            await self.checkpoint()  # queue entries of durable records into their files
            now = now_ms() if now is None else now
            for tc in list(self.catalog.topic_configs.values()):
                if not tc.compacted:
                    continue
                for cq in list(self.catalog.queues(tc.name)):
                    plan = self._plan(cq, now)
                    if plan is None:
                        continue
                    current = await self.run_io(self._compact, plan, now, stats)
                    if self.catalog.topic_configs.get(tc.name) is not tc:
                        continue  # deleted (or recreated) meanwhile
                    self._install(cq, plan.directory, current)
                    stats.queues += 1
        stats.seconds = time.perf_counter() - t0
        self.last = stats
        return stats

    def _plan(self, cq: ConsumeQueue, now: int) -> _Plan | None:
        """Loop: what the IO thread compacts of `cq`: its generation plus its entries in closed
        segments that are in the queue file (the in-memory ones go there with the next checkpoint)."""
        seg = self.commitlog.segment_size
        active = self.commitlog.write_pos - self.commitlog.write_pos % seg
        start = max(cq.compacted_upto, cq.min_offset)
        limit = min(cq.file_offset, cq.max_offset)
        upto = cq.first_at(active, start) if start < limit else start
        upto = max(min(upto, limit), start)
        old = cq.compacted
        keep_ms = self.config.tombstone_retention_ms
        if upto == start and (old is None or old.tombstone_ts is None or now - old.tombstone_ts <= keep_ms):
            return None  # nothing new, and no tombstone to remove
        new_entries = os.pread(cq.fd, (upto - start) * ENTRY_SIZE, (start - cq.base) * ENTRY_SIZE)
        old_live: list[tuple[int, int, int, int, int]] = []
        if old is not None:
            for i in range(old.base, old.upto, _READ_CHUNK):
                end = min(i + _READ_CHUNK, old.upto)
                data = os.pread(old.map_fd, (end - i) * ENTRY_SIZE, (i - old.base) * ENTRY_SIZE)
                for k, (pos, size, th, ts) in enumerate(ENTRY.iter_unpack(data)):
                    if size:
                        old_live.append((i + k, pos, size, th, ts))
        directory = os.path.join(self.root, cq.topic, str(cq.queue_id))
        gen = old.gen + 1 if old is not None else 1
        return _Plan(cq, directory, old, old_live, new_entries, start, upto, gen)

    def _compact(self, plan: _Plan, now: int, stats: CompactionStats) -> dict:
        """IO thread: write generation `plan.gen` and make it current; returns what CURRENT says."""
        os.makedirs(plan.directory, exist_ok=True)
        # every candidate, oldest first, read twice (for its key, then to copy it if kept) rather
        # than held in memory: (offset, record reader, th, ts, key)
        candidates: list[tuple[int, _Source, int, int, str | None]] = []
        latest: dict[str, int] = {}
        old = plan.old
        pace = _Pace(self.config.compaction_duty)
        for offset, pos, size, th, ts in plan.old_live:
            pace.tick()
            src = _Source(old.log_fd, pos, size)
            candidates.append((offset, src, th, ts, _key_of(src.read())))
        cl = self.commitlog
        for k, (clo, size, th, ts) in enumerate(ENTRY.iter_unpack(plan.new_entries)):
            pace.tick()
            seg = cl.segment_for(clo)
            src = _Source(seg.fd if seg is not None else -1, clo - (seg.base if seg else 0), size)
            try:
                data = src.read()
                codec.check(data, 0, len(data))
            except (OSError, codec.CorruptRecord):
                log.error(
                    "compaction of %s/%d: unreadable record at %d", plan.cq.topic, plan.cq.queue_id, clo
                )
                continue
            candidates.append((plan.start + k, src, th, ts, _key_of(data)))
        for offset, _src, _th, _ts, key in candidates:
            if key is not None:
                latest[key] = offset
        keep_ms = self.config.tombstone_retention_ms
        gen = plan.gen
        base = None
        next_offset = plan.upto
        pos = 0
        tombstone_ts: int | None = None
        with (
            _SyncedFile(os.path.join(plan.directory, f"gen-{gen}.log")) as out_log,
            _SyncedFile(os.path.join(plan.directory, f"gen-{gen}.map")) as out_map,
        ):
            for offset, src, th, ts, key in candidates:
                pace.tick()
                stats.records_in += 1
                stats.bytes_in += src.size
                if key is not None:
                    if latest[key] != offset:
                        continue  # a newer record of the key
                    data = src.read()
                    if _is_tombstone(data):
                        if now - ts > keep_ms:
                            continue  # a tombstone past its retention: the key is gone
                        tombstone_ts = ts if tombstone_ts is None else min(tombstone_ts, ts)
                else:
                    data = src.read()
                if base is None:
                    base = next_offset = offset
                # removed ones: size 0, at the position of the next kept one (entries stay in order)
                out_map.write(ENTRY.pack(pos, 0, 0, 0) * (offset - next_offset))
                out_map.write(ENTRY.pack(pos, len(data), th, ts))
                out_log.write(data)
                pos += len(data)
                next_offset = offset + 1
                stats.records_kept += 1
                stats.bytes_kept += len(data)
            if base is None:
                base = next_offset = plan.upto
            out_map.write(ENTRY.pack(pos, 0, 0, 0) * (plan.upto - next_offset))
        current = {"gen": gen, "base": base, "upto": plan.upto, "tombstone_ts": tombstone_ts}
        _write_current(plan.directory, current)
        if old is not None:
            for ext in ("log", "map"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(plan.directory, f"gen-{old.gen}.{ext}"))
        return current

    def drop_topic(self, topic: str) -> None:
        """A deleted topic: forget its generations (their files go at the next open)."""
        for key in [k for k in self._keys if k[0] == topic]:
            del self._keys[key]

    # ------------------------------------------------------------------ latest values
    def latest(self, topic: str, key: str, tombstones: bool = False) -> Message | None:
        """The latest record of `key` in compacted topic `topic` (None when there is none, or it is
        a tombstone unless `tombstones`)."""
        best: Message | None = None
        for cq in self.catalog.queues(topic):
            km = self._caught_up(cq)
            offset = km.latest.get(key)
            if offset is None or offset < cq.min_offset:
                continue
            clo, size, _th, _ts = cq.entry(offset)
            msg = self.read_message(clo, size) if size else None
            if msg is not None and (best is None or msg.store_timestamp >= best.store_timestamp):
                best = msg
        if best is None or (not best.body and not tombstones):
            return None
        return best

    def latest_items(self, topic: str, tombstones: bool = False) -> list[Message]:
        """The latest record of every key of compacted topic `topic`, by key (tombstones left out
        unless `tombstones`)."""
        out: dict[str, Message] = {}
        for cq in self.catalog.queues(topic):
            km = self._caught_up(cq)
            for key, offset in km.latest.items():
                if offset < cq.min_offset:
                    continue
                clo, size, _th, _ts = cq.entry(offset)
                msg = self.read_message(clo, size) if size else None
                if msg is None:
                    continue
                have = out.get(key)
                if have is None or msg.store_timestamp >= have.store_timestamp:
                    out[key] = msg
        return [m for _k, m in sorted(out.items()) if tombstones or m.body]

    def _caught_up(self, cq: ConsumeQueue) -> _KeyMap:
        km = self._keys.get((cq.topic, cq.queue_id))
        if km is None:
            km = self._keys[(cq.topic, cq.queue_id)] = _KeyMap()
        start = max(km.seen, cq.min_offset)
        end = cq.max_offset
        for chunk in _chunks(start, end):
            for i, (clo, size, _th, _ts) in enumerate(cq.entries(chunk, min(_READ_CHUNK, end - chunk))):
                if not size:
                    continue
                msg = self.read_message(clo, size)
                key = compaction_key(msg) if msg is not None else None
                if key is not None:
                    km.latest[key] = chunk + i
        km.seen = max(km.seen, end)
        return km


def _chunks(start: int, end: int) -> Iterator[int]:
    return iter(range(start, end, _READ_CHUNK))


def _key_of(record: bytes) -> str | None:
    try:
        return compaction_key(codec.decode(record))
    except Exception:  # noqa: BLE001 - a checked record that does not decode: keep it
        return None


def _is_tombstone(record: bytes) -> bool:
    """Whether a (checked) record's body is empty: its last length field (see codec.py)."""
    return struct.unpack_from("<I", record, codec.HEADER_SIZE - 4)[0] == 0


class _Pace:
    """Keeps compaction, which runs Python code on the IO thread (and so holds the GIL the event
    loop needs), to a fraction `duty` of the time: after each few milliseconds of work it sleeps
    long enough (the GIL is free meanwhile) that appends and deliveries keep most of the core."""

    __slots__ = ("duty", "n", "since")
    WORK_S = 0.004

    def __init__(self, duty: float) -> None:
        self.duty = min(max(duty, 0.05), 1.0)
        self.n = 0
        self.since = time.perf_counter()

    def tick(self) -> None:
        self.n += 1
        if self.n & 63 or self.duty >= 1.0:
            return
        busy = time.perf_counter() - self.since
        if busy >= self.WORK_S:
            time.sleep(busy * (1 / self.duty - 1))
            self.since = time.perf_counter()


class _Source:
    """Where a candidate record is: a file, a position and a size."""

    __slots__ = ("fd", "pos", "size")

    def __init__(self, fd: int, pos: int, size: int) -> None:
        self.fd, self.pos, self.size = fd, pos, size

    def read(self) -> bytes:
        data = os.pread(self.fd, self.size, self.pos)
        if len(data) != self.size:
            raise OSError(f"short read of {len(data)} of {self.size} bytes")
        return data


class _SyncedFile:
    """A new file written through a buffer, fsynced and closed on success (removed on failure)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.f = open(path, "wb")  # noqa: SIM115 - closed in __exit__

    def __enter__(self) -> _SyncedFile:
        return self

    def write(self, data: bytes) -> None:
        if data:
            self.f.write(data)

    def __exit__(self, exc_type: object, *rest: object) -> None:
        try:
            if exc_type is None:
                self.f.flush()
                os.fsync(self.f.fileno())
        finally:
            self.f.close()
            if exc_type is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)


def _write_synced(path: str, parts: list[bytes]) -> None:
    with _SyncedFile(path) as f:
        for p in parts:
            f.write(p)


def _read_current(directory: str) -> dict | None:
    try:
        with open(os.path.join(directory, "CURRENT")) as f:
            d = json.load(f)
        ts = d.get("tombstone_ts")
        return {
            "gen": int(d["gen"]),
            "base": int(d["base"]),
            "upto": int(d["upto"]),
            "tombstone_ts": None if ts is None else int(ts),
        }
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def _write_current(directory: str, current: dict) -> None:
    tmp = os.path.join(directory, "CURRENT.tmp")
    _write_synced(tmp, [json.dumps(current).encode()])
    os.replace(tmp, os.path.join(directory, "CURRENT"))
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
