"""Benchmark of the RocketMQ 5 gRPC adapter end to end: grpc.aio server + MessagingProcessor + Store.

What it measures, in one run:

1. Sends. The gateway pieces (Store with `--flush` policy, sync by default; MessagingProcessor;
   GrpcAdapter on an ephemeral port) run in this process on uvloop (when importable), with the
   garbage collector set up as `gateway start` sets it up (`gateway.collector`). Load
   generators run in `--clients` separate processes (multiprocessing, spawn), each with its own
   grpc.aio channel and event loop, together running `--producers` concurrent producer tasks. Each
   task awaits one SendMessage before the next. Run twice: with 1 message per SendMessage
   (`sends_per_s_batch1`) and with `--batch` messages per SendMessage (`sends_per_s`, counted in
   messages). Latency percentiles are per SendMessage call, in ms. Bodies are `--size` bytes.

2. Receive + ack. The messages sent above are consumed by one group: `--consumers` tasks (spread
   over the client processes) loop ReceiveMessage(batch 32) and then one AckMessage with every
   receipt handle of the batch, for `--seconds` or until the topic is drained.
   `receive_ack_per_s` counts acked messages.

3. Ceiling (like the bare endpoint of the HTTP bench): the same receive + ack load against a grpc.aio
   server on this loop that does no work: ReceiveMessage streams 32 responses built once (from a
   stored message, by `convert.fill_proto`; grpc serializes them each time), AckMessage answers
   every entry OK without a store. `receive_ack_ceiling_per_s` is what grpc.aio and the load
   generator reach by themselves on this machine; `receive_ack_ratio_vs_ceiling` = our rate / that.

Load generator I/O (`--client-poller`, `client_poller` in the output). The load generators share
this machine's CPUs with the gateway, so what they spend per message is taken from the gateway.
grpc's default EventEngine moves every streamed message through extra threads: about 8 context
switches per received message in all, against 4-5 with EventEngine turned off for client channels
(`GRPC_EXPERIMENTS=-event_engine_client`, set in the load generator processes only). `legacy`, the
default, does that; `event-engine` keeps grpc's default. The gateway and the ceiling server always
run with grpc's defaults, and both phases use the same load generators.

Host noise. `*_host_steal` is the share of all CPU time the hypervisor gave to other guests during
each phase (from /proc/stat). On a shared virtual machine it reaches 0.3-0.5 at times, and the
figures of such a phase say more about the host than about the gateway.

`--phases` picks a subset of send,receive,ceiling; without `send`, `--preload` messages are appended
to the store directly (not timed) for the receive phase.

Output: a readable summary, or with `--json` exactly one JSON object on stdout (progress goes to
stderr). `--quick` is a short smoke run.

    .venv/bin/python bench/grpc_bench.py [--quick] [--json] [--seconds S] [--producers N] [--batch B]
        [--phases send,receive,ceiling] [--preload N] [--client-poller legacy|event-engine]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import shutil
import tempfile
import time

from common import cpu_ticks, log, steal_since
from grpc_loadgen import GROUP, RECEIVE_BATCH, TOPIC, Job, loop_policy, run_clients

# ---------------------------------------------------------------------------- gateway


async def _bench(args: argparse.Namespace, loop_name: str) -> dict:
    from adapters.grpc import GrpcAdapter
    from gateway import collector as gc_collector
    from messaging_processor import LocalStoreClient, MessagingProcessor
    from store import Message, Store, StoreConfig

    phases = set(args.phases.split(","))
    tmp = tempfile.mkdtemp(prefix="grpc-bench-", dir=args.dir)
    res: dict = {
        "event_loop": loop_name,
        "flush": args.flush,
        "body_bytes": args.size,
        "client_poller": args.client_poller,
    }
    try:
        store = await Store.open(StoreConfig(data_dir=tmp, flush=args.flush, auto_create_topics=False))
        processor = MessagingProcessor(LocalStoreClient(store))
        await processor.start()
        await processor.create_topic(TOPIC, queues=8)
        # The first append allocates (zero-fills) the first commit log segment: keep it out of the timing.
        await store.append(Message(TOPIC, b"warm-up", tag="warm-up"))
        adapter = GrpcAdapter(processor, host="127.0.0.1", port=0)
        await adapter.start()
        collector = gc_collector.take_over()  # the garbage collector set up as `gateway start` sets it up
        try:
            if "send" in phases:
                res.update(await _send_phases(args, adapter.address))
            elif "receive" in phases:
                body = b"x" * args.size
                for i in range(0, args.preload, 1000):
                    n = min(1000, args.preload - i)
                    await store.append_many([Message(TOPIC, body, tag="bench") for _ in range(n)])
                log(f"preloaded {args.preload} messages")
            if "receive" in phases:
                log(f"receive+ack: {args.consumers} consumers, batch {RECEIVE_BATCH}")
                jr = Job(
                    "receive",
                    adapter.address,
                    args.consumers,
                    args.seconds * 2,
                    0.0,
                    loop=args.loop,
                    poller=args.client_poller,
                )
                t0 = cpu_ticks()
                rr = await run_clients(jr, args.clients)
                steal = steal_since(t0)
                log(f"  {rr['per_s']:.0f} msg/s, p50 {rr['p50_ms']:.2f} ms, p99 {rr['p99_ms']:.2f} ms")
                res.update(
                    {
                        "consumers": args.consumers,
                        "receive_batch": RECEIVE_BATCH,
                        "receive_ack_per_s": rr["per_s"],
                        "receive_ack_p50_ms": rr["p50_ms"],
                        "receive_ack_p99_ms": rr["p99_ms"],
                        "receive_ack_messages": rr["count"],
                        "receive_ack_errors": rr["errors"],
                        "receive_ack_host_steal": steal,
                    }
                )
        finally:
            collector.stop()
            await adapter.stop(1.0)
            await processor.close()
            await store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if "ceiling" in phases:
        log(f"receive+ack ceiling (a server that does no work): {args.consumers} consumers")
        rc = await _ceiling(args)
        log(f"  {rc['per_s']:.0f} msg/s, p50 {rc['p50_ms']:.2f} ms, p99 {rc['p99_ms']:.2f} ms")
        res["receive_ack_ceiling_per_s"] = rc["per_s"]
        res["ceiling_host_steal"] = rc["steal"]
        if "receive_ack_per_s" in res and rc["per_s"]:
            res["receive_ack_ratio_vs_ceiling"] = res["receive_ack_per_s"] / rc["per_s"]
    return res


async def _send_phases(args: argparse.Namespace, address: str) -> dict:
    log(f"sends: {args.producers} producers x {args.clients} processes, batch 1, {args.seconds} s")
    base = Job(
        "send",
        address,
        args.producers,
        args.seconds,
        args.warmup,
        1,
        args.size,
        args.loop,
        args.client_poller,
    )
    t0 = cpu_ticks()
    r1 = await run_clients(base, args.clients)
    log(f"  {r1['per_s']:.0f} msg/s, p50 {r1['p50_ms']:.2f} ms, p99 {r1['p99_ms']:.2f} ms")
    log(f"sends: batch {args.batch}")
    jb = dataclasses.replace(base, batch=args.batch)
    rb = await run_clients(jb, args.clients)
    steal = steal_since(t0)
    log(f"  {rb['per_s']:.0f} msg/s, p50 {rb['p50_ms']:.2f} ms, p99 {rb['p99_ms']:.2f} ms")
    return {
        "producers": args.producers,
        "client_processes": args.clients,
        "send_batch": args.batch,
        "sends_per_s": rb["per_s"],
        "send_p50_ms": rb["p50_ms"],
        "send_p99_ms": rb["p99_ms"],
        "sends_per_s_batch1": r1["per_s"],
        "send_p50_ms_batch1": r1["p50_ms"],
        "send_p99_ms_batch1": r1["p99_ms"],
        "send_errors": r1["errors"] + rb["errors"],
        "send_host_steal": steal,
    }


async def _ceiling(args: argparse.Namespace) -> dict:
    """The receive + ack load against a grpc.aio MessagingService that does no work."""
    import grpc

    from adapters.grpc.codes import OK, Code
    from adapters.grpc.convert import fill_proto
    from adapters.grpc.generated import service_pb2 as s
    from adapters.grpc.generated import service_pb2_grpc
    from messaging_processor import Delivery
    from store import Message

    now = int(time.time() * 1000)
    msg = Message(
        TOPIC, b"x" * args.size, tag="bench", message_id="0A0B0C0D00002A9F0000000000000001",
        born_timestamp=now, born_host="127.0.0.1", queue_id=3, store_timestamp=now,
        store_host="127.0.0.1:8081", queue_offset=1234, commitlog_offset=99999, size=200,
    )  # fmt: skip
    batch = []
    for i in range(RECEIVE_BATCH):
        r = s.ReceiveMessageResponse()
        fill_proto(Delivery(msg, f"1a2b3c 3 {i} {TOPIC} {GROUP}", now + 60_000, 1), r.message)
        batch.append(r)
    head = s.ReceiveMessageResponse(status=OK)

    class Idle(service_pb2_grpc.MessagingServiceServicer):
        async def QueryRoute(self, request, context):  # noqa: N802 - gRPC method name
            return s.QueryRouteResponse(status=OK)

        async def ReceiveMessage(self, request, context):  # noqa: N802
            yield head
            for r in batch:
                yield r
            tail = s.ReceiveMessageResponse()
            tail.delivery_timestamp.GetCurrentTime()
            yield tail

        async def AckMessage(self, request, context):  # noqa: N802
            resp = s.AckMessageResponse(status=OK)
            add = resp.entries.add
            for e in request.entries:
                st = add(message_id=e.message_id, receipt_handle=e.receipt_handle).status
                st.code = Code.OK
                st.message = "OK"
            return resp

    server = grpc.aio.server()
    service_pb2_grpc.add_MessagingServiceServicer_to_server(Idle(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        address = f"127.0.0.1:{port}"
        job = Job(
            "receive",
            address,
            args.consumers,
            args.seconds * 2,
            0.0,
            loop=args.loop,
            poller=args.client_poller,
        )  # as ours
        t0 = cpu_ticks()
        res = await run_clients(job, args.clients)
        res["steal"] = steal_since(t0)
        return res
    finally:
        await server.stop(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each send phase")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--producers", type=int, default=64, help="concurrent producer tasks in all")
    ap.add_argument("--consumers", type=int, default=32, help="concurrent consumer tasks in all")
    ap.add_argument("--clients", type=int, default=1, help="load generator processes")
    ap.add_argument("--batch", type=int, default=32, help="messages per SendMessage in the batched phase")
    ap.add_argument("--size", type=int, default=100, help="message body bytes")
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument(
        "--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop (all processes)"
    )
    ap.add_argument(
        "--client-poller",
        choices=("legacy", "event-engine"),
        default="legacy",
        help="grpc I/O in the load generators: legacy (EventEngine off for client channels, fewer "
        "thread hand-offs per message) or grpc's default EventEngine",
    )
    ap.add_argument("--dir", default=None, help="parent of the temporary data directory")
    ap.add_argument("--quick", action="store_true", help="short smoke run")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--phases", default="send,receive,ceiling", help="subset of send,receive,ceiling")
    ap.add_argument("--preload", type=int, default=200_000, help="messages stored for receive without send")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds = min(args.seconds, 0.5)
        args.warmup = min(args.warmup, 0.2)
        args.producers = min(args.producers, 8)
        args.consumers = min(args.consumers, 2)
    loop_name = loop_policy(args.loop)
    res = asyncio.run(_bench(args, loop_name))
    if args.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:24} {v:.2f}" if isinstance(v, float) else f"{k:24} {v}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
