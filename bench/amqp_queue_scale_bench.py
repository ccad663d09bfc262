"""Queues at scale (issue 48 item 5): declare `--queues` durable queues, each bound to a durable
direct exchange by its own key, through one aio-pika connection; report the time per queue of each
successive 1,000 (first and last tenth compared), the gateway's open file descriptors and RSS per
queue once declared, and the time a restart over them takes (SIGTERM, start again, until the AMQP
port answers and a passive declare of the last queue succeeds).

    .venv/bin/python bench/amqp_queue_scale_bench.py [--queues 10000] [--gateway-src DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
from amqp_servers import AmqpServer, amqp_ready
from common import cpu_s, log, start_gateway


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def host_load() -> dict[str, Any]:
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    return {"loadavg": load, "steal_ticks": cpu[7] if len(cpu) > 7 else 0}


async def declare(port: int, queues: int) -> dict[str, Any]:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=30)
    try:
        ch = await conn.channel()
        ex = await ch.declare_exchange("scale-bench", aio_pika.ExchangeType.DIRECT, durable=True)
        per_1000: list[float] = []
        t0 = last = time.perf_counter()
        for i in range(queues):
            q = await ch.declare_queue(f"scale-bench-{i}", durable=True)
            await q.bind(ex, f"k{i}")
            if (i + 1) % 1000 == 0:
                now = time.perf_counter()
                per_1000.append(round((now - last), 3))
                last = now
        total = time.perf_counter() - t0
    finally:
        await conn.close()
    tenth = max(len(per_1000) // 10, 1)
    first, lastp = sum(per_1000[:tenth]), sum(per_1000[-tenth:])
    return {
        "declare_total_s": round(total, 2),
        "s_per_1000": per_1000,
        "first_tenth_s": round(first, 3),
        "last_tenth_s": round(lastp, 3),
        "last_vs_first": round(lastp / first, 3) if first else None,
    }


async def check_queue(port: int, name: str) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=30)
    try:
        ch = await conn.channel()
        await ch.declare_queue(name, passive=True)
    finally:
        await conn.close()


def start(work: Path, args: argparse.Namespace) -> AmqpServer:
    return start_gateway(
        work, "amqp", [], src=args.gateway_src, ready=amqp_ready, server_cls=AmqpServer, timeout=600
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--gateway-src", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="work directory to use and keep")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="queue-scale-"))
    out: dict[str, Any] = {"queues": args.queues, "host_before": host_load()}
    server = start(work, args)
    try:
        pid = server.pid
        fd0, rss0 = fds(pid), rss_kib(pid)
        c0 = cpu_s(pid)
        out.update(asyncio.run(declare(server.port, args.queues)))
        out["server_cpu_s"] = round(cpu_s(pid) - c0, 2)
        fd1, rss1 = fds(pid), rss_kib(pid)
        out.update(
            fds_before=fd0,
            fds_after=fd1,
            fds_per_queue=round((fd1 - fd0) / args.queues, 4),
            rss_kib_before=rss0,
            rss_kib_after=rss1,
            rss_kib_per_queue=round((rss1 - rss0) / args.queues, 2),
        )
    finally:
        server.stop(timeout=120)
    t0 = time.perf_counter()
    server = start(work, args)
    try:
        asyncio.run(check_queue(server.port, f"scale-bench-{args.queues - 1}"))
        out["restart_s"] = round(time.perf_counter() - t0, 2)
        out["fds_after_restart"] = fds(server.pid)
        out["rss_kib_after_restart"] = rss_kib(server.pid)
    finally:
        server.stop(timeout=120)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    out["host_after"] = host_load()
    log(str(out))
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
