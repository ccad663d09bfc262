"""AMQP 0-9-1 broker benchmark: our gateway against RabbitMQ, same load generator, same machine.

    .venv/bin/python bench/amqp_bench.py [--brokers gateway,rabbitmq] [--duration S] [--warmup S]
        [--publishers N] [--procs K] [--window W] [--prefetch P] [--latency-rate R] [--fixed-rate R]
        [--fixed-publishers N] [--fixed-inflight W] [--fixed-exclusive] [--phases P,...]
        [--gateway-profile FILE] [--quick] [--json]

For each broker (bench/amqp_servers.py: started on loopback in a fresh directory, pinned to
`--server-cpu`, default CPU 0) the load generator (bench/amqp_loadgen.py: `--procs` processes
pinned to `--gen-cpus`, default CPU 1, raw asyncio sockets with frames pre-encoded by our codec;
this process is pinned there too) measures, in this order:

1. Persistent publish with confirms: N publishers (one connection each, spread over the generator
   processes), each on its own durable queue (default exchange, routing key = queue), 100-byte
   bodies, delivery_mode 2, `confirm.select`, at most `--window` (200) unconfirmed messages each.
   After `--warmup` s, confirms counted over `--duration` s: msg/s, and the server's CPU (utime +
   stime from /proc/<pid>/stat over the same window) per confirmed message.
2. Consume + ack: one consumer per queue of phase 1 (prefetch `--prefetch`, 100; manual ack, one
   basic.ack per delivery) drains the backlog phase 1 left (the declare-ok message count, i.e. every
   confirmed message). Rate = backlog / time until the last consumer has its last message; CPU =
   server CPU from the start until the server is idle again / backlog.
3. Latency: one confirmed persistent publisher paced at `--latency-rate` (2,000) msg/s and one
   consumer (prefetch 100, acking) on another generator process; latency = receive time - write
   time stamped in the body (CLOCK_MONOTONIC); p50/p99 over messages written in the window.

4. Fixed rate (phase `fixed`, in the default `--phases`; about 25 s more for the two brokers):
   `--fixed-publishers` (4) confirmed persistent publishers paced together at `--fixed-rate`
   (3,000) msg/s in total with at most `--fixed-inflight` (100) unconfirmed messages in total
   (a publisher held back by its share of the window falls behind the pace, counted in `behind`),
   and one consumer (basic.consume, prefetch 100, manual ack) on the same durable queue
   `amqpbench.fixed`: publish + consume + ack (`--fixed-exclusive`: an exclusive queue the consumer
   declares, `queue` in the phase's details). After `--warmup` s, over `--duration` s: confirmed
   and delivered msg/s, publish→receive latency p50/p99 (stamped as in phase 3), `other_util`,
   `host_steal`, and server CPU µs per confirmed message over the whole server process tree
   (`cpu_us_per_fixed_msg`: the gateway and its children; beam.smp and its children such as
   erl_child_setup, whereas phases 1-3 count beam.smp alone; the main process alone in
   `cpu_us_per_fixed_msg_main_process`). `cpu_ratio_vs_rabbitmq_at_3k` = gateway / RabbitMQ CPU
   per message (target <= 0.5).

Authentication (`--auth-rounds N`, default 3; `--quick`: 1): phase 1 again on fresh gateways
started with `--auth` (first admin from GATEWAY_ADMIN_PASSWORD), whose load generator logs in as
the `user`-role user `bench` (created through the admin API, POST /admin/users) under `--acl-rules`
(1,000) ACL rules (imported as one policy file, POST /admin/acl/import): the few that allow `bench`
its queues and the rest on other paths and for other users, some of them denies; alternating with
runs with auth off (round 1's is the main run's phase 1). `confirms_auth_ratio` is the median over
the rounds of auth-on / auth-off publisher-confirm throughput (target >= 0.9).

Our gateway runs with its defaults: flush policy `sync`, i.e. a confirm is sent after the group
commit's fdatasync (data directory under `--dir`, default the system temp directory; the output
says which filesystem). RabbitMQ 3.10 (Debian) runs with its defaults (classic queues; confirms
after its message store / queue index sync) but with scheduler busy-waiting off so that idle
spinning is not counted as its CPU (see bench/amqp_servers.py). The gateway's CPU is its main
process (its fsync helper child, if any, is in `cpu_us_per_msg_incl_children`); RabbitMQ's is
beam.smp (epmd negligible, reported as `epmd_cpu_s`).

Shared machines: before each measured run the bench waits (at most `--quiet-wait` s) until the
machine uses < 0.3 CPUs besides itself, and reports per run `other_util` (CPUs used by anything
but the server and the generator during the window, from /proc/stat), `host_steal` (the share of
all CPU time the hypervisor gave to other guests then; phases 1, 3 and 4) and the load average.

Output: a table (figures, gateway / RabbitMQ ratios, targets: ≥ 1.0× RabbitMQ on confirms and no
more CPU per message, auth on ≥ 0.9× off, at the fixed rate ≤ 0.5× RabbitMQ's CPU per message);
`--json` prints one JSON object instead (progress on stderr) with `confirms_ratio_vs_rabbitmq`,
`consume_ratio_vs_rabbitmq`, `cpu_us_per_msg` (gateway, phase 1), `rabbitmq_cpu_us_per_msg`,
`cpu_ratio_vs_rabbitmq`, `confirms_auth_ratio` (its rounds in `auth`),
`cpu_ratio_vs_rabbitmq_at_3k`, `fixed_cpu_us_per_msg` and `rabbitmq_fixed_cpu_us_per_msg` (phase
4; per broker in `figures` as `fixed_publish_msgs_per_s`, `fixed_delivered_msgs_per_s`,
`fixed_p50_ms`, `fixed_p99_ms`, `cpu_us_per_fixed_msg`), `targets`, `ratios`, `brokers` (figures
and details per broker), `config`. A broker that cannot start or a phase that fails gives null
figures and an `error`; the run goes on.

Profiling our gateway: `--gateway-profile FILE` runs it under `python -m cProfile -o FILE` (e.g.
with `--brokers gateway --phases fixed`); the stats are written when it exits.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from amqp_loadgen import Job, Spec, worker_main
from amqp_servers import AmqpServer, amqp_ready, epmd_cpu_s, start_rabbitmq
from common import (
    ServerError,
    admin_call,
    cpu_s,
    cpu_ticks,
    descendants,
    fmt,
    fs_type,
    log,
    pct_ms,
    policy_toml,
    sleep_until,
    start_gateway,
    steal_since,
    system_busy_s,
    tree_cpu_s,
    wait_idle,
    wait_quiet,
)

BROKERS = ("gateway", "rabbitmq")

# (key, label, higher is better)
FIGURES: list[tuple[str, str, bool]] = [
    ("confirms_msgs_per_s", "persistent publish+confirm, msg/s", True),
    ("consume_msgs_per_s", "consume+ack (prefetch 100), msg/s", True),
    ("p50_ms", "p50 latency ms", False),
    ("p99_ms", "p99 latency ms", False),
    ("cpu_us_per_msg", "server CPU µs/confirmed msg", False),
    ("cpu_us_per_consumed_msg", "server CPU µs/consumed msg", False),
    ("fixed_publish_msgs_per_s", "fixed rate: confirmed msg/s", True),
    ("fixed_delivered_msgs_per_s", "fixed rate: delivered msg/s", True),
    ("fixed_p50_ms", "fixed rate: p50 latency ms", False),
    ("fixed_p99_ms", "fixed rate: p99 latency ms", False),
    ("cpu_us_per_fixed_msg", "fixed rate: server CPU µs/msg", False),
]


class Generator:
    def __init__(self, base: Job, specs: list[Spec], procs: int, placement: list[int] | None = None) -> None:
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
            job = Job(**{**base.__dict__, "specs": mine})
            p = ctx.Process(target=worker_main, args=(job, child), daemon=True)
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

    def ready(self, timeout: float = 60) -> list[dict]:
        return [self._recv(p, timeout, "ready") for p in self.pipes]

    def start_run(self, t_start: float, t0: float, t1: float) -> None:
        for p in self.pipes:
            p.send(("run", t_start, t0, t1))

    def results(self, timeout: float) -> dict[str, Any]:
        rs = [self._recv(p, timeout, "result") for p in self.pipes]
        roles: dict[str, dict[str, int]] = {}
        for r in rs:
            for role, v in r["roles"].items():
                acc = roles.setdefault(role, {})
                for k, x in v.items():
                    acc[k] = acc.get(k, 0) + x
        return {
            "roles": roles,
            "gen_cpu_s": sum(r["gen_cpu_s"] for r in rs),
            "lat_ns": sorted(x for r in rs for x in r["lat_ns"]),
            "errors": [e for r in rs for e in r["errors"]],
            "done_at": [t for r in rs for t in r["done_at"]],
        }

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError, EOFError, BrokenPipeError):
                pipe.send(("stop",))
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


BENCH_USER = "bench"


def acl_policy(n: int, queues: list[str]) -> str:
    """`n` ACL rules as a policy file: `bench` may declare, publish to and consume its `queues`;
    the others are rules of its role on other paths (a fifth of them denies) and other users'."""
    rules = [(f"user:{BENCH_USER}", q, "publish,subscribe,admin", "allow") for q in queues]
    i = 0
    while len(rules) < n:
        if i % 2:
            rules.append((f"user:device{i}", f"devices/device{i}/#", "publish", "allow"))
        else:
            effect = "deny" if i % 10 == 0 else "allow"
            rules.append(("role:user", f"telemetry/{i}/+/#", "publish,subscribe", effect))
        i += 1
    return policy_toml(rules[:n])


