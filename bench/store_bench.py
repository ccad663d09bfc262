"""Benchmark of the durable message store (`store`), through its public API only.

What it measures, in one run:

1. Sequential write bandwidth of the disk under the data directory: a Python loop writes
   `--seq-mib` MiB (default 256) in 1 MiB blocks to a new file, then one `os.fdatasync`; the whole
   thing is timed (the equivalent of `dd bs=1M count=256 conv=fdatasync`). Repeated `--seq-repeats`
   times (default 3); the median is reported as `seq_write_mb_s`.

2. Append throughput and latency for every combination of message body size (100 B, 4 KiB),
   concurrent producers (1, 8, 64) and flush policy (`sync`: an append returns after fsync;
   `async`: after the write). Each producer is an asyncio task that awaits each append before the
   next. Each configuration gets a fresh store in a fresh directory (opened and warmed up outside the
   timed window, so the first segment's zero-filled preallocation is excluded), runs for `--seconds`
   after a short warm-up, and reports appends/s, MB/s of message bodies (MB = 10**6 bytes) and p50/p99
   append latency in ms. Message objects are built before the timed window. Every 4 KiB `sync` result
   is also given as a fraction of the sequential write bandwidth (`disk_fraction_4k_sync_{1,8,64}p`;
   `disk_fraction_4k_sync` is the best of them).

3. Pop+ack throughput for one consumer group: a topic is pre-filled (`--fill` messages of 100 B,
   async flush), then one group drains it with one consumer task, and another group drains it with
   4 concurrent consumer tasks. Each task loops `pop(max_messages=32)` then acks every message, until
   the backlog is empty or `--pop-seconds` pass. `pop_ack_per_s` is the better of the two. Then one
   reader reads the same backlog by offset (`Store.tail`, batch 32, nothing to ack): `tail_per_s`,
   and `tail_vs_pop_ack_1c` (over the one-consumer pop+ack rate).

4. Batch records: 100-byte messages appended (sync flush) by 8 producers, each awaiting its call:
   one message per call (`append`: one record each) against batches of 16 and 64 per call
   (`append_many` of one queue stores one batch record). Messages/s and process CPU per message
   (all threads, `time.process_time`) over `--seconds`: `batch{1,16,64}_append_msgs_per_s`,
   `batch{1,16,64}_cpu_us_per_msg`, `batch{16,64}_vs_single_ratio` (messages/s over the
   one-per-call run's, same producers). The single-message store's best case, 64 producers (the
   group commit then shares each fsync among 64 appends), is reported beside it:
   `batch1_64p_append_msgs_per_s`, `batch1_64p_cpu_us_per_msg`, `batch64_vs_single_64p_ratio`.

5. Compaction: a compacted topic of `--compact-keys` keys x 50 versions of 100 B is compacted once
   (`compaction_mb_s`: MB of records read per second of the pass at the store's default pace,
   `compaction_duty` 0.5; `compaction_records_in`, `compaction_records_kept`); then single appends
   (16 producers, sync) to another topic run for `--seconds` alone and again while three more such
   topics are compacted: `compaction_append_ratio` = appends/s during that pass / alone.

6. Logic queues: a topic of 4 queues is filled with `--rescale-messages` (default 1,000,000; quick
   100,000) messages of 100 B, then grown to 16 queues and shrunk back to 4: `rescale_grow_ms`,
   `rescale_shrink_ms` (wall time of `Store.resize_topic`, median of 5 round trips),
   `rescale_messages`, and `rescale_first_pop_ms` (a pop right after the grow).

7. Tiered storage (`--only tier`, not in the default set: it starts a local S3-compatible server,
   moto's server mode): 80 MiB of 1 KiB messages in one queue, 16 MiB segments; the closed ones
   are tiered (uploaded, verified, deleted locally). Reads go through `LocalStoreClient` (what
   the processor calls): `tier_first_read_ms` / `local_first_read_ms` (median time to the first
   message of one read at an offset of a range not read before: for the tiered range the block
   cache is emptied first, so it includes the ranged GET), `tier_read_mb_s` / `local_read_mb_s`
   (a range of up to 12 MiB read with `read_raw` in 1 MiB requests, cold cache), and their ratios
   `tier_first_read_ratio`, `tier_read_mb_s_ratio`; `tier_cached_read_mb_s`: the same tiered range
   read again (from the block cache). `tier_upload_mb_s`: upload speed of the pass.

`--only batch,compaction` (any of seq, append, pop, batch, compaction, rescale, tier) runs just those
parts; `--append-config 100b_sync_64p` (a comma list) runs just those append configurations.

The store's compiled hot path (docs/store.md, "Compiled hot path") is used when it is built:
`store_hot_path` says which ran ("compiled" or "pure"), and `append_100b_sync_64p_pure_per_s` is the
same 100 B / sync / 64 producer run in a subprocess with `GATEWAY_PURE_PYTHON=1` (the pure-Python
path; the figure itself when this process already runs pure Python).

Output: a human-readable table, or with `--json` exactly one JSON object on stdout (progress goes to
stderr). `--quick` shrinks everything for smoke runs. uvloop is used when importable.

    .venv/bin/python bench/store_bench.py [--quick] [--json] [--seconds S] [--dir PARENT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from common import log

from store import Message, Store, StoreConfig, codec

MiB = 1024 * 1024
MB = 1_000_000
SIZES: tuple[tuple[str, int], ...] = (("100b", 100), ("4k", 4096))
PRODUCERS: tuple[int, ...] = (1, 8, 64)
FLUSHES: tuple[str, ...] = ("sync", "async")
TOPIC = "bench"
POP_BATCH = 32
POP_CONSUMERS: tuple[int, ...] = (1, 4)


@dataclass(slots=True)
class Settings:
    parent: str
    seconds: float
    warmup: float
    segment_size: int
    seq_bytes: int
    seq_repeats: int
    fill: int
    pop_seconds: float
    pool_max: int
    json: bool
    only: set[str]
    compact_keys: int
    rescale_messages: int = 1_000_000
    append_configs: set[str] | None = None  # e.g. {"100b_sync_64p"}; None: every one


@dataclass(slots=True)
class AppendStats:
    count: int
    seconds: float
    body_bytes: int
    latencies: list[float]  # seconds, one per append

    @property
    def per_s(self) -> float:
        return self.count / self.seconds

    @property
    def mb_s(self) -> float:
        return self.body_bytes / self.seconds / MB

    def pct_ms(self, q: float) -> float:
        return percentile(self.latencies, q) * 1000


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of an unsorted list; sorts it in place."""
    if not values:
        return float("nan")
    values.sort()
    k = max(0, min(len(values) - 1, math.ceil(q * len(values)) - 1))
    return values[k]


