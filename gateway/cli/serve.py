"""`gateway start` (a gateway: LOCAL, CLUSTER proxy or `--workers N`) and `gateway store` (a
CLUSTER mode store node), both serving until SIGTERM/SIGINT; exit 2 for bad settings."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Coroutine
from typing import Any

from gateway.config import Settings, check_exposure, load
from runtime import ConfigError
from runtime.settings import Process, add_flags, serve

from .command import CommandGroup, Parents, SubParsers
from .flags import START_FLAGS, STORE_FLAGS

log = logging.getLogger("gateway")


def add_start_parser(sub: SubParsers, _parents: Parents) -> None:
    start = sub.add_parser("start", help="open the store and serve until SIGTERM/SIGINT")
    start.add_argument("--config", metavar="FILE", help="TOML settings file")
    add_flags(start, ((field, field, opts) for field, opts in START_FLAGS.items()))
    # set by the supervisor of `--workers N` for each worker it starts (gateway/workers)
    start.add_argument("--worker-of", metavar="DIR", help=argparse.SUPPRESS)
    start.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)


def add_store_parser(sub: SubParsers, _parents: Parents) -> None:
    store = sub.add_parser("store", help="run a CLUSTER mode store node until SIGTERM/SIGINT")
    store.add_argument("--config", metavar="FILE", help="TOML settings file")
    add_flags(store, ((flag, field, opts) for flag, (field, opts) in STORE_FLAGS.items()))


def settings_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> Settings:
    fields = [f for f, _ in STORE_FLAGS.values()] if args.command == "store" else list(START_FLAGS)
    overrides = {field: getattr(args, field, None) for field in fields}
    return load(overrides, dict(os.environ) if env is None else env, args.config)


def _check_cluster_secret(settings: Settings) -> None:
    """ConfigError (exit 2) when `cluster_secret_file` is set but unusable (remoting/cluster_auth.py)."""
    if settings.cluster_secret_file is None:
        return
    from remoting.cluster_auth import ClusterSecretError, read_secret

    try:
        read_secret(settings.cluster_secret_file)
    except ClusterSecretError as e:
        raise ConfigError(str(e)) from None


def start(args: argparse.Namespace) -> int:
    def prepare() -> Process:
        settings = settings_from_args(args)
        check_exposure(settings)
        _check_cluster_secret(settings)
        tag = f"worker-{args.worker_index}" if args.worker_of else None
        return Process(settings.log_level, settings.event_loop, lambda: _gateway(args, settings), tag)

    # grpc.aio runs on uvloop (checked with grpcio 1.85: unary, bidi streaming, graceful stop);
    # `--event-loop asyncio` is the fallback should an adapter misbehave on it.
    return serve(prepare, log)


def _gateway(args: argparse.Namespace, settings: Settings) -> Coroutine[Any, Any, int]:
    """`gateway start`'s coroutine: a worker of `--workers N`, their supervisor, or the gateway."""
    if settings.log_level != "debug":
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    from gateway.server import run  # imported late: `gateway --help` must work even if a module is broken

    if args.worker_of:
        from gateway.workers import WorkerLink

        return run(settings, worker=WorkerLink(args.worker_of, args.worker_index))
    if settings.workers > 1:
        from gateway.workers import supervise

        return supervise(settings, args.argv)
    return run(settings)


def store(args: argparse.Namespace) -> int:
    def prepare() -> Process:
        settings = settings_from_args(args)
        _check_cluster_secret(settings)
        return Process(settings.log_level, settings.event_loop, lambda: _store_node(settings))

    return serve(prepare, log)


def _store_node(settings: Settings) -> Coroutine[Any, Any, int]:
    from gateway.store_process import serve as serve_store

    return serve_store(settings)


START = CommandGroup(add_start_parser, start)
STORE = CommandGroup(add_store_parser, store)