def provision(server: AmqpServer, args: argparse.Namespace) -> dict[str, Any]:
    """Create the `bench` user and the ACL rules through the admin API of a gateway started with
    `--auth`."""
    m = re.search(r"--http-port (\d+)", str(server.info.get("command", "")))
    if m is None:
        raise ServerError("no --http-port in the gateway's command line")
    base = f"http://127.0.0.1:{m.group(1)}"
    pw = args.admin_password
    body = json.dumps({"name": BENCH_USER, "password": args.bench_password, "role": "user"}).encode()
    admin_call(base, pw, "/admin/users", body, "application/json", timeout=30)
    queues = [f"amqpbench.q{i}" for i in range(args.publishers)] + ["amqpbench.lat"]
    t = time.monotonic()
    res = admin_call(
        base,
        pw,
        "/admin/acl/import?replace=false",
        acl_policy(args.acl_rules, queues).encode(),
        "application/toml",
        timeout=30,
    )
    return {"acl_rules": res["rules"], "provision_s": time.monotonic() - t}


class BrokerBench:
    def __init__(self, server: AmqpServer, args: argparse.Namespace, auth: bool = False) -> None:
        self.server = server
        self.args = args
        creds = {"user": BENCH_USER, "password": args.bench_password} if auth else {}
        self.base = Job(
            host="127.0.0.1",
            port=server.port,
            payload=args.payload,
            window=args.window,
            prefetch=args.prefetch,
            rate=args.latency_rate,
            cpus=args.gen_cpu_list,
            **creds,
        )
        self.kids = descendants(server.pid) if server.name == "gateway" else []

    def _check(self) -> None:
        if not self.server.alive():
            raise ServerError(f"{self.server.name} died:\n{self.server.log_tail()}")

    def _cpu(self, kids: list[int] | None = None) -> tuple[float, float]:
        return cpu_s(self.server.pid), tree_cpu_s(self.server.pid, self.kids if kids is None else kids)

    def _window(
        self, gen: Generator, warm: float, dur: float, kids: list[int] | None = None
    ) -> dict[str, Any]:
        """One run: load from t_start, measured window [t0, t1] after `warm` s; `kids`: the processes
        counted with the server in `server_tree_cpu_s` (default `self.kids`)."""
        a = self.args
        waited = wait_quiet(a.quiet_wait) if a.quiet_wait > 0 else 0.0
        if waited > 1:
            log(f"  waited {waited:.1f} s for other processes to leave the CPUs")
        la = loadavg()
        t_start = time.monotonic() + 0.05
        t0, t1 = t_start + warm, t_start + warm + dur
        gen.start_run(t_start, t0, t1)
        sleep_until(t0)
        c0, ct0 = self._cpu(kids)
        s0 = system_busy_s()
        ticks0 = cpu_ticks()
        sleep_until(t1)
        c1, ct1 = self._cpu(kids)
        s1 = system_busy_s()
        steal = steal_since(ticks0)
        res = gen.results(timeout=60)
        gen_cpu = res["gen_cpu_s"] * (dur / (warm + dur)) if warm + dur else 0.0
        res.update(
            {
                "duration_s": dur,
                "quiet_wait_s": waited,
                "loadavg_1m": la,
                "server_cpu_s": c1 - c0,
                "server_tree_cpu_s": ct1 - ct0,
                "server_util": (c1 - c0) / dur,
                "gen_util": gen_cpu / (dur * max(1, len(a.gen_cpu_list or [0]))),
                "other_util": max(0.0, (s1 - s0) - (ct1 - ct0) - gen_cpu) / dur,
                # share of all CPU time the hypervisor gave to other guests during the window
                "host_steal": steal,
            }
        )
        self._check()
        return res

    def confirms(self) -> dict[str, Any]:
        a = self.args
        specs = [Spec("pub", i, f"amqpbench.q{i}") for i in range(a.publishers)]
        gen = Generator(self.base, specs, a.procs)
        try:
            gen.ready()
            r = self._window(gen, a.warmup, a.duration)
        finally:
            gen.stop()
        c = r["roles"]["pub"]
        n = c["window"]
        return {
            "publishers": a.publishers,
            "window": a.window,
            "confirmed_in_window": n,
            "confirmed_total": c["final"],
            "nacks": c["nacks"],
            "confirms_msgs_per_s": n / r["duration_s"],
            "cpu_us_per_msg": r["server_cpu_s"] / n * 1e6 if n else None,
            "cpu_us_per_msg_incl_children": r["server_tree_cpu_s"] / n * 1e6 if n else None,
            **_details(r),
        }

    def consume(self) -> dict[str, Any]:
        a = self.args
        specs = [Spec("cons", i, f"amqpbench.q{i}") for i in range(a.publishers)]
        gen = Generator(self.base, specs, a.procs)
        try:
            backlog = sum(x["backlog"] for x in gen.ready())
            if a.quiet_wait > 0:
                wait_quiet(a.quiet_wait)
            la = loadavg()
            c0, ct0 = self._cpu()
            s0 = system_busy_s()
            t_start = time.monotonic() + 0.05
            gen.start_run(t_start, t_start, t_start + a.consume_max)
            res = gen.results(timeout=a.consume_max + 30)
            t_end = max(res["done_at"]) if res["done_at"] else time.monotonic()
            drain = wait_idle(self.server.pid, max_wait=10, interval=0.05)
            c1, ct1 = self._cpu()
            s1 = system_busy_s()
        finally:
            gen.stop()
        self._check()
        got = res["roles"]["cons"]["final"]
        dur = max(1e-6, t_end - t_start)
        wall = time.monotonic() - t_start
        return {
            "consumers": a.publishers,
            "prefetch": a.prefetch,
            "backlog": backlog,
            "consumed": got,
            "consume_s": dur,
            "consume_msgs_per_s": got / dur,
            "cpu_us_per_consumed_msg": (c1 - c0) / got * 1e6 if got else None,
            "cpu_us_per_consumed_msg_incl_children": (ct1 - ct0) / got * 1e6 if got else None,
            "server_util": (c1 - c0) / dur,
            "settle_s": drain,
            "loadavg_1m": la,
            "other_util": max(0.0, (s1 - s0) - (ct1 - ct0) - res["gen_cpu_s"]) / wall,
            "errors": res["errors"][:5],
        }

    def latency(self) -> dict[str, Any]:
        a = self.args
        specs = [Spec("latpub", 0, "amqpbench.lat"), Spec("latsub", 0, "amqpbench.lat")]
        gen = Generator(self.base, specs, a.procs, [0, 1 % max(1, a.procs)])
        try:
            gen.ready()
            r = self._window(gen, a.warmup, a.duration)
        finally:
            gen.stop()
        lat = r["lat_ns"]
        return {
            "rate": a.latency_rate,
            "samples": len(lat),
            "p50_ms": pct_ms(lat, 50),
            "p99_ms": pct_ms(lat, 99),
            "max_ms": lat[-1] / 1e6 if lat else None,
            **_details(r),
        }

    def fixed(self) -> dict[str, Any]:
        """Phase `fixed`: `--fixed-publishers` confirmed persistent publishers paced together at
        `--fixed-rate` msg/s with at most `--fixed-inflight` unconfirmed in total, and one consumer
        (manual ack) on the same queue. CPU per message counts the whole server process tree."""
        a = self.args
        n = max(1, min(a.fixed_publishers, a.fixed_inflight))
        q = "amqpbench.fixed"
        specs = [Spec("fixpub", i, q) for i in range(n)] + [Spec("latsub", 0, q)]
        base = replace(
            self.base, rate=a.fixed_rate / n, window=a.fixed_inflight // n, exclusive=a.fixed_exclusive
        )
        gen = Generator(base, specs, a.procs, [0] * n + [1 % max(1, a.procs)])
        # the gateway and its children (fsync helper, if any); beam.smp and its children (erl_child_setup...)
        kids = descendants(self.server.pid)
        try:
            gen.ready()
            r = self._window(gen, a.warmup, a.duration, kids=kids)
        finally:
            gen.stop()
        dur = r["duration_s"]
        pub, sub = r["roles"]["fixpub"], r["roles"]["latsub"]
        published, delivered = pub["window"], sub["window"]
        lat = r["lat_ns"]
        return {
            "rate_target": a.fixed_rate,
            "publishers": n,
            "queue": "exclusive" if a.fixed_exclusive else "durable",
            "inflight_max": base.window * n,
            "published": published,
            "delivered": delivered,
            "nacks": pub["nacks"],
            "behind": pub["behind"],
            "fixed_publish_msgs_per_s": published / dur,
            "fixed_delivered_msgs_per_s": delivered / dur,
            "kept_up": published >= 0.95 * a.fixed_rate * dur and delivered >= 0.95 * a.fixed_rate * dur,
            "cpu_us_per_fixed_msg": r["server_tree_cpu_s"] / published * 1e6 if published else None,
            "cpu_us_per_fixed_msg_main_process": r["server_cpu_s"] / published * 1e6 if published else None,
            "server_processes": 1 + len(kids),
            "latency_samples": len(lat),
            "fixed_p50_ms": pct_ms(lat, 50),
            "fixed_p99_ms": pct_ms(lat, 99),
            "fixed_max_ms": lat[-1] / 1e6 if lat else None,
            "host_steal": r["host_steal"],
            **_details(r),
        }


