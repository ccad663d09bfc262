"""The bridge soak (issue 50, item 3's acceptance): N messages (100,000 by default) moved
Mosquitto -> gateway -> RabbitMQ -> gateway -> Mosquitto by four links of one `gateway bridge`
process, while each part in turn is killed with SIGKILL and started again: the bridge process,
the gateway, RabbitMQ, Mosquitto. Prints (and with --json writes) produced, received, lost,
duplicates and the time taken.

    .venv/bin/python bench/bridge_soak.py [--messages N] [--json FILE] [--workdir DIR]

The chain (docs/bridges.md, "The soak"):

    producer --fwd/<k>--> Mosquitto --[l1 mqtt->mqtt]--> gateway (store topic `fwd`)
      --[l2 gateway AMQP queue `fwd` -> RabbitMQ amq.topic, key fwd.<k>]--> RabbitMQ queue `soak`
      --[l3 RabbitMQ queue -> gateway MQTT, fwd/ -> ret/]--> gateway (topic `ret`)
      --[l4 gateway MQTT ret/# -> Mosquitto]--> Mosquitto --ret/#--> consumer

Producer and consumer are MQTT QoS 1 clients of Mosquitto (the consumer with a persistent
session); the producer resends a batch whose PUBACKs it did not all get (so a Mosquitto kill can
add duplicates of its own). Lost = produced (PUBACKed to the producer) - distinct received; each kill's
`duplicates_after` is what arrived twice between it and the next kill.
Mosquitto saves its database after every change (`autosave_interval 1`); the gateway runs with
`--flush sync`; RabbitMQ's queue is durable and the messages persistent. Kills happen when the
consumer has `--kill-at` of the messages (default 0.15, 0.35, 0.55, 0.75), one part each."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aio_pika
import aiomqtt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.bridge.peers import Mosquitto, RabbitMQ, free_port  # noqa: E402

PARTS = ("bridge", "gateway", "rabbitmq", "mosquitto")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Proc:
    """A `gateway ...` subprocess (bridge or gateway), restartable with the same arguments."""

    def __init__(self, name: str, args: list[str], workdir: Path, ready) -> None:
        self.name, self.args, self.workdir, self.ready = name, args, workdir, ready
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 60) -> None:
        self.starts += 1
        out = open(self.workdir / f"{self.name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", *self.args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: see {self.workdir / (self.name + '.log')}")
            if self.ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready in {timeout} s")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


def bridges_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return all(b["up"] for b in json.loads(r.read()))
    except (OSError, ValueError):
        return False


def bridge_toml(mq: int, gw_mqtt: int, gw_amqp: int, rabbit: int, inflight: int) -> str:
    common = f"inflight = {inflight}\nreconnect_min_s = 0.1\nreconnect_max_s = 2.0\n"
    return f"""
[[bridge]]
name = "l1-mosquitto-to-gateway"
{common}from = {{ url = "mqtt://127.0.0.1:{mq}" }}
to = {{ url = "mqtt://127.0.0.1:{gw_mqtt}" }}
[[bridge.topic]]
filter = "fwd/#"

[[bridge]]
name = "l2-gateway-to-rabbitmq"
{common}from = {{ url = "amqp://127.0.0.1:{gw_amqp}", queue = "fwd", declare = true }}
to = {{ url = "amqp://127.0.0.1:{rabbit}", exchange = "amq.topic" }}

[[bridge]]
name = "l3-rabbitmq-to-gateway"
{common}from = {{ url = "amqp://127.0.0.1:{rabbit}", queue = "soak" }}
to = {{ url = "mqtt://127.0.0.1:{gw_mqtt}" }}
[[bridge.topic]]
filter = "#"
from_prefix = "fwd/"
to_prefix = "ret/"

[[bridge]]
name = "l4-gateway-to-mosquitto"
{common}from = {{ url = "mqtt://127.0.0.1:{gw_mqtt}" }}
to = {{ url = "mqtt://127.0.0.1:{mq}" }}
[[bridge.topic]]
filter = "ret/#"
"""


class Consumer:
    """A persistent-session MQTT subscriber of Mosquitto's `ret/#`, reconnecting after failures."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen: dict[int, int] = {}
        self.received = 0
        self.progress = asyncio.Event()

    async def run(self) -> None:
        first = True
        while True:
            try:
                async with aiomqtt.Client(
                    "127.0.0.1", self.port, identifier="soak-consumer", clean_session=False, timeout=5
                ) as c:
                    if first:
                        await c.subscribe("ret/#", qos=1)
                        first = False
                    async for m in c.messages:
                        i = int(m.payload)
                        self.seen[i] = self.seen.get(i, 0) + 1
                        self.received += 1
                        self.progress.set()
            except aiomqtt.MqttError:
                await asyncio.sleep(0.2)


class Producer:
    """QoS 1 to Mosquitto `fwd/<i % 16>`, in batches; a batch not fully PUBACKed is sent again."""

    def __init__(self, port: int, total: int, batch: int = 50) -> None:
        self.port, self.total, self.batch = port, total, batch
        self.acked = 0  # every message < acked was PUBACKed
        self.resent = 0

    async def run(self) -> None:
        while self.acked < self.total:
            try:
                async with aiomqtt.Client("127.0.0.1", self.port, identifier="soak-producer", timeout=5) as c:
                    c.pending_calls_threshold = self.batch + 10
                    while self.acked < self.total:
                        hi = min(self.acked + self.batch, self.total)
                        await asyncio.gather(
                            *(
                                c.publish(f"fwd/{i % 16}", str(i).encode(), qos=1)
                                for i in range(self.acked, hi)
                            )
                        )
                        self.acked = hi
            except aiomqtt.MqttError:
                self.resent += self.batch
                await asyncio.sleep(0.2)