# ============================================================================ sequential disk bandwidth
def seq_write_mb_s(directory: str, total: int) -> float:
    """One `dd bs=1M conv=fdatasync` equivalent: MB/s of writing `total` bytes then one fdatasync."""
    block = os.urandom(MiB)
    path = os.path.join(directory, "seqwrite.bin")
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = total
        while left > 0:
            n = os.write(fd, block if left >= MiB else block[:left])
            left -= n
        os.fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return total / elapsed / MB


# ============================================================================ appends
def build_messages(n: int, body: bytes) -> list[Message]:
    return [Message(TOPIC, body) for _ in range(n)]


async def produce(
    store: Store, producers: int, pool: list[Message], deadline: float, latencies: list[float] | None
) -> int:
    """`producers` tasks append messages from `pool` (each awaits its append) until `deadline`."""
    counter = [0]
    n_pool = len(pool)
    append = store.append
    clock = time.perf_counter

    async def producer() -> None:
        lat_add = latencies.append if latencies is not None else None
        while True:
            i = counter[0]
            if i >= n_pool or clock() >= deadline:
                return
            counter[0] = i + 1
            msg = pool[i]
            t0 = clock()
            await append(msg)
            if lat_add is not None:
                lat_add(clock() - t0)

    await asyncio.gather(*(producer() for _ in range(producers)))
    return counter[0]


