"""MQTT broker benchmark: our gateway against Mosquitto and amqtt, same load generator, same machine.

    .venv/bin/python bench/mqtt_bench.py [--brokers gateway,mosquitto,amqtt] [--duration S]
        [--publishers N] [--subscribers M] [--idle-conns K] [--auth-rounds N] [--tls-rounds N]
        [--fixed-rate R] [--fixed-publishers N] [--p99-runs N] [--phases P,...] [--quick] [--json]

For each broker (started on loopback by bench/common.py, the gateway, or bench/mqtt_servers.py,
pinned to `--server-cpu`, default CPU 0) the load generator (bench/mqtt_loadgen.py: `--procs`
processes pinned to `--gen-cpus`, default CPU 1, raw asyncio sockets with pre-encoded MQTT 3.1.1
packets; this process is pinned there too) measures, in this order:

1. Idle connections. 20 warm-up connections, then VmRSS of the server process; then K more
   CONNECTed clients (keep-alive 120 s) and VmRSS again once the server is idle. The growth per
   connection is scaled to 10,000 connections (MiB) and to connections per GiB.
2. QoS 0 publish throughput: N publishers, 100-byte payloads, each writing batches of 100 publishes
   followed by a PINGREQ with at most 2 batches unanswered (the PINGRESP confirms the batch).
3. QoS 1 publish throughput: N publishers each with at most `--window` (100) unacked publishes,
   counting PUBACKs.
   For 2 and 3, a warm-up run, a wait until the server is idle, then the measured run of
   `--duration` s starting from that idle server. A server may confirm faster than it works (e.g.
   a PUBACK before the message is processed, or QoS 0 work queued in tasks), so after the run the
   bench waits until the server process is idle again (< 1 clock tick per 50 ms): rate = messages
   confirmed since the run started (those in flight at its end included) / (duration + that drain
   time), CPU per message = server CPU from the start of the run until idle / the same messages.
   Both publish phases run without subscribers.
4. Fan-out: one QoS 1 publisher to topic `fan/t`, M QoS 1 subscribers to it (spread over the
   generator processes). The publisher keeps at most 1000 messages between what it published and
   what the slowest subscriber received, so the server cannot build a backlog; the figure is
   deliveries received by all subscribers per second, and CPU per delivery.
5. Latency: one QoS 1 publisher paced at `--latency-rate` (5,000) msg/s, one QoS 1 subscriber in
   another generator process; latency = receive time - write time stamped in the payload
   (CLOCK_MONOTONIC), p50/p99 over messages written in the measured window.

6. Authentication (`--auth-rounds N`, default 3; `--quick`: 1): phase 3 again on fresh gateways per
   round, one started as usual (auth off) and one with `--auth` (first admin from
   GATEWAY_ADMIN_PASSWORD), which of them goes first alternating from round to round. The auth-on
   gateway's publishers log in as the `user`-role user `bench` (created through the admin API, POST
   /admin/users) under `--acl-rules` (1,000) ACL rules (one policy file, POST /admin/acl/import):
   one allows `bench` to publish to `bench/#`, the others are its role's rules on other paths (a
   tenth of them denies) and other users' rules. Both sides run the same gateway code path, the
   real login and the per-message ACL check of `processor.send` included. `qos1_auth_ratio` is the
   median over the rounds of auth-on / auth-off QoS 1 throughput (target >= 0.9).

7. TLS (`--tls-rounds N`, default 3; `--quick`: 1): phase 3 again on fresh brokers per round: our
   gateway in clear, our gateway over TLS (`--tls-cert`/`--tls-key`, publishers on its
   `--mqtt-tls-port`), Mosquitto over TLS (`certfile`/`keyfile` on its listener) and Mosquitto in
   clear (for context; the Mosquitto runs only with `mosquitto` in `--brokers`), in that order in
   odd rounds and the reverse in even ones: the same load and pinning, the generator's connections
   then being TLS (the event loop's TLS transport, the server certificate verified). All serve one
   self-signed EC P-256 certificate made for the run by the `openssl` CLI in a temporary directory
   (removed after it). `qos1_tls_ratio` is the median over the rounds of gateway TLS / gateway
   plain QoS 1 throughput (target >= 0.7), `qos1_tls_ratio_vs_mosquitto` the median of gateway TLS
   / Mosquitto TLS. `tls.gateway_cpu_ratio` (median of gateway plain / TLS server CPU per message)
   is the throughput ratio a CPU-bound gateway would show: a cross-check when other jobs disturb
   the throughput figures.

8. Message trace (`--trace-rounds N`, default 3; `--quick`: 1): phase 3 again on fresh gateways per
   round, one with tracing off (`--trace-retention 0`) and one with it on (the default, 24h: every
   message is traced, and its received/stored/delivered/acked events go to `%TRACE%`), the
   order alternating. `qos1_trace_ratio` is the median of on / off QoS 1 throughput (target >= 0.9).

9. Fixed rate (phase `fixed`, in the default `--phases`; it adds about 30 s to a run of the three
   brokers): `--fixed-publishers` (4) QoS 1 publishers paced together at `--fixed-rate` (10,000)
   msg/s in total (1 ms ticks, at most 1,000 unacked each), 100-byte payloads (`--payload`) to
   `fixed/p<i>`, and one QoS 1 subscriber to `fixed/#` in another generator process (a clean
   session; a persistent one with `--fixed-persistent`, `subscriber` in the JSON): publish and
   deliver, as a real deployment. A warm-up run of `--warmup` s, then a run measuring `--duration`
   s after the same warm-up: the publish rate (PUBACKs in the window), the delivered rate, server
   CPU µs per message (server process CPU in the window / messages published in it; with its
   children in `cpu_us_per_fixed_msg_incl_children`), p50/p99 publish→receive latency (stamped as
   in phase 5), `kept_up` (both rates >= 95 % of the target), `other_util` and `host_steal`. amqtt
   is skipped (`skipped`, null figures) when its warm-up run does not keep up with the rate.
   `cpu_ratio_vs_mosquitto_at_10k` = gateway / Mosquitto CPU per message (target <= 1.0).

10. Workers (`--workers-rounds N`, default 0): phase 9 on our gateway with `--workers 1` and with
   `--workers 2` (a store process and two worker processes sharing the port), N rounds in
   alternating order. The CPU counted is the whole process tree's (store process, workers, fsync
   helper: `cpu_us_per_fixed_msg_incl_children`); `workers2_cpu_ratio` is the median of the rounds'
   workers-2 / workers-1 ratios (target <= 1.3). The server is not pinned in these runs (it may use
   every core, the generator's included; the generator stays on `--gen-cpus`), as a deployment of
   `--workers` would run.

11. p99 runs (`--p99-runs N`, default 5; `--quick`: 1; with `latency` in `--phases`): phase 5 again
   on N fresh gateways, one after the other. `p99_ms_at_5k_runs` lists each run's p99 (null for a
   failed run) and `p99_at_5k_runs_met` counts the runs with p99 <= 10 ms (target: >= 4 of 5, i.e.
   80 % of the runs); each run's `other_util` and `host_steal` are in `p99_runs`. `p99_ms_at_5k`
   stays the main run's phase 5.

Server CPU is utime+stime from /proc/<pid>/stat of the server process (the gateway's fsync helper
child, when its store uses one, is reported separately in `cpu_us_per_qos1_msg_incl_children`;
with Linux AIO fdatasync, the default, the kernel worker that runs it is not counted), so it stays
comparable when the generator, not the server, is the bottleneck; each phase also reports the server's and the
generator's CPU utilisation and which one was saturated. Acknowledgements and deliveries are
counted by the generator. Our gateway runs with its defaults (flush policy `sync`: a PUBACK waits
for the group commit's fdatasync), with the data directory under `--dir` (default the system temp
directory); the output says which filesystem that is.

Shared machines: before each measured run the bench waits (up to `--quiet-wait` s) until the whole
machine uses < 0.3 CPUs, and each run reports `other_util`, the CPUs used by processes other than
the server (and its children) and the generator during the window (/proc/stat minus those), and
`host_steal`, the share of all CPU time the hypervisor gave to other guests then; the table flags
runs where `other_util` exceeded 0.15 CPUs, as their figures are disturbed.

Profiling our gateway: `--gateway-profile FILE` runs it under `python -m cProfile -o FILE` (e.g.
with `--brokers gateway --phases qos1`); the stats are written when it exits on SIGTERM. cProfile
measures wall time, so the frame that waits in the event loop also collects idle time.

Output: a table of the figures, our ratio to each peer (gateway / peer; the arrow says which way is
better) and the targets; `--json` prints one JSON object instead (progress goes to stderr) with the
top-level keys `qos1_ratio_vs_mosquitto`, `qos1_ratio_vs_amqtt`, `cpu_us_per_qos1_msg`,
`p99_ms_at_5k`, `p99_ms_at_5k_runs`, `p99_at_5k_runs_met` (its runs in `p99_runs`),
`cpu_ratio_vs_mosquitto_at_10k` (phase 9 per broker in `fixed`, and in `brokers` as
`fixed_publish_msgs_per_s`, `fixed_delivered_msgs_per_s`, `cpu_us_per_fixed_msg`,
`cpu_us_per_fixed_msg_incl_children`, `fixed_p50_ms`, `fixed_p99_ms`),
`idle_conn_rss_mib_per_10k`, `qos1_auth_ratio` (our gateway; its rounds in `auth`),
`workers2_cpu_ratio` (`--workers-rounds`; its rounds and medians in `workers`),
`qos1_trace_ratio` (its rounds in `trace`),
`qos1_tls_ratio` and `qos1_tls_ratio_vs_mosquitto` (in `tls`: the rounds, each run's rate, server
CPU per message, `other_util` and `host_steal`, and the medians per run kind), `targets`, `ratios`,
`brokers` (figures and per-phase details per broker) and `config`. A broker that cannot start, or
a phase that fails, gives null figures and an `error`; the run goes on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import re
import resource
import secrets
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import (
    Server,
    ServerError,
    admin_call,
    cpu_s,
    cpu_ticks,
    descendants,
    fmt,
    free_port,
    fs_type,
    log,
    pct_ms,
    policy_toml,
    rss_bytes,
    self_signed_cert,
    sleep_until,
    start_gateway,
    steal_since,
    system_busy_s,
    tcp_ready,
    tree_cpu_s,
    wait_idle,
    wait_quiet,
    wait_ready,
)
from mqtt_loadgen import Job, Spec, raise_nofile, worker_main
from mqtt_report import BROKERS, FIGURES, GIB, MIB, build_report, print_table
from mqtt_servers import start_amqtt, start_mosquitto

# ---------------------------------------------------------------------------- generator processes


class Generator:
    """Worker processes of mqtt_loadgen holding `specs`; `placement[i]` is spec i's process."""

    def __init__(
        self,
        base: Job,
        specs: list[Spec],
        procs: int,
        placement: list[int] | None = None,
        fan_counts: Any = None,
    ) -> None:
        ctx = mp.get_context("fork")
        procs = max(1, min(procs, len(specs)))
        placement = placement or [i % procs for i in range(len(specs))]
        self.pipes: list[Any] = []
        self.procs: list[Any] = []
        for k in range(procs):
            mine = [s for s, p in zip(specs, placement, strict=True) if p == k]
            if not mine:
                continue
            parent, child = ctx.Pipe()
            job = replace(base, specs=mine)
            p = ctx.Process(target=worker_main, args=(job, child, fan_counts), daemon=True)
            p.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(p)

    def _recv(self, pipe: Any, timeout: float, want: str) -> Any:
        if not pipe.poll(timeout):
            raise TimeoutError(f"load generator: no {want} after {timeout:.0f} s")
        kind, payload = pipe.recv()
        if kind == "error":
            raise RuntimeError(f"load generator: {payload}")
        return payload

    def ready(self, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        return [self._recv(p, max(0.1, deadline - time.monotonic()), "ready") for p in self.pipes]

    def start_run(self, t_start: float, t0: float, t1: float) -> None:
        for p in self.pipes:
            p.send(("run", t_start, t0, t1))

    def results(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        rs = [self._recv(p, max(0.1, deadline - time.monotonic()), "result") for p in self.pipes]
        roles: dict[str, dict[str, int]] = {}
        for r in rs:
            for role, v in r["roles"].items():
                acc = roles.setdefault(role, dict.fromkeys(v, 0))
                for k, x in v.items():
                    acc[k] += x
        return {
            "roles": roles,
            "gen_cpu_s": sum(r["gen_cpu_s"] for r in rs),
            "lat_ns": sorted(x for r in rs for x in r["lat_ns"]),
            "errors": [e for r in rs for e in r["errors"]],
            "drained": all(r["drained"] for r in rs),
            "stalls": sum(r["stalls"] for r in rs),
            "behind_ticks": sum(r["behind_ticks"] for r in rs),
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


# ---------------------------------------------------------------------------- one broker


class BrokerBench:
    def __init__(
        self, server: Server, args: argparse.Namespace, auth: bool = False, tls_ca: Path | None = None
    ) -> None:
        self.server = server
        self.args = args
        creds = {"username": BENCH_USER, "password": args.bench_password} if auth else {}
        self.base = Job(
            host="127.0.0.1",
            port=server.port,
            specs=[],
            payload=args.payload,
            window=args.window,
            rate=args.latency_rate,
            cpus=args.gen_cpu_list,
            loop=args.loop,
            tls_ca=str(tls_ca) if tls_ca else None,
            **creds,
        )
        self.kids = descendants(server.pid)  # the gateway's fsync helper

    def _check(self) -> None:
        if not self.server.alive():
            raise ServerError(f"{self.server.name} died:\n{self.server.log_tail()}")

    def _cpu(self) -> tuple[float, float]:
        return cpu_s(self.server.pid), tree_cpu_s(self.server.pid, self.kids)

    def _timed(
        self, gen: Generator, warm: float, dur: float, settle: bool, quiet: bool = True
    ) -> dict[str, Any]:
        """One run: load from t_start, window [t0, t1]; with `settle`, wait for the server to go
        idle after t1 and count that time and CPU in. With `quiet`, first wait for other jobs on
        the machine to calm down (at most --quiet-wait s)."""
        waited = wait_quiet(self.args.quiet_wait) if quiet and self.args.quiet_wait > 0 else 0.0
        if waited > 1:
            log(f"  waited {waited:.1f} s for other processes to leave the CPUs")
        t_start = time.monotonic() + 0.05
        t0 = t_start + warm
        t1 = t0 + dur
        gen.start_run(t_start, t0, t1)
        sleep_until(t0)
        c0, ct0 = self._cpu()
        sys0 = system_busy_s()
        ticks0 = cpu_ticks()
        sleep_until(t1)
        c1, ct1 = self._cpu()
        sys1 = system_busy_s()
        steal = steal_since(ticks0)
        drain = 0.0
        c2, ct2 = c1, ct1
        if settle:
            drain = wait_idle(self.server.pid, max_wait=self.args.drain_max, interval=0.05)
            c2, ct2 = self._cpu()
        res = gen.results(timeout=30 + self.args.drain_max)
        ncpu = len(self.args.gen_cpu_list or [0]) or 1
        res.update(
            {
                "duration_s": dur,
                "drain_s": drain,
                "quiet_wait_s": waited,
                "server_cpu_s": c2 - c0,
                "server_tree_cpu_s": ct2 - ct0,
                "server_util": (c1 - c0) / dur,
                "gen_util": res["gen_cpu_s"] / (dur * ncpu),
                # CPU used by anything else on the machine during the window (other jobs): in CPUs
                "other_util": max(0.0, (sys1 - sys0) - (ct1 - ct0) - res["gen_cpu_s"]) / dur,
                # share of all CPU time the hypervisor gave to other guests during the window
                "host_steal": steal,
            }
        )
        s_util, g_util = res["server_util"], res["gen_util"]
        if s_util >= 0.85:
            res["bottleneck"] = "server and generator" if g_util >= 0.85 else "server"
        else:
            res["bottleneck"] = "generator" if g_util >= 0.85 else "neither (latency-bound)"

        self._check()
        return res

    # -- phases

    def idle(self) -> dict[str, Any]:
        a = self.args
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        k = a.idle_conns
        if hard != resource.RLIM_INFINITY and k > hard - 200:
            k = max(1, hard - 200)  # the server needs one descriptor per connection too
            log(f"  RLIMIT_NOFILE hard limit {hard}: {k} idle connections (scaled to 10k)")
        timeout = 60 + k / 50
        warm = Generator(self.base, [Spec("idle", i) for i in range(20)], 1)
        gen: Generator | None = None
        try:
            warm.ready(timeout)
            wait_idle(self.server.pid, max_wait=5)
            time.sleep(0.3)
            rss0 = rss_bytes(self.server.pid)
            t = time.monotonic()
            gen = Generator(self.base, [Spec("idle", 20 + i) for i in range(k)], a.procs)
            gen.ready(timeout)
            connect_s = time.monotonic() - t
            wait_idle(self.server.pid, max_wait=10)
            time.sleep(0.3)
            self._check()
            rss1 = rss_bytes(self.server.pid)
        finally:
            if gen is not None:
                gen.stop()
            warm.stop()
        per_conn = max(rss1 - rss0, 1) / k
        return {
            "connections": k,
            "keep_alive_s": self.base.keep_alive,
            "rss_before_mib": rss0 / MIB,
            "rss_after_mib": rss1 / MIB,
            "bytes_per_conn": per_conn,
            "idle_conn_rss_mib_per_10k": per_conn * 10_000 / MIB,
            "idle_conns_per_gib": GIB / per_conn,
            "connect_s": connect_s,
            "connects_per_s": k / connect_s,
        }

    def publish(self, qos: int) -> dict[str, Any]:
        a = self.args
        role = "pub1" if qos else "pub0"
        specs = [Spec(role, i, f"bench/q{qos}/p{i}") for i in range(a.publishers)]
        gen = Generator(self.base, specs, a.procs)
        try:
            gen.ready(60)
            self._timed(gen, 0.0, a.warmup, settle=True, quiet=False)  # warm-up run
            r = self._timed(gen, 0.0, a.duration, settle=True)
        finally:
            gen.stop()
        counts = r["roles"][role]
        # The run starts from an idle server at t0 and ends when it is idle again: every message
        # confirmed after t0 (also those in flight at t1) is paid for by the CPU measured.
        n = counts["final"] - counts["at_t0"]
        out = {
            "publishers": a.publishers,
            "qos": qos,
            "window": a.window if qos else self.base.qos0_batch * self.base.qos0_batches,
            "confirmed": n,
            "rate_in_window": counts["window"] / r["duration_s"],
            f"qos{qos}_msgs_per_s": n / (r["duration_s"] + r["drain_s"]),
            f"cpu_us_per_qos{qos}_msg": r["server_cpu_s"] / n * 1e6 if n else None,
            f"cpu_us_per_qos{qos}_msg_incl_children": r["server_tree_cpu_s"] / n * 1e6 if n else None,
        }
        out.update(_run_details(r))
        return out

    def fanout(self) -> dict[str, Any]:
        a = self.args
        m = a.subscribers
        specs = [Spec("fanpub", 0, "fan/t")] + [Spec("sub", i, "fan/t") for i in range(m)]
        placement = [0] + [i % a.procs for i in range(m)]
        counts = mp.get_context("fork").RawArray("q", m)
        base = replace(self.base, fan_subscribers=m)
        gen = Generator(base, specs, a.procs, placement, counts)
        try:
            gen.ready(60)
            time.sleep(0.2)  # let fan-out loops that start on SUBSCRIBE settle
            self._timed(gen, 0.0, a.warmup, settle=False, quiet=False)
            r = self._timed(gen, 0.0, a.duration, settle=False)
        finally:
            gen.stop()
        d = r["roles"]["sub"]["window"]
        pub = r["roles"]["fanpub"]
        out = {
            "subscribers": m,
            "publish_rate": pub["window"] / r["duration_s"],
            "deliveries": d,
            "fanout_deliveries_per_s": d / r["duration_s"],
            "cpu_us_per_fanout_delivery": r["server_cpu_s"] / d * 1e6 if d else None,
            "missing_deliveries": pub["sent"] * m - r["roles"]["sub"]["final"],
            "stalls": r["stalls"],
        }
        out.update(_run_details(r))
        return out

    def latency(self) -> dict[str, Any]:
        a = self.args
        specs = [Spec("latpub", 0, "lat/t"), Spec("latsub", 0, "lat/t")]
        placement = [0, 1 % a.procs]
        gen = Generator(self.base, specs, a.procs, placement)
        try:
            gen.ready(60)
            time.sleep(0.2)
            r = self._timed(gen, a.warmup, a.duration, settle=False)
        finally:
            gen.stop()
        lat = r["lat_ns"]
        acked = r["roles"]["latpub"]["window"]
        expected = int(a.latency_rate * r["duration_s"])
        out = {
            "rate_target": a.latency_rate,
            "rate_acked": acked / r["duration_s"],
            "received": len(lat),
            "expected": expected,
            "p50_ms_at_5k": pct_ms(lat, 50),
            "p90_ms": pct_ms(lat, 90),
            "p99_ms_at_5k": pct_ms(lat, 99),
            "p999_ms": pct_ms(lat, 99.9),
            "max_ms": lat[-1] / 1e6 if lat else None,
            "behind_ticks": r["behind_ticks"],
            "cpu_us_per_msg": r["server_cpu_s"] / acked * 1e6 if acked else None,
        }
        out.update(_run_details(r))
        out.pop("lat_ns", None)
        return out

    def fixed(self) -> dict[str, Any]:
        """Phase `fixed`: `--fixed-publishers` QoS 1 publishers paced together at `--fixed-rate`
        msg/s to `fixed/p<i>`, one QoS 1 subscriber to `fixed/#` in another generator process. A
        warm-up run first; a broker in FIXED_OPTIONAL that cannot keep up with it is skipped."""
        a = self.args
        n = max(1, a.fixed_publishers)
        sub = Spec("latsub", 0, "fixed/#", persistent=a.fixed_persistent)
        specs = [Spec("latpub", i, f"fixed/p{i}") for i in range(n)] + [sub]
        placement = [0] * n + [1 % a.procs]
        gen = Generator(replace(self.base, rate=a.fixed_rate / n), specs, a.procs, placement)
        try:
            gen.ready(60)
            time.sleep(0.2)
            warm = _fixed_figures(self._timed(gen, 0.0, a.warmup, settle=False, quiet=False), a.fixed_rate)
            if self.server.name in FIXED_OPTIONAL and not warm["kept_up"]:
                return {
                    "rate_target": a.fixed_rate,
                    "publishers": n,
                    "skipped": (
                        f"{self.server.name} could not keep up with {a.fixed_rate:.0f} msg/s in the warm-up "
                        f"(published {warm['fixed_publish_msgs_per_s']:.0f}/s, delivered "
                        f"{warm['fixed_delivered_msgs_per_s']:.0f}/s)"
                    ),
                }
            r = self._timed(gen, a.warmup, a.duration, settle=False)
        finally:
            gen.stop()
        out: dict[str, Any] = {
            "rate_target": a.fixed_rate,
            "publishers": n,
            "subscriber": "persistent" if a.fixed_persistent else "clean",
        }
        out.update(_fixed_figures(r, a.fixed_rate))
        out.update(_run_details(r))
        return out


# peers whose fixed-rate phase is skipped when they cannot keep up with the rate in the warm-up
FIXED_OPTIONAL = frozenset({"amqtt"})


def _fixed_figures(r: dict[str, Any], rate: float) -> dict[str, Any]:
    """The figures of one fixed-rate run: achieved publish (PUBACKed) and delivered rates in the
    window, server CPU per published message, publish→receive latency percentiles."""
    dur = r["duration_s"]
    published = r["roles"]["latpub"]["window"]
    delivered = r["roles"]["latsub"]["window"]
    lat = r["lat_ns"]
    pub_rate, del_rate = published / dur, delivered / dur
    return {
        "published": published,
        "delivered": delivered,
        "fixed_publish_msgs_per_s": pub_rate,
        "fixed_delivered_msgs_per_s": del_rate,
        "kept_up": pub_rate >= 0.95 * rate and del_rate >= 0.95 * rate,
        "cpu_us_per_fixed_msg": r["server_cpu_s"] / published * 1e6 if published else None,
        "cpu_us_per_fixed_msg_incl_children": r["server_tree_cpu_s"] / published * 1e6 if published else None,
        "latency_samples": len(lat),
        "fixed_p50_ms": pct_ms(lat, 50),
        "fixed_p99_ms": pct_ms(lat, 99),
        "fixed_p999_ms": pct_ms(lat, 99.9),
        "fixed_max_ms": lat[-1] / 1e6 if lat else None,
        "behind_ticks": r["behind_ticks"],
    }


def _run_details(r: dict[str, Any]) -> dict[str, Any]:
    keep = (
        "duration_s",
        "drain_s",
        "server_cpu_s",
        "server_util",
        "gen_util",
        "other_util",
        "host_steal",
        "bottleneck",
        "errors",
    )
    d = {k: r[k] for k in keep}
    d["errors"] = d["errors"][:5]
    if not r["drained"]:
        d["drained"] = False
    return d


def start_server(
    name: str,
    workdir: Path,
    args: argparse.Namespace,
    auth: bool = False,
    tls: tuple[Path, Path] | None = None,
    gateway_extra: tuple[str, ...] = (),
) -> Server:
    """Broker `name` started fresh in `workdir`; with `tls` (certificate, key) `server.port` is its
    MQTT over TLS port (our gateway: `--mqtt-tls-port`, its plain listener left unused)."""
    if name == "gateway":
        src = Path(args.gateway_src).resolve() if args.gateway_src else None
        prof = Path(args.gateway_profile).resolve() if args.gateway_profile else None
        extra = shlex.split(args.gateway_args) + (["--auth"] if auth else []) + list(gateway_extra)
        tls_port = free_port() if tls is not None else 0
        if tls is not None:
            extra += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1]), "--mqtt-tls-port", str(tls_port)]
            extra += ["--https-port", "0"]  # HTTPS is on with --tls-cert (8443 by default)
        server = start_gateway(workdir, "mqtt", extra, cpu=args.server_cpu, src=src, profile=prof)
        if tls is not None:
            server.port = tls_port
            wait_ready(server, lambda: tcp_ready(tls_port), 30)
        return server
    if name == "mosquitto":
        return start_mosquitto(workdir, args.server_cpu, tls=tls)
    if tls is not None:
        raise ServerError(f"no TLS runs for {name}")
    if name == "amqtt":
        return start_amqtt(workdir, args.server_cpu)
    raise ServerError(f"unknown broker {name!r} (known: {', '.join(BROKERS)})")