def _details(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("server_util", "gen_util", "other_util", "loadavg_1m", "quiet_wait_s")
    out = {k: r[k] for k in keys}
    s, g = r["server_util"], r["gen_util"]
    out["bottleneck"] = (
        ("server and generator" if g >= 0.85 else "server")
        if s >= 0.85
        else ("generator" if g >= 0.85 else "neither (latency-bound)")
    )
    out["errors"] = r["errors"][:5]
    return out


def run_broker(
    name: str, args: argparse.Namespace, *, auth: bool = False, phases: list[str] | None = None
) -> dict[str, Any]:
    """One broker started fresh, its `phases` (default `--phases`) measured; `auth`: our gateway with
    `--auth`, the `bench` user and the ACL rules."""
    work = Path(tempfile.mkdtemp(prefix=f"amqpbench-{name}-", dir=args.dir))
    out: dict[str, Any] = {"figures": dict.fromkeys(k for k, _, _ in FIGURES), "phases": {}}
    server: AmqpServer | None = None
    phase_list = args.phase_list if phases is None else phases
    try:
        if name == "gateway":
            server = start_gateway(
                work,
                "amqp",
                [*args.gateway_args, *(["--auth"] if auth else [])],
                cpu=args.server_cpu,
                src=args.gateway_src,
                profile=args.gateway_profile.resolve() if args.gateway_profile else None,
                ready=amqp_ready,  # and the AMQP port sends connection.start
                server_cls=AmqpServer,
                info_src=False,
            )
        else:
            server = start_rabbitmq(work, args.server_cpu)
        out["info"] = {**server.info, "data_fs": fs_type(work)}
        if auth:
            out["info"].update(provision(server, args))
        b = BrokerBench(server, args, auth)
        for phase, fn in (
            ("confirms", b.confirms),
            ("consume", b.consume),
            ("latency", b.latency),
            ("fixed", b.fixed),
        ):
            if phase not in phase_list:
                continue
            log(f"{name}: {phase} ...")
            try:
                res = fn()
                out["phases"][phase] = res
                for k in out["figures"]:
                    if k in res and res[k] is not None:
                        out["figures"][k] = res[k]
                log(
                    f"{name}: {phase}: "
                    + ", ".join(f"{k}={res[k]:.4g}" for k in out["figures"] if res.get(k) is not None)
                )
            except Exception as e:  # noqa: BLE001
                out["phases"][phase] = {"error": f"{type(e).__name__}: {e}"}
                log(f"{name}: {phase} failed: {e}\n{traceback.format_exc()}")
                if server is not None and not server.alive():
                    break
        if name == "rabbitmq":
            out["info"]["epmd_cpu_s"] = epmd_cpu_s(server)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"{name}: {out['error']}")
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return out