async def declare_rabbit(port: int) -> None:
    conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/")
    ch = await conn.channel()
    q = await ch.declare_queue("soak", durable=True)
    await q.bind("amq.topic", "fwd.#")
    await conn.close()


async def soak(args: argparse.Namespace, work: Path) -> dict:
    total = args.messages
    mosq = Mosquitto(work / "mosquitto", autosave_changes=args.mosquitto_autosave).start()
    rabbit = RabbitMQ(work / "rabbitmq").start()
    await declare_rabbit(rabbit.port)
    gw_mqtt, gw_amqp, gw_http, metrics = free_port(), free_port(), free_port(), free_port()
    gateway = Proc(
        "gateway",
        [
            "start",
            "--data-dir",
            str(work / "gw"),
            "--protocols",
            "mqtt,amqp,http",
            "--mqtt-port",
            str(gw_mqtt),
        ]
        + [
            "--amqp-port",
            str(gw_amqp),
            "--http-port",
            str(gw_http),
            "--flush",
            "sync",
            "--auto-create-topics",
        ],
        work,
        lambda: http_ok(f"http://127.0.0.1:{gw_http}/healthz"),
    )
    config = work / "bridge.toml"
    config.write_text(bridge_toml(mosq.port, gw_mqtt, gw_amqp, rabbit.port, args.inflight))
    bridge = Proc(
        "bridge",
        ["bridge", "--config", str(config), "--metrics-port", str(metrics)],
        work,
        lambda: bridges_up(f"http://127.0.0.1:{metrics}/bridges"),
    )
    gateway.start()
    bridge.start()
    consumer, producer = Consumer(mosq.port), Producer(mosq.port, total)
    tasks = [asyncio.create_task(consumer.run())]
    await asyncio.sleep(0.5)  # the consumer's session subscribed before the first message
    tasks.append(asyncio.create_task(producer.run()))
    kills: list[dict] = []
    dups_at: list[int] = []  # duplicates received before each kill
    t0 = time.monotonic()
    try:
        for part, at in zip(PARTS, args.kill_at, strict=False):
            while len(consumer.seen) < at * total:
                consumer.progress.clear()
                await asyncio.wait_for(consumer.progress.wait(), args.stall_s)
            k0 = time.monotonic()
            log(f"kill -9 {part} at {len(consumer.seen)} received")
            dups_at.append(consumer.received - len(consumer.seen))
            target = {"bridge": bridge, "gateway": gateway, "rabbitmq": rabbit, "mosquitto": mosq}[part]
            await asyncio.to_thread(target.kill9)
            await asyncio.to_thread(target.start)
            kills.append(
                {
                    "part": part,
                    "at_received": len(consumer.seen),
                    "restart_s": round(time.monotonic() - k0, 2),
                }
            )
        last, last_t = -1, time.monotonic()
        while len(consumer.seen) < producer.acked or producer.acked < total:
            if len(consumer.seen) != last:
                last, last_t = len(consumer.seen), time.monotonic()
            elif time.monotonic() - last_t > args.stall_s:
                log(f"no progress for {args.stall_s} s: stopping")
                break
            await asyncio.sleep(0.2)
        elapsed = time.monotonic() - t0
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/bridges", timeout=2) as r:
                links = json.loads(r.read())
        except OSError:
            links = []
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(BaseException):
                await t
        bridge.stop()
        gateway.stop()
        rabbit.stop()
        mosq.stop()
    distinct = len([i for i in consumer.seen if i < producer.acked])
    dups = consumer.received - len(consumer.seen)
    marks = [*dups_at, dups]
    for i, k in enumerate(kills):  # duplicates received after this kill, before the next one
        k["duplicates_after"] = marks[i + 1] - marks[i]
    return {
        "messages": total,
        "produced_acked": producer.acked,
        "producer_resent": producer.resent,
        "received": consumer.received,
        "distinct": len(consumer.seen),
        "lost": producer.acked - distinct,
        "duplicates": dups,
        "max_copies": max(consumer.seen.values(), default=0),
        "seconds": round(elapsed, 1),
        "msgs_per_s": round(len(consumer.seen) / elapsed) if elapsed else None,
        "kills": kills,
        "links": [
            {k: s[k] for k in ("name", "received", "forwarded", "connects", "connect_failures")}
            for s in links
        ],
        "inflight": args.inflight,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--inflight", type=int, default=100, help="each link's window")
    p.add_argument("--kill-at", type=float, nargs="*", default=[0.15, 0.35, 0.55, 0.75])
    p.add_argument("--stall-s", type=float, default=60.0, help="give up after this long without progress")
    p.add_argument(
        "--mosquitto-autosave", type=int, default=1, help="Mosquitto saves after this many changes"
    )
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--workdir", metavar="DIR")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bridge-soak-", dir=args.workdir) as d:
        out = asyncio.run(soak(args, Path(d)))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if out["lost"] == 0 and out["produced_acked"] == out["messages"] else 1


if __name__ == "__main__":
    os.environ.setdefault("GATEWAY_MQTT_WS", "false")  # no fixed WebSocket ports
    sys.exit(main())
