"""`gateway bridge --config FILE [--metrics-port N] [--metrics-host ADDR] [--gateway-host ADDR]
[--gateway-mqtt-port N] [--gateway-amqp-port N] [--log-level L]`: run the `[[bridge]]` links of a
TOML file as a process of their own until SIGTERM/SIGINT (exit 0; 2 for a bad config).

`gateway:mqtt` / `gateway:amqp` endpoints mean `--gateway-host` (default 127.0.0.1) and the given
ports (default 1883 / 5672). `--metrics-port` serves `GET /metrics` (Prometheus text) and
`GET /bridges` (JSON, one object per link); it logs `bridge ready` once listening (0: ephemeral,
the chosen port is logged as `metrics on HOST:PORT`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import Any

from runtime import LOG_LEVELS, ConfigError, setup_logging
from runtime.settings import load_toml

from .config import BridgeConfig, parse_bridges, resolve
from .runner import Bridges

log = logging.getLogger("gateway.bridge")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bridge", help="run bridges to other MQTT / AMQP brokers (docs/bridges.md)")
    p.add_argument("--config", metavar="FILE", required=True, help="TOML file with [[bridge]] entries")
    p.add_argument("--metrics-port", type=int, metavar="N", help="serve /metrics and /bridges on this port")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="ADDR", help="address of --metrics-port")
    p.add_argument("--gateway-host", default="127.0.0.1", metavar="ADDR", help="host of gateway: endpoints")
    p.add_argument("--gateway-mqtt-port", type=int, default=1883, metavar="N", help="port of gateway:mqtt")
    p.add_argument("--gateway-amqp-port", type=int, default=5672, metavar="N", help="port of gateway:amqp")
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)


def load_file(path: str) -> tuple[BridgeConfig, ...]:
    """The `[[bridge]]` entries of a TOML file (other top-level keys are refused)."""
    data = load_toml(path)
    unknown = sorted(set(data) - {"bridge"})
    if unknown:
        raise ConfigError(f"unknown key(s) in {path}: {', '.join(unknown)} (only [[bridge]] entries)")
    bridges = parse_bridges(data.get("bridge"))
    if not bridges:
        raise ConfigError(f"{path} has no [[bridge]] entry")
    return bridges


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    try:
        ports = {"mqtt": args.gateway_mqtt_port, "amqp": args.gateway_amqp_port}
        configs = [resolve(c, args.gateway_host, ports) for c in load_file(args.config)]
    except ConfigError as e:
        print(f"gateway bridge: {e}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(configs, args.metrics_host, args.metrics_port))


async def _serve(configs: list[BridgeConfig], host: str, port: int | None) -> int:
    bridges = Bridges(configs)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = None
    if port is not None:
        server = await asyncio.start_server(lambda r, w: _http(bridges, r, w), host, port)
        bound = server.sockets[0].getsockname()
        log.info("metrics on %s:%d", bound[0], bound[1])
    bridges.start()
    log.info("bridge ready: %d link(s)", len(bridges.links))
    await stop.wait()
    if server is not None:
        server.close()
    await bridges.stop()
    log.info("bridge stopped")
    return 0


async def _http(bridges: Bridges, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A minimal HTTP/1.0 answer: GET /metrics, GET /bridges; anything else 404."""
    try:
        line = (await asyncio.wait_for(reader.readline(), 5)).decode("latin-1").split()
        while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
            pass
        path = line[1].split("?", 1)[0] if len(line) >= 2 and line[0] == "GET" else ""
        if path == "/metrics":
            status, ctype, body = (
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                bridges.metrics().encode(),
            )
        elif path == "/bridges":
            status, ctype, body = "200 OK", "application/json", json.dumps(bridges.snapshot()).encode()
        else:
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
        head = f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
        head += "Connection: close\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
    except (OSError, TimeoutError, UnicodeError):
        pass
    finally:
        writer.close()