async def bench_append(cfg: Settings, size: int, producers: int, flush: str) -> AppendStats:
    body = os.urandom(size)
    data_dir = tempfile.mkdtemp(prefix=f"append-{size}-{flush}-{producers}p-", dir=cfg.parent)
    try:
        store = await Store.open(StoreConfig(data_dir=data_dir, flush=flush, segment_size=cfg.segment_size))
        try:
            store.create_topic(TOPIC, queues=8)
            # The first append waits for the first segment's zero-fill: not part of the warm-up rate.
            await store.append(Message(TOPIC, body))
            # Warm-up: first writes, page faults, lazily created files; also sizes the message pool.
            warm_pool = build_messages(min(cfg.pool_max, 50_000), body)
            t0 = time.perf_counter()
            n_warm = await produce(store, producers, warm_pool, t0 + cfg.warmup, None)
            warm_rate = n_warm / max(time.perf_counter() - t0, 1e-9)
            del warm_pool
            # generous: the warm-up rate underestimates the steady rate (up to 2x seen)
            need = int(warm_rate * cfg.seconds * 3) + 50_000
            pool = build_messages(min(need, cfg.pool_max), body)
            latencies: list[float] = []
            gc.collect()
            gc.freeze()
            try:
                t0 = time.perf_counter()
                count = await produce(store, producers, pool, t0 + cfg.seconds, latencies)
                elapsed = time.perf_counter() - t0
            finally:
                gc.unfreeze()
            if count >= len(pool):
                log(
                    f"  note: all {len(pool)} pre-built messages used before --seconds ran out "
                    f"(timed {elapsed:.2f} s; see --pool-max)"
                )
        finally:
            await store.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return AppendStats(len(latencies), elapsed, len(latencies) * size, latencies)


# ============================================================================ pop + ack
async def fill_topic(store: Store, n: int, size: int) -> None:
    body = os.urandom(size)
    pool = build_messages(n, body)
    await produce(store, 64, pool, float("inf"), None)


async def drain(store: Store, group: str, consumers: int, seconds: float) -> tuple[int, float]:
    """`consumers` tasks of one group pop (max 32) and ack until the backlog is empty or time is up."""
    done = [0]
    clock = time.perf_counter

    async def consumer(deadline: float) -> None:
        pop, ack = store.pop, store.ack
        while clock() < deadline:
            msgs = await pop(group, TOPIC, max_messages=POP_BATCH, invisible_time_ms=60_000)
            if not msgs:
                return
            for m in msgs:
                ack(m.receipt_handle)
            done[0] += len(msgs)
            # pop does not suspend while messages are available: let the other consumers and the
            # store's background tasks (progress log flushes) run, as network I/O would.
            await asyncio.sleep(0)

    t0 = clock()
    await asyncio.gather(*(consumer(t0 + seconds) for _ in range(consumers)))
    return done[0], clock() - t0


async def tail_all(store: Store, seconds: float) -> tuple[int, float]:
    """One reader reads the backlog by offset (`Store.tail`, batch POP_BATCH, nothing to ack) until
    it is read or time is up: what a subscriber that does not compete pays instead of pop + ack."""
    positions: dict[int, int] = {}
    n = 0
    clock = time.perf_counter
    t0 = clock()
    deadline = t0 + seconds
    while clock() < deadline:
        msgs = await store.tail(TOPIC, positions, POP_BATCH)
        if not msgs:
            break
        for m in msgs:
            positions[m.queue_id] = m.queue_offset + 1
        n += len(msgs)
        await asyncio.sleep(0)  # (as the pop consumers do)
    return n, clock() - t0


async def bench_pop_ack(cfg: Settings) -> dict[int, tuple[int, float]]:
    data_dir = tempfile.mkdtemp(prefix="popack-", dir=cfg.parent)
    out: dict[int, tuple[int, float]] = {}
    try:
        store = await Store.open(StoreConfig(data_dir=data_dir, flush="async", segment_size=cfg.segment_size))
        try:
            store.create_topic(TOPIC, queues=8)
            t0 = time.perf_counter()
            await fill_topic(store, cfg.fill, 100)
            log(f"  filled {cfg.fill} messages of 100 B in {time.perf_counter() - t0:.2f} s")
            for consumers in POP_CONSUMERS:
                gc.collect()
                # a separate group per run: each drains the whole backlog on its own
                n, secs = await drain(store, f"bench-{consumers}c", consumers, cfg.pop_seconds)
                out[consumers] = (n, secs)
                log(f"  pop+ack {consumers} consumer(s): {n} msgs in {secs:.2f} s = {n / secs:,.0f}/s")
            gc.collect()
            n, secs = await tail_all(store, cfg.pop_seconds)
            out[0] = (n, secs)
            log(f"  tail reads, 1 reader: {n} msgs in {secs:.2f} s = {n / secs:,.0f}/s")
        finally:
            await store.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


# ============================================================================ batch records
BATCH_SIZES: tuple[int, ...] = (1, 16, 64)


