"""Helpers for the store tests (imported by the tests and by the child scripts in this directory).

A few helpers reach into the store's internals to simulate a crash in-process: `crash_copy` copies
the data directory from the flusher thread (so no write races the copy) after the consumer
operations log was flushed; the copy is what a SIGKILL at that moment would leave on disk.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from store import Message, Store, StoreConfig, appending, codec, popping, retention, scheduling

ROOT = Path(__file__).resolve().parents[2]  # the repository (so child processes can import `store`)
HERE = Path(__file__).resolve().parent

# Background jobs that would otherwise run during a test are pushed far out unless a test wants them.
QUIET = 3_600_000

# The store modules that read the clock: `now_ms`, or `time_ns` where a hot path inlines it.
CLOCKED_MODULES = (appending, popping, retention, scheduling)


def clock_patches(clock_ms: Callable[[], int]) -> list[tuple[object, str, Callable[[], int]]]:
    """(module, name, fake) for every clock the store reads: a fake clock in epoch ms for each."""
    out: list[tuple[object, str, Callable[[], int]]] = []
    for mod in CLOCKED_MODULES:
        if hasattr(mod, "now_ms"):
            out.append((mod, "now_ms", clock_ms))
        if hasattr(mod, "time_ns"):
            out.append((mod, "time_ns", lambda: clock_ms() * 1_000_000))
    return out


def install_clock(clock_ms: Callable[[], int], set_attr: Callable[[object, str, object], None] = setattr):
    """Replace the store's clocks (with `set_attr`, e.g. monkeypatch.setattr); a function that
    puts the real ones back (a no-op when `set_attr` undoes itself, as monkeypatch's does)."""
    patches = clock_patches(clock_ms)
    real = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    for mod, name, fake in patches:
        set_attr(mod, name, fake)

    def restore() -> None:
        for mod, name, old in real:
            setattr(mod, name, old)

    return restore


def config(data_dir: str, **kw) -> StoreConfig:
    defaults = dict(
        flush="sync",
        segment_size=64 * 1024,
        default_queues=4,
        min_free_bytes=0,
        retention_check_interval_ms=QUIET,
    )
    defaults.update(kw)
    return StoreConfig(data_dir=str(data_dir), **defaults)


async def open_store(**kw) -> Store:
    data_dir = kw.pop("data_dir")
    return await Store.open(config(data_dir, **kw))


async def append(store: Store, msg: Message):
    """`await store.append(msg)` as a coroutine (errors raised at call time land in gather results)."""
    return await store.append(msg)


def read_queue(
    store: Store, topic: str, qid: int, start: int | None = None, end: int | None = None
) -> list[Message]:
    """Every message of one queue in [start, end) (default: all retained), page by page."""
    lo = store.min_offset(topic, qid) if start is None else start
    hi = store.max_offset(topic, qid) if end is None else end
    out: list[Message] = []
    while lo < hi:
        page = store.read(topic, qid, lo, hi, max_messages=500)
        if not page:
            break
        out.extend(page)
        lo = page[-1].queue_offset + 1
    return out


def read_all(store: Store, topic: str) -> list[Message]:
    """Every retained message of a topic, queue by queue (empty if the topic does not exist)."""
    if topic not in {t.name for t in store.topics()}:
        return []
    out: list[Message] = []
    for qid in range(store.queue_count(topic)):
        out.extend(read_queue(store, topic, qid))
    return out


def bodies(msgs) -> list[bytes]:
    return [m.body for m in msgs]


async def flush_progress(store: Store) -> None:
    """Write and fdatasync the consumer operations log now (internal; normally every few ms)."""
    await store._parts.checkpoints.flush_progress()


async def crash_copy(store: Store, dst: str | os.PathLike) -> None:
    """Copy the data directory as a crash right now would leave it (appends done so far are written)."""
    await flush_progress(store)
    src = store.config.data_dir

    def copy() -> None:  # runs on the store's io thread: ordered after its queued file jobs
        t = getattr(store.commitlog, "_prealloc_thread", None)
        if t is not None:
            t.join()
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.tmp", "LOCK"))

    await store._run_io(copy)


def segment_files(data_dir: str | os.PathLike) -> list[Path]:
    d = Path(data_dir) / "commitlog"
    return sorted(p for p in d.iterdir() if p.name.isdigit() and len(p.name) == 20)


def segment_path(data_dir: str | os.PathLike, segment_size: int, clo: int) -> tuple[Path, int]:
    """(segment file, position in it) of a commit log offset."""
    base = clo - clo % segment_size
    return Path(data_dir) / "commitlog" / f"{base:020d}", clo - base


async def wait_until(cond, timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll `cond()` (for state the store exposes no event for); True once it holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(interval)
    return bool(cond())


def legacy_record(rec: bytes) -> bytes:
    """`rec` (a record as `codec.encode` writes it) as a store written before JSON property blocks
    wrote it: flag 0x0001 clear and the properties as (u16 length, name, u32 length, value) pairs."""
    head = list(codec.HEAD.unpack_from(rec, codec.PREFIX.size))
    flags, lp, lb = head[2], head[14], head[15]
    if not flags & codec.FLAG_JSON_PROPERTIES:
        return rec
    end = len(rec) - lb
    props = json.loads(rec[end - lp : end])
    pairs = b"".join(
        struct.pack("<H", len(k.encode())) + k.encode() + struct.pack("<I", len(v.encode())) + v.encode()
        for k, v in props.items()
    )
    head[2], head[14] = flags & ~codec.FLAG_JSON_PROPERTIES, len(pairs)
    payload = codec.HEAD.pack(*head) + rec[codec.HEADER_SIZE : end - lp] + pairs + rec[end:]
    return codec.PREFIX.pack(len(payload) + 8, zlib.crc32(payload)) + payload


def write_legacy_records(monkeypatch) -> None:
    """From now on (in this test) the store writes records in the layout from before JSON properties."""
    encode = codec.encode
    monkeypatch.setattr(codec, "encode", lambda *a, **kw: legacy_record(encode(*a, **kw)))
