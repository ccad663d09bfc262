"""Retained replay and reconnect storms, gateway vs Mosquitto (issue 48 items 3 and 4).

    .venv/bin/python bench/mqtt_index_bench.py [--retained 10000] [--matching 0] [--sessions 10000]
        [--servers gateway,mosquitto] [--src DIR] [--json]

- retained: `--retained` retained messages are published (pipelined QoS 1, window 500); with
  `--matching M` only one path in retained/M is a `dev/<i>/state`, the rest `other/<i>/x`
  (default: all are). Then a new subscriber of `dev/+/state` (QoS 1, acking) is timed from its
  SUBSCRIBE to the last retained message (`retained_replay_s`), three times.
- storm: `--sessions` persistent 3.1.1 sessions (Clean Session 0), each subscribed to
  `dev/<i>/cmd`, disconnect; then all reconnect, 200 at a time: `reconnects_per_s` (CONNECT to a
  CONNACK with session present), every one checked.

Raw clients over the repository's MQTT codec, one process, the same for every server; the
server is pinned to CPU 1, the clients run on CPU 0. Host load and steal are printed beside the
figures: on a shared machine they are provisional.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import cpu_ticks, start_gateway, steal_since  # noqa: E402
from mqtt_servers import start_mosquitto  # noqa: E402

from adapters.mqtt.codec import (  # noqa: E402
    Connack,
    Connect,
    Decoder,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    encode_connect,
    encode_puback,
    encode_publish,
    encode_subscribe,
)
from adapters.mqtt.codec.packets import Puback  # noqa: E402


class Client:
    def __init__(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.r, self.w = r, w
        self.dec = Decoder("client", version=4)

    @classmethod
    async def connect(cls, port: int, cid: str, clean: bool = True) -> tuple[Client, Connack]:
        r, w = await asyncio.open_connection("127.0.0.1", port)
        c = cls(r, w)
        w.write(encode_connect(Connect(cid, 4, clean_start=clean, keep_alive=600)))
        ack = await c.recv()
        assert isinstance(ack, Connack) and ack.reason_code == 0, ack
        return c, ack

    async def recv(self):
        while True:
            p = self.dec.next_packet()
            if p is not None:
                return p
            data = await self.r.read(1 << 16)
            if not data:
                raise ConnectionError("closed")
            self.dec.feed(data)

    def close(self) -> None:
        self.w.close()


async def publish_retained(port: int, paths: list[str]) -> None:
    c, _ = await Client.connect(port, "retained-publisher")
    window = asyncio.Semaphore(500)
    done = asyncio.Event()
    left = len(paths)

    async def acks() -> None:
        nonlocal left
        while left:
            p = await c.recv()
            if isinstance(p, Puback):
                window.release()
                left -= 1
        done.set()

    t = asyncio.create_task(acks())
    for i, path in enumerate(paths):
        await window.acquire()
        c.w.write(encode_publish(path, b"state-%d" % i, 1, i % 65535 + 1, retain=True))
        if i % 256 == 0:
            await c.w.drain()
    await done.wait()
    await t
    c.close()


async def replay(port: int, expect: int, n: int) -> float:
    c, _ = await Client.connect(port, f"replay-{n}")
    t0 = time.perf_counter()
    c.w.write(encode_subscribe(Subscribe(1, [Subscription("dev/+/state", 1)]), 4))
    got = 0
    while got < expect:
        p = await c.recv()
        if isinstance(p, Publish):
            got += 1
            if p.qos:
                c.w.write(encode_puback(p.packet_id))
        elif isinstance(p, Suback):
            continue
    dt = time.perf_counter() - t0
    c.close()
    return dt


async def storm(port: int, sessions: int) -> float:
    sem = asyncio.Semaphore(200)

    async def make(i: int) -> None:
        async with sem:
            c, _ = await Client.connect(port, f"dev-{i}", clean=False)
            c.w.write(encode_subscribe(Subscribe(1, [Subscription(f"dev/{i}/cmd", 1)]), 4))
            while not isinstance(await c.recv(), Suback):
                pass
            c.w.write(b"\xe0\x00")  # DISCONNECT
            await c.w.drain()
            c.close()

    await asyncio.gather(*(make(i) for i in range(sessions)))
    await asyncio.sleep(2)  # the sessions' detach (a record write each) done

    async def resume(i: int) -> None:
        async with sem:
            c, ack = await Client.connect(port, f"dev-{i}", clean=False)
            assert ack.session_present, f"dev-{i} lost its session"
            c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(resume(i) for i in range(sessions)))
    return sessions / (time.perf_counter() - t0)


def host() -> str:
    return open("/proc/loadavg").read().split()[0]


async def run(server: str, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"idx-{server}-"))
    if server == "mosquitto":
        srv = start_mosquitto(work, cpu=1)
    else:
        src = Path(args.src) if args.src else None
        srv = start_gateway(
            work, "mqtt", ["--trace-retention", "off"] if args.no_trace else [], cpu=1, src=src
        )
    out: dict = {"server": server}
    try:
        if args.retained:
            m = args.matching or 1
            paths = [f"dev/{i}/state" if i % m == 0 else f"other/{i}/x" for i in range(args.retained)]
            expect = sum(1 for p in paths if p.startswith("dev/"))
            t0 = time.perf_counter()
            await publish_retained(srv.port, paths)
            out["retained_publish_s"] = round(time.perf_counter() - t0, 2)
            ticks = cpu_ticks()
            runs = [await replay(srv.port, expect, k) for k in range(3)]
            out |= {
                "retained": args.retained,
                "replayed": expect,
                "retained_replay_s": round(min(runs), 4),
                "retained_replay_runs_s": [round(x, 4) for x in runs],
                "load": host(),
                "steal_pct": round(100 * steal_since(ticks), 1),
            }
        if args.sessions:
            ticks = cpu_ticks()
            out["reconnects_per_s"] = round(await storm(srv.port, args.sessions))
            out["storm_load"] = host()
            out["storm_steal_pct"] = round(100 * steal_since(ticks), 1)
    finally:
        srv.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--retained", type=int, default=10_000)
    ap.add_argument("--matching", type=int, default=0, help="one dev/<i>/state path in this many")
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--servers", default="gateway,mosquitto")
    ap.add_argument("--src", help="gateway source tree to run (default: this repository)")
    ap.add_argument("--no-trace", action="store_true", help="gateway with --trace-retention off")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.sched_setaffinity(0, {0})
    results = [asyncio.run(run(s, args)) for s in args.servers.split(",")]
    if args.json:
        print(json.dumps(results))
    else:
        for r in results:
            print(r)


if __name__ == "__main__":
    main()
