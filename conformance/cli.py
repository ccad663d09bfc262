"""python -m conformance --target HOST [--grpc-port 8081] [--http-port 8082] [--mqtt-port 1883]
[--amqp-port 5672]
[--protocol grpc,mqtt,http] [--client python,node,paho,mqttjs,mosquitto,cloudevents] [--scenario NAME,...]
[--jobs N] [--json]"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from conformance.runner import CLIENTS, Result, Target, format_table, registry, run_all


def _csv(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m conformance",
        description="Run conformance scenarios with real third-party clients against a live gateway.",
    )
    p.add_argument("--target", default="127.0.0.1", help="gateway host (default 127.0.0.1)")
    p.add_argument("--grpc-port", type=int, default=8081)
    p.add_argument(
        "--http-port",
        type=int,
        default=8082,
        help="HTTP port: the admin API (topics/groups are created there) and the CloudEvents routes",
    )
    p.add_argument("--mqtt-port", type=int, default=1883)
    p.add_argument("--amqp-port", type=int, default=5672)
    p.add_argument("--protocol", type=_csv, default=None, help="comma list (default: all registered)")
    p.add_argument(
        "--client",
        type=_csv,
        default=None,
        help=f"comma list of {','.join(CLIENTS)} (default: all; a protocol's scenarios run with "
        "the clients that have scripts for them)",
    )
    p.add_argument("--scenario", type=_csv, default=None, help="comma list of scenario names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="scenario processes run at once (default 1)")
    p.add_argument("--log-dir", default=None, help="where client logs/stdout/stderr go (default: a temp dir)")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object with all results instead of a table",
    )
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument(
        "--spawn",
        action="store_true",
        help="start a local gateway (.venv's `gateway start`, temp data dir, ephemeral ports, "
        "2 s transaction timeout) for this run instead of using --target",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reg = registry()
    protocols = args.protocol or list(reg)
    clients = args.client or list(CLIENTS)
    for proto in protocols:
        if proto not in reg:
            print(f"unknown protocol {proto!r}; known: {', '.join(reg)}", file=sys.stderr)
            return 2
    for c in clients:
        if c not in CLIENTS:
            print(f"unknown client {c!r}; known: {', '.join(CLIENTS)}", file=sys.stderr)
            return 2
    known = {s for proto in protocols for s in reg[proto]}
    for s in args.scenario or []:
        if s not in known:
            print(f"unknown scenario {s!r}; known: {', '.join(sorted(known))}", file=sys.stderr)
            return 2
    if args.list:
        for proto in protocols:
            for spec in reg[proto].values():
                print(f"{proto:5} {spec.name:20} [{','.join(spec.clients)}] {spec.summary}")
        print()
        for c in CLIENTS.values():
            print(f"client {c.name:10} {c.description}")
        return 0

    spawned = None
    if args.spawn:
        from conformance.gateway_proc import GatewayProcess

        spawned = GatewayProcess(Path(tempfile.mkdtemp(prefix="conformance-gw-")) / "data")
        target = spawned.start()
        print(
            f"spawned gateway: grpc {target.grpc_endpoint}, mqtt {target.mqtt_endpoint}, "
            f"http {target.http_port}, amqp {target.amqp_port}, log {spawned.log_path}",
            file=sys.stderr,
        )
    else:
        target = Target(args.target, args.grpc_port, args.http_port, args.mqtt_port, args.amqp_port)
    try:
        return _run(args, target, protocols, clients)
    finally:
        if spawned:
            spawned.stop()


def _run(args, target: Target, protocols: list[str], clients: list[str]) -> int:
    admin = target.admin()
    if not admin.healthy():
        print(f"warning: {admin.base}/healthz does not answer 200", file=sys.stderr)

    def progress(r: Result) -> None:
        if not args.json:
            print(
                f"{r.status:4} {r.protocol}/{r.scenario}/{r.client} ({r.elapsed:.1f}s)"
                + (f": {r.reason}" if r.status == "FAIL" else ""),
                file=sys.stderr,
                flush=True,
            )

    results = run_all(
        target,
        protocols,
        clients,
        scenarios=args.scenario,
        jobs=args.jobs,
        log_dir=args.log_dir,
        on_result=progress,
    )
    if not results:
        print(
            "no (scenario, client) pair to run: no chosen client has a script for the chosen scenarios",
            file=sys.stderr,
        )
        return 2
    failed = [r for r in results if r.status == "FAIL"]
    if args.json:
        print(
            json.dumps(
                {
                    "target": target.grpc_endpoint,
                    "mqtt": target.mqtt_endpoint,
                    "passed": not failed,
                    "results": [r.to_json() for r in results],
                },
                indent=None,
            )
        )
    else:
        print(format_table(results, clients))
    return 1 if failed else 0
