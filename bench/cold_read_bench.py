"""Cold-read isolation (issue 51 item 4): does a reader of a topic's tiered history slow the live tail?

A LOCAL gateway (`gateway start --protocols mqtt,http` with tiered storage on a local S3-compatible
server, moto's, as the tests use) holds a topic `history` whose segments were tiered before it
started (written and tiered by a `store.Store` on the same data directory, then closed). Two
figures:

- **live**: an MQTT publisher (aiomqtt, QoS 1) sends `--rate` messages a second to `live/probe`, a
  subscriber on the same topic (its own connection) takes them; publish-to-delivery latency of each
  message, both ends in this process (one clock).
- **cold reader**: a separate process reading the whole of `history` through the HTTP read API,
  queue by queue, as Arrow streams, the way the Spark connector's `ReadClient` requests ranges
  (`GET /read/topics/{t}/queues/{q}/messages?start=&end=&max=&format=arrow`; here with httpx, and the
  bytes are counted, not decoded: decoding is the Spark executor's CPU, not the gateway's). Before
  each pass it empties the tier's block cache directory, so every pass fetches its blocks from
  the object store again (ranged GETs) rather than reading the gateway's cache.

Phases alternate `alone`, `with cold reader`, `--rounds` times (`--seconds` each); the p99 of each
kind is over all its samples. `--json` prints `live_p99_ms_alone`, `live_p99_ms_with_cold_reader`,
`ratio` (the second over the first; the target is <= 1.5), `live_p50_ms_*`, `samples_*`,
`cold_read_mb_s` (what the cold reader got while it ran), `history_mib`, `loadavg_1m_before`
and `_after` (the machine is shared: say so with the figures).

    python bench/cold_read_bench.py [--history-mib 96] [--rate 200] [--seconds 8] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, log, start_gateway

SEG_MIB = 8
BUCKET = "cold-read-bench"
HISTORY = "history"
QUEUES = 2

READER = r"""
import glob, os, sys, time
import httpx
base, topic, queues, cache_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with httpx.Client(base_url=base, timeout=120) as c:
    qs = c.get(f"/read/topics/{topic}/queues").json()["queues"]
    ends = {int(q["queue_id"]): int(q["max_offset"]) for q in qs}
    print("READY", flush=True)
    while True:
        for f in glob.glob(os.path.join(cache_dir, "*")):
            try:
                os.unlink(f)
            except OSError:
                pass
        for q in range(queues):
            off, end = 0, ends[q]
            while off < end:
                params = {"start": off, "end": end, "max": 500000, "format": "arrow"}
                with c.stream("GET", f"/read/topics/{topic}/queues/{q}/messages", params=params,
                              headers={"Accept": "application/vnd.apache.arrow.stream"}) as r:
                    r.raise_for_status()
                    nxt = int(r.headers["X-Next-Offset"])
                    n = sum(len(b) for b in r.iter_bytes())
                print("BYTES", n, time.monotonic(), flush=True)
                if nxt <= off:
                    break
                off = nxt