def ratio(ours: float | None, peer: float | None) -> float | None:
    if ours is None or peer is None or peer == 0:
        return None
    return ours / peer


def auth_rounds(args: argparse.Namespace, first_off: dict[str, Any] | None) -> dict[str, Any]:
    """Publisher confirms with auth on vs off, `--auth-rounds` alternating fresh gateways (round 1's
    auth-off run is `first_off`, the main run, when it measured phase 1)."""
    rounds = []
    for i in range(args.auth_rounds):
        off = first_off if i == 0 and first_off is not None else None
        on_first = off is None and i % 2 == 1  # alternate which runs first: no order bias

        def run_on(i: int = i) -> dict[str, Any]:
            log(f"gateway (auth on, {args.acl_rules} ACL rules, round {i + 1}) ...")
            return run_broker("gateway", args, auth=True, phases=["confirms"])

        on = run_on() if on_first else None
        if off is None:
            log(f"gateway (auth off, round {i + 1}) ...")
            off = run_broker("gateway", args, phases=["confirms"])
        if on is None:
            on = run_on()
        f_off, f_on = off["figures"], on["figures"]
        rounds.append(
            {
                "confirms_off": f_off["confirms_msgs_per_s"],
                "confirms_on": f_on["confirms_msgs_per_s"],
                "ratio": ratio(f_on["confirms_msgs_per_s"], f_off["confirms_msgs_per_s"]),
                "cpu_us_per_msg_off": f_off["cpu_us_per_msg"],
                "cpu_us_per_msg_on": f_on["cpu_us_per_msg"],
                "on": {k: on[k] for k in ("info", "phases", "error") if k in on},
            }
        )
    ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
    return {
        "confirms_auth_ratio": statistics.median(ratios) if ratios else None,
        "acl_rules": args.acl_rules,
        "rounds": rounds,
        "target": ">= 0.9",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--brokers", default=",".join(BROKERS))
    p.add_argument("--phases", default="confirms,consume,latency,fixed")
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--window", type=int, default=200)
    p.add_argument("--prefetch", type=int, default=100)
    p.add_argument("--payload", type=int, default=100)
    p.add_argument("--latency-rate", type=int, default=2000)
    p.add_argument("--fixed-rate", type=float, default=3000.0, help="paced msg/s of phase fixed (total)")
    p.add_argument("--fixed-publishers", type=int, default=4, help="confirmed publishers of phase fixed")
    p.add_argument("--fixed-inflight", type=int, default=100, help="unconfirmed messages at most, in total")
    p.add_argument(
        "--fixed-exclusive",
        action="store_true",
        help="phase fixed into an exclusive queue its consumer declares (default: a durable queue)",
    )
    p.add_argument("--consume-max", type=float, default=60.0)
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--gen-cpus", default="1")
    p.add_argument("--quiet-wait", type=float, default=10.0)
    p.add_argument("--dir", default=None, help="parent of the brokers' data directories")
    p.add_argument("--gateway-src", type=Path, default=None)
    p.add_argument("--gateway-arg", dest="gateway_args", action="append", default=[])
    p.add_argument(
        "--gateway-profile",
        type=Path,
        default=None,
        help="run the gateway under cProfile, stats written here",
    )
    p.add_argument("--auth-rounds", type=int, default=3, help="auth on/off rounds (0: none)")
    p.add_argument("--acl-rules", type=int, default=1000)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--quick", action="store_true", help="short runs (smoke test)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.quick:
        a.duration, a.warmup, a.quiet_wait, a.latency_rate, a.consume_max = 1.5, 0.3, 0.0, 500, 12.0
        a.auth_rounds = min(a.auth_rounds, 1)
    a.gen_cpu_list = [int(x) for x in a.gen_cpus.split(",") if x.strip()]
    a.phase_list = [x.strip() for x in a.phases.split(",") if x.strip()]
    ncpu = os.cpu_count() or 1
    if a.server_cpu >= ncpu or any(c >= ncpu for c in a.gen_cpu_list):
        a.server_cpu, a.gen_cpu_list = None, None
    if a.gen_cpu_list:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, set(a.gen_cpu_list))
    brokers = [b.strip() for b in a.brokers.split(",") if b.strip()]
    a.admin_password = secrets.token_urlsafe(16)  # the auth runs' first admin (bootstrap from env)
    a.bench_password = secrets.token_urlsafe(16)
    os.environ["GATEWAY_ADMIN_PASSWORD"] = a.admin_password
    results = {b: run_broker(b, a) for b in brokers}
    auth: dict[str, Any] = {"confirms_auth_ratio": None}
    if "gateway" in results and "confirms" in a.phase_list and a.auth_rounds > 0:
        auth = auth_rounds(a, results["gateway"] if not results["gateway"].get("error") else None)

    g = results.get("gateway", {}).get("figures", {})
    r = results.get("rabbitmq", {}).get("figures", {})
    ratios = {k: ratio(g.get(k), r.get(k)) for k, _, _ in FIGURES}
    doc = {
        "confirms_ratio_vs_rabbitmq": ratios["confirms_msgs_per_s"],
        "consume_ratio_vs_rabbitmq": ratios["consume_msgs_per_s"],
        "cpu_us_per_msg": g.get("cpu_us_per_msg"),
        "rabbitmq_cpu_us_per_msg": r.get("cpu_us_per_msg"),
        "cpu_ratio_vs_rabbitmq": ratios["cpu_us_per_msg"],
        # phase fixed: server process tree CPU per message, gateway / RabbitMQ (beam.smp and children)
        "cpu_ratio_vs_rabbitmq_at_3k": ratios["cpu_us_per_fixed_msg"],
        "fixed_cpu_us_per_msg": g.get("cpu_us_per_fixed_msg"),
        "rabbitmq_fixed_cpu_us_per_msg": r.get("cpu_us_per_fixed_msg"),
        "confirms_auth_ratio": auth["confirms_auth_ratio"],
        "auth": auth,
        "cpu_us_per_consumed_msg": g.get("cpu_us_per_consumed_msg"),
        "rabbitmq_cpu_us_per_consumed_msg": r.get("cpu_us_per_consumed_msg"),
        "p50_ms": g.get("p50_ms"),
        "p99_ms": g.get("p99_ms"),
        "rabbitmq_p50_ms": r.get("p50_ms"),
        "rabbitmq_p99_ms": r.get("p99_ms"),
        "targets": {
            "confirms_ratio_vs_rabbitmq": ">= 1.0",
            "cpu_ratio_vs_rabbitmq": "<= 1.0",
            "confirms_auth_ratio": ">= 0.9",
            "cpu_ratio_vs_rabbitmq_at_3k": "<= 0.5",
        },
        "ratios": ratios,
        "brokers": results,
        "config": {
            k: v
            for k, v in vars(a).items()
            if k not in ("gateway_src", "gateway_profile", "admin_password", "bench_password")
            and not callable(v)
        }
        | {"gateway_src": str(a.gateway_src) if a.gateway_src else None, "cpus": os.cpu_count()},
    }
    if a.json:
        print(json.dumps(doc, default=str))
        return 0
    names = [b for b in BROKERS if b in results]
    w = 36
    print(f"{'figure':<{w}}" + "".join(f"{n:>14}" for n in names) + f"{'gw/rabbit':>12}")
    for k, label, higher in FIGURES:
        row = f"{label:<{w}}"
        for n in names:
            v = results[n]["figures"].get(k)
            row += f"{v:>14.4g}" if v is not None else f"{'-':>14}"
        rv = ratios[k]
        row += (f"{rv:>10.2f}x" + ("↑" if higher else "↓")) if rv is not None else f"{'-':>12}"
        print(row)
    for n in names:
        if results[n].get("error"):
            print(f"{n}: {results[n]['error']}")
        for ph, res in results[n]["phases"].items():
            if "error" in res:
                print(f"{n} {ph}: {res['error']}")
            else:
                print(
                    f"{n} {ph}: server_util={res.get('server_util', 0):.2f} "
                    f"gen_util={res.get('gen_util', 0) or 0:.2f} other_util={res.get('other_util', 0):.2f} "
                    f"load={res.get('loadavg_1m')} {res.get('bottleneck', '')}"
                )
    car = auth["confirms_auth_ratio"]
    for i, r in enumerate(auth.get("rounds", ())):
        print(
            f"auth round {i + 1}: confirms off {r['confirms_off'] or 0:.4g} msg/s, on "
            f"{r['confirms_on'] or 0:.4g} msg/s ({a.acl_rules} ACL rules)"
        )
    print(
        f"confirms_auth_ratio (auth on / off, median): {car:.3f}"
        if car is not None
        else "confirms_auth_ratio: -"
    )
    print_fixed(results, doc["cpu_ratio_vs_rabbitmq_at_3k"])
    print("targets: confirms >= 1.0x RabbitMQ; server CPU per message <= RabbitMQ; auth on >= 0.9x off;")
    print(f"  fixed {a.fixed_rate:.0f} msg/s: server CPU per message <= 0.5x RabbitMQ")
    return 0


def print_fixed(results: dict[str, dict[str, Any]], cpu_ratio: float | None) -> None:
    """The fixed-rate phase's lines of the text output."""
    for n, res in results.items():
        d = res.get("phases", {}).get("fixed")
        if not d or "error" in d:
            continue
        print(
            f"{n} fixed {d['rate_target']:.0f} msg/s: confirmed {d['fixed_publish_msgs_per_s']:.0f}/s, "
            f"delivered {d['fixed_delivered_msgs_per_s']:.0f}/s, server CPU {fmt(d['cpu_us_per_fixed_msg'])} "
            f"µs/msg ({d['server_processes']} processes), p50 {fmt(d['fixed_p50_ms'])} ms, p99 "
            f"{fmt(d['fixed_p99_ms'])} ms, other {d['other_util']:.2f} CPUs, steal {d['host_steal']}"
        )
    print(f"cpu_ratio_vs_rabbitmq_at_3k: {fmt(cpu_ratio)} (target <= 0.5)")


if __name__ == "__main__":
    sys.exit(main())
