"""What one lonely message costs the server: calls, tasks, futures, loop wake-ups and system calls.

    .venv/bin/python bench/lonely_trace.py [--flow mqtt|amqp] [--rate R] [--seconds S]
        [--brokers gateway,mosquitto] [--flush sync|async] [--gateway-src DIR] [--json]

At a fixed low rate (`--rate`, default 100 msg/s) one publisher sends QoS 1 messages one at a time
(each waits for its PUBACK, or with `--flow amqp` for its publisher confirm, before the next slot)
and one subscriber receives them (MQTT QoS 1 on `lonely/#`; AMQP: a manual-ack consumer of the
durable queue `lonely`), so no two messages share a socket read, a commit or a wake-up. Three
windows of `--seconds` each, one after the other, on the same server:

1. plain: server CPU per message (utime+stime of /proc/<pid>/stat over the window);
2. system calls: `strace -f -c -p <pid>` (every thread) over the window, per message by kind;
3. Python (the gateway only): a `sys.setprofile` hook in the gateway's main thread (the event loop's),
   switched on by SIGUSR1 and off by SIGUSR2, counts Python frames entered (`py_calls`: calls and
   resumed coroutines), C calls (`c_calls`), tasks created (through the loop's task factory), and
   calls of the loop's scheduling methods from Python (`create_future`, `call_soon`, `call_later`,
   `call_at`, `call_soon_threadsafe`, `run_in_executor`). Futures the C code of uvloop or asyncio
   makes itself are not seen; event-loop iterations are the `epoll_wait` calls of window 2.

The hook is a `sitecustomize.py` this script writes into a temporary directory put first on the
gateway's PYTHONPATH: nothing of it is in the product. Each figure is divided by the messages
published in its window. Mosquitto gets windows 1 and 2. The machine's steal and the other
processes' CPU (`other_util`, of one CPU) are reported per window, as in the other benches.

`--json` prints {"flow", "rate", "seconds", "brokers": {name: {"cpu_us_per_msg", "delivered_share",
"syscalls_per_msg": {kind: n, "total": n}, "python_per_msg": {...}, "windows": [...]}}}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import Server, cpu_ticks, log, run_s, start_gateway, system_busy_s
from mqtt_servers import start_mosquitto

# The syscalls counted under each kind (the rest are "other").
KINDS = {
    "epoll_wait": ("epoll_wait", "epoll_pwait", "epoll_pwait2"),
    "epoll_ctl": ("epoll_ctl",),
    "read": ("read", "recvfrom", "recvmsg", "readv"),
    "write": ("write", "sendto", "sendmsg", "writev"),
    "pwrite": ("pwrite64", "pwritev", "pwritev2"),
    "sync": ("fsync", "fdatasync", "sync_file_range", "io_submit", "io_getevents", "io_uring_enter"),
    "futex": ("futex",),
    "signals": ("rt_sigprocmask", "rt_sigaction", "rt_sigreturn"),
}
LOOP_METHODS = (
    "create_future",
    "call_soon",
    "call_later",
    "call_at",
    "call_soon_threadsafe",
    "run_in_executor",
)

HOOK = '''\
"""Counting hook of bench/lonely_trace.py (never part of the product)."""
import os

if os.environ.get("LONELY_COUNTS"):
    import asyncio
    import collections
    import json
    import signal
    import sys

    _out = os.environ["LONELY_COUNTS"]
    _counts = collections.Counter()
    _watch = frozenset(%(methods)r)
    _on = [False]

    def _profile(frame, event, arg):
        if event == "call":
            _counts["py_calls"] += 1
        elif event == "c_call":
            _counts["c_calls"] += 1
            name = getattr(arg, "__name__", None)
            if name in _watch:
                _counts[name] += 1

    def _factory(loop, coro, **kw):
        if _on[0]:
            _counts["tasks"] += 1
        return asyncio.Task(coro, loop=loop, **kw)

    def _counting(factory):
        def new_loop():
            loop = factory()
            loop.set_task_factory(_factory)
            return loop
        return new_loop

    try:
        import uvloop
        uvloop.new_event_loop = _counting(uvloop.new_event_loop)
    except ImportError:
        pass
    asyncio.new_event_loop = _counting(asyncio.new_event_loop)

    def _start(signum, frame):
        _counts.clear()
        _on[0] = True
        sys.setprofile(_profile)

    def _stop(signum, frame):
        sys.setprofile(None)
        _on[0] = False
        with open(_out + ".part", "w") as f:
            json.dump(dict(_counts), f)
        os.replace(_out + ".part", _out)

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
'''


class Traffic:
    """The paced publisher and the subscriber of one flow, in threads of this process."""

    def __init__(self, flow: str, port: int, rate: float) -> None:
        self.flow, self.port, self.interval = flow, port, 1.0 / rate
        self.published = 0
        self.received = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._pub_stop = threading.Event()
        self._ready = threading.Event()
        self._threads = [
            threading.Thread(target=self._guard(self._subscribe), daemon=True),
            threading.Thread(target=self._guard(self._publish), daemon=True),
        ]

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception as e:  # reported, the run goes on and says so
                self.errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")
                self._ready.set()

        return run

    def start(self) -> None:
        self._threads[0].start()
        if not self._ready.wait(20):
            raise RuntimeError("subscriber not ready")
        self._threads[1].start()

    def stop(self) -> None:
        """Stop the publisher, give the subscriber up to 5 s for what is still on its way, stop it."""
        self._pub_stop.set()
        self._threads[1].join(10)
        deadline = time.monotonic() + 5
        while self.received < self.published and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stop.set()
        self._threads[0].join(10)

    def _paced(self, send_one: Callable[[int], None]) -> None:
        nxt = time.monotonic()
        i = 0
        while not self._pub_stop.is_set():
            send_one(i)
            self.published += 1
            i += 1
            nxt += self.interval
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                nxt = time.monotonic()  # behind: no burst to catch up (every message stays alone)

    # -- MQTT: paho, QoS 1, one publish in flight
    def _mqtt_client(self, cid: str):
        import paho.mqtt.client as paho

        c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=cid, protocol=paho.MQTTv311)
        c.connect("127.0.0.1", self.port, keepalive=60)
        return c

    def _subscribe(self) -> None:
        if self.flow == "amqp":
            return self._amqp_consume()
        c = self._mqtt_client("lonely-sub")

        def on_message(client, userdata, msg) -> None:
            self.received += 1

        c.on_message = on_message
        c.on_subscribe = lambda *a: self._ready.set()
        c.subscribe("lonely/#", qos=1)
        c.loop_start()
        self._stop.wait()
        c.loop_stop()
        c.disconnect()

    def _publish(self) -> None:
        if self.flow == "amqp":
            return self._amqp_publish()
        c = self._mqtt_client("lonely-pub")
        c.loop_start()
        body = b"x" * 64

        def one(i: int) -> None:
            c.publish(f"lonely/dev{i % 8}", body, qos=1).wait_for_publish(10)

        self._paced(one)
        c.loop_stop()
        c.disconnect()

    # -- AMQP: pika, a publisher confirm per message, a manual-ack consumer
    def _amqp_channel(self):
        import pika

        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port, heartbeat=0))
        ch = conn.channel()
        ch.queue_declare("lonely", durable=True)
        return conn, ch

    def _amqp_consume(self) -> None:
        conn, ch = self._amqp_channel()

        def on_message(chan, method, props, body) -> None:
            self.received += 1
            chan.basic_ack(method.delivery_tag)

        ch.basic_qos(prefetch_count=10)
        ch.basic_consume("lonely", on_message)
        self._ready.set()
        while not self._stop.is_set():
            conn.process_data_events(time_limit=0.2)
        conn.close()

    def _amqp_publish(self) -> None:
        import pika

        conn, ch = self._amqp_channel()
        ch.confirm_delivery()
        body = b"x" * 64
        props = pika.BasicProperties(delivery_mode=2)
        self._paced(lambda i: ch.basic_publish("", "lonely", body, props, mandatory=False))
        conn.close()


def parse_strace(text: str) -> dict[str, int]:
    """{syscall: calls} from the summary table of `strace -c`."""
    calls: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
        if m and m.group(2) != "total":
            calls[m.group(2)] = calls.get(m.group(2), 0) + int(m.group(1))
    return calls


def by_kind(calls: dict[str, int], messages: int) -> dict[str, float]:
    named = {n: kind for kind, names in KINDS.items() for n in names}
    out = dict.fromkeys(KINDS, 0.0) | {"other": 0.0}
    for name, n in calls.items():
        out[named.get(name, "other")] += n
    out["total"] = sum(calls.values())
    return {k: round(v / messages, 2) for k, v in out.items()}


class Window:
    """Messages, server CPU, machine busy time and steal over one window."""

    def __init__(self, traffic: Traffic, pid: int) -> None:
        self.traffic, self.pid = traffic, pid

    def __enter__(self) -> Window:
        self.p0, self.r0, self.c0 = self.traffic.published, self.traffic.received, run_s(self.pid)
        self.b0, self.t0, self.s0 = system_busy_s(), time.monotonic(), cpu_ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = time.monotonic() - self.t0
        self.messages = max(1, self.traffic.published - self.p0)
        self.received = self.traffic.received - self.r0
        self.cpu = run_s(self.pid) - self.c0
        steal1, all1 = cpu_ticks()
        self.steal = (steal1 - self.s0[0]) / max(1, all1 - self.s0[1])
        self.other_util = max(0.0, (system_busy_s() - self.b0 - self.cpu) / wall)  # of one CPU

    def summary(self, name: str) -> dict[str, Any]:
        return {
            "window": name,
            "messages": self.messages,
            "received": self.received,
            "cpu_us_per_msg": round(self.cpu * 1e6 / self.messages, 1),
            "host_steal": round(self.steal, 4),
            "other_util": round(self.other_util, 3),
        }


def measure(server: Server, flow: str, rate: float, seconds: float, hook_out: Path | None) -> dict[str, Any]:
    traffic = Traffic(flow, server.port, rate)
    traffic.start()
    try:
        time.sleep(min(2.0, seconds))  # warm-up: connections, first topic and queue creation
        windows = []
        with Window(traffic, server.proc.pid) as plain:
            time.sleep(seconds)
        windows.append(plain.summary("plain"))
        out = Path(tempfile.mkstemp(suffix=".strace")[1])
        strace = subprocess.Popen(
            ["strace", "-f", "-c", "-p", str(server.proc.pid), "-o", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # attached to every thread
        with Window(traffic, server.proc.pid) as traced:
            time.sleep(seconds)
        strace.send_signal(signal.SIGINT)
        strace.wait(30)
        windows.append(traced.summary("strace"))
        res: dict[str, Any] = {
            "cpu_us_per_msg": windows[0]["cpu_us_per_msg"],
            "syscalls_per_msg": by_kind(parse_strace(out.read_text()), traced.messages),
        }
        out.unlink()
        if hook_out is not None:
            with Window(traffic, server.proc.pid) as profiled:
                os.kill(server.proc.pid, signal.SIGUSR1)
                time.sleep(seconds)
                os.kill(server.proc.pid, signal.SIGUSR2)
            windows.append(profiled.summary("python"))
            deadline = time.monotonic() + 10
            while not hook_out.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            counts = json.loads(hook_out.read_text())
            keys = ("py_calls", "c_calls", "tasks", *LOOP_METHODS)
            res["python_per_msg"] = {k: round(counts.get(k, 0) / profiled.messages, 2) for k in keys}
    finally:
        traffic.stop()
    res["delivered_share"] = round(traffic.received / max(1, traffic.published), 3)  # the whole run
    res["windows"] = windows
    res["errors"] = traffic.errors
    return res


def run_gateway(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    hook_dir = work / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK % {"methods": LOOP_METHODS})
    hook_out = work / "counts.json"
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "LONELY_COUNTS")}
    src = str(args.gateway_src.resolve()) if args.gateway_src else None  # imported before the venv
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook_dir), src, saved["PYTHONPATH"]]))
    os.environ["LONELY_COUNTS"] = str(hook_out)
    try:
        server = start_gateway(work, args.flow, ["--flush", args.flush], cpu=args.server_cpu)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        if src:
            server.info["src"] = src
        return measure(server, args.flow, args.rate, args.seconds, hook_out) | {"info": server.info}
    finally:
        server.stop()


def run_mosquitto(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    server = start_mosquitto(work, args.server_cpu)
    try:
        return measure(server, "mqtt", args.rate, args.seconds, None) | {"info": server.info}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flow", choices=("mqtt", "amqp"), default="mqtt")
    ap.add_argument("--rate", type=float, default=100.0, help="messages per second (default 100)")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each window (default 5)")
    ap.add_argument("--brokers", default=None, help="default gateway,mosquitto (mqtt) or gateway (amqp)")
    ap.add_argument("--flush", default="sync", choices=("sync", "async"))
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--gen-cpu", type=int, default=1)
    ap.add_argument("--gateway-src", type=Path, default=None, help="the gateway from this tree (A/B)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    brokers = (args.brokers or ("gateway,mosquitto" if args.flow == "mqtt" else "gateway")).split(",")
    if args.flow == "amqp" and "mosquitto" in brokers:
        ap.error("mosquitto speaks no AMQP")
    if args.gen_cpu is not None:
        os.sched_setaffinity(0, {args.gen_cpu})
    result: dict[str, Any] = {"flow": args.flow, "rate": args.rate, "seconds": args.seconds, "brokers": {}}
    for name in brokers:
        with tempfile.TemporaryDirectory(prefix=f"lonely-{name}-") as d:
            log(f"{name}: {args.flow} at {args.rate:g} msg/s, windows of {args.seconds:g} s")
            run = run_gateway if name == "gateway" else run_mosquitto
            result["brokers"][name] = run(args, Path(d))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name, r in result["brokers"].items():
            print(f"{name}: {r['cpu_us_per_msg']} µs CPU per message, delivered {r['delivered_share']:.0%}")
            print(
                "  system calls per message: "
                + ", ".join(f"{k} {v}" for k, v in r["syscalls_per_msg"].items())
            )
            if "python_per_msg" in r:
                print(
                    "  Python per message: " + ", ".join(f"{k} {v}" for k, v in r["python_per_msg"].items())
                )
            for w in r["windows"]:
                print(f"  window {w['window']}: {w}")
            for e in r["errors"]:
                print(f"  error: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