async def bench_batch(cfg: Settings, batch: int, producers: int = 8) -> tuple[float, float]:
    """(messages/s, CPU µs per message) of 100-byte appends, `batch` per call (1: `append`)."""
    data_dir = tempfile.mkdtemp(prefix=f"batch-{batch}-", dir=cfg.parent)
    body = os.urandom(100)
    try:
        store = await Store.open(StoreConfig(data_dir=data_dir, flush="sync", segment_size=cfg.segment_size))
        try:
            store.create_topic(TOPIC, queues=8)
            clock = time.perf_counter
            count = [0]

            async def producer(deadline: float) -> None:
                if batch == 1:
                    while clock() < deadline:
                        await store.append(Message(TOPIC, body))
                        count[0] += 1
                else:
                    while clock() < deadline:
                        await store.append_many([Message(TOPIC, body) for _ in range(batch)])
                        count[0] += batch

            await asyncio.gather(*(producer(clock() + cfg.warmup) for _ in range(producers)))
            gc.collect()
            count[0] = 0
            cpu0, t0 = time.process_time(), clock()
            await asyncio.gather(*(producer(t0 + cfg.seconds) for _ in range(producers)))
            elapsed, cpu = clock() - t0, time.process_time() - cpu0
        finally:
            await store.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    n = max(count[0], 1)
    return n / elapsed, cpu / n * 1e6


# ============================================================================ compaction
async def fill_compacted(store: Store, topic: str, keys: int, versions: int) -> None:
    store.create_topic(topic, queues=4, compacted=True)
    body = os.urandom(100)
    for v in range(versions):
        await store.append_many([Message(topic, body + b"%d" % v, keys=(f"k{k}",)) for k in range(keys)])


