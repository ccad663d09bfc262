"""IoT scale bench (issue 48): many devices, each with its own connection, subscription and
session, on our gateway and on Mosquitto in the same run, with the same generator.

    .venv/bin/python bench/scale_bench.py [--servers gateway,mosquitto] [--phases P,...]
        [--conns N] [--persistent-share F] [--sessions S] [--queues Q] [--retained R]
        [--telemetry-rate R] [--gateway-src DIR] [--gateway-arg ARG ...] [--gen-procs N]
        [--quick] [--json]

The generator is this process (bench/scale_client.py: raw asyncio MQTT 3.1.1 clients on uvloop
with pre-encoded packets, sockets bound to loopback source addresses 127.0.0.2 ... 127.0.0.9),
pinned to `--gen-cpu` (1); each server is pinned to `--server-cpu` (0), started fresh on
loopback with its defaults (bench/common.py start_gateway, bench/mqtt_servers.py start_mosquitto:
no persistence, no queue limits). This process raises its RLIMIT_NOFILE soft limit to the hard
limit and servers are spawned with it; `--conns` is capped below that limit (the output says so).

`--gen-procs N` (1) spreads the idle fleet over N generator processes (bench/scale_gen.py: child k
holds the devices i = k mod N, from its own source addresses 127.0.0.(2+8k) ... (9+8k), and
reports to this process), so that `--conns` may reach N times the descriptor limit (a one-process
server still holds at most the limit: run Mosquitto with fewer). With N > 1 only the phases
`idle`, `commands` (deliveries collected from the children), `retained`, `persistent` and
`amqp_queues` run. `--gateway-arg=--workers=4` starts the gateway with four workers; the server's
CPU and memory are then those of its whole process tree (supervisor with the store, workers).

Phases (`--phases`, all by default), in this order, on one server each group:

- `idle`: `--conns` (18,000) devices `dev-<i>` connect (keep-alive 600 s, at most
  `--concurrency` handshakes at once; a `--persistent-share` (0.5) of them with clean session 0),
  then each subscribes (QoS 1) to `dev/<i>/cmd`. `connects_per_s` = N / time to all CONNACKs;
  `idle_conn_rss_kib` = VmRSS growth of the server process / N once it is idle (RssAnon growth
  beside it); `idle_tree_rss_kib` (`_anon_kib`) the same summed over its whole process tree (with
  `--workers`: supervisor, workers; `idle_tree_rss_mib` after, `idle_tree_procs`);
  `idle_store_rss_mib_before` / `_after`: the server process's own VmRSS before and after the
  connections (with `--workers` the supervisor, which holds the store); `idle_worker_conns`: each
  descendant's growth in open descriptors (a worker's connections), `idle_worker_rss_mib` their
  VmRSS after; `idle_connected_tree_rss_kib` and `idle_connected_store_rss_mib`: the same once
  connected, before subscribing; `idle_gen_procs`: `--gen-procs`.
- `commands`: QoS 1 commands from one publisher to `--commands` (1,000) random connected devices,
  one each, paced at `--command-rate` (500/s): `commands_delivered`, p50/p99 publish-to-delivery.
- `retained`: `--retained` (10,000) retained QoS 1 messages to `dev/<i>/state` (at most 500
  unacked; `retained_store_s`; a server that has not stored them all after `--retained-max-s`
  (120) s gets no more: `retained_messages` is what it stored), then a new `dev/+/state`
  subscriber: `retained_replay_s` from its SUBSCRIBE to the last distinct retained message.
- `reconnect`: every persistent-session device DISCONNECTs; once the server is idle all
  reconnect (clean session 0) as fast as they can: `reconnects_per_s`, and how many CONNACKs said
  session present (`reconnect_session_present`); then commands to 100 resumed devices arrive
  through their kept subscriptions (`resumed_commands_*`).
- `telemetry` (last of its group, so that a server left behind disturbs no other phase): the
  first 1,000 devices publish QoS 1 to `dev/<j>/telemetry`, `--telemetry-rate` (5,000) msg/s in
  all (`--warmup` s, then `--duration` s measured); one `dev/+/telemetry` subscriber: server CPU
  over the window (utime+stime of the server and its children) per message it acknowledged in
  the window, PUBACKs per second in the window, publish-to-delivery p50/p99. When more than
  `--max-behind-s` (1) seconds of the rate are unacknowledged, sends are held back and counted
  (`telemetry_held_back`: the server did not keep up); then at most `--drain-max` (30) s for the
  rest: every message delivered once and acked (`_drained`, `_undelivered`, `_duplicates`,
  `_unacked`).
- `devices` (last of its group): the everyday IoT load, `--devices` (10,000) of the connected
  devices each publish one QoS 1 message a second (`--device-rate`) to `dev/<i>/telemetry`, in
  turn, so that every message travels alone on its connection; one `dev/+/telemetry` subscriber;
  figures as in `telemetry` (`devices_cpu_us_per_msg`, `_acks_per_s`, `_p50_ms`, `_p99_ms`, ...),
  and `devices_cpu_ratio_vs_mosquitto` (gateway / Mosquitto CPU per message, same run).
- `persistent` (a fresh server): `--sessions` (1,000) connected devices with persistent sessions,
  each subscribed to `dev/<i>/cmd` (`persistent_session_rss_kib`), while
  `--persistent-publishers` (100) other devices publish telemetry at `--persistent-rate` (500)
  msg/s: `persistent_cpu_us_per_msg`, `_acks_per_s`, `_p99_ms`, as in `telemetry`, and the
  server's memory after it (`persistent_rss_mib_after`, `persistent_rss_anon_mib_after`).
- `amqp_queues` (the gateway; RabbitMQ too when installed, under "rabbitmq", except with
  `--quick`): bench/scale_amqp.py.

Every phase also reports `<phase>_other_util` (CPUs used by everything but the server and this
generator over the phase's window: other jobs on a shared machine) and `<phase>_host_steal`
(share of CPU time the hypervisor gave to other guests). `--json` prints one object: "gateway"
and "mosquitto" (one flat dict each), top-level `<key>_ratio` (gateway / Mosquitto) for the
main figures, and "config" (sizes, descriptor limit, load average). Exits non-zero if a server
fails; losses and duplicates are reported as counts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop
from common import REPO, Server, ServerError, fmt, log, start_gateway
from mqtt_servers import start_mosquitto
from scale_amqp import amqp_queues
from scale_gen import MAX_PROCS
from scale_phases import Run

PHASES = ("idle", "commands", "telemetry", "retained", "reconnect", "devices", "persistent", "amqp_queues")
FLEET_PHASES = ("idle", "commands", "telemetry", "reconnect", "devices")
LOCAL_FLEET_PHASES = ("telemetry", "reconnect", "devices")  # need the fleet in this process
KEYS = (
    "idle_conn_rss_kib",
    "idle_tree_rss_kib",
    "connects_per_s",
    "reconnects_per_s",
    "commands_p99_ms",
    "commands_delivered",
    "telemetry_cpu_us_per_msg",
    "telemetry_acks_per_s",
    "telemetry_p99_ms",
    "devices_cpu_us_per_msg",
    "devices_acks_per_s",
    "devices_p99_ms",
    "retained_replay_s",
    "persistent_cpu_us_per_msg",
    "persistent_acks_per_s",
    "persistent_p99_ms",
    "amqp_declare_first_s_per_1k",
    "amqp_declare_last_s_per_1k",
    "amqp_restart_s",
)
RESERVE_FDS = 1000  # descriptors a server and this process need besides the connections


def raise_nofile() -> int:
    """Soft RLIMIT_NOFILE to the hard limit; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def git_head() -> str:
    """The repository's commit (+ "dirty" with uncommitted changes): what the gateway ran."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "src"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return sha + (" + uncommitted changes in src/" if dirty else "")


def start_server(name: str, work: Path, args: argparse.Namespace) -> Server:
    if name == "gateway":
        return start_gateway(work, "mqtt", args.gateway_args, cpu=args.server_cpu, src=args.gateway_src)
    if name == "mosquitto":
        return start_mosquitto(work, args.server_cpu)
    raise ServerError(f"unknown server {name}")


async def fleet_group(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    """idle, commands, telemetry, retained, reconnect on one server (those selected)."""
    run = Run(server, args)
    out: dict[str, Any] = {}
    try:
        if any(p in args.phase_list for p in FLEET_PHASES):
            out.update(await run.idle(report="idle" in args.phase_list))
        if "commands" in args.phase_list:
            out.update(await run.commands())
        if "retained" in args.phase_list:
            out.update(await run.retained())
        if "reconnect" in args.phase_list:
            out.update(await run.reconnect())
        if "telemetry" in args.phase_list:  # late: a server that fell behind disturbs no other phase
            pubs = run.fleet[: min(args.telemetry_devices, len(run.fleet))]
            out.update(await run.telemetry("telemetry", pubs, args.telemetry_rate))
        if "devices" in args.phase_list:  # every device once a second: each message alone
            pubs = run.fleet[: min(args.devices, len(run.fleet))]
            out.update(await run.telemetry("devices", pubs, len(pubs) * args.device_rate))
        run.check()
    except (ConnectionError, TimeoutError):
        log(f"[{server.name}] the end of its log:\n{server.log_tail(30)}")
        raise
    finally:
        await run.close()
    return out


async def persistent_group(server: Server, args: argparse.Namespace) -> dict[str, Any]:
    run = Run(server, args)
    try:
        out = await run.persistent()
        run.check()
        return out
    finally:
        await run.close()


def bench_server(name: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    groups = []
    if any(p in args.phase_list for p in (*FLEET_PHASES, "retained")):
        groups.append(fleet_group)
    if "persistent" in args.phase_list:
        groups.append(persistent_group)
    for group in groups:
        work = Path(tempfile.mkdtemp(prefix=f"scale-bench-{name}-"))
        server: Server | None = None
        try:
            server = start_server(name, work, args)
            gw = f"gateway from {args.gateway_src}" if args.gateway_src else f"gateway {git_head()}"
            out.setdefault("version", server.info.get("version") or gw)
            log(f"[{name}] {group.__name__} (pid {server.pid})")
            out.update(uvloop.run(group(server, args)))
        finally:
            if server is not None:
                server.stop(60)  # a gateway's workers detach their many sessions first
            shutil.rmtree(work, ignore_errors=True)
    if "amqp_queues" in args.phase_list and name == "gateway":
        work = Path(tempfile.mkdtemp(prefix="scale-bench-amqp-"))
        try:
            log(f"[{name}] amqp_queues ({args.queues} queues)")
            out.update(amqp_queues(name, work, args))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default="gateway,mosquitto")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--conns", type=int, default=18_000, help="idle devices per server (18,000)")
    ap.add_argument("--persistent-share", type=float, default=0.5)
    # Mosquitto listens with a backlog of 100: more handshakes at once drop SYNs (1 s retries)
    ap.add_argument("--concurrency", type=int, default=64, help="handshakes in flight at once (64)")
    ap.add_argument("--commands", type=int, default=1000)
    ap.add_argument("--command-rate", type=float, default=500.0)
    ap.add_argument("--telemetry-devices", type=int, default=1000)
    ap.add_argument("--telemetry-rate", type=float, default=5000.0)
    ap.add_argument("--devices", type=int, default=10_000, help="devices of phase devices (10,000)")
    ap.add_argument("--device-rate", type=float, default=1.0, help="phase devices: msg/s of each device (1)")
    ap.add_argument("--retained", type=int, default=10_000)
    ap.add_argument(
        "--retained-max-s",
        type=float,
        default=120.0,
        help="stop storing retained messages after this (120 s)",
    )
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--persistent-publishers", type=int, default=100)
    ap.add_argument("--persistent-rate", type=float, default=500.0)
    ap.add_argument("--queues", type=int, default=10_000)
    ap.add_argument("--payload", type=int, default=64, help="payload bytes (at least 16)")
    ap.add_argument(
        "--max-behind-s",
        type=float,
        default=1.0,
        help="telemetry: unacked messages allowed, in seconds of the rate; beyond, sends are held back",
    )
    ap.add_argument("--drain-max", type=float, default=30.0, help="telemetry: wait for the rest (30 s)")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--server-cpu", type=int, default=0)
    ap.add_argument("--gen-cpu", type=int, default=1)
    ap.add_argument("--gateway-arg", action="append", default=[], help="one more `gateway start` argument")
    ap.add_argument("--gateway-src", type=Path, default=None, help="run the gateway from this source tree")
    ap.add_argument("--seed", type=int, default=48)
    ap.add_argument(
        "--gen-procs",
        type=int,
        default=1,
        help=f"idle fleet in this many generator processes (1 ... {MAX_PROCS}; 1: this one)",
    )
    ap.add_argument("--quick", action="store_true", help="a small, short run (the smoke test; no RabbitMQ)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.conns, args.commands, args.command_rate = min(args.conns, 300), 100, 1000.0
        args.telemetry_devices, args.telemetry_rate, args.retained = 100, 500.0, 300
        args.sessions, args.persistent_publishers, args.persistent_rate = 100, 20, 200.0
        args.queues, args.warmup, args.duration = min(args.queues, 200), 0.3, 1.0
        args.drain_max = min(args.drain_max, 10.0)
    args.payload = max(args.payload, 16)
    args.gateway_args = list(args.gateway_arg)
    args.server_list = [s for s in args.servers.split(",") if s]
    args.phase_list = [p for p in args.phases.split(",") if p]
    bad = set(args.phase_list) - set(PHASES)
    if bad:
        ap.error(f"unknown phases {sorted(bad)} (known: {', '.join(PHASES)})")
    if not 1 <= args.gen_procs <= MAX_PROCS:
        ap.error(f"--gen-procs: 1 ... {MAX_PROCS}")
    if args.gen_procs > 1 and (local := [p for p in args.phase_list if p in LOCAL_FLEET_PHASES]):
        ap.error(f"--gen-procs > 1 runs no {', '.join(local)} (the fleet is in other processes)")
    online = sorted(os.sched_getaffinity(0))
    if len(online) < 2 or args.server_cpu not in online or args.gen_cpu not in online:
        log(f"cannot pin server/generator to CPUs {args.server_cpu}/{args.gen_cpu} (online {online})")
        args.server_cpu = None
    else:
        os.sched_setaffinity(0, {args.gen_cpu})
    return args


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


LOADAVG_BEFORE = loadavg()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nofile = raise_nofile()
    cap = max(nofile - RESERVE_FDS, 1)
    capped = None
    for attr, most in (("conns", cap * args.gen_procs), ("sessions", cap)):
        if getattr(args, attr) > most:
            capped = capped or {}
            capped[attr] = getattr(args, attr)
            setattr(args, attr, most)
    note = f"RLIMIT_NOFILE {nofile} (servers get it too): at most {cap} connections per server process"
    if args.gen_procs > 1:
        note += f", {cap} per generator process ({args.gen_procs}: --conns at most {cap * args.gen_procs})"
    if capped:
        note += f"; capped {capped} to {cap}"
    log(note)
    t = time.monotonic()
    report: dict[str, Any] = {}
    for name in args.server_list:
        try:
            report[name] = bench_server(name, args)
        except ServerError as e:
            log(f"[{name}] failed: {e}")
            return 1
    if "amqp_queues" in args.phase_list and "gateway" in args.server_list and not args.quick:
        with contextlib.suppress(Exception):
            work = Path(tempfile.mkdtemp(prefix="scale-bench-rabbitmq-"))
            try:
                rmq = amqp_queues("rabbitmq", work, args)
                if rmq:
                    report["rabbitmq"] = rmq
            finally:
                shutil.rmtree(work, ignore_errors=True)
    g, m = report.get("gateway", {}), report.get("mosquitto", {})
    for k in KEYS:
        a, b = g.get(k), m.get(k)
        report[f"{k}_ratio"] = round(a / b, 3) if a is not None and b else None
    report["devices_cpu_ratio_vs_mosquitto"] = report["devices_cpu_us_per_msg_ratio"]  # (issue 49's name)
    report["config"] = {
        "conns": args.conns,
        "sessions": args.sessions,
        "queues": args.queues,
        "persistent_share": args.persistent_share,
        "gen_procs": args.gen_procs,
        "gateway_args": args.gateway_args,
        "loadavg_before": LOADAVG_BEFORE,
        "nofile_limit": nofile,
        "capped": capped,
        "quick": args.quick,
        "loadavg_after": loadavg(),
        "elapsed_s": round(time.monotonic() - t, 1),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report, args.server_list)
    return 0


def print_table(report: dict[str, Any], servers: list[str]) -> None:
    keys = sorted({k for s in servers for k in report.get(s, {}) if k != "version"})
    print(f"{'figure':40} " + " ".join(f"{s:>14}" for s in servers))
    for k in keys:
        print(f"{k:40} " + " ".join(f"{fmt(report[s].get(k)):>14}" for s in servers))
    for k in KEYS:
        if report.get(f"{k}_ratio") is not None:
            print(f"{k}_ratio (gateway / mosquitto): {report[f'{k}_ratio']}")
    print(f"config: {report['config']}")


if __name__ == "__main__":
    sys.exit(main())
