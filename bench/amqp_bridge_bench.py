"""CPU per message of foreign (MQTT-style) traffic routed through the MQTT exchange (amq.topic),
in one process: a store, a processor and an AMQP adapter; messages stored as the MQTT adapter
stores them (`mqtt.topic` = plant1/dev<i % 1000>/telemetry, on store topic plant1) in sends of 32.

    .venv/bin/python bench/amqp_bridge_bench.py [--messages N] [--queues Q]

Scenarios: no bindings (the baseline: just the sends), and Q queues bound to amq.topic with narrow
patterns `plant1.dev<k>.telemetry` (k < Q: each matches 1 device in 1,000, so Q/1000 of the
traffic is routed to one queue). CPU = process time (all threads) from the first send until the
routing loop has acked everything; the figure is the extra CPU per foreign message over the
baseline."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aio_pika  # noqa: E402

from adapters.amqp import AmqpAdapter  # noqa: E402
from messaging_processor import ClientContext, Message  # noqa: E402
from tests.support import Core  # noqa: E402

CTX = ClientContext("mqtt", client_id="bench")


async def run(n: int, queues: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as d:
        core = await Core.open(d, flush="async", default_queues=8)
        p = core.processor
        adapter = await core.add(AmqpAdapter(p, "127.0.0.1", 0))
        await p.create_topic("plant1")
        bridge = adapter.broker.bridge
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{adapter.bound_port}/")
        ch = await conn.channel()
        for k in range(queues):
            q = await ch.declare_queue(f"worker{k}", durable=True)
            await q.bind("amq.topic", f"plant1.dev{k}.telemetry")
        while queues and "plant1" not in bridge.loops:
            await asyncio.sleep(0.01)
        msgs = [
            Message(
                "plant1",
                b"x" * 100,
                "",
                (),
                {"mqtt.topic": f"plant1/dev{i % 1000}/telemetry", "mqtt.qos": "1"},
            )
            for i in range(n)
        ]
        t0 = time.process_time()
        for i in range(0, n, 32):
            await p.send(CTX, msgs[i : i + 32], receipts=False)
        if queues:
            while (await p.backlog("amqp|x|plant1", "plant1")) != (0, 0):
                await asyncio.sleep(0.02)
        cpu = time.process_time() - t0
        routed = bridge.routed
        await conn.close()
        await core.close()
        return cpu, routed


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--queues", type=int, default=10)
    a = ap.parse_args()
    ap_runs = 3
    base = statistics.median([(await run(a.messages, 0))[0] for _ in range(ap_runs)])
    runs = [await run(a.messages, a.queues) for _ in range(ap_runs)]
    bound, routed = statistics.median(r[0] for r in runs), runs[0][1]
    us = 1e6 / a.messages
    print(f"{a.messages} foreign messages, sends of 32, median of {ap_runs} runs")
    print(f"no bindings:              {base * us:6.1f} us CPU/message")
    print(f"{a.queues} narrow bindings:       {bound * us:6.1f} us CPU/message ({routed} copies routed)")
    print(f"extra for the bindings:   {(bound - base) * us:6.1f} us CPU/message")


if __name__ == "__main__":
    asyncio.run(main())
