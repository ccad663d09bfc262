"""The `amqp_queues` phase of bench/scale_bench.py: many durable bound queues through aio-pika,
then a restart with them (our gateway; RabbitMQ beside it when installed).

One aio-pika connection declares a durable direct exchange, then Q durable queues, each bound by
its own routing key, one after the other (declare, bind; each awaits its -ok), like
bench/amqp_declare_bench.py. Figures: `amqp_declare_first_s_per_1k` and `..._last_s_per_1k`
(seconds per 1,000 queues over the first and the last 10 % of them: equal when the cost does not
grow with what is declared already), `amqp_declare_total_s`, the server's open descriptors and
VmRSS with the queues (`amqp_open_fds`, `amqp_rss_mib`), files under its data directory, then
`amqp_restart_s`: from SIGTERM's end (process gone) to ready again on the same data (ready line,
/healthz, AMQP port), and whether a sample of the queues is still there (passive declares).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aio_pika
from amqp_servers import AmqpServer, amqp_ready, rabbitmq_script, start_rabbitmq
from common import Server, log, start_gateway
from scale_phases import Window, proc_mem

EXCHANGE = "scale-bench"


async def declare(port: int, queues: int) -> tuple[list[float], float]:
    """Declare and bind `queues` queues; (completion time of each since the start, total s)."""
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=30)
    try:
        ch = await conn.channel()
        ex = await ch.declare_exchange(EXCHANGE, aio_pika.ExchangeType.DIRECT, durable=True)
        done: list[float] = []
        t0 = time.perf_counter()
        for i in range(queues):
            q = await ch.declare_queue(f"scale-q-{i}", durable=True)
            await q.bind(ex, f"k{i}")
            done.append(time.perf_counter() - t0)
    finally:
        await conn.close()
    return done, done[-1] if done else 0.0


async def still_there(port: int, queues: int, sample: int = 20) -> int:
    """How many of `sample` queues spread over the declared ones a passive declare finds."""
    names = sorted({f"scale-q-{i * max(queues - 1, 1) // max(sample - 1, 1)}" for i in range(sample)})
    found = 0
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=30)
    try:
        for name in names:
            ch = await conn.channel()
            try:
                await ch.declare_queue(name, passive=True)
                found += 1
            except aio_pika.exceptions.ChannelClosed:
                pass
    finally:
        await conn.close()
    return found if len(names) == sample else found * sample // max(len(names), 1)


def _open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _files(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def amqp_queues(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The phase on server `name` (gateway or rabbitmq) with data in `work`."""
    start: Callable[[], Server]
    if name == "gateway":

        def start() -> Server:
            return start_gateway(
                work,
                "amqp",
                args.gateway_args,
                cpu=args.server_cpu,
                src=args.gateway_src,
                ready=amqp_ready,
                server_cls=AmqpServer,
            )
    else:
        if rabbitmq_script() is None:
            return {}

        def start() -> Server:
            return start_rabbitmq(work, args.server_cpu)

    q = args.queues
    tenth = max(q // 10, 1)
    server = start()
    try:
        w = Window(server)
        done, total = asyncio.run(declare(server.port, q))
        load = w.stop("amqp_queues")
        first = done[tenth - 1]
        last = done[-1] - (done[-tenth - 1] if q > tenth else 0.0)
        rss, _ = proc_mem(server.pid)
        out: dict[str, Any] = {
            "amqp_queues": q,
            "amqp_declare_total_s": round(total, 2),
            "amqp_declare_first_s_per_1k": round(first / tenth * 1000, 3),
            "amqp_declare_last_s_per_1k": round(last / tenth * 1000, 3),
            "amqp_declare_server_cpu_s": round(w.figures["server_cpu_s"], 2),
            "amqp_open_fds": _open_fds(server.pid),
            "amqp_rss_mib": round(rss / 2**20, 1),
            **load,
        }
        data = work / ("data" if name == "gateway" else "mnesia")
        out["amqp_data_files"] = _files(data)
        server.stop(timeout=60)
        t = time.monotonic()
        server = start()
        out["amqp_restart_s"] = round(time.monotonic() - t, 2)
        out["amqp_open_fds_after_restart"] = _open_fds(server.pid)
        out["amqp_queues_found_after_restart"] = asyncio.run(still_there(server.port, q))
        log(f"  amqp_queues [{name}]: {out}")
        return out
    finally:
        with contextlib.suppress(Exception):
            server.stop()
