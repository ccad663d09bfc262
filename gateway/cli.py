"""Command line entry point: ``gateway start [--config FILE] [--data-dir DIR] [--host ADDR] [--flush P]``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from gateway.config import FLUSH_POLICIES, ConfigError, Settings, load

log = logging.getLogger("gateway")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gateway", description="Multi-protocol messaging gateway.")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="open the store and serve until SIGTERM/SIGINT")
    start.add_argument("--config", metavar="FILE", help="TOML settings file")
    start.add_argument("--data-dir", metavar="DIR", help="store directory (default ./data)")
    start.add_argument("--host", metavar="ADDR", help="address to listen on (default 127.0.0.1)")
    start.add_argument("--flush", choices=FLUSH_POLICIES, help="store flush policy (default sync)")
    return parser


def settings_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> Settings:
    overrides = {"data_dir": args.data_dir, "host": args.host, "flush": args.flush}
    return load(overrides, dict(os.environ) if env is None else env, args.config)


async def serve(settings: Settings) -> None:
    """Open the store, wait for SIGTERM/SIGINT, close the store."""
    from store import Store, StoreConfig  # imported late: the CLI must parse even if the store is broken

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    store = await Store.open(StoreConfig(data_dir=settings.data_dir, flush=settings.flush))
    try:
        log.info("store opened at %s (flush=%s)", settings.data_dir, settings.flush)
        await stop.wait()
        log.info("shutting down")
    finally:
        await store.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _loop_factory():
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.new_event_loop
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    if args.command == "start":
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
