"""gRPC load generators of bench/grpc_bench.py and bench/cluster_bench.py: `run_clients(job, n)`
runs a `Job` (sends or receive + ack against a MessagingService at `address`) split over `n`
separate processes (multiprocessing, spawn), each with its own grpc.aio channel and event loop
(`loop_policy`), and returns the total rate and latency percentiles.

- send: `tasks` producer tasks, each awaiting one SendMessage (`batch` messages of `size` bytes)
  before the next; latency per SendMessage call.
- receive: `tasks` consumer tasks looping ReceiveMessage(batch 32) then one AckMessage with every
  receipt handle of the batch, until `seconds` pass or the topic is drained; latency per
  receive + ack.

`poller` "legacy" (the default) turns grpc's EventEngine off for client channels in the load
generator processes (`GRPC_EXPERIMENTS=-event_engine_client`): fewer thread hand-offs per message;
"event-engine" keeps grpc's default.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import dataclass

TOPIC = "bench"
GROUP = "bench-consumers"
RECEIVE_BATCH = 32
CLIENT_ID = "bench@{pid}@{i}"


def loop_policy(name: str = "uvloop") -> str:
    if name == "asyncio":
        return "asyncio"
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    except ImportError:
        return "asyncio"


@dataclass(slots=True)
class Job:
    kind: str  # "send" | "receive"
    address: str
    tasks: int
    seconds: float
    warmup: float
    batch: int = 1
    size: int = 100
    loop: str = "uvloop"
    poller: str = "legacy"


# GRPC_EXPERIMENTS entry that turns grpc's EventEngine off for client channels (`--client-poller legacy`).
_NO_EVENT_ENGINE_CLIENT = "-event_engine_client"


def _worker(job: Job, out: mp.Queue) -> None:
    if job.poller == "legacy":  # read by grpc when it starts in this process, i.e. at first use
        os.environ["GRPC_EXPERIMENTS"] = ",".join(
            x for x in (os.environ.get("GRPC_EXPERIMENTS"), _NO_EVENT_ENGINE_CLIENT) if x
        )
    loop_policy(job.loop)
    try:
        out.put(asyncio.run(_run_job(job)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        out.put({"error": f"{type(e).__name__}: {e}"})


async def _run_job(job: Job) -> dict:
    import grpc

    from adapters.grpc.generated import definition_pb2 as d
    from adapters.grpc.generated import service_pb2 as s
    from adapters.grpc.generated import service_pb2_grpc

    channel = grpc.aio.insecure_channel(job.address, options=[("grpc.max_receive_message_length", -1)])
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    md = (("x-mq-client-id", CLIENT_ID.format(pid=os.getpid(), i=0)),)
    # Connect and warm the channel before the clock starts (process start-up is not measured).
    await channel.channel_ready()
    await stub.QueryRoute(s.QueryRouteRequest(topic=d.Resource(name=TOPIC)), metadata=md)
    lat: list[float] = []
    count = 0
    errors = 0
    t0 = time.perf_counter()
    start = t0 + job.warmup
    end = start + job.seconds
    stop = False

    if job.kind == "send":
        body = b"x" * job.size
        req = s.SendMessageRequest(
            messages=[
                d.Message(
                    topic=d.Resource(name=TOPIC),
                    body=body,
                    system_properties=d.SystemProperties(
                        tag="bench", message_type=d.NORMAL, body_encoding=d.IDENTITY
                    ),
                )
                for _ in range(job.batch)
            ]
        )
        send = stub.SendMessage

        async def producer() -> None:
            nonlocal count, errors
            pc = time.perf_counter
            while True:
                t = pc()
                if t >= end:
                    return
                r = await send(req, metadata=md)
                t2 = pc()
                if r.status.code != d.Code.OK:
                    errors += 1
                elif t >= start:
                    lat.append(t2 - t)
                    count += job.batch

        await asyncio.gather(*[producer() for _ in range(job.tasks)])
    else:
        rreq = s.ReceiveMessageRequest(
            group=d.Resource(name=GROUP),
            message_queue=d.MessageQueue(topic=d.Resource(name=TOPIC), id=-1),
            filter_expression=d.FilterExpression(type=d.TAG, expression="*"),
            batch_size=RECEIVE_BATCH,
        )
        rreq.invisible_duration.seconds = 60
        rreq.long_polling_timeout.nanos = 200_000_000
        group = d.Resource(name=GROUP)
        topic = d.Resource(name=TOPIC)
        empty = 0

        async def consumer() -> None:
            nonlocal count, errors, stop, empty
            pc = time.perf_counter
            while not stop:
                t = pc()
                if t >= end:
                    return
                entries = []
                async for r in stub.ReceiveMessage(rreq, metadata=md):
                    if r.HasField("message"):
                        sp = r.message.system_properties
                        entries.append(
                            s.AckMessageEntry(message_id=sp.message_id, receipt_handle=sp.receipt_handle)
                        )
                if not entries:
                    empty += 1
                    if empty >= 2 * job.tasks and pc() >= start:
                        stop = True  # drained
                    continue
                a = await stub.AckMessage(
                    s.AckMessageRequest(group=group, topic=topic, entries=entries), metadata=md
                )
                t2 = pc()
                if a.status.code != d.Code.OK:
                    errors += 1
                elif t >= start:
                    lat.append(t2 - t)
                    count += len(entries)

        await asyncio.gather(*[consumer() for _ in range(job.tasks)])
    elapsed = min(time.perf_counter(), end) - start
    await channel.close()
    return {"count": count, "errors": errors, "lat": lat, "elapsed": max(elapsed, 1e-9)}


async def run_clients(job: Job, clients: int) -> dict:
    """Run `job` split over `clients` processes; returns total rate and latency percentiles (ms)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per = [job.tasks // clients + (1 if i < job.tasks % clients else 0) for i in range(clients)]
    procs = []
    for n in per:
        if n == 0:
            continue
        j = dataclasses.replace(job, tasks=n)
        p = ctx.Process(target=_worker, args=(j, q), daemon=True)
        p.start()
        procs.append(p)
    loop = asyncio.get_running_loop()
    results = [await loop.run_in_executor(None, q.get) for _ in procs]
    for p in procs:
        await loop.run_in_executor(None, p.join)
    errs = [r["error"] for r in results if "error" in r]
    if errs:
        raise RuntimeError("; ".join(errs))
    lat = sorted(x for r in results for x in r["lat"])
    count = sum(r["count"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    return {
        "per_s": count / elapsed,
        "count": count,
        "errors": sum(r["errors"] for r in results),
        "p50_ms": _pct(lat, 50),
        "p99_ms": _pct(lat, 99),
    }


def _pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    if len(xs) == 1:
        return xs[0] * 1000
    return statistics.quantiles(xs, n=100, method="inclusive")[int(p) - 1] * 1000
