"""`gateway namesrv [--config FILE] [--host ADDR] [--port N] [--lease-period-s S]
[--lease-expiry-s S] [--scan-interval-s S] [--cluster-secret-file FILE] [--tls-cert PEM]
[--tls-key PEM] [--tls-client-ca PEM] [--tls-require-client-cert] [--event-loop L]
[--log-level L]`: a standalone name server, serving until SIGTERM/SIGINT (exit 0; 1 if the port
cannot be bound; 2 for bad settings, an unusable cluster secret file or TLS file among them)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Coroutine
from typing import Any

from runtime import ConfigError
from runtime.settings import SHARED_FLAGS, Process, add_flags, serve

from .config import load

_FLAGS: dict[str, dict[str, Any]] = {
    "host": {"metavar": "ADDR", "help": "address to bind (default 127.0.0.1)"},
    "port": {"type": int, "metavar": "N", "help": "port (default 9876; 0 = ephemeral)"},
    "lease_period_s": {"type": float, "metavar": "S", "help": "registrants renew every S s (default 30)"},
    "lease_expiry_s": {
        "type": float,
        "metavar": "S",
        "help": "drop registrations idle for S s (default 120)",
    },
    "scan_interval_s": {"type": float, "metavar": "S", "help": "check leases every S s (default 5)"},
    "cluster_secret_file": {
        "metavar": "FILE",
        "help": "every connection must prove this secret first (docs/security.md, 'Closed cluster')",
    },
    "tls_cert": {"metavar": "PEM", "help": "PEM certificate chain: the port serves TLS only"},
    "tls_key": SHARED_FLAGS["tls_key"],
    "tls_client_ca": SHARED_FLAGS["tls_client_ca"],
    "tls_require_client_cert": {
        "action": argparse.BooleanOptionalAction,
        "help": "refuse a TLS handshake without a certificate signed by --tls-client-ca",
    },
    "event_loop": SHARED_FLAGS["event_loop"],
    "log_level": SHARED_FLAGS["log_level"],
}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("namesrv", help="run a standalone RocketMQ-compatible name server")
    p.add_argument("--config", metavar="FILE", help="TOML settings file (keys at top level or in [namesrv])")
    add_flags(p, ((field, field, opts) for field, opts in _FLAGS.items()))
    return p


def run(args: argparse.Namespace, env: dict[str, str] | None = None) -> int:
    def prepare() -> Process:
        s = load(
            {f: getattr(args, f, None) for f in _FLAGS}, dict(os.environ) if env is None else env, args.config
        )
        auth = None
        if s.cluster_secret_file is not None:
            from remoting.cluster_auth import ClusterAuth, ClusterSecretError

            try:
                auth = ClusterAuth.from_file(s.cluster_secret_file)
            except ClusterSecretError as e:
                raise ConfigError(str(e)) from None
        tls = None
        if s.tls_cert is not None:
            from runtime.tls import ServerTls, TlsError, TlsFiles

            files = TlsFiles(s.tls_cert, s.tls_key, s.tls_client_ca, s.tls_require_client_cert)
            try:
                tls = ServerTls(files, logging.getLogger("namesrv.tls")).context()
            except TlsError as e:
                raise ConfigError(str(e)) from None

        def main() -> Coroutine[Any, Any, int]:
            from .server import serve as serve_namesrv

            return serve_namesrv(s, auth, tls)

        return Process(s.log_level, s.event_loop, main)

    return serve(prepare, logging.getLogger("namesrv"))
