"""Benchmark of the Spark `gateway` source (analytics/) against Spark's own JSON-lines reader.

What it measures, in one run:

1. Fill: `--messages` (default 1,000,000) messages with 100-byte bodies (JSON telemetry padded to
   100 bytes, MQTT-style properties `mqtt.topic` = `bench/dev<i % 1000>/telemetry` and `mqtt.qos`)
   are stored on topic `bench` (`--queues` queues, default 4) through an in-process
   `MessagingProcessor.send` in batches of 1024, async flush. Reported as `fill_per_s`.
2. A `gateway start` subprocess (HTTP only, on a free port) serves that data directory.
3. Spark (`--master`, default local[2]; shuffle partitions 2, UI off) reads the topic with the
   gateway source once and writes it as one JSON-lines file (Spark's JSON writer: the body as
   base64, the same rows and columns). This is the reference input.
4. Timed, `--runs` times each, alternating, after untimed warm-ups (row counts of both, checked,
   then one run of each; `--quick` skips the latter): the gateway source
   (`spark.read.format("gateway")`, the executors read over HTTP as Arrow) and Spark's native
   JSON reader over the file with the source's schema given (no inference); each DataFrame is
   fully materialised with the `noop` sink (every column of every row is produced).

`rows_per_s` is messages / median time of the gateway source; `native_json_rows_per_s` the same
for the JSON reader; `ratio_vs_native_json` = rows_per_s / native_json_rows_per_s (target >= 0.5).

Output: a human-readable summary, or with `--json` exactly one JSON object on stdout (progress on
stderr). `--quick`: 50,000 messages, 2 runs. Temporary data is removed unless `--keep`.

    .venv/bin/python bench/analytics_bench.py [--quick] [--json] [--messages N] [--runs R]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, Server, log, start_gateway

TOPIC = "bench"
BODY_BYTES = 100


def progress(msg: str) -> None:
    log(f"[analytics_bench] {msg}")


def body(i: int) -> bytes:
    b = json.dumps(
        {"ts": 1_700_000_000 + i // 1000, "value": round(20 + (i % 97) / 10, 2), "seq": i}
    ).encode()
    return (b + b" " * BODY_BYTES)[:BODY_BYTES]


async def fill(data_dir: str, n: int, queues: int) -> float:
    """Store n messages through the processor; returns messages per second."""
    from messaging_processor import ClientContext, LocalStoreClient, MessagingProcessor
    from store import Message, Store, StoreConfig

    store = await Store.open(StoreConfig(data_dir=data_dir, flush="async"))
    p = MessagingProcessor(LocalStoreClient(store))
    try:
        await p.create_topic(TOPIC, queues)
        ctx = ClientContext("bench")
        t0 = time.perf_counter()
        for lo in range(0, n, 1024):
            batch = [
                Message(
                    TOPIC,
                    body(i),
                    properties={"mqtt.topic": f"bench/dev{i % 1000}/telemetry", "mqtt.qos": "1"},
                    queue_id=i % queues,
                )
                for i in range(lo, min(n, lo + 1024))
            ]
            await p.send(ctx, batch)
        return n / (time.perf_counter() - t0)
    finally:
        await p.close()
        await store.close()


def timed(action: Any) -> float:
    t0 = time.perf_counter()
    action()
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> dict[str, Any]:
    n = args.messages
    root = tempfile.mkdtemp(prefix="analytics-bench-", dir=args.dir)
    data_dir = os.path.join(root, "data")
    gw: Server | None = None
    spark = None
    try:
        progress(f"filling {n} messages of {BODY_BYTES} B into {data_dir}")
        fill_rate = asyncio.run(fill(data_dir, n, args.queues))
        # `gateway start --data-dir <root>/data --protocols http --http-port P` (log in <root>/gateway.log);
        # it logs only warnings, so it is ready when /healthz answers 200.
        extra = ["--flush", "async", "--log-level", "warning"]
        gw = start_gateway(Path(root), "http", extra, ready_line=False, cwd=REPO)
        url = f"http://127.0.0.1:{gw.port}"
        progress(f"gateway on {url}; starting Spark ({args.master})")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from analytics.session import spark_session
        from analytics.source import SCHEMA

        spark = spark_session(
            "analytics-bench",
            master=args.master,
            conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        source = spark.read.format("gateway").option("url", url).option("topic", TOPIC)
        jdir = os.path.join(root, "json")
        progress("writing the reference JSON-lines file")
        source.load().coalesce(1).write.json(jdir)
        (part,) = glob.glob(os.path.join(jdir, "part-*"))
        jfile = os.path.join(root, "records.jsonl")
        os.rename(part, jfile)
        native = spark.read.schema(SCHEMA).json(jfile)

        def gateway_read() -> None:
            source.load().write.format("noop").mode("overwrite").save()

        def native_read() -> None:
            native.write.format("noop").mode("overwrite").save()

        progress("warm-up (and row counts)")
        counts = (source.load().count(), native.count())
        if counts != (n, n):
            raise RuntimeError(f"row counts {counts} != {n}")
        if not args.quick:
            gateway_read()
            native_read()
        g_times: list[float] = []
        j_times: list[float] = []
        for r in range(args.runs):
            g_times.append(timed(gateway_read))
            j_times.append(timed(native_read))
            progress(f"run {r + 1}/{args.runs}: gateway {g_times[-1]:.2f} s, native json {j_times[-1]:.2f} s")
        g, j = statistics.median(g_times), statistics.median(j_times)
        return {
            "rows_per_s": round(n / g, 1),
            "native_json_rows_per_s": round(n / j, 1),
            "ratio_vs_native_json": round(j / g, 3),
            "best_rows_per_s": round(n / min(g_times), 1),
            "best_native_json_rows_per_s": round(n / min(j_times), 1),
            "gateway_s": [round(t, 3) for t in g_times],
            "native_json_s": [round(t, 3) for t in j_times],
            "messages": n,
            "body_bytes": BODY_BYTES,
            "queues": args.queues,
            "json_file_mb": round(os.path.getsize(jfile) / 1e6, 1),
            "fill_per_s": round(fill_rate, 1),
            "spark_master": args.master,
            "runs": args.runs,
        }
    finally:
        if spark is not None:
            spark.stop()
        if gw is not None:
            gw.stop()
        if args.keep:
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=None, help="messages to store and read (default 1000000)")
    ap.add_argument("--runs", type=int, default=None, help="timed runs of each reader (default 3)")
    ap.add_argument("--queues", type=int, default=4, help="queues of the topic (default 4)")
    ap.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    ap.add_argument("--quick", action="store_true", help="50,000 messages, 2 runs (smoke test)")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--dir", default=None, help="parent of the temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the temporary data")
    args = ap.parse_args(argv)
    if args.messages is None:
        args.messages = 50_000 if args.quick else 1_000_000
    if args.runs is None:
        args.runs = 2 if args.quick else 3
    res = run(args)
    if args.json:
        print(json.dumps(res))
    else:
        print(
            f"gateway source: {res['rows_per_s']:,.0f} rows/s (median of {res['runs']}), "
            f"Spark JSON-lines reader: {res['native_json_rows_per_s']:,.0f} rows/s, "
            f"ratio {res['ratio_vs_native_json']:.2f} (target >= 0.5); "
            f"{res['messages']:,} messages of {res['body_bytes']} B, fill {res['fill_per_s']:,.0f}/s"
        )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