async def close_segment(store: Store) -> None:
    seg = store.segment_size
    first = store.commitlog.write_pos // seg
    big = os.urandom(min(seg // 4, 4 * MiB - 1024))
    while store.commitlog.write_pos // seg == first:
        await store.append(Message("filler", big))


async def bench_compaction(cfg: Settings) -> dict[str, float]:
    data_dir = tempfile.mkdtemp(prefix="compaction-", dir=cfg.parent)
    out: dict[str, float] = {}
    try:
        store = await Store.open(
            StoreConfig(
                data_dir=data_dir, flush="sync", segment_size=cfg.segment_size, compaction_interval_ms=10**9
            )
        )
        try:
            await fill_compacted(store, "table1", cfg.compact_keys, 50)
            await close_segment(store)
            st = await store.compact()
            out["compaction_mb_s"] = st.bytes_in / MB / st.seconds
            out["compaction_records_in"] = st.records_in
            out["compaction_records_kept"] = st.records_kept
            out["compaction_seconds"] = st.seconds
            log(
                f"  compaction: {st.records_in} records ({st.bytes_in / MB:.1f} MB) -> {st.records_kept} in "
                f"{st.seconds:.2f} s = {out['compaction_mb_s']:.1f} MB/s"
            )
            for t in ("table2", "table3", "table4"):  # work for the pass that appends run beside
                await fill_compacted(store, t, cfg.compact_keys, 50)
            await close_segment(store)
            clock = time.perf_counter
            body = os.urandom(100)

            async def appends(until: Callable[[], bool]) -> float:
                n = [0]

                async def producer() -> None:
                    while not until():
                        await store.append(Message(TOPIC, body))
                        n[0] += 1

                t0 = clock()
                await asyncio.gather(*(producer() for _ in range(16)))
                return n[0] / (clock() - t0)

            t_end = clock() + cfg.seconds
            alone = await appends(lambda: clock() >= t_end)
            task = asyncio.create_task(store.compact())
            during = await appends(task.done)
            st = task.result()
            out["compaction_append_alone_per_s"] = alone
            out["compaction_append_during_per_s"] = during
            out["compaction_append_ratio"] = during / alone
            out["compaction_during_seconds"] = st.seconds
            log(
                f"  appends alone {alone:,.0f}/s, during a {st.seconds:.2f} s compaction pass {during:,.0f}/s"
            )
        finally:
            await store.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


# ============================================================================ logic queues
async def bench_rescale(cfg: Settings) -> dict[str, float]:
    data_dir = tempfile.mkdtemp(prefix="rescale-", dir=cfg.parent)
    try:
        store = await Store.open(StoreConfig(data_dir=data_dir, flush="async", segment_size=cfg.segment_size))
        try:
            store.create_topic("rescale", queues=4)
            body = b"x" * 100
            n, batch = cfg.rescale_messages, 64
            t0 = time.perf_counter()
            for i in range(0, n, batch):
                await store.append_many(
                    [Message("rescale", body, queue_id=(i // batch) % 4)] * min(batch, n - i)
                )
            log(f"  rescale: {n:,} messages stored in {time.perf_counter() - t0:.1f} s")
            grow, shrink, first_pop = [], [], []
            for _ in range(5):
                t0 = time.perf_counter()
                store.resize_topic("rescale", 16)
                grow.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                await store.append(Message("rescale", body, queue_id=15))
                got = await store.pop("G-RESCALE", "rescale", max_messages=1)
                first_pop.append((time.perf_counter() - t0) * 1000)
                assert got
                t0 = time.perf_counter()
                store.resize_topic("rescale", 4)
                shrink.append((time.perf_counter() - t0) * 1000)
            out = {
                "rescale_messages": n,
                "rescale_grow_ms": statistics.median(grow),
                "rescale_shrink_ms": statistics.median(shrink),
                "rescale_first_pop_ms": statistics.median(first_pop),
            }
            log(
                f"  rescale of {n:,} messages: grow 4->16 {out['rescale_grow_ms']:.2f} ms, shrink 16->4 "
                f"{out['rescale_shrink_ms']:.2f} ms, append+pop after {out['rescale_first_pop_ms']:.2f} ms"
            )
            return out
        finally:
            await store.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


# ============================================================================ tiered storage
async def bench_tier(cfg: Settings) -> dict[str, float]:
    from messaging_processor.store_client import LocalStoreClient
    from tests.store.s3server import s3_server

    data_dir = tempfile.mkdtemp(prefix="tier-", dir=cfg.parent)
    seg = 16 * MiB
    body = b"t" * 1000
    try:
        with s3_server() as s3:
            s3.create_bucket("bench-tier")
            store = await Store.open(
                StoreConfig(
                    data_dir=data_dir,
                    flush="async",
                    segment_size=seg,
                    tier_endpoint=s3.endpoint,
                    tier_bucket="bench-tier",
                    tier_interval_ms=10**9,
                )
            )
            try:
                store.create_topic("tier", queues=1)
                n = 80 * MiB // 1100  # 4 closed segments and most of a fifth (local)
                for _ in range(0, n, 64):
                    await store.append_many([Message("tier", body, queue_id=0)] * 64)
                t0 = time.perf_counter()
                tiered = await store.tier_now(now=2**62)
                up = time.perf_counter() - t0
                stats = store.tier_stats()
                client = LocalStoreClient(store)
                hi = store.max_offset("tier", 0)
                cq = store._queue("tier", 0)  # noqa: SLF001 - where the tiered range ends
                first_local = cq.first_at(store.commitlog.local_min_offset, cq.min_offset)
                out: dict[str, float] = {
                    "tier_segments": tiered,
                    "tier_upload_mb_s": stats["tiered_bytes"] / MB / up,
                }
                tier_first, local_first = [], []
                for k in range(7):
                    store.drop_tier_cache()
                    off = 1000 + k * 1500  # tiered (below `first_local`), not read before in this run
                    assert off < first_local
                    t0 = time.perf_counter()
                    got = await client.read("tier", 0, off, None, 1)
                    tier_first.append((time.perf_counter() - t0) * 1000)
                    assert got and got[0].queue_offset == off
                    off = first_local + k * (hi - first_local) // 8  # local
                    assert first_local <= off < hi
                    t0 = time.perf_counter()
                    got = await client.read("tier", 0, off, None, 1)
                    local_first.append((time.perf_counter() - t0) * 1000)
                    assert got and got[0].queue_offset == off
                out["tier_first_read_ms"] = statistics.median(tier_first)
                out["local_first_read_ms"] = statistics.median(local_first)
                store.drop_tier_cache()
                rows = 12 * MiB // 1100
                out["tier_read_mb_s"] = await _read_mb_s(client, 0, min(rows, first_local))
                out["tier_cached_read_mb_s"] = await _read_mb_s(client, 0, min(rows, first_local))
                out["local_read_mb_s"] = await _read_mb_s(client, max(first_local, hi - rows), hi)
                out["tier_first_read_ratio"] = out["tier_first_read_ms"] / out["local_first_read_ms"]
                out["tier_read_mb_s_ratio"] = out["tier_read_mb_s"] / out["local_read_mb_s"]
                log(
                    f"  tier: {tiered} segments uploaded at {out['tier_upload_mb_s']:.1f} MB/s; first "
                    f"read {out['tier_first_read_ms']:.2f} ms tiered (cold) vs "
                    f"{out['local_first_read_ms']:.3f} ms local; range read "
                    f"{out['tier_read_mb_s']:.1f} MB/s tiered vs "
                    f"{out['local_read_mb_s']:.1f} MB/s local"
                )
                return out
            finally:
                await store.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def _read_mb_s(client: Any, start: int, end: int) -> float:
    t0 = time.perf_counter()
    nbytes, off = 0, start
    while off < end:
        raw = await client.read_raw("tier", 0, off, end, 4096, MiB)
        if not len(raw):
            break
        nbytes += len(raw.data)
        off = raw.first + len(raw)
    return nbytes / MB / (time.perf_counter() - t0)


# ============================================================================ driver
async def run(cfg: Settings) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if "batch" in cfg.only:
        for b in BATCH_SIZES:
            per_s, cpu = await bench_batch(cfg, b)
            res[f"batch{b}_append_msgs_per_s"] = per_s
            res[f"batch{b}_cpu_us_per_msg"] = cpu
            log(f"batch {b}: {per_s:,.0f} msgs/s, {cpu:.2f} µs CPU per message")
        per_s, cpu = await bench_batch(cfg, 1, 64)
        res["batch1_64p_append_msgs_per_s"] = per_s
        res["batch1_64p_cpu_us_per_msg"] = cpu
        log(f"batch 1, 64 producers: {per_s:,.0f} msgs/s, {cpu:.2f} µs CPU per message")
        for b in BATCH_SIZES[1:]:
            res[f"batch{b}_vs_single_ratio"] = (
                res[f"batch{b}_append_msgs_per_s"] / res["batch1_append_msgs_per_s"]
            )
        res["batch64_vs_single_64p_ratio"] = res["batch64_append_msgs_per_s"] / per_s
    if "compaction" in cfg.only:
        res.update(await bench_compaction(cfg))
    if "rescale" in cfg.only:
        res.update(await bench_rescale(cfg))
    if "tier" in cfg.only:
        res.update(await bench_tier(cfg))
    if not cfg.only & {"seq", "append", "pop"}:
        return res
    seq = []
    for i in range(cfg.seq_repeats if "seq" in cfg.only else 0):
        v = seq_write_mb_s(cfg.parent, cfg.seq_bytes)
        seq.append(v)
        log(f"seq write {cfg.seq_bytes // MiB} MiB + fdatasync, run {i + 1}: {v:,.1f} MB/s")
    if seq:
        res["seq_write_mb_s"] = statistics.median(seq)

    for flush in FLUSHES if "append" in cfg.only else ():
        for label, size in SIZES:
            for producers in PRODUCERS:
                key = f"append_{label}_{flush}_{producers}p"
                if cfg.append_configs is not None and key[len("append_") :] not in cfg.append_configs:
                    continue
                r = await bench_append(cfg, size, producers, flush)
                res[f"{key}_per_s"] = r.per_s
                res[f"{key}_mb_s"] = r.mb_s
                res[f"{key}_p50_ms"] = r.pct_ms(0.50)
                res[f"{key}_p99_ms"] = r.pct_ms(0.99)
                res[f"{key}_count"] = r.count
                log(
                    f"{key}: {r.per_s:,.0f}/s {r.mb_s:,.2f} MB/s p50 {res[f'{key}_p50_ms']:.3f} ms "
                    f"p99 {res[f'{key}_p99_ms']:.3f} ms ({r.count} in {r.seconds:.2f} s)"
                )

    if "append_100b_sync_64p_per_s" in res:
        res["store_hot_path"] = "pure" if codec.speedups is None else "compiled"
        res["append_100b_sync_64p_pure_per_s"] = (
            res["append_100b_sync_64p_per_s"] if codec.speedups is None else pure_append_100b_sync_64p(cfg)
        )
        pure = res["append_100b_sync_64p_pure_per_s"]
        log(f"append_100b_sync_64p_pure: {pure:,.0f}/s (GATEWAY_PURE_PYTHON=1)")

    fractions = []
    for producers in PRODUCERS if {"seq", "append"} <= cfg.only else ():
        if f"append_4k_sync_{producers}p_mb_s" not in res:
            continue
        f = res[f"append_4k_sync_{producers}p_mb_s"] / res["seq_write_mb_s"]
        res[f"disk_fraction_4k_sync_{producers}p"] = f
        fractions.append(f)
    if fractions:
        res["disk_fraction_4k_sync"] = max(fractions)
    if "pop" not in cfg.only:
        return res
    log(f"pop+ack: pre-filling {cfg.fill} messages")
    pops = await bench_pop_ack(cfg)
    n, secs = pops.pop(0)
    res["tail_per_s"] = n / secs
    res["tail_count"] = n
    for consumers, (n, secs) in pops.items():
        res[f"pop_ack_{consumers}c_per_s"] = n / secs
        res[f"pop_ack_{consumers}c_count"] = n
    res["pop_ack_per_s"] = max(res[f"pop_ack_{c}c_per_s"] for c in POP_CONSUMERS)
    res["tail_vs_pop_ack_1c"] = res["tail_per_s"] / res["pop_ack_1c_per_s"]
    return res


def pure_append_100b_sync_64p(cfg: Settings) -> float:
    """appends/s of the 100 B / sync / 64 producer run with the pure-Python store (a subprocess with
    GATEWAY_PURE_PYTHON=1: the store chooses its path once, at import)."""
    argv = [sys.executable, os.path.abspath(__file__), "--json", "--only", "append"]
    argv += ["--append-config", "100b_sync_64p", "--seconds", str(cfg.seconds), "--warmup", str(cfg.warmup)]
    argv += ["--segment-mib", str(cfg.segment_size // MiB), "--pool-max", str(cfg.pool_max)]
    argv += ["--dir", cfg.parent]
    env = dict(os.environ, GATEWAY_PURE_PYTHON="1")
    out = subprocess.run(argv, env=env, check=True, stdout=subprocess.PIPE, text=True).stdout
    return float(json.loads(out)["append_100b_sync_64p_per_s"])


def table(res: dict[str, Any], cfg: Settings, loop_name: str, total: float) -> str:
    if not {"seq", "append", "pop"} <= cfg.only:  # a partial run: its figures as they are
        return "\n".join(
            f"{k}: {v:,.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in sorted(res.items())
        )
    lines = [
        f"store benchmark  (loop: {loop_name}, {cfg.seconds:g} s per config, segment "
        f"{cfg.segment_size // MiB} MiB, dir {cfg.parent})",
        f"sequential write + fdatasync ({cfg.seq_bytes // MiB} MiB, median of {cfg.seq_repeats}): "
        f"{res['seq_write_mb_s']:,.1f} MB/s",
        "",
        f"{'size':>5} {'flush':>5} {'prod':>4} {'appends/s':>11} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'disk frac':>9}",
    ]
    for flush in FLUSHES:
        for label, _size in SIZES:
            for p in PRODUCERS:
                k = f"append_{label}_{flush}_{p}p"
                frac = res.get(f"disk_fraction_4k_sync_{p}p") if (label, flush) == ("4k", "sync") else None
                lines.append(
                    f"{label:>5} {flush:>5} {p:>4} {res[k + '_per_s']:>11,.0f} {res[k + '_mb_s']:>8,.2f} "
                    f"{res[k + '_p50_ms']:>8.3f} {res[k + '_p99_ms']:>8.3f} "
                    f"{'' if frac is None else f'{frac:.3f}':>9}"
                )
    lines.append(
        f"store hot path: {res['store_hot_path']}; 100 B sync 64 producers with pure Python "
        f"(GATEWAY_PURE_PYTHON=1): {res['append_100b_sync_64p_pure_per_s']:,.0f}/s"
    )
    lines.append("")
    lines.append(
        f"pop+ack (backlog {cfg.fill} x 100 B, batch {POP_BATCH}): "
        + ", ".join(
            f"{c} consumer{'s' if c > 1 else ''} {res[f'pop_ack_{c}c_per_s']:,.0f}/s" for c in POP_CONSUMERS
        )
        + f"; best {res['pop_ack_per_s']:,.0f}/s"
    )
    lines.append(
        f"tail reads (1 reader, batch {POP_BATCH}, nothing to ack): {res['tail_per_s']:,.0f}/s = "
        f"{res['tail_vs_pop_ack_1c']:.2f}x pop+ack with 1 consumer"
    )
    extra = [k for k in sorted(res) if k.startswith(("batch", "compaction", "rescale", "tier", "local"))]
    lines += [""] + [f"{k}: {res[k]:,.3f}" for k in extra]
    lines.append(f"total runtime {total:.1f} s")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> Settings:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 s per config, short warm-up, small fill, 64 MiB segments and seq file",
    )
    p.add_argument("--seconds", type=float, help="timed seconds per append config (default 3, quick 1)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per append config (default 0.5, quick 0.1)")
    p.add_argument(
        "--dir",
        default="./data",
        help="parent directory for temporary data dirs (default ./data); a fresh temp dir is "
        "made inside and removed afterwards",
    )
    p.add_argument("--segment-mib", type=int, help="commit log segment size in MiB (default 256, quick 64)")
    p.add_argument("--seq-mib", type=int, help="sequential write size in MiB (default 256, quick 64)")
    p.add_argument("--seq-repeats", type=int, default=3, help="sequential write repeats (median; default 3)")
    p.add_argument("--fill", type=int, help="messages pre-filled for pop+ack (default 200000, quick 20000)")
    p.add_argument("--pop-seconds", type=float, help="time bound per pop+ack run (default 30, quick 5)")
    p.add_argument(
        "--pool-max",
        type=int,
        default=2_000_000,
        help="max pre-built messages per append config (default 2000000)",
    )
    p.add_argument(
        "--only",
        help="comma list of parts to run: seq, append, pop, batch, compaction, rescale, tier "
        "(default: all but tier)",
    )
    p.add_argument(
        "--rescale-messages", type=int, help="messages in the rescaled topic (default 1000000, quick 100000)"
    )
    p.add_argument(
        "--compact-keys", type=int, help="keys of the compaction benchmark (default 20000, quick 2000)"
    )
    p.add_argument(
        "--append-config",
        help="comma list of append configurations to run, e.g. 100b_sync_64p (default: all 12)",
    )
    a = p.parse_args(argv)
    q = a.quick

    def pick(v: Any, full: Any, quick: Any) -> Any:
        return v if v is not None else (quick if q else full)

    return Settings(
        parent=a.dir,
        seconds=pick(a.seconds, 3.0, 1.0),
        warmup=pick(a.warmup, 0.5, 0.1),
        segment_size=pick(a.segment_mib, 256, 64) * MiB,
        seq_bytes=pick(a.seq_mib, 256, 64) * MiB,
        seq_repeats=max(1, a.seq_repeats),
        fill=pick(a.fill, 200_000, 20_000),
        pop_seconds=pick(a.pop_seconds, 30.0, 5.0),
        pool_max=a.pool_max,
        json=a.json,
        only=set(a.only.split(",")) if a.only else {"seq", "append", "pop", "batch", "compaction", "rescale"},
        compact_keys=pick(a.compact_keys, 20_000, 2_000),
        rescale_messages=pick(a.rescale_messages, 1_000_000, 100_000),
        append_configs=set(a.append_config.split(",")) if a.append_config else None,
    )


def event_loop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop, "asyncio"
    return uvloop.new_event_loop, "uvloop"


def run_in_loop(
    coro: Coroutine[Any, Any, dict[str, Any]], factory: Callable[[], asyncio.AbstractEventLoop]
) -> dict[str, Any]:
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    parent = os.path.abspath(cfg.parent)
    # Remember which directories we create so that they can go again afterwards.
    created: list[str] = []
    d = parent
    while not os.path.exists(d):
        created.append(d)
        d = os.path.dirname(d)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix="store-bench-", dir=parent)
    cfg.parent = work
    factory, loop_name = event_loop_factory()
    log(f"store bench: loop {loop_name}, work dir {work}")
    t0 = time.perf_counter()
    try:
        res = run_in_loop(run(cfg), factory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for d in created:  # innermost first
            with contextlib.suppress(OSError):
                os.rmdir(d)
    total = time.perf_counter() - t0
    res["event_loop"] = loop_name
    res["seconds_per_config"] = cfg.seconds
    res["total_runtime_s"] = total
    if cfg.json:
        print(json.dumps(res, sort_keys=True))
    else:
        cfg.parent = parent
        print(table(res, cfg, loop_name, total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
