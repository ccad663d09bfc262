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
import bisect
import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import struct
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
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
class _Job:
    """A compaction of one queue, prepared in the event loop for the worker (picklable: it runs in
    a process of its own, `compact_queue`)."""

    label: str  # topic/queue, for logs
    directory: str
    gen: int  # the generation to write
    old_gen: int | None  # the current one
    old_base: int
    old_upto: int
    new_entries: bytes  # the queue's own entries for [start, upto)
    start: int
    upto: int
    segments: list[tuple[int, str]]  # (base, path) of the commit log segments
    now: int
    keep_ms: int
    duty: float


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
        self._pool: ProcessPoolExecutor | None = None  # the compaction worker, started on first use
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
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

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
                    job = self._plan(cq, now)
                    if job is None:
                        continue
                    current, done = await self._run_job(job)
                    for f in ("records_in", "records_kept", "bytes_in", "bytes_kept"):
                        setattr(stats, f, getattr(stats, f) + done[f])
                    if self.catalog.topic_configs.get(tc.name) is not tc:
                        continue  # deleted (or recreated) meanwhile
                    self._install(cq, job.directory, current)
                    stats.queues += 1
        stats.seconds = time.perf_counter() - t0
        self.last = stats
        return stats

    async def _run_job(self, job: _Job) -> tuple[dict, dict]:
        """A queue's compaction, in the worker process (or on the IO thread without one)."""
        if not self.config.compaction_process:
            return await self.run_io(compact_queue, job)
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_die_with_parent
            )
        try:
            return await loop.run_in_executor(self._pool, compact_queue, job)
        except BrokenProcessPool:
            self._pool = None  # a new worker next time
            raise

    def _plan(self, cq: ConsumeQueue, now: int) -> _Job | None:
        """Loop: what to compact of `cq`: its generation plus its entries in closed segments that
        are in the queue file (the in-memory ones go there with the next checkpoint)."""
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
        new_entries = cq.file_range(start, upto)
        directory = os.path.join(self.root, cq.topic, str(cq.queue_id))
        return _Job(
            label=f"{cq.topic}/{cq.queue_id}",
            directory=directory,
            gen=old.gen + 1 if old is not None else 1,
            old_gen=old.gen if old is not None else None,
            old_base=old.base if old is not None else 0,
            old_upto=old.upto if old is not None else 0,
            new_entries=new_entries,
            start=start,
            upto=upto,
            segments=[(sg.base, sg.path) for sg in self.commitlog.segments()],
            now=now,
            keep_ms=keep_ms,
            duty=self.config.compaction_duty,
        )

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


def compact_queue(job: _Job) -> tuple[dict, dict]:
    """Write generation `job.gen` of a queue from the current one and the new entries' records,
    and make it current (CURRENT replaced atomically). Runs in the compaction worker process (or
    the store's IO thread); returns (what CURRENT says, counts)."""
    os.makedirs(job.directory, exist_ok=True)
    stats = {"records_in": 0, "records_kept": 0, "bytes_in": 0, "bytes_kept": 0}
    pace = _Pace(job.duty)
    fds: list[int] = []

    def opened(path: str) -> int:
        fd = os.open(path, os.O_RDONLY)
        fds.append(fd)
        return fd

    try:
        # every candidate, oldest first, read twice (for its key, then to copy it if kept) rather
        # than held in memory: (offset, record reader, th, ts, key)
        candidates: list[tuple[int, _Source, int, int, str | None]] = []
        if job.old_gen is not None:
            log_fd = opened(os.path.join(job.directory, f"gen-{job.old_gen}.log"))
            map_fd = opened(os.path.join(job.directory, f"gen-{job.old_gen}.map"))
            for i in range(job.old_base, job.old_upto, _READ_CHUNK):
                end = min(i + _READ_CHUNK, job.old_upto)
                data = os.pread(map_fd, (end - i) * ENTRY_SIZE, (i - job.old_base) * ENTRY_SIZE)
                for k, (pos, size, th, ts) in enumerate(ENTRY.iter_unpack(data)):
                    if size:
                        pace.tick()
                        src = _Source(log_fd, pos, size)
                        candidates.append((i + k, src, th, ts, _key_of(src.read())))
        bases = [b for b, _p in job.segments]
        seg_fds: dict[int, int] = {}
        for k, (clo, size, th, ts) in enumerate(ENTRY.iter_unpack(job.new_entries)):
            pace.tick()
            n = bisect.bisect(bases, clo) - 1
            try:
                if n < 0:
                    raise OSError("segment deleted")
                base, path = job.segments[n]
                fd = seg_fds.get(base)
                if fd is None:
                    fd = seg_fds[base] = opened(path)
                src = _Source(fd, clo - base, size)
                data = src.read()
                codec.check(data, 0, len(data))
            except (OSError, codec.CorruptRecord) as e:
                log.error("compaction of %s: unreadable record at %d: %s", job.label, clo, e)
                continue
            candidates.append((job.start + k, src, th, ts, _key_of(data)))
        latest: dict[str, int] = {}
        for offset, _src, _th, _ts, key in candidates:
            if key is not None:
                latest[key] = offset
        base_offset = None
        next_offset = job.upto
        pos = 0
        tombstone_ts: int | None = None
        with (
            _SyncedFile(os.path.join(job.directory, f"gen-{job.gen}.log")) as out_log,
            _SyncedFile(os.path.join(job.directory, f"gen-{job.gen}.map")) as out_map,
        ):
            for offset, src, th, ts, key in candidates:
                pace.tick()
                stats["records_in"] += 1
                stats["bytes_in"] += src.size
                if key is not None:
                    if latest[key] != offset:
                        continue  # a newer record of the key
                    data = src.read()
                    if _is_tombstone(data):
                        if job.now - ts > job.keep_ms:
                            continue  # a tombstone past its retention: the key is gone
                        tombstone_ts = ts if tombstone_ts is None else min(tombstone_ts, ts)
                else:
                    data = src.read()
                if base_offset is None:
                    base_offset = next_offset = offset
                # removed ones: size 0, at the position of the next kept one (entries stay in order)
                out_map.write(ENTRY.pack(pos, 0, 0, 0) * (offset - next_offset))
                out_map.write(ENTRY.pack(pos, len(data), th, ts))
                out_log.write(data)
                pos += len(data)
                next_offset = offset + 1
                stats["records_kept"] += 1
                stats["bytes_kept"] += len(data)
            if base_offset is None:
                base_offset = next_offset = job.upto
            out_map.write(ENTRY.pack(pos, 0, 0, 0) * (job.upto - next_offset))
    finally:
        for fd in fds:
            os.close(fd)
    current = {"gen": job.gen, "base": base_offset, "upto": job.upto, "tombstone_ts": tombstone_ts}
    _write_current(job.directory, current)
    if job.old_gen is not None:
        for ext in ("log", "map"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(job.directory, f"gen-{job.old_gen}.{ext}"))
    return current, stats


def _die_with_parent() -> None:
    """Compaction worker: killed with the store's process (a kill -9 of the store must not leave
    a worker switching generations under the next store to open the directory)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


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
