"""Declaring many bound queues: what an AMQP app that declares its topology at start waits for, on
our gateway and on RabbitMQ (same client, same machine).

One aio-pika connection declares a durable direct exchange, then `--queues` (3,000) durable queues,
each bound to the exchange by its own routing key, one after the other (declare, bind; each awaits
its -ok). Per broker: `declare_total_s`, `declare_bind_ms_per_queue` (total / queues), the time per
queue of each successive 1,000 (`ms_per_queue_by_1000`: flat when the cost does not grow with what
is declared already), and the server's CPU over the run (`server_cpu_s`). `declare_ratio_vs_rabbitmq`
= gateway total / RabbitMQ total. Brokers run unpinned, with their defaults, data in a fresh
temporary directory (bench/amqp_servers.py).

    .venv/bin/python bench/amqp_declare_bench.py [--brokers gateway,rabbitmq] [--queues N]
        [--gateway-src DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
from amqp_servers import AmqpServer, amqp_ready, start_rabbitmq
from common import cpu_s, log, start_gateway


async def declare(port: int, queues: int) -> dict[str, Any]:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=30)
    try:
        ch = await conn.channel()
        ex = await ch.declare_exchange("declare-bench", aio_pika.ExchangeType.DIRECT, durable=True)
        per_1000: list[float] = []
        t0 = last = time.perf_counter()
        for i in range(queues):
            q = await ch.declare_queue(f"declare-bench-{i}", durable=True)
            await q.bind(ex, f"k{i}")
            if (i + 1) % 1000 == 0:
                now = time.perf_counter()
                per_1000.append(round((now - last) / 1000 * 1000, 2))
                last = now
        total = time.perf_counter() - t0
    finally:
        await conn.close()
    return {
        "declare_total_s": round(total, 2),
        "declare_bind_ms_per_queue": round(total / queues * 1000, 2),
        "ms_per_queue_by_1000": per_1000,
    }


def run_broker(name: str, args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"declare-bench-{name}-"))
    server: AmqpServer | None = None
    try:
        if name == "gateway":
            server = start_gateway(
                work,
                "amqp",
                [],
                src=args.gateway_src,
                ready=amqp_ready,
                server_cls=AmqpServer,
                info_src=False,
            )
        else:
            server = start_rabbitmq(work, None)
        pid = getattr(server, "measured_pid", None) or server.pid
        c0 = cpu_s(pid)
        out = asyncio.run(declare(server.port, args.queues))
        out["server_cpu_s"] = round(cpu_s(pid) - c0, 2)
        log(f"[{name}] {out}")
        return out
    except Exception as e:  # noqa: BLE001 - report it, go on with the other broker
        log(f"[{name}] failed: {e}")
        return {"error": str(e)}
    finally:
        if server is not None:
            with contextlib.suppress(Exception):
                server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--brokers", default="gateway,rabbitmq")
    ap.add_argument("--queues", type=int, default=3000)
    ap.add_argument("--gateway-src", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    brokers = {b: run_broker(b, args) for b in args.brokers.split(",") if b}
    g, r = brokers.get("gateway", {}), brokers.get("rabbitmq", {})
    ratio = (
        round(g["declare_total_s"] / r["declare_total_s"], 3)
        if "declare_total_s" in g and "declare_total_s" in r
        else None
    )
    report = {"declare_ratio_vs_rabbitmq": ratio, "queues": args.queues, "brokers": brokers}
    if args.json:
        print(json.dumps(report))
    else:
        for name, figs in brokers.items():
            print(f"{name:9} {figs}")
        print(f"declare_ratio_vs_rabbitmq {ratio}")


if __name__ == "__main__":
    main()
