"""CloudEvents over HTTP benchmark: ingest into our gateway against a bare FastAPI endpoint under the
same load, and push delivery to a local webhook.

    .venv/bin/python bench/http_bench.py [--duration S] [--conns N] [--procs P] [--rounds R]
        [--batch 100] [--push-events N] [--phases single,batch,push] [--quick] [--json]

Servers (bench/http_servers.py), both pinned to `--server-cpu` (default CPU 0) and both running for
the whole bench (an idle one costs nothing):

- `gateway`: `.venv/bin/gateway start --protocols http --http-port P --data-dir <tmp>` with its
  defaults (flush policy `sync`: a 202 waits for the store's group-commit fdatasync; uvloop), a topic
  `bench` (8 queues) created through the admin API.
- `bare`: a FastAPI app with one route `POST /topics/{topic}/events` that reads the body and answers
  an empty 202, served by the gateway's own `HttpAdapter` (same uvicorn settings, httptools, uvloop):
  the framework's ceiling on this machine.

The load generator (bench/http_loadgen.py: `--procs` processes pinned to `--gen-cpus`, default CPU
1, raw asyncio HTTP/1.1 over `--conns` keep-alive connections in total, each with one request in
flight, requests pre-encoded) measures, in this order:

1. single: binary-mode events (`ce-specversion/id/source/type/time` headers, `Content-Type:
   application/json`, a `--payload`-byte JSON body, distinct ids), alternately against the bare
   endpoint and the gateway, `--rounds` times each; the best run of each counts (a shared machine
   only ever makes a run slower). `single_ratio_vs_bare` = our events/s / the bare endpoint's.
2. batch: `application/cloudevents-batch+json` arrays of `--batch` (100) structured events with
   JSON data, against the gateway (`--rounds` runs, the best counts) and once against the bare
   endpoint for reference. Events/s = 2xx responses x batch size / duration.
3. push: `--push-events` events are loaded into topic `push` (batches over one keep-alive
   connection, not timed), a webhook receiver (a raw asyncio HTTP server in a process on the
   generator CPU: answers the OPTIONS handshake with `WebHook-Allowed-Origin: *` and every POST
   with an empty 200) starts, then `POST /subscriptions` (start `earliest`, default delivery
   settings unless `--push-inflight`) and the clock runs until the receiver has every event:
   `push_events_per_s` = events / (last arrival - subscription created).

Each run: warm-up `--warmup` s, then a `--duration` s window; rates and latency (p50/p99 of the
requests that completed in the window, write to last response byte) count only the window. Server
CPU is utime+stime from /proc/<pid>/stat over the window (the gateway's fsync helper child, when
its store uses one rather than Linux AIO, is reported separately in `*_incl_children`), divided by
the events of the window: `cpu_us_per_event`.
Before each measured run the bench waits (up to `--quiet-wait` s) until the whole machine uses
< 0.3 CPUs; each run reports `other_util` (CPUs used by other processes during the window) and the
table flags runs where that exceeded 0.15.

`--gateway-profile FILE` runs the gateway under `python -m cProfile -o FILE` (written when it exits
on SIGTERM), e.g. with `--phases single`. `--json` prints one JSON object (progress goes to stderr)
with at least `single_ratio_vs_bare`, `batched_events_per_s`, `push_events_per_s`, and the CPU per
event, latencies, targets, every run's details and the config.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing as mp
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import (
    Server,
    ServerError,
    cpu_s,
    descendants,
    fmt,
    free_port,
    fs_type,
    log,
    pct_ms,
    sleep_until,
    start_gateway,
    system_busy_s,
    tree_cpu_s,
    wait_idle,
    wait_quiet,
)
from http_loadgen import GenJob, gen_main, http_request, raise_nofile, receiver_main
from http_report import build_report, print_table
from http_servers import call, create_topic, start_bare

TOPIC = "bench"
PUSH_TOPIC = "push"
RING_SINGLE = 256
RING_BATCH = 8

# ---------------------------------------------------------------------------- requests


def _time(n: int) -> str:
    """A distinct RFC 3339 time per event (milliseconds), as real events have."""
    return f"2024-05-01T{n // 3_600_000 % 24:02d}:{n // 60_000 % 60:02d}:{n // 1000 % 60:02d}.{n % 1000:03d}Z"


def _data(payload: int, n: int) -> dict[str, Any]:
    """A JSON object whose compact serialization is about `payload` bytes."""
    base = {"n": n, "sensor": "bench", "pad": ""}
    size = len(json.dumps(base, separators=(",", ":")))
    base["pad"] = "x" * max(0, payload - size)
    return base


def single_requests(host: str, proc: int, conns: int, payload: int) -> list[list[bytes]]:
    out = []
    for c in range(conns):
        ring = []
        for i in range(RING_SINGLE):
            body = json.dumps(_data(payload, i), separators=(",", ":")).encode()
            headers = [
                ("content-type", "application/json"),
                ("ce-specversion", "1.0"),
                ("ce-id", f"s{proc}-{c}-{i}"),
                ("ce-source", "/bench/http"),
                ("ce-type", "com.example.bench.single"),
                ("ce-time", _time(proc * 10_000_000 + c * 10_000 + i)),
            ]
            ring.append(http_request("POST", f"/topics/{TOPIC}/events", host, headers, body))
        out.append(ring)
    return out


def batch_body(prefix: str, batch: int, payload: int, t0: int = 0) -> bytes:
    events = [
        {
            "specversion": "1.0",
            "id": f"{prefix}-{j}",
            "source": "/bench/http",
            "type": "com.example.bench.batch",
            "time": _time(t0 + j),
            "datacontenttype": "application/json",
            "data": _data(payload, j),
        }
        for j in range(batch)
    ]
    return json.dumps(events, separators=(",", ":")).encode()


def batch_requests(host: str, proc: int, conns: int, batch: int, payload: int) -> list[list[bytes]]:
    headers = [("content-type", "application/cloudevents-batch+json")]
    return [
        [
            http_request(
                "POST",
                f"/topics/{TOPIC}/events",
                host,
                headers,
                batch_body(f"b{proc}-{c}-{i}", batch, payload, ((proc * 1000 + c) * RING_BATCH + i) * batch),
            )
            for i in range(RING_BATCH)
        ]
        for c in range(conns)
    ]


# ---------------------------------------------------------------------------- generator processes


class Generator:
    """`procs` generator processes sharing `conns` connections to 127.0.0.1:port."""

    def __init__(self, port: int, kind: str, args: argparse.Namespace) -> None:
        ctx = mp.get_context("fork")
        procs = max(1, min(args.procs, args.conns))
        host = f"127.0.0.1:{port}"
        self.events_per_request = args.batch if kind == "batch" else 1
        self.pipes: list[Any] = []
        self.procs: list[Any] = []
        for k in range(procs):
            n = args.conns // procs + (1 if k < args.conns % procs else 0)
            if kind == "batch":
                reqs = batch_requests(host, k, n, args.batch, args.payload)
            else:
                reqs = single_requests(host, k, n, args.payload)
            job = GenJob("127.0.0.1", port, reqs, self.events_per_request, args.gen_cpu_list, args.loop)
            parent, child = ctx.Pipe()
            p = ctx.Process(target=gen_main, args=(job, child), daemon=True)
            p.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(p)

    @staticmethod
    def _recv(pipe: Any, timeout: float, want: str) -> Any:
        if not pipe.poll(timeout):
            raise TimeoutError(f"load generator: no {want} after {timeout:.0f} s")
        kind, payload = pipe.recv()
        if kind == "error":
            raise RuntimeError(f"load generator: {payload}")
        return payload

    def ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for p in self.pipes:
            self._recv(p, max(0.1, deadline - time.monotonic()), "ready")

    def run(self, t_start: float, t0: float, t1: float, timeout: float) -> dict[str, Any]:
        for p in self.pipes:
            p.send(("run", t_start, t0, t1))
        deadline = time.monotonic() + timeout
        rs = [self._recv(p, max(0.1, deadline - time.monotonic()), "result") for p in self.pipes]
        return {
            "ok": sum(r["ok"] for r in rs),
            "errors": sum(r["errors"] for r in rs),
            "gen_cpu_s": sum(r["gen_cpu_s"] for r in rs),
            "lat_ns": sorted(x for r in rs for x in r["lat_ns"]),
            "error_samples": [e for r in rs for e in r["error_samples"]][:5],
            "closed": sum(r["closed"] for r in rs),
            "drained": all(r["drained"] for r in rs),
        }

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError, EOFError, BrokenPipeError):
                pipe.send(("stop",))
        for pipe in self.pipes:
            with contextlib.suppress(OSError, EOFError):
                if pipe.poll(5):
                    pipe.recv()
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


# ---------------------------------------------------------------------------- one run


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ncpu_gen = len(args.gen_cpu_list or [0]) or 1

    def _quiet(self) -> float:
        a = self.args
        waited = wait_quiet(a.quiet_wait) if a.quiet_wait > 0 else 0.0
        if waited > 1:
            log(f"  waited {waited:.1f} s for other processes to leave the CPUs")
        return waited

    def load_run(self, server: Server, kind: str) -> dict[str, Any]:
        """One measured run of `kind` (single | batch) against `server`."""
        a = self.args
        kids = descendants(server.pid)
        gen = Generator(server.port, kind, a)
        try:
            gen.ready()
            wait_idle(server.pid, max_wait=1 if a.quick else 3)
            waited = self._quiet()
            t_start = time.monotonic() + 0.05
            t0 = t_start + a.warmup
            t1 = t0 + a.duration
            # The result arrives after t1; the CPU snapshots are taken here at t0 and t1.
            ctl = _Snapshots(server.pid, kids)
            th = threading.Thread(target=ctl.take, args=(t0, t1), daemon=True)
            th.start()
            res = gen.run(t_start, t0, t1, timeout=a.warmup + a.duration + 60)
            th.join()
        finally:
            gen.stop()
        if not server.alive():
            raise ServerError(f"{server.name} died:\n{server.log_tail()}")
        dur = a.duration
        events = res["ok"] * gen.events_per_request
        lat = res["lat_ns"]
        out: dict[str, Any] = {
            "server": server.name,
            "kind": kind,
            "conns": a.conns,
            "events_per_request": gen.events_per_request,
            "requests": res["ok"],
            "requests_per_s": res["ok"] / dur,
            "events_per_s": events / dur,
            "non_2xx": res["errors"],
            "p50_ms": pct_ms(lat, 50),
            "p99_ms": pct_ms(lat, 99),
            "cpu_us_per_event": ctl.cpu / events * 1e6 if events else None,
            "cpu_us_per_event_incl_children": ctl.tree_cpu / events * 1e6 if events else None,
            # what one fully used server CPU would sustain at this cost (less sensitive to other jobs)
            "events_per_server_cpu_s": events / ctl.cpu if events and ctl.cpu else None,
            "server_util": ctl.cpu / dur,
            "gen_util": res["gen_cpu_s"] / (dur * self.ncpu_gen),
            "other_util": max(0.0, ctl.busy - ctl.tree_cpu - res["gen_cpu_s"]) / dur,
            "quiet_wait_s": waited,
        }
        s, g = out["server_util"], out["gen_util"]
        if s >= 0.85:
            out["bottleneck"] = "server and generator" if g >= 0.85 else "server"
        else:
            out["bottleneck"] = "generator" if g >= 0.85 else "neither (latency-bound)"
        if res["error_samples"]:
            out["error_samples"] = res["error_samples"]
        if res["closed"]:
            out["connections_closed"] = res["closed"]
        return out

    # -- push

    def push(self, gw: Server) -> dict[str, Any]:
        a = self.args
        n = a.push_events
        create_topic(gw.port, PUSH_TOPIC)
        t = time.monotonic()
        _load_events(gw.port, PUSH_TOPIC, n, a.batch, a.payload)
        load_s = time.monotonic() - t
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe()
        rport = free_port()
        p = ctx.Process(
            target=receiver_main, args=("127.0.0.1", rport, a.gen_cpu_list, a.loop, child), daemon=True
        )
        p.start()
        child.close()
        sub_id = None
        try:
            Generator._recv(parent, 10, "receiver ready")
            kids = descendants(gw.pid)
            wait_idle(gw.pid, max_wait=5)
            waited = self._quiet()
            delivery: dict[str, Any] = {}
            if a.push_inflight:
                delivery["max_inflight"] = a.push_inflight
            sub = {
                "topic": PUSH_TOPIC,
                "sink": f"http://127.0.0.1:{rport}/hook",
                "start": "earliest",
                "delivery": delivery,
            }
            c0, ct0, b0, r0 = cpu_s(gw.pid), tree_cpu_s(gw.pid, kids), system_busy_s(), cpu_s(p.pid)
            t_created0 = time.monotonic()
            status, body = call(gw.port, "POST", "/subscriptions", sub)
            t_created = time.monotonic()
            if status != 201:
                raise RuntimeError(f"POST /subscriptions -> {status} {body}")
            sub_id = body["id"]  # type: ignore[index]
            deadline = t_created + a.push_timeout
            stats: dict[str, Any] = {}
            while time.monotonic() < deadline:
                parent.send(("stats",))
                stats = Generator._recv(parent, 10, "receiver stats")
                if stats["count"] >= n:
                    break
                time.sleep(0.02)
            c1, ct1, b1, r1 = cpu_s(gw.pid), tree_cpu_s(gw.pid, kids), system_busy_s(), cpu_s(p.pid)
            t_end = time.monotonic()
            _, sub_status = call(gw.port, "GET", f"/subscriptions/{sub_id}")
        finally:
            with contextlib.suppress(Exception):
                if sub_id:
                    call(gw.port, "DELETE", f"/subscriptions/{sub_id}")
            with contextlib.suppress(Exception):
                parent.send(("stop",))
            p.join(5)
            if p.is_alive():
                p.kill()
        got = stats.get("count", 0)
        span = (stats["last"] - t_created) if got else None
        out = {
            "events": n,
            "load_s": load_s,
            "received": got,
            "distinct": stats.get("distinct", 0),
            "handshakes": stats.get("handshakes", 0),
            "receiver_connections": stats.get("connections", 0),
            "create_s": t_created - t_created0,
            "first_delivery_s": (stats["first"] - t_created) if got else None,
            "push_events_per_s": got / span if got and span else None,
            "steady_events_per_s": (got - 1) / (stats["last"] - stats["first"])
            if got > 1 and stats["last"] > stats["first"]
            else None,
            "cpu_us_per_event": (c1 - c0) / got * 1e6 if got else None,
            "cpu_us_per_event_incl_children": (ct1 - ct0) / got * 1e6 if got else None,
            "server_util": (c1 - c0) / (t_end - t_created0),
            "receiver_util": (r1 - r0) / (t_end - t_created0),
            "other_util": max(0.0, (b1 - b0) - (ct1 - ct0) - (r1 - r0)) / (t_end - t_created0),
            "quiet_wait_s": waited,
            "max_inflight": a.push_inflight or "default (16)",
            "subscription_status": (sub_status or {}).get("status") if isinstance(sub_status, dict) else None,
        }
        if got < n:
            out["error"] = f"only {got} of {n} events arrived within {a.push_timeout:.0f} s"
        return out


class _Snapshots:
    """Server CPU and machine busy time at t0 and t1 (taken on a thread while the generator runs)."""

    def __init__(self, pid: int, kids: list[int]) -> None:
        self.pid, self.kids = pid, kids
        self.cpu = self.tree_cpu = self.busy = 0.0

    def take(self, t0: float, t1: float) -> None:
        sleep_until(t0)
        c0, ct0, b0 = cpu_s(self.pid), tree_cpu_s(self.pid, self.kids), system_busy_s()
        sleep_until(t1)
        c1, ct1, b1 = cpu_s(self.pid), tree_cpu_s(self.pid, self.kids), system_busy_s()
        self.cpu, self.tree_cpu, self.busy = c1 - c0, ct1 - ct0, b1 - b0


def _load_events(port: int, topic: str, n: int, batch: int, payload: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        sent = 0
        while sent < n:
            k = min(batch, n - sent)
            body = batch_body(f"p{sent}", k, payload, sent)
            conn.request(
                "POST",
                f"/topics/{topic}/events",
                body,
                {"content-type": "application/cloudevents-batch+json"},
            )
            r = conn.getresponse()
            text = r.read()
            if r.status != 202:
                raise RuntimeError(f"loading push events: {r.status} {text[:300]!r}")
            sent += k
    finally:
        conn.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds before each window")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each ingest kind (best counts)")
    ap.add_argument("--conns", type=int, default=64, help="keep-alive connections in total")
    ap.add_argument("--procs", type=int, default=2, help="load generator processes")
    ap.add_argument("--batch", type=int, default=100, help="events per batch request")
    ap.add_argument("--payload", type=int, default=100, help="bytes of JSON data per event")
    ap.add_argument("--push-events", type=int, default=20_000, help="events delivered in the push phase")
    ap.add_argument("--push-inflight", type=int, default=0, help="subscription max_inflight (0: default)")
    ap.add_argument("--push-timeout", type=float, default=120.0, help="longest push phase")
    ap.add_argument("--phases", default="single,batch,push", help="subset of single,batch,push")
    ap.add_argument("--server-cpu", type=int, default=0, help="CPU both servers are pinned to")
    ap.add_argument("--gen-cpus", default="1", help="CPUs of the load generator and the webhook (comma list)")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="generator event loop")
    ap.add_argument(
        "--bare-ignore-body", action="store_true", help="the bare endpoint does not read the body"
    )
    ap.add_argument("--gateway-args", default="", help="extra `gateway start` flags, e.g. '--flush async'")
    ap.add_argument("--gateway-src", default=None, help="run the gateway from this source tree")
    ap.add_argument(
        "--gateway-profile", default=None, help="run the gateway under cProfile, stats to this file"
    )
    ap.add_argument(
        "--quiet-wait", type=float, default=10.0, help="wait up to this long for a quiet machine (0: never)"
    )
    ap.add_argument("--dir", default=None, help="parent of the temporary work directory")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, data)")
    ap.add_argument("--quick", action="store_true", help="small fast run (smoke test)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--json-file", default=None, help="also write the JSON object to this file")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration = min(args.duration, 1.0)
        args.warmup = min(args.warmup, 0.3)
        args.rounds = 1
        args.conns = min(args.conns, 32)
        args.push_events = min(args.push_events, 2000)
        args.push_timeout = min(args.push_timeout, 15.0)
        args.quiet_wait = min(args.quiet_wait, 0.5)
    args.rounds = max(1, args.rounds)
    args.phase_list = [p.strip() for p in args.phases.split(",") if p.strip()]
    online = sorted(os.sched_getaffinity(0))
    gen = [int(c) for c in args.gen_cpus.split(",") if c.strip()]
    if len(online) < 2 or args.server_cpu not in online or not set(gen) <= set(online):
        log(f"cannot pin server/generator to CPUs {args.server_cpu}/{gen} (online {online}): not pinning")
        args.server_cpu = None
        args.gen_cpu_list = None
    else:
        args.gen_cpu_list = gen
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_nofile()
    if args.gen_cpu_list:
        os.sched_setaffinity(0, args.gen_cpu_list)
    workdir = Path(tempfile.mkdtemp(prefix="http-bench-", dir=args.dir))
    runs: dict[str, list[dict[str, Any]]] = {
        k: [] for k in ("bare_single", "gateway_single", "bare_batch", "gateway_batch")
    }
    info: dict[str, Any] = {}
    push: dict[str, Any] | None = None
    gw = bare = None
    ready = False
    b = Bench(args)
    t = time.monotonic()

    def attempt(name: str, server: Server, kind: str) -> None:
        log(f"[{name}] (at {time.monotonic() - t:.1f} s)")
        try:
            r = b.load_run(server, kind)
        except Exception as e:  # noqa: BLE001 - a failing run gives null figures
            log(f"[{name}] failed: {type(e).__name__}: {e}")
            if args.verbose:
                traceback.print_exc(file=sys.stderr)
            r = {"error": f"{type(e).__name__}: {e}"}
        else:
            log(
                f"  {r['events_per_s']:.0f} events/s, {r['requests_per_s']:.0f} req/s, "
                f"p50 {fmt(r['p50_ms'])} ms, "
                f"p99 {fmt(r['p99_ms'])} ms, server {fmt(r['cpu_us_per_event'])} µs/event, "
                f"util server {r['server_util']:.0%} gen {r['gen_util']:.0%} other {r['other_util']:.2f}"
                + (f", {r['non_2xx']} non-2xx: {r.get('error_samples')}" if r["non_2xx"] else "")
            )
        runs[name].append(r)

    try:
        try:
            gw_dir, bare_dir = workdir / "gateway", workdir / "bare"
            gw_dir.mkdir()
            bare_dir.mkdir()
            src = Path(args.gateway_src).resolve() if args.gateway_src else None
            prof = Path(args.gateway_profile).resolve() if args.gateway_profile else None
            with ThreadPoolExecutor(2) as pool:  # both start at once (each takes a second or two)
                extra = shlex.split(args.gateway_args)
                f_gw = pool.submit(
                    start_gateway, gw_dir, "http", extra, cpu=args.server_cpu, src=src, profile=prof
                )
                f_bare = pool.submit(start_bare, bare_dir, args.server_cpu, not args.bare_ignore_body)
                failed = [f.exception() for f in (f_gw, f_bare) if f.exception() is not None]
            gw = f_gw.result() if f_gw.exception() is None else None
            bare = f_bare.result() if f_bare.exception() is None else None
            if failed:
                raise failed[0]  # the finally below stops the one that did start
            assert gw is not None and bare is not None
            create_topic(gw.port, TOPIC, 8)
            info["gateway"] = {**gw.info, "data_fs": fs_type(gw_dir)}
            info["bare"] = dict(bare.info)
            log(f"servers up in {time.monotonic() - t:.1f} s (gateway :{gw.port}, bare :{bare.port})")
            ready = True
        except ServerError as e:
            log(f"cannot start: {e}")
            info["error"] = str(e)
        if ready and gw is not None and bare is not None:
            if "single" in args.phase_list:
                for _ in range(args.rounds):
                    attempt("bare_single", bare, "single")
                    attempt("gateway_single", gw, "single")
            if "batch" in args.phase_list:
                attempt("bare_batch", bare, "batch")
                for _ in range(args.rounds):
                    attempt("gateway_batch", gw, "batch")
            if "push" in args.phase_list:
                log(f"[push] {args.push_events} events (at {time.monotonic() - t:.1f} s)")
                try:
                    push = b.push(gw)
                    log(
                        f"  {fmt(push['push_events_per_s'])} events/s, "
                        f"{fmt(push['cpu_us_per_event'])} µs/event, "
                        f"first after {fmt(push['first_delivery_s'])} s"
                    )
                except Exception as e:  # noqa: BLE001
                    log(f"[push] failed: {type(e).__name__}: {e}")
                    if args.verbose:
                        traceback.print_exc(file=sys.stderr)
                    push = {"error": f"{type(e).__name__}: {e}"}
    finally:
        for s in (bare, gw):
            if s is not None:
                s.stop()
                if s.proc.returncode not in (0, -15, None):
                    info.setdefault(s.name, {})["exit_status"] = s.proc.returncode
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    log(f"done in {time.monotonic() - t:.1f} s")
    rep = build_report(runs, push, info, args)
    text = json.dumps(rep, default=str)
    if args.json_file:
        Path(args.json_file).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print_table(rep)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