PHASES: list[tuple[str, Callable[[BrokerBench], dict[str, Any]]]] = [
    ("idle", BrokerBench.idle),
    ("qos0", lambda b: b.publish(0)),
    ("qos1", lambda b: b.publish(1)),
    ("fanout", BrokerBench.fanout),
    ("latency", BrokerBench.latency),
    ("fixed", BrokerBench.fixed),
]


def bench_broker(
    name: str,
    args: argparse.Namespace,
    *,
    auth: bool = False,
    phases: list[str] | None = None,
    tls: tuple[Path, Path] | None = None,
    gateway_extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One broker started fresh and its `phases` (default `--phases`) measured; `auth`: our gateway
    with `--auth`, the `bench` user and the ACL rules; `tls` (certificate, key): the broker serves
    MQTT over TLS with them and every generator connection uses it."""
    res: dict[str, Any] = {k: None for k, _, _ in FIGURES}
    res["details"] = {}
    workdir = Path(tempfile.mkdtemp(prefix=f"mqtt-bench-{name}-", dir=args.dir))
    t = time.monotonic()
    server: Server | None = None
    phase_list = args.phase_list if phases is None else phases
    try:
        log(f"[{name}] starting" + (" with --auth" if auth else "") + (" over TLS" if tls else ""))
        server = start_server(name, workdir, args, auth, tls, gateway_extra)
        res["info"] = dict(server.info)
        res["info"]["tls"] = tls is not None
        res["info"]["start_s"] = round(time.monotonic() - t, 2)
        if name == "gateway":
            res["info"]["data_fs"] = fs_type(workdir)
        if auth:
            res["info"].update(provision(server, args))
        b = BrokerBench(server, args, auth, tls[0] if tls else None)
        for phase, fn in PHASES:
            if phase not in phase_list:
                continue
            if not server.alive():
                res["details"][phase] = {"error": f"{name} is not running"}
                continue
            log(f"[{name}] {phase} (at {time.monotonic() - t:.1f} s)")
            try:
                d = fn(b)
            except Exception as e:  # noqa: BLE001 - a failing phase gives null figures
                log(f"[{name}] {phase} failed: {type(e).__name__}: {e}")
                if args.verbose:
                    traceback.print_exc(file=sys.stderr)
                res["details"][phase] = {"error": f"{type(e).__name__}: {e}"}
                hint = _last_error_line(server)
                if hint:
                    res["details"][phase]["server_log"] = hint
                    log(f"  {name} log: {hint}")
                continue
            res["details"][phase] = d
            for k, _, _ in FIGURES:
                if k in d:
                    res[k] = d[k]
            for k in ("cpu_us_per_qos1_msg_incl_children", "cpu_us_per_fixed_msg_incl_children"):
                if k in d:
                    res[k] = d[k]
            log("  " + _brief(d))
    except ServerError as e:
        log(f"[{name}] cannot start: {e}")
        res["error"] = str(e)
    finally:
        if server is not None:
            server.stop()
            log(f"[{name}] stopped (at {time.monotonic() - t:.1f} s)")
            if server.proc.returncode not in (0, -15, None) and "error" not in res:
                res.setdefault("info", {})["exit_status"] = server.proc.returncode
        if args.keep:
            log(f"[{name}] kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return res


# ---------------------------------------------------------------------------- auth on vs off

BENCH_USER = "bench"


def acl_policy(n: int) -> str:
    """`n` ACL rules as a policy file: the one that lets `bench` publish to `bench/#`, then rules of
    its role on other paths (a tenth of them denies) and other users' rules."""
    rules = [(f"user:{BENCH_USER}", "bench/#", "publish", "allow")]
    i = 0
    while len(rules) < n:
        if i % 2:
            rules.append((f"user:device{i}", f"devices/device{i}/#", "publish,subscribe", "allow"))
        else:
            effect = "deny" if i % 10 == 0 else "allow"
            rules.append(("role:user", f"telemetry/{i}/%u/+/#", "publish,subscribe", effect))
        i += 1
    return policy_toml(rules[:n])


def provision(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """Create the `bench` user and the ACL rules through the admin API of a gateway started with
    `--auth` (its first admin's password from GATEWAY_ADMIN_PASSWORD)."""
    m = re.search(r"--http-port (\d+)", str(server.info.get("command", "")))
    if m is None:
        raise ServerError("no --http-port in the gateway's command line")
    base = f"http://127.0.0.1:{m.group(1)}"
    t = time.monotonic()
    user = {"name": BENCH_USER, "password": args.bench_password, "role": "user"}
    admin_call(base, args.admin_password, "/admin/users", json.dumps(user).encode(), "application/json")
    res = admin_call(
        base,
        args.admin_password,
        "/admin/acl/import?replace=false",
        acl_policy(args.acl_rules).encode(),
        "application/toml",
    )
    return {"acl_rules": res.get("rules"), "provision_s": round(time.monotonic() - t, 2)}


def auth_rounds(args: argparse.Namespace) -> dict[str, Any]:
    """QoS 1 throughput with auth on vs off: `--auth-rounds` rounds, each a fresh gateway with auth
    off and a fresh one with auth on (the same phase, the same load), in alternating order (off
    first in odd rounds, on first in even ones) so that neither side always runs second."""
    rounds = []
    for i in range(args.auth_rounds):
        figs = {}
        for auth in (False, True) if i % 2 == 0 else (True, False):
            log(f"[gateway] auth round {i + 1}: auth {'on' if auth else 'off'}")
            r = bench_broker("gateway", args, auth=auth, phases=["qos1"])
            err = r.get("error") or r["details"].get("qos1", {}).get("error")
            figs[auth] = (r.get("qos1_msgs_per_s"), r.get("cpu_us_per_qos1_msg"), err, r.get("info", {}))
        (off, cpu_off, err_off, _), (on, cpu_on, err_on, info_on) = figs[False], figs[True]
        rounds.append(
            {
                "qos1_off": off,
                "qos1_on": on,
                "ratio": on / off if on and off else None,
                "cpu_us_per_qos1_msg_off": cpu_off,
                "cpu_us_per_qos1_msg_on": cpu_on,
                "errors": [e for e in (err_off, err_on) if e],
                "on_info": {k: info_on.get(k) for k in ("acl_rules", "provision_s")},
            }
        )
        log(f"  round {i + 1}: off {off} msg/s, on {on} msg/s")
    ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
    return {
        "qos1_auth_ratio": statistics.median(ratios) if ratios else None,
        "acl_rules": args.acl_rules,
        "rounds": rounds,
        "target": ">= 0.9",
    }


# ---------------------------------------------------------------------------- message trace on vs off

TRACE_OFF = ("--trace-retention", "0")


def trace_rounds(args: argparse.Namespace) -> dict[str, Any]:
    """QoS 1 throughput with message tracing on (the default) vs off: `--trace-rounds` rounds, each
    a fresh gateway of each kind, in alternating order (as `auth_rounds`)."""
    rounds = []
    for i in range(args.trace_rounds):
        figs = {}
        for on in (False, True) if i % 2 == 0 else (True, False):
            log(f"[gateway] trace round {i + 1}: tracing {'on' if on else 'off'}")
            r = bench_broker("gateway", args, phases=["qos1"], gateway_extra=() if on else TRACE_OFF)
            err = r.get("error") or r["details"].get("qos1", {}).get("error")
            figs[on] = (r.get("qos1_msgs_per_s"), r.get("cpu_us_per_qos1_msg"), err)
        (off, cpu_off, err_off), (on_rate, cpu_on, err_on) = figs[False], figs[True]
        rounds.append(
            {
                "qos1_off": off,
                "qos1_on": on_rate,
                "ratio": on_rate / off if on_rate and off else None,
                "cpu_us_per_qos1_msg_off": cpu_off,
                "cpu_us_per_qos1_msg_on": cpu_on,
                "errors": [e for e in (err_off, err_on) if e],
            }
        )
        log(f"  round {i + 1}: off {off} msg/s, on {on_rate} msg/s")
    ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
    return {
        "qos1_trace_ratio": statistics.median(ratios) if ratios else None,
        "rounds": rounds,
        "target": ">= 0.9",
    }


# ---------------------------------------------------------------------------- --workers 2 vs 1


def workers_rounds(args: argparse.Namespace) -> dict[str, Any]:
    """Phase `fixed` on a gateway of one worker (`--workers 1`: the single process) and one of
    `--workers 2` (a store process and two workers), `--workers-rounds` rounds in alternating order
    (as `auth_rounds`). The CPU is the whole process tree's (`cpu_us_per_fixed_msg_incl_children`),
    so the store process, both workers and the fsync helper count; `workers2_cpu_ratio` is the
    median of the rounds' workers-2 / workers-1 ratios (target <= 1.3)."""
    rounds = []
    keys = (
        "cpu_us_per_fixed_msg_incl_children",
        "fixed_publish_msgs_per_s",
        "fixed_delivered_msgs_per_s",
        "fixed_p50_ms",
        "fixed_p99_ms",
    )
    every_cpu = ",".join(str(c) for c in range(os.cpu_count() or 1))  # not the bench's own (the generator's)
    unpinned = argparse.Namespace(**{**vars(args), "server_cpu": every_cpu})
    for i in range(args.workers_rounds):
        figs: dict[int, dict[str, Any]] = {}
        for n in (1, 2) if i % 2 == 0 else (2, 1):
            log(f"[gateway] workers round {i + 1}: --workers {n}")
            r = bench_broker("gateway", unpinned, phases=["fixed"], gateway_extra=("--workers", str(n)))
            d = r["details"].get("fixed", {})
            figs[n] = {k: d.get(k) for k in keys}
            figs[n].update({k: d.get(k) for k in ("other_util", "host_steal")})
            err = r.get("error") or d.get("error")
            if err:
                figs[n]["error"] = err.splitlines()[0]
        cpu1, cpu2 = (
            figs[1]["cpu_us_per_fixed_msg_incl_children"],
            figs[2]["cpu_us_per_fixed_msg_incl_children"],
        )
        rounds.append({"workers1": figs[1], "workers2": figs[2], "ratio": _div(cpu2, cpu1)})
        log(f"  round {i + 1}: tree CPU µs/msg {cpu1} (1 worker), {cpu2} (2 workers)")
    ratio = _median([r["ratio"] for r in rounds])
    return {
        "workers2_cpu_ratio": ratio,
        "cpu_us_per_fixed_msg_workers1": _median([r["workers1"][keys[0]] for r in rounds]),
        "cpu_us_per_fixed_msg_workers2": _median([r["workers2"][keys[0]] for r in rounds]),
        "rounds": rounds,
        "target": "<= 1.3",
        "met": None if ratio is None else ratio <= 1.3,
    }


# ---------------------------------------------------------------------------- p99 at 5k, repeated

P99_BOUND_MS = 10.0


def p99_runs(args: argparse.Namespace) -> dict[str, Any]:
    """The latency phase (5) on `--p99-runs` fresh gateways, one after the other: p99 per run and
    how many runs met the bound (target: at least 4 of 5, i.e. 80 % of the runs)."""
    runs = []
    for i in range(args.p99_runs):
        log(f"[gateway] p99 run {i + 1} of {args.p99_runs}")
        r = bench_broker("gateway", args, phases=["latency"])
        d = r["details"].get("latency", {})
        keys = ("p50_ms_at_5k", "p99_ms_at_5k", "rate_acked", "other_util", "host_steal")
        run = {k: d.get(k) for k in keys}
        err = r.get("error") or d.get("error")
        if err:
            run["error"] = err.splitlines()[0]
        runs.append(run)
    p99s = [r["p99_ms_at_5k"] for r in runs]
    met = sum(1 for v in p99s if v is not None and v <= P99_BOUND_MS)
    need = math.ceil(0.8 * len(runs))
    return {
        "p99_ms_at_5k_runs": p99s,
        "p99_at_5k_runs_met": met,
        "runs": runs,
        "bound_ms": P99_BOUND_MS,
        "target": f">= {need} of {len(runs)} runs with p99 <= {P99_BOUND_MS:g} ms",
        "met": met >= need if runs else None,
    }


# ---------------------------------------------------------------------------- TLS vs plain

# the runs of one TLS round in odd rounds (even rounds run them in reverse): (broker, over TLS)
TLS_RUNS = (("gateway", False), ("gateway", True), ("mosquitto", True), ("mosquitto", False))


def _tls_run(r: dict[str, Any]) -> dict[str, Any]:
    """The figures of one TLS-phase run (a `bench_broker` result with its qos1 phase)."""
    d = r["details"].get("qos1", {})
    out = {"qos1_msgs_per_s": r.get("qos1_msgs_per_s"), "cpu_us_per_qos1_msg": r.get("cpu_us_per_qos1_msg")}
    out.update({k: d.get(k) for k in ("server_util", "gen_util", "bottleneck", "other_util", "host_steal")})
    err = r.get("error") or d.get("error")
    if err:
        out["error"] = err.splitlines()[0]
    return out


def _div(a: Any, b: Any) -> float | None:
    return a / b if a and b else None


def _median(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def tls_rounds(args: argparse.Namespace) -> dict[str, Any]:
    """QoS 1 throughput over TLS vs plain: `--tls-rounds` rounds, each running phase 3 on a fresh
    gateway in clear, a fresh one over TLS, a fresh Mosquitto over TLS and one in clear (when
    `mosquitto` is in `--brokers`), in the order of TLS_RUNS in odd rounds and the reverse in even
    ones, so that neither side of a pair always runs second. All use one self-signed certificate
    made for this run (deleted after it)."""
    out: dict[str, Any] = {"qos1_tls_ratio": None, "qos1_tls_ratio_vs_mosquitto": None, "target": ">= 0.7"}
    certdir = Path(tempfile.mkdtemp(prefix="mqtt-bench-cert-", dir=args.dir))
    try:
        tls = self_signed_cert(certdir)
    except ServerError as e:
        shutil.rmtree(certdir, ignore_errors=True)
        log(f"TLS rounds: {e}")
        out["error"] = str(e)
        return out
    runs = [r for r in TLS_RUNS if r[0] in args.broker_list]
    rounds = []
    try:
        for i in range(args.tls_rounds):
            rnd: dict[str, Any] = {"order": []}
            for name, over_tls in runs if i % 2 == 0 else runs[::-1]:
                key = _run_key((name, over_tls))
                log(f"[{name}] TLS round {i + 1}: {'TLS' if over_tls else 'plain'}")
                rnd[key] = _tls_run(bench_broker(name, args, phases=["qos1"], tls=tls if over_tls else None))
                rnd["order"].append(key)
            rate = {k: rnd.get(k, {}).get("qos1_msgs_per_s") for k in map(_run_key, TLS_RUNS)}
            rnd["ratio"] = _div(rate["gateway_tls"], rate["gateway_plain"])
            rnd["ratio_vs_mosquitto"] = _div(rate["gateway_tls"], rate["mosquitto_tls"])
            rnd["mosquitto_ratio"] = _div(rate["mosquitto_tls"], rate["mosquitto_plain"])
            cpu = {k: rnd.get(k, {}).get("cpu_us_per_qos1_msg") for k in ("gateway_plain", "gateway_tls")}
            # the TLS / plain throughput of a CPU-bound gateway: less disturbed by other jobs than `ratio`
            rnd["cpu_ratio"] = _div(cpu["gateway_plain"], cpu["gateway_tls"])
            rnd["errors"] = [f"{k}: {rnd[k]['error']}" for k in rnd["order"] if "error" in rnd[k]]
            rounds.append(rnd)
            log(
                f"  TLS round {i + 1}: "
                + ", ".join(f"{k} {fmt(rate[k])} msg/s" for k in rnd["order"])
                + f"; gateway TLS/plain {fmt(rnd['ratio'])}"
            )
    finally:
        shutil.rmtree(certdir, ignore_errors=True)

    def med(key: str, fig: str = "qos1_msgs_per_s") -> float | None:
        return _median([r.get(key, {}).get(fig) for r in rounds])

    out.update(
        {
            "qos1_tls_ratio": _median([r["ratio"] for r in rounds]),
            "qos1_tls_ratio_vs_mosquitto": _median([r["ratio_vs_mosquitto"] for r in rounds]),
            "mosquitto_tls_ratio": _median([r["mosquitto_ratio"] for r in rounds]),
            "gateway_cpu_ratio": _median([r["cpu_ratio"] for r in rounds]),
            "qos1_msgs_per_s": {k: med(k) for k in map(_run_key, TLS_RUNS)},
            "cpu_us_per_qos1_msg": {k: med(k, "cpu_us_per_qos1_msg") for k in map(_run_key, TLS_RUNS)},
            "certificate": "self-signed EC P-256 (openssl req -x509), server-authenticated TLS",
            "rounds": rounds,
        }
    )
    return out


def _run_key(run: tuple[str, bool]) -> str:
    return f"{run[0]}_{'tls' if run[1] else 'plain'}"


def _last_error_line(server: Server) -> str | None:
    lines = [ln for ln in server.log_tail(200).splitlines() if "Error" in ln or "rror:" in ln]
    return lines[-1].strip()[:300] if lines else None


def _brief(d: dict[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
        for k, v in d.items()
        if k not in ("errors",) and v is not None and not isinstance(v, list | dict)
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--brokers", default=",".join(BROKERS), help="comma list (default: all three)")
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per phase")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per phase")
    ap.add_argument("--publishers", type=int, default=8, help="publishers in the QoS 0/1 phases")
    ap.add_argument("--subscribers", type=int, default=10, help="subscribers in the fan-out phase")
    ap.add_argument("--idle-conns", type=int, default=10_000, help="idle connections for the RSS figure")
    ap.add_argument("--window", type=int, default=100, help="unacked QoS 1 publishes per publisher")
    ap.add_argument("--payload", type=int, default=100, help="payload bytes (>= 8)")
    ap.add_argument("--latency-rate", type=float, default=5000.0, help="paced msg/s of the latency phase")
    ap.add_argument("--fixed-rate", type=float, default=10_000.0, help="paced msg/s of phase fixed (total)")
    ap.add_argument("--fixed-publishers", type=int, default=4, help="QoS 1 publishers of phase fixed")
    ap.add_argument(
        "--fixed-persistent",
        action="store_true",
        help="phase fixed's subscriber is a persistent session (clean session 0) instead of a clean one",
    )
    ap.add_argument(
        "--p99-runs", type=int, default=5, help="latency runs on fresh gateways for the p99 count (0: none)"
    )
    ap.add_argument("--procs", type=int, default=2, help="load generator processes")
    ap.add_argument("--server-cpu", type=int, default=0, help="CPU the broker is pinned to")
    ap.add_argument("--gen-cpus", default="1", help="CPUs of the load generator (comma list)")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="generator event loop")
    ap.add_argument(
        "--phases",
        default="idle,qos0,qos1,fanout,latency,fixed",
        help="subset of idle,qos0,qos1,fanout,latency,fixed",
    )
    ap.add_argument("--gateway-args", default="", help="extra `gateway start` flags, e.g. '--flush async'")
    ap.add_argument("--gateway-src", default=None, help="run the gateway from this source tree")
    ap.add_argument(
        "--gateway-profile", default=None, help="run the gateway under cProfile, stats written to this file"
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=10.0,
        help="before each measured run wait up to this long for other jobs to leave the CPUs (0: never)",
    )
    ap.add_argument("--drain-max", type=float, default=10.0, help="longest wait for a server to go idle")
    ap.add_argument(
        "--auth-rounds", type=int, default=3, help="QoS 1 auth off/on rounds of our gateway (0: none)"
    )
    ap.add_argument("--acl-rules", type=int, default=1000, help="ACL rules of the auth-on runs")
    ap.add_argument(
        "--trace-rounds", type=int, default=3, help="QoS 1 trace off/on rounds of our gateway (0: none)"
    )
    ap.add_argument(
        "--tls-rounds", type=int, default=3, help="QoS 1 plain/TLS rounds (gateway, Mosquitto; 0: none)"
    )
    ap.add_argument(
        "--workers-rounds",
        type=int,
        default=0,
        help="phase fixed rounds of our gateway with --workers 1 and --workers 2 (0: none)",
    )
    ap.add_argument("--dir", default=None, help="parent of the temporary work directories")
    ap.add_argument("--keep", action="store_true", help="keep work directories (logs, configs)")
    ap.add_argument("--quick", action="store_true", help="small fast run (smoke test)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--json-file", default=None, help="also write the JSON object to this file")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.duration = min(args.duration, 0.8)
        args.warmup = min(args.warmup, 0.2)
        args.publishers = min(args.publishers, 4)
        args.subscribers = min(args.subscribers, 4)
        args.idle_conns = min(args.idle_conns, 500)
        args.drain_max = min(args.drain_max, 3.0)
        args.quiet_wait = min(args.quiet_wait, 1.0)
        args.auth_rounds = min(args.auth_rounds, 1)
        args.trace_rounds = min(args.trace_rounds, 1)
        args.tls_rounds = min(args.tls_rounds, 1)
        args.p99_runs = min(args.p99_runs, 1)
    args.payload = max(args.payload, 8)
    args.broker_list = [b.strip() for b in args.brokers.split(",") if b.strip()]
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
    args.admin_password = secrets.token_urlsafe(16)  # the auth runs' first admin (bootstrap from env)
    args.bench_password = secrets.token_urlsafe(16)
    os.environ["GATEWAY_ADMIN_PASSWORD"] = args.admin_password
    brokers: dict[str, dict[str, Any]] = {}
    for name in args.broker_list:
        brokers[name] = bench_broker(name, args)
    auth: dict[str, Any] = {"qos1_auth_ratio": None}
    if "gateway" in args.broker_list and "qos1" in args.phase_list and args.auth_rounds > 0:
        auth = auth_rounds(args)
    trace: dict[str, Any] = {"qos1_trace_ratio": None}
    if "gateway" in args.broker_list and "qos1" in args.phase_list and args.trace_rounds > 0:
        trace = trace_rounds(args)
    tls: dict[str, Any] = {"qos1_tls_ratio": None, "qos1_tls_ratio_vs_mosquitto": None}
    if "gateway" in args.broker_list and "qos1" in args.phase_list and args.tls_rounds > 0:
        tls = tls_rounds(args)
    workers: dict[str, Any] = {"workers2_cpu_ratio": None}
    if "gateway" in args.broker_list and args.workers_rounds > 0:
        workers = workers_rounds(args)
    p99: dict[str, Any] = {"p99_ms_at_5k_runs": None, "p99_at_5k_runs_met": None}
    if "gateway" in args.broker_list and "latency" in args.phase_list and args.p99_runs > 0:
        p99 = p99_runs(args)
    report = build_report(brokers, args)
    report["p99_ms_at_5k_runs"] = p99["p99_ms_at_5k_runs"]
    report["p99_at_5k_runs_met"] = p99["p99_at_5k_runs_met"]
    report["p99_runs"] = p99
    report["targets"]["p99_at_5k_runs"] = {
        "target": p99.get("target", "p99 latency at 5k msg/s <= 10 ms in >= 4 of 5 runs"),
        "value": p99["p99_at_5k_runs_met"],
        "met": p99.get("met"),
    }
    report["fixed"] = fixed_summary(brokers, args)
    report["workers2_cpu_ratio"] = workers["workers2_cpu_ratio"]
    report["workers"] = workers
    report["config"]["workers_rounds"] = args.workers_rounds
    report["targets"]["workers2_cpu"] = {
        "target": "--workers 2: process-tree CPU per message at the fixed rate <= 1.3x one worker's",
        "value": workers["workers2_cpu_ratio"],
        "met": workers.get("met"),
    }
    report["qos1_auth_ratio"] = auth["qos1_auth_ratio"]
    report["qos1_trace_ratio"] = trace["qos1_trace_ratio"]
    report["qos1_tls_ratio"] = tls["qos1_tls_ratio"]
    report["qos1_tls_ratio_vs_mosquitto"] = tls["qos1_tls_ratio_vs_mosquitto"]
    report["config"].update(
        auth_rounds=args.auth_rounds, acl_rules=args.acl_rules, tls_rounds=args.tls_rounds
    )
    report["config"]["trace_rounds"] = args.trace_rounds
    report["auth"] = auth
    report["trace"] = trace
    report["targets"]["qos1_trace"] = {
        "target": "QoS 1 throughput with message tracing on >= 0.9x off",
        "value": trace["qos1_trace_ratio"],
        "met": None if trace["qos1_trace_ratio"] is None else trace["qos1_trace_ratio"] >= 0.9,
    }
    report["tls"] = tls
    report["targets"]["qos1_auth"] = {
        "target": "QoS 1 throughput with auth on and 1,000 ACL rules >= 0.9x auth off",
        "value": auth["qos1_auth_ratio"],
        "met": None if auth["qos1_auth_ratio"] is None else auth["qos1_auth_ratio"] >= 0.9,
    }
    report["targets"]["qos1_tls"] = {
        "target": "QoS 1 throughput over TLS >= 0.7x plain",
        "value": tls["qos1_tls_ratio"],
        "met": None if tls["qos1_tls_ratio"] is None else tls["qos1_tls_ratio"] >= 0.7,
    }
    text = json.dumps(report, default=str)
    if args.json_file:
        Path(args.json_file).write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print_table(report)
        for i, r in enumerate(auth.get("rounds", ())):
            print(
                f"auth round {i + 1}: QoS 1 off {r['qos1_off'] or 0:,.0f} msg/s, on {r['qos1_on'] or 0:,.0f}"
                f" msg/s ({args.acl_rules} ACL rules)"
            )
    qar = auth["qos1_auth_ratio"]
    text_ratio = f"{qar:.3f}" if qar is not None else "-"
    log(f"qos1_auth_ratio (auth on / off, median of {len(auth.get('rounds', ()))}): {text_ratio}")
    if not args.json:
        print(f"qos1_auth_ratio (QoS 1 auth on / off, median): {text_ratio} (target >= 0.9)")
        qtr = fmt(trace["qos1_trace_ratio"])
        print(f"qos1_trace_ratio (QoS 1 tracing on / off, median): {qtr} (target >= 0.9)")
        print_tls(tls)
        print_fixed(report)
    return 0


def fixed_summary(brokers: dict[str, dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The fixed-rate phase per broker (rates, CPU per message, latency, other_util, host_steal)."""
    keys = (
        "fixed_publish_msgs_per_s",
        "fixed_delivered_msgs_per_s",
        "kept_up",
        "cpu_us_per_fixed_msg",
        "cpu_us_per_fixed_msg_incl_children",
        "fixed_p50_ms",
        "fixed_p99_ms",
        "other_util",
        "host_steal",
        "skipped",
        "error",
    )
    per = {}
    for name, b in brokers.items():
        d = b.get("details", {}).get("fixed")
        if d is not None:
            per[name] = {k: d[k] for k in keys if k in d}
    return {"rate": args.fixed_rate, "publishers": args.fixed_publishers, "brokers": per}


def print_fixed(report: dict[str, Any]) -> None:
    """The fixed-rate and p99-runs lines of the text output."""
    fx = report["fixed"]
    for name, d in fx["brokers"].items():
        if "skipped" in d or "error" in d:
            print(f"fixed {fx['rate']:.0f} msg/s, {name}: {d.get('skipped') or d.get('error')}")
            continue
        print(
            f"fixed {fx['rate']:.0f} msg/s, {name}: published {fmt(d['fixed_publish_msgs_per_s'])}/s, "
            f"delivered {fmt(d['fixed_delivered_msgs_per_s'])}/s, server CPU "
            f"{fmt(d['cpu_us_per_fixed_msg'])} µs/msg (incl. children "
            f"{fmt(d['cpu_us_per_fixed_msg_incl_children'])}), p50 {fmt(d['fixed_p50_ms'])} ms, p99 "
            f"{fmt(d['fixed_p99_ms'])} ms, other {fmt(d['other_util'])} CPUs, steal {fmt(d['host_steal'])}"
        )
    print(f"cpu_ratio_vs_mosquitto_at_10k: {fmt(report['cpu_ratio_vs_mosquitto_at_10k'])} (target <= 1.0)")
    runs = report["p99_runs"].get("runs")
    if runs:
        p99s = ", ".join(fmt(r["p99_ms_at_5k"]) for r in runs)
        print(
            f"p99 ms at 5k msg/s on {len(runs)} fresh gateways: {p99s}; "
            f"{report['p99_at_5k_runs_met']} met <= 10 ms ({report['p99_runs']['target']})"
        )


def print_tls(tls: dict[str, Any]) -> None:
    """The TLS rounds' lines of the text output."""
    if tls.get("error"):
        print(f"TLS rounds: could not run: {tls['error'].splitlines()[0]}")
    for i, r in enumerate(tls.get("rounds", ())):
        runs = ", ".join(
            f"{k.replace('_', ' ')} {fmt(r[k]['qos1_msgs_per_s'])} msg/s "
            f"({fmt(r[k]['cpu_us_per_qos1_msg'])} µs/msg, other {fmt(r[k]['other_util'])} CPUs, "
            f"steal {fmt(r[k]['host_steal'])})"
            for k in r["order"]
        )
        print(f"TLS round {i + 1}: {runs}" + "".join(f"; {e}" for e in r["errors"]))
    cpu = tls.get("cpu_us_per_qos1_msg", {})
    print(f"qos1_tls_ratio (QoS 1 gateway TLS / plain, median): {fmt(tls['qos1_tls_ratio'])} (target >= 0.7)")
    print(
        "qos1_tls_ratio_vs_mosquitto (gateway TLS / Mosquitto TLS, median): "
        f"{fmt(tls['qos1_tls_ratio_vs_mosquitto'])}; server CPU µs/QoS1 msg over TLS: gateway "
        f"{fmt(cpu.get('gateway_tls'))} (plain {fmt(cpu.get('gateway_plain'))}: CPU ratio "
        f"{fmt(tls.get('gateway_cpu_ratio'))}), Mosquitto {fmt(cpu.get('mosquitto_tls'))}"
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