"""


def preload(data_dir: Path, endpoint: str, mib: int) -> int:
    """Write `mib` MiB of 1 KiB messages to `history` and tier every closed segment; returns how
    many segments are tiered."""
    from store import Message, Store, StoreConfig
    from store.message import now_ms

    async def run() -> int:
        cfg = StoreConfig(
            data_dir=str(data_dir),
            segment_size=SEG_MIB << 20,
            flush="async",
            tier_endpoint=endpoint,
            tier_bucket=BUCKET,
            tier_interval_ms=3_600_000,
            compaction_process=False,
        )
        store = await Store.open(cfg)
        try:
            store.create_topic(HISTORY, queues=QUEUES)
            body = b"h" * 1000
            n = (mib << 20) // 1100
            for lo in range(0, n, 500):
                await store.append_many(
                    [Message(HISTORY, body, keys=(f"k{i}",)) for i in range(lo, min(lo + 500, n))]
                )
            await store.append_many([Message("filler", b"f" * 1000) for _ in range(2000)])  # closes the last
            return await store.tier_now(now_ms() + 2 * 86_400_000)
        finally:
            await store.close()

    return asyncio.run(run())


async def live_phase(port: int, rate: int, seconds: float) -> list[float]:
    """Publish-to-delivery latencies (ms) of `rate` QoS 1 messages a second for `seconds`."""
    import aiomqtt

    lat: list[float] = []
    n = int(rate * seconds)
    got = asyncio.Event()
    async with (
        aiomqtt.Client("127.0.0.1", port, identifier=f"sub-{os.getpid()}") as sub,
        aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{os.getpid()}") as pub,
    ):
        await sub.subscribe("live/probe", qos=1)

        async def receive() -> None:
            async for m in sub.messages:
                (sent,) = struct.unpack_from("<q", m.payload)
                lat.append((time.perf_counter_ns() - sent) / 1e6)
                if len(lat) >= n:
                    got.set()
                    return

        rx = asyncio.create_task(receive())
        await asyncio.sleep(0.3)
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            payload = struct.pack("<q", time.perf_counter_ns()) + b"p" * 100
            await pub.publish("live/probe", payload, qos=1)
        try:
            await asyncio.wait_for(got.wait(), 10)
        except TimeoutError:
            log(f"live phase: {len(lat)} of {n} delivered")
        rx.cancel()
    return lat


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))] if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history-mib", type=int, default=96)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()

    from tests.store.s3server import start_s3

    work = Path(tempfile.mkdtemp(prefix="cold-read-"))
    load_before = os.getloadavg()[0]
    s3 = start_s3()
    gw = reader = None
    try:
        s3.create_bucket(BUCKET)
        data = work / "data"
        t = time.monotonic()
        tiered = preload(data, s3.endpoint, args.history_mib)
        log(f"preloaded {args.history_mib} MiB, {tiered} segments tiered in {time.monotonic() - t:.1f}s")
        tier_args = ["--tier-s3-endpoint", s3.endpoint, "--tier-bucket", BUCKET]
        # (the segment size must be the preloaded one: bodies small enough not to grow it)
        tier_args += ["--segment-size-mib", str(SEG_MIB), "--max-body-size", "65536"]
        tier_args += ["--amqp-max-body-size", "65536"]
        gw = start_gateway(work, "mqtt", tier_args)
        words = str(gw.info["command"]).split()
        base = f"http://127.0.0.1:{words[words.index('--http-port') + 1]}"
        samples: dict[str, list[float]] = {"alone": [], "cold": []}
        cold_bytes, cold_s = 0, 0.0
        asyncio.run(live_phase(gw.port, args.rate, 1.0))  # warm-up
        for r in range(args.rounds):
            samples["alone"] += asyncio.run(live_phase(gw.port, args.rate, args.seconds))
            log(f"round {r}: alone p99 {pct(samples['alone'], 0.99):.2f} ms")
            reader = subprocess.Popen(
                [sys.executable, "-c", READER, base, HISTORY, str(QUEUES), str(data / "tier" / "cache")],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            assert reader.stdout is not None
            assert reader.stdout.readline().strip() == "READY"
            t0 = time.monotonic()
            samples["cold"] += asyncio.run(live_phase(gw.port, args.rate, args.seconds))
            cold_s += time.monotonic() - t0
            reader.terminate()
            out, _ = reader.communicate(timeout=10)
            reader = None
            cold_bytes += sum(int(line.split()[1]) for line in out.splitlines() if line.startswith("BYTES"))
            log(f"round {r}: with cold reader p99 {pct(samples['cold'], 0.99):.2f} ms")
    finally:
        if reader is not None:
            reader.kill()
        if gw is not None:
            gw.stop()
        s3.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    alone, cold = pct(samples["alone"], 0.99), pct(samples["cold"], 0.99)
    res = {
        "live_p99_ms_alone": round(alone, 3),
        "live_p99_ms_with_cold_reader": round(cold, 3),
        "ratio": round(cold / alone, 3),
        "live_p50_ms_alone": round(statistics.median(samples["alone"]), 3),
        "live_p50_ms_with_cold_reader": round(statistics.median(samples["cold"]), 3),
        "samples_alone": len(samples["alone"]),
        "samples_with_cold_reader": len(samples["cold"]),
        "cold_read_mb_s": round(cold_bytes / 1e6 / cold_s, 1) if cold_s else 0.0,
        "history_mib": args.history_mib,
        "rate": args.rate,
        "loadavg_1m_before": round(load_before, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
    }
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:32} {v}")


if __name__ == "__main__":
    main()
