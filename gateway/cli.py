"""Command line entry point.

``gateway start [--config FILE] [--data-dir DIR] [--host ADDR] [--grpc-port N] ... [--flush P]``
serves until SIGTERM/SIGINT (``--mode cluster --namesrv H:P``: as a stateless proxy over store
nodes). ``gateway store --name NAME --data-dir DIR --port N --namesrv H:P`` runs a CLUSTER mode
store node (docs/cluster.md). ``gateway topic|group|client|user|token|acl ...`` talk to a
running gateway's HTTP admin API (``--url``, default ``$GATEWAY_URL`` or http://127.0.0.1:8082;
credentials as CREDENTIALS_HELP says)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gateway.config import (
    FLUSH_POLICIES,
    MODES,
    MQTT_QUEUE_FULL_POLICIES,
    Settings,
    check_exposure,
    load,
    parse_protocols,
)
from runtime import EVENT_LOOPS, LOG_LEVELS, ConfigError, loop_factory, setup_logging

log = logging.getLogger("gateway")

# Settings fields that `gateway start` takes as flags (all of them), with argparse types.
_START_FLAGS: dict[str, dict[str, Any]] = {
    "data_dir": {"metavar": "DIR", "help": "store directory (default ./data)"},
    "host": {"metavar": "ADDR", "help": "address every listener binds (default 127.0.0.1)"},
    "flush": {"choices": FLUSH_POLICIES, "help": "store flush policy (default sync)"},
    "grpc_port": {"type": int, "metavar": "N", "help": "RocketMQ 5 gRPC port (default 8081; 0 = ephemeral)"},
    "remoting_port": {"type": int, "metavar": "N", "help": "RocketMQ 4.x remoting port (default 8080)"},
    "http_port": {"type": int, "metavar": "N", "help": "HTTP port: health, metrics, admin (default 8082)"},
    "mqtt_port": {"type": int, "metavar": "N", "help": "MQTT port (default 1883)"},
    "amqp_port": {"type": int, "metavar": "N", "help": "AMQP 0-9-1 port (default 5672)"},
    "protocols": {
        "type": parse_protocols,
        "metavar": "LIST",
        "help": "comma list of listeners to enable (default grpc,remoting,mqtt,amqp,http)",
    },
    "advertise_host": {"metavar": "ADDR", "help": "host clients are told to connect to (default: --host)"},
    "auto_create_topics": {
        "action": argparse.BooleanOptionalAction,
        "help": "create unknown topics on first send (default off)",
    },
    "max_body_size": {"type": int, "metavar": "BYTES", "help": "largest message body (default 4 MiB)"},
    "default_queues": {"type": int, "metavar": "N", "help": "queues of a new topic (default 8)"},
    "segment_size_mib": {
        "type": int,
        "metavar": "MIB",
        "help": "commit log segment size (default 128; grown to hold the largest body)",
    },
    "transaction_timeout_ms": {"type": int, "metavar": "MS", "help": "first transaction check (6000)"},
    "transaction_check_interval_ms": {"type": int, "metavar": "MS", "help": "between checks (5000)"},
    "drain_timeout_s": {"type": float, "metavar": "S", "help": "shutdown drain time (default 5)"},
    "event_loop": {"choices": EVENT_LOOPS, "help": "asyncio event loop (default uvloop)"},
    "log_level": {"choices": LOG_LEVELS, "help": "log level (default info)"},
    "tls_cert": {"metavar": "PEM", "help": "PEM certificate chain: enables TLS listeners"},
    "tls_key": {"metavar": "PEM", "help": "private key of --tls-cert (default: inside the cert file)"},
    "mqtt_tls_port": {"type": int, "metavar": "N", "help": "MQTT over TLS port (default 8883)"},
    "amqp_tls_port": {"type": int, "metavar": "N", "help": "AMQP over TLS port (default 5671)"},
    "https_port": {"type": int, "metavar": "N", "help": "HTTPS port, with --tls-cert (default 8443)"},
    "grpc_plain": {
        "action": argparse.BooleanOptionalAction,
        "help": "with --tls-cert, keep the gRPC port in clear (default: TLS only)",
    },
    "tls_required": {
        "action": argparse.BooleanOptionalAction,
        "help": "remoting port: refuse clients that do not start TLS (default: both served)",
    },
    "tls_client_ca": {"metavar": "PEM", "help": "CA to ask for and verify client certificates with"},
    "tls_require_client_cert": {
        "action": argparse.BooleanOptionalAction,
        "help": "refuse TLS clients without a certificate signed by --tls-client-ca",
    },
    "mqtt_cert_identity": {
        "action": argparse.BooleanOptionalAction,
        "help": "MQTT over TLS: the client certificate's CN is the user (no password)",
    },
    "mqtt_ws": {
        "action": argparse.BooleanOptionalAction,
        "help": "MQTT over WebSocket on --mqtt-ws-port, and --mqtt-wss-port with --tls-cert (default on)",
    },
    "mqtt_ws_port": {"type": int, "metavar": "N", "help": "MQTT over WebSocket port (default 8083)"},
    "mqtt_wss_port": {"type": int, "metavar": "N", "help": "MQTT over secure WebSocket port (default 8084)"},
    "mqtt_ws_path": {"metavar": "PATH", "help": "MQTT over WebSocket request path (default /mqtt)"},
    "amqp_mqtt_exchange": {
        "metavar": "NAME",
        "help": "AMQP exchange of vhost / that MQTT topics map to (default amq.topic; '' = none)",
    },
    "amqp_max_body_size": {
        "type": int,
        "metavar": "BYTES",
        "help": "largest AMQP message body (default 16 MiB, as RabbitMQ 4)",
    },
    "mqtt_max_keep_alive": {"type": int, "metavar": "S", "help": "longest MQTT keep-alive allowed (0 = any)"},
    "sys_interval": {
        "type": int,
        "metavar": "S",
        "help": "seconds between MQTT $SYS/broker/... updates (10; 0 = off)",
    },
    "client_events": {
        "action": argparse.BooleanOptionalAction,
        "help": "client connect/disconnect/subscribe/auth-failure events: $events/#, amq.rabbitmq.event",
    },
    "tombstone_retention": {
        "metavar": "DURATION",
        "help": "compacted topics: keep a deleted key's tombstone this long (24h; 30m, 90s, 500ms)",
    },
    "trace_retention": {
        "metavar": "DURATION",
        "help": "keep message trace records this long (24h; 30m, 90s; 0 or off: no tracing)",
    },
    "otlp_endpoint": {
        "metavar": "URL",
        "help": "send message trace events as OpenTelemetry spans to this OTLP/HTTP endpoint (off)",
    },
    "tier_s3_endpoint": {
        "metavar": "URL",
        "help": "tier closed commit log segments to this S3-compatible endpoint (credentials: AWS_* vars)",
    },
    "tier_bucket": {"metavar": "NAME", "help": "bucket of tiered segments (needed with --tier-s3-endpoint)"},
    "tier_after": {
        "metavar": "AGE|SIZE",
        "help": "tier segments older than an age (24h; 30m, 90s) or beyond a local size (10GiB, 512MiB)",
    },
    "disk_free_limit": {
        "metavar": "SIZES",
        "help": "refuse publishes below this free disk: a size, a %% of the volume, or both (the smaller)",
    },
    "mqtt_max_client_id_length": {"type": int, "metavar": "N", "help": "longest MQTT client id (65535)"},
    "mqtt_max_topic_length": {"type": int, "metavar": "N", "help": "longest MQTT topic, bytes (65535)"},
    "mqtt_max_topic_levels": {"type": int, "metavar": "N", "help": "most MQTT topic levels (128)"},
    "mqtt_max_retained_messages": {"type": int, "metavar": "N", "help": "retained messages cap (0 = none)"},
    "mqtt_max_retained_bytes": {"type": int, "metavar": "BYTES", "help": "retained bytes cap (0 = none)"},
    "mqtt_max_queued_messages": {
        "type": int,
        "metavar": "N",
        "help": "offline MQTT session backlog, cut at reconnect (default 0: no cap)",
    },
    "mqtt_max_queued_bytes": {
        "type": int,
        "metavar": "BYTES",
        "help": "offline MQTT session backlog, payload bytes (default 0: no cap)",
    },
    "mqtt_queue_full_policy": {
        "choices": MQTT_QUEUE_FULL_POLICIES,
        "help": "offline MQTT backlog over its cap: drop-oldest (default) or refuse-new (keep the oldest)",
    },
    "amqp_channel_max": {"type": int, "metavar": "N", "help": "AMQP channel_max offered (default 2047)"},
    "amqp_frame_max": {"type": int, "metavar": "BYTES", "help": "AMQP frame_max offered (default 131072)"},
    "amqp_max_queues_per_vhost": {"type": int, "metavar": "N", "help": "AMQP queues per vhost (0 = no cap)"},
    "amqp_max_queues_per_user": {
        "type": int,
        "metavar": "N",
        "help": "AMQP queues one user may declare, over all vhosts (0 = no cap)",
    },
    "cloudevents_dedup_window_s": {
        "type": int,
        "metavar": "S",
        "help": "CloudEvents ingest drops a source+id seen within S seconds (default 0: off)",
    },
    "max_connections": {"type": int, "metavar": "N", "help": "connections per listener (100000; 0 = any)"},
    "max_connections_per_user": {"type": int, "metavar": "N", "help": "connections per user (0 = any)"},
    "max_connection_rate": {
        "type": float,
        "metavar": "PER_S",
        "help": "new connections per second per source address (default 0: off)",
    },
    "connection_burst": {"type": int, "metavar": "N", "help": "connections an address may open at once"},
    "publish_rate_msgs": {"type": float, "metavar": "PER_S", "help": "messages/s per client and per user"},
    "publish_rate_bytes": {"type": int, "metavar": "BYTES", "help": "bytes/s per client and per user"},
    "publish_burst": {"type": float, "metavar": "S", "help": "seconds of publish rate sent at once (1)"},
    "metrics_per_object": {
        "action": argparse.BooleanOptionalAction,
        "help": "per-topic and per-group series in /metrics (default on; always in /metrics/per-object)",
    },
    "metrics_max_objects": {
        "type": int,
        "metavar": "N",
        "help": "topics and groups (each) in the per-object metrics, the busiest first (1000)",
    },
    "max_outbound_bytes_per_connection": {
        "type": int,
        "metavar": "BYTES",
        "help": "unsent bytes per MQTT/AMQP connection above which its deliveries pause (4 MiB; 0 = off)",
    },
    "workers": {
        "metavar": "N",
        "help": "LOCAL mode: N proxy processes on the same ports over one store process; auto: one per core",
    },
    "mode": {
        "choices": MODES,
        "help": "local: embedded store; cluster: proxy over store nodes (default local)",
    },
    "namesrv": {"metavar": "HOST:PORT", "help": "name server(s), ';'-separated (cluster mode)"},
    "cluster_name": {
        "metavar": "NAME",
        "help": "store cluster to use / register in (default DefaultCluster)",
    },
    "proxy_name": {"metavar": "NAME", "help": "name this proxy registers under (default proxy-<host>-<pid>)"},
    "lease_period_s": {"type": float, "metavar": "S", "help": "name server re-registration period (30)"},
    "lease_expiry_s": {"type": float, "metavar": "S", "help": "registration expiry without renewal (120)"},
    "route_refresh_s": {"type": float, "metavar": "S", "help": "store node list refresh period (5)"},
    "cluster_secret_file": {
        "metavar": "FILE",
        "help": "cluster mode: prove this secret to name servers and stores (docs/security.md)",
    },
    "cluster_tls": {
        "action": argparse.BooleanOptionalAction,
        "help": "cluster mode: speak TLS to name servers and store nodes (default off)",
    },
    "cluster_tls_ca": {
        "metavar": "PEM",
        "help": "CA to verify name servers and store nodes with (implies --cluster-tls; default: system)",
    },
    "auth": {
        "action": argparse.BooleanOptionalAction,
        "help": "authenticate every client and apply the ACL rules (default off; docs/security.md)",
    },
    "allow_anonymous": {
        "action": argparse.BooleanOptionalAction,
        "help": "admit clients without credentials: with --auth as the ACL's anonymous principal, "
        "without it on a non-loopback --host (default: refused)",
    },
    "jwt_jwks": {"metavar": "FILE", "help": "device tokens: verify JWTs (RS256/ES256) with this JWKS file"},
    "jwt_public_key": {
        "metavar": "PEM",
        "help": "device tokens: verify JWTs with this RSA or P-256 public key",
    },
    "jwt_secret_file": {
        "metavar": "FILE",
        "help": "device tokens: verify HS256 JWTs with this secret (mode 600)",
    },
    "jwt_user_claim": {"metavar": "CLAIM", "help": "the JWT claim naming the user (default sub)"},
    "jwt_device_claim": {"metavar": "CLAIM", "help": "the JWT claim that %%d stands for in ACL rules"},
    "jwt_audience": {"metavar": "AUD", "help": "refuse JWTs whose aud does not include this"},
    "jwt_issuer": {"metavar": "ISS", "help": "refuse JWTs whose iss is not this"},
    "jwt_leeway_s": {"type": float, "metavar": "S", "help": "clock skew allowed on exp and nbf (default 0)"},
}

# `gateway store`: flag -> Settings field (every one also a GATEWAY_* env var and a TOML key).
_STORE_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "data_dir": ("data_dir", _START_FLAGS["data_dir"]),
    "host": ("host", _START_FLAGS["host"]),
    "port": ("store_port", {"type": int, "metavar": "N", "help": "store protocol port (default 10911)"}),
    "name": (
        "store_name",
        {"metavar": "NAME", "help": "node name in the cluster (default store-<host>-<port>)"},
    ),
    "namesrv": ("namesrv", {"metavar": "HOST:PORT", "help": "name server(s) to register with"}),
    "cluster_name": ("cluster_name", _START_FLAGS["cluster_name"]),
    "advertise_host": ("advertise_host", {"metavar": "ADDR", "help": "host proxies connect to"}),
    "flush": ("flush", _START_FLAGS["flush"]),
    "default_queues": ("default_queues", _START_FLAGS["default_queues"]),
    "max_body_size": ("max_body_size", _START_FLAGS["max_body_size"]),
    "segment_size_mib": ("segment_size_mib", _START_FLAGS["segment_size_mib"]),
    "disk_free_limit": ("disk_free_limit", _START_FLAGS["disk_free_limit"]),
    "tombstone_retention": ("tombstone_retention", _START_FLAGS["tombstone_retention"]),
    "tier_s3_endpoint": ("tier_s3_endpoint", _START_FLAGS["tier_s3_endpoint"]),
    "tier_bucket": ("tier_bucket", _START_FLAGS["tier_bucket"]),
    "tier_after": ("tier_after", _START_FLAGS["tier_after"]),
    "transaction_timeout_ms": ("transaction_timeout_ms", _START_FLAGS["transaction_timeout_ms"]),
    "transaction_check_interval_ms": (
        "transaction_check_interval_ms",
        _START_FLAGS["transaction_check_interval_ms"],
    ),
    "lease_period_s": ("lease_period_s", _START_FLAGS["lease_period_s"]),
    "lease_expiry_s": ("lease_expiry_s", _START_FLAGS["lease_expiry_s"]),
    "cluster_secret_file": (
        "cluster_secret_file",
        {"metavar": "FILE", "help": "every connection to this node, and its own, prove this secret first"},
    ),
    "tls_cert": (
        "tls_cert",
        {"metavar": "PEM", "help": "PEM certificate chain: the node's port serves TLS only"},
    ),
    "tls_key": ("tls_key", _START_FLAGS["tls_key"]),
    "tls_client_ca": ("tls_client_ca", _START_FLAGS["tls_client_ca"]),
    "tls_require_client_cert": ("tls_require_client_cert", _START_FLAGS["tls_require_client_cert"]),
    "cluster_tls": ("cluster_tls", _START_FLAGS["cluster_tls"]),
    "cluster_tls_ca": ("cluster_tls_ca", _START_FLAGS["cluster_tls_ca"]),
    "group": (
        "store_group",
        {"metavar": "NAME", "help": "replica group of this node (needs --controller; docs/cluster.md)"},
    ),
    "controller": (
        "controller",
        {"metavar": "URLS", "help": "etcd client URL(s) of the replica groups' controller, comma separated"},
    ),
    "replication": (
        "replication",
        {
            "choices": ("sync", "async"),
            "help": "acknowledge a send when --min-insync nodes hold it (sync, "
            "default) or when the primary does (async)",
        },
    ),
    "min_insync": (
        "min_insync",
        {
            "type": int,
            "metavar": "N",
            "help": "sync: nodes, the primary included, that must hold a send (default 2)",
        },
    ),
    "drain_timeout_s": ("drain_timeout_s", _START_FLAGS["drain_timeout_s"]),
    "event_loop": ("event_loop", _START_FLAGS["event_loop"]),
    "log_level": ("log_level", _START_FLAGS["log_level"]),
}


def _arg_type(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a parser so that argparse reports its ConfigError/ValueError as a usage error."""

    def parse(text: str) -> Any:
        try:
            return fn(text)
        except (ConfigError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = getattr(fn, "__name__", "value")
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="Multi-protocol messaging gateway.", epilog=CREDENTIALS_HELP
    )
    parser.add_argument("--user", dest="g_user", metavar="NAME", help="admin commands: log in as this user")
    parser.add_argument(
        "--password-stdin",
        dest="g_password_stdin",
        action="store_true",
        help="admin commands: read --user's password from the first line of stdin",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser("start", help="open the store and serve until SIGTERM/SIGINT")
    start.add_argument("--config", metavar="FILE", help="TOML settings file")
    for field, opts in _START_FLAGS.items():
        opts = dict(opts)
        if "type" in opts and opts["type"] is not int and opts["type"] is not float:
            opts["type"] = _arg_type(opts["type"])
        start.add_argument("--" + field.replace("_", "-"), dest=field, default=None, **opts)
    # set by the supervisor of `--workers N` for each worker it starts (gateway/workers)
    start.add_argument("--worker-of", metavar="DIR", help=argparse.SUPPRESS)
    start.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)

    store = sub.add_parser("store", help="run a CLUSTER mode store node until SIGTERM/SIGINT")
    store.add_argument("--config", metavar="FILE", help="TOML settings file")
    for flag, (field, opts) in _STORE_FLAGS.items():
        store.add_argument("--" + flag.replace("_", "-"), dest=field, default=None, **opts)

    from namesrv.cli import add_parser as add_namesrv_parser

    add_namesrv_parser(sub)

    from analytics.cli import add_parser as add_analytics_parser

    add_analytics_parser(sub)

    from bridge.cli import add_parser as add_bridge_parser

    add_bridge_parser(sub)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=None,
        help="the gateway's HTTP address (default $GATEWAY_URL, else http://127.0.0.1:8082)",
    )
    common.add_argument("--json", action="store_true", help="print the API's JSON answer")
    creds = argparse.ArgumentParser(add_help=False)
    creds.add_argument("--user", dest="auth_user", metavar="NAME", help="log in as this admin user")
    creds.add_argument(
        "--password-stdin",
        dest="auth_password_stdin",
        action="store_true",
        help="read the admin user's password from the first line of stdin",
    )

    topic = sub.add_parser("topic", help="manage topics of a running gateway").add_subparsers(
        dest="action", required=True
    )
    p = topic.add_parser("create", parents=[common, creds], help="create (or update) a topic")
    p.add_argument("name")
    p.add_argument("--queues", type=int, metavar="N", help="number of queues (default: gateway default)")
    p.add_argument("--retention-ms", type=int, metavar="MS", help="keep messages this long")
    p.add_argument("--retention-bytes", type=int, metavar="BYTES", help="keep at most this much")
    p.add_argument(
        "--compacted",
        action="store_true",
        default=None,
        help="a compacted topic: the latest record per message key wins, an empty body deletes its key",
    )
    p = topic.add_parser(
        "update",
        parents=[common, creds],
        help="grow or shrink a topic's queues in place (no message moves; docs/store.md)",
    )
    p.add_argument("name")
    p.add_argument("--queues", type=int, metavar="N", required=True, help="queues per store from now on")
    topic.add_parser("list", parents=[common, creds], help="list topics")
    p = topic.add_parser("get", parents=[common, creds], help="a topic's queues, offsets and group backlogs")
    p.add_argument("name")
    p = topic.add_parser("delete", parents=[common, creds], help="delete a topic")
    p.add_argument("name")

    group = sub.add_parser("group", help="manage consumer groups of a running gateway").add_subparsers(
        dest="action", required=True
    )
    p = group.add_parser("create", parents=[common, creds], help="create (or update) a consumer group")
    p.add_argument("name")
    p.add_argument("--max-attempts", type=int, metavar="N", help="deliveries before the DLQ (default 16)")
    p.add_argument("--retry-initial-ms", type=int, metavar="MS", help="first retry back-off (default 1000)")
    p.add_argument("--retry-multiplier", type=float, metavar="X", help="back-off growth (default 2)")
    p.add_argument("--retry-max-ms", type=int, metavar="MS", help="back-off cap (default 60000)")
    group.add_parser("list", parents=[common, creds], help="list consumer groups with backlog")
    p = group.add_parser("get", parents=[common, creds], help="a group's settings and backlog per topic")
    p.add_argument("name")
    p = group.add_parser("delete", parents=[common, creds], help="delete a consumer group")
    p.add_argument("name")

    client = sub.add_parser("client", help="connected clients of a running gateway").add_subparsers(
        dest="action", required=True
    )
    client.add_parser("list", parents=[common, creds], help="list registered clients")
    _add_security_commands(sub, common, creds)
    _add_message_commands(sub, common, creds)
    return parser


CREDENTIALS_HELP = (
    "Admin commands authenticate with --user NAME and --password-stdin (the password as the first "
    "line of stdin), else $GATEWAY_USER and $GATEWAY_PASSWORD, else $GATEWAY_TOKEN (an API token). "
    "Where a command has its own --user or --password-stdin (user add, user passwd, token create, "
    "acl add), give the credentials before the command (gateway --user admin --password-stdin user "
    "add ...) or in the environment."
)


def _add_security_commands(
    sub: argparse._SubParsersAction, common: argparse.ArgumentParser, creds: argparse.ArgumentParser
) -> None:
    """`gateway user|token|acl ...`: identities and ACL rules through the admin API."""

    user = sub.add_parser("user", help="users of a running gateway (auth on)", epilog=CREDENTIALS_HELP)
    users = user.add_subparsers(dest="action", required=True)
    p = users.add_parser(
        "add",
        parents=[common],
        help="create a user",
        epilog="With both --password-stdin and --secret-key-stdin, stdin holds two lines: the password, "
        "then the secret key (after the admin's password when that comes from stdin too). "
        + CREDENTIALS_HELP,
    )
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", help="read the new user's password from stdin")
    p.add_argument("--role", choices=("admin", "user"), default="user", help="default user")
    p.add_argument("--access-key", metavar="AK", help="RocketMQ AccessKey (needs --secret-key-stdin)")
    p.add_argument("--secret-key-stdin", action="store_true", help="read the SecretKey from stdin")
    p.add_argument("--vhosts", metavar="LIST", help="AMQP virtual hosts the user may open (default /)")
    users.add_parser("list", parents=[common, creds], help="list users (never passwords or secrets)")
    p = users.add_parser(
        "passwd",
        parents=[common],
        help="set a user's password",
        epilog="The new password is the last line read from stdin. " + CREDENTIALS_HELP,
    )
    p.add_argument("name")
    p.add_argument("--password-stdin", action="store_true", required=True, help="read it from stdin")
    p = users.add_parser("delete", parents=[common, creds], help="delete a user and its tokens")
    p.add_argument("name")

    token = sub.add_parser("token", help="API tokens (HTTP Bearer)", epilog=CREDENTIALS_HELP)
    tokens = token.add_subparsers(dest="action", required=True)
    p = tokens.add_parser(
        "create",
        parents=[common],
        help="create a token; its text is printed this once",
        epilog=CREDENTIALS_HELP,
    )
    p.add_argument("name", help="what the token is for")
    p.add_argument("--user", help="whose token (default: the user running the command)")
    tokens.add_parser("list", parents=[common, creds], help="list tokens (never their text)")
    p = tokens.add_parser("revoke", parents=[common, creds], help="revoke a token")
    p.add_argument("id")

    acl = sub.add_parser("acl", help="ACL rules (docs/security.md)", epilog=CREDENTIALS_HELP)
    rules = acl.add_subparsers(dest="action", required=True)
    p = rules.add_parser(
        "add",
        parents=[common],
        help="add a rule: a deny that matches wins over an allow",
        epilog="Patterns use MQTT syntax (+, #) with %%u (user name) and %%c (client id). "
        + CREDENTIALS_HELP,
    )
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--user", metavar="NAME", help="the rule is for this user")
    who.add_argument("--role", choices=("admin", "user"), help="the rule is for every user of this role")
    who.add_argument("--anyone", action="store_true", help="the rule is for every authenticated user")
    who.add_argument(
        "--anonymous",
        action="store_true",
        help="the rule is for clients without credentials (--allow-anonymous)",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--topic", metavar="PATTERN", help="topic paths (devices/%%u/#)")
    what.add_argument("--group", metavar="PATTERN", help="consumer group names")
    p.add_argument("--actions", required=True, metavar="LIST", help="comma list of publish,subscribe,admin")
    p.add_argument("--deny", action="store_true", help="deny instead of allow")
    rules.add_parser("list", parents=[common, creds], help="list rules")
    p = rules.add_parser("delete", parents=[common, creds], help="delete a rule")
    p.add_argument("id")
    rules.add_parser("export", parents=[common, creds], help="print the policy (users, rules) as TOML")
    p = rules.add_parser("import", parents=[common, creds], help="apply a policy file (TOML)")
    p.add_argument("file", help="the policy file ('-': stdin)")
    p.add_argument(
        "--merge", action="store_true", help="keep stored rules the file lacks (default: remove them)"
    )


def _add_message_commands(
    sub: argparse._SubParsersAction, common: argparse.ArgumentParser, creds: argparse.ArgumentParser
) -> None:
    """`gateway message get|find|trace` and `gateway dlq list|redrive` (the message browser API)."""
    message = sub.add_parser("message", help="read, find and trace messages of a running gateway")
    messages = message.add_subparsers(dest="action", required=True)
    p = messages.add_parser("get", parents=[common, creds], help="messages of a topic by queue and offset")
    p.add_argument("topic")
    p.add_argument("--offset", type=int, metavar="N", help="first queue offset (default: each queue's min)")
    p.add_argument("--queue", type=int, metavar="Q", help="one queue (default: every queue)")
    p.add_argument("--count", type=int, metavar="C", help="at most this many messages (default 20)")
    p.add_argument("--format", choices=("text", "json", "hex"), default="text", help="how to print bodies")
    p = messages.add_parser("find", parents=[common, creds], help="messages by key (or by --id)")
    p.add_argument("--key", metavar="K", help="a message key")
    p.add_argument("--id", metavar="ID", help="a message id")
    p.add_argument("--format", choices=("text", "json", "hex"), default="text", help="how to print bodies")
    p = messages.add_parser("trace", parents=[common, creds], help="a message's lifecycle as a timeline")
    p.add_argument("id")
    dlq = sub.add_parser("dlq", help="dead letters of a consumer group").add_subparsers(
        dest="action", required=True
    )
    p = dlq.add_parser("list", parents=[common, creds], help="a group's dead letters, oldest first")
    p.add_argument("group")
    p.add_argument("--count", type=int, metavar="C", help="at most this many (default 100)")
    p.add_argument("--pending", action="store_true", help="only those not redriven yet")
    p = dlq.add_parser(
        "redrive", parents=[common, creds], help="send dead letters back to their topic (each at most once)"
    )
    p.add_argument("group")
    p.add_argument("--ids", nargs="+", metavar="ID", help="these dead letters (default: every pending one)")


def _message_command(args: argparse.Namespace, client: Any) -> int:
    """`gateway message|dlq ...`; AdminError propagates. A redrive draws its progress on stderr."""
    from gateway import admin_client as ac

    cmd = (args.command, args.action)
    out: Any
    if cmd == ("message", "get"):
        out = client.browse(args.topic, args.offset, args.queue, args.count)
        text = ac.render_messages(out, args.format)
    elif cmd == ("message", "find"):
        if (args.key is None) == (args.id is None):
            raise ac.AdminError("give one of --key K or --id ID")
        out = client.find_messages(args.key) if args.key is not None else client.get_message(args.id)
        text = ac.render_messages(out, args.format)
    elif cmd == ("message", "trace"):
        out = client.trace(args.id)
        text = ac.render_trace(out)
    elif cmd == ("dlq", "list"):
        out = client.dead_letters(args.group, args.count, pending=args.pending)
        text = ac.render_dead_letters(out)
    elif cmd == ("dlq", "redrive"):
        drawn = False

        def progress(done: int, total: int) -> None:  # a bar for redrives of more than one request
            nonlocal drawn
            if total > ac.REDRIVE_CHUNK:
                print("\r" + ac.progress_bar(done, total), end="", file=sys.stderr, flush=True)
                drawn = True

        out = client.redrive_in_chunks(args.group, args.ids, progress)
        if drawn:
            print(file=sys.stderr)
        text = f"redrove {out['redriven']} dead letter(s) of {args.group}"
    else:  # pragma: no cover - argparse only produces the commands above
        raise ac.AdminError(f"unknown command {' '.join(cmd)}")
    print(ac.dumps(out) if args.json else text)
    return 0


def settings_from_args(args: argparse.Namespace, env: dict[str, str] | None = None) -> Settings:
    fields = [f for f, _ in _STORE_FLAGS.values()] if args.command == "store" else list(_START_FLAGS)
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


def _start(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        check_exposure(settings)
        _check_cluster_secret(settings)
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, f"worker-{args.worker_index}" if args.worker_of else None)
    if settings.log_level != "debug":
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    from gateway.server import run  # imported late: `gateway --help` must work even if a module is broken

    if args.worker_of:
        from gateway.workers import WorkerLink

        main = run(settings, worker=WorkerLink(args.worker_of, args.worker_index))
    elif settings.workers > 1:
        from gateway.workers import supervise

        main = supervise(settings, args.argv)
    else:
        main = run(settings)
    # grpc.aio runs on uvloop (checked with grpcio 1.85: unary, bidi streaming, graceful stop);
    # `--event-loop asyncio` is the fallback should an adapter misbehave on it.
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop, log)) as runner:
        return runner.run(main)


def _store(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        _check_cluster_secret(settings)
    except ConfigError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level)
    from gateway.store_process import serve

    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop, log)) as runner:
        return runner.run(serve(settings))


class _Stdin:
    """Secrets read from stdin, one per line, in the order asked (a prompt without echo on a tty)."""

    def __init__(self) -> None:
        self.read = 0

    def line(self, what: str) -> str:
        from gateway.admin_client import AdminError

        if sys.stdin is None:
            raise AdminError(f"no stdin to read {what} from")
        if sys.stdin.isatty():
            import getpass

            text = getpass.getpass(f"{what}: ")
        else:
            text = sys.stdin.readline()
            if not text:
                raise AdminError(f"stdin ended before {what} (line {self.read + 1})")
            text = text.rstrip("\r\n")
        self.read += 1
        if not text:
            raise AdminError(f"{what} is empty")
        return text


def _credentials(args: argparse.Namespace, stdin: _Stdin, env: Mapping[str, str]) -> tuple[str, ...] | None:
    """How admin commands authenticate (see CREDENTIALS_HELP); None: no credentials."""
    from gateway.admin_client import AdminError

    user = getattr(args, "auth_user", None) or getattr(args, "g_user", None)
    from_stdin = getattr(args, "auth_password_stdin", False) or getattr(args, "g_password_stdin", False)
    user = user or env.get("GATEWAY_USER")
    if not user and not from_stdin and env.get("GATEWAY_TOKEN"):
        return ("bearer", env["GATEWAY_TOKEN"])
    if not user:
        if from_stdin:
            raise AdminError("--password-stdin needs --user (or GATEWAY_USER)")
        return None
    password = stdin.line(f"password of {user}") if from_stdin else env.get("GATEWAY_PASSWORD")
    if not password:
        raise AdminError(f"no password for {user}: use --password-stdin or set GATEWAY_PASSWORD")
    return ("basic", user, password)


def _admin(args: argparse.Namespace) -> int:
    from gateway import admin_client as ac

    url = args.url or os.environ.get("GATEWAY_URL") or ac.DEFAULT_URL
    stdin = _Stdin()
    try:
        client = ac.AdminClient(url, auth=_credentials(args, stdin, os.environ))
        if args.command in ("user", "token", "acl"):
            return _security_command(args, client, stdin)
        if args.command in ("message", "dlq"):
            return _message_command(args, client)
    except ac.AdminError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 1
    cmd = (args.command, args.action)
    try:
        if cmd == ("topic", "create"):
            out = client.create_topic(
                args.name,
                queues=args.queues,
                retention_ms=args.retention_ms,
                retention_bytes=args.retention_bytes,
                compacted=args.compacted,
            )
            text = ac.render_topics([out])
        elif cmd == ("topic", "update"):
            out = client.update_topic(args.name, args.queues)
            text = ac.render_topics([out])
        elif cmd == ("topic", "list"):
            out = client.list_topics()
            text = ac.render_topics(out)
        elif cmd == ("topic", "get"):
            out = client.get_topic(args.name)
            text = ac.render_topic(out)
        elif cmd == ("topic", "delete"):
            client.delete_topic(args.name)
            out, text = {"deleted": args.name}, f"deleted topic {args.name}"
        elif cmd == ("group", "create"):
            out = client.create_group(
                args.name,
                max_attempts=args.max_attempts,
                retry_initial_ms=args.retry_initial_ms,
                retry_multiplier=args.retry_multiplier,
                retry_max_ms=args.retry_max_ms,
            )
            text = ac.render_groups([out])
        elif cmd == ("group", "list"):
            out = client.list_groups()
            text = ac.render_groups(out)
        elif cmd == ("group", "get"):
            out = client.get_group(args.name)
            text = ac.render_group(out)
        elif cmd == ("group", "delete"):
            client.delete_group(args.name)
            out, text = {"deleted": args.name}, f"deleted group {args.name}"
        elif cmd == ("client", "list"):
            out = client.list_clients()
            text = ac.render_clients(out)
        else:  # pragma: no cover - argparse only produces the commands above
            raise ac.AdminError(f"unknown command {' '.join(cmd)}")
    except ac.AdminError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 1
    print(ac.dumps(out) if args.json else text)
    return 0


def _security_command(args: argparse.Namespace, client: Any, stdin: _Stdin) -> int:
    """`gateway user|token|acl ...`; AdminError propagates."""
    from gateway import admin_client as ac

    cmd = (args.command, args.action)
    out: Any
    if cmd == ("user", "add"):
        if (args.access_key is None) != (not args.secret_key_stdin):
            raise ac.AdminError("--access-key and --secret-key-stdin go together")
        password = stdin.line(f"password of {args.name}") if args.password_stdin else None
        secret = stdin.line(f"secret key of {args.name}") if args.secret_key_stdin else None
        vhosts = [v.strip() for v in args.vhosts.split(",") if v.strip()] if args.vhosts else None
        out = client.add_user(
            args.name,
            password=password,
            role=args.role,
            access_key=args.access_key,
            secret_key=secret,
            vhosts=vhosts,
        )
        text = ac.render_users([out])
    elif cmd == ("user", "list"):
        out = client.list_users()
        text = ac.render_users(out)
    elif cmd == ("user", "passwd"):
        client.set_password(args.name, stdin.line(f"new password of {args.name}"))
        out, text = {"user": args.name, "password": True}, f"password of {args.name} set"
    elif cmd == ("user", "delete"):
        client.delete_user(args.name)
        out, text = {"deleted": args.name}, f"deleted user {args.name}"
    elif cmd == ("token", "create"):
        out = client.create_token(args.name, args.user)
        if not args.json:
            print(
                f"token {out['id']} ({out['name']}) for user {out['user']}: shown only now, keep it safe",
                file=sys.stderr,
            )
        text = out["token"]
    elif cmd == ("token", "list"):
        out = client.list_tokens()
        text = ac.render_tokens(out)
    elif cmd == ("token", "revoke"):
        client.revoke_token(args.id)
        out, text = {"revoked": args.id}, f"revoked token {args.id}"
    elif cmd == ("acl", "add"):
        who = "anonymous" if args.anonymous else "anyone"
        subject = f"user:{args.user}" if args.user else f"role:{args.role}" if args.role else who
        kind, pattern = ("topic", args.topic) if args.topic is not None else ("group", args.group)
        actions = [a.strip().lower() for a in args.actions.split(",") if a.strip()]
        out = client.add_rule(subject, kind, pattern, actions, "deny" if args.deny else "allow")
        text = ac.render_rules([out])
    elif cmd == ("acl", "list"):
        out = client.list_rules()
        text = ac.render_rules(out)
    elif cmd == ("acl", "delete"):
        client.delete_rule(args.id)
        out, text = {"deleted": args.id}, f"deleted rule {args.id}"
    elif cmd == ("acl", "export"):
        sys.stdout.write(client.export_policy())
        return 0
    elif cmd == ("acl", "import"):
        try:
            if args.file == "-":
                policy = sys.stdin.read()
            else:
                with open(args.file, encoding="utf-8") as fh:
                    policy = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ac.AdminError(f"cannot read {args.file}: {e}") from e
        out = client.import_policy(policy, replace=not args.merge)
        text = f"imported {out['users']} user(s) and {out['rules']} rule(s); removed {out['removed']} rule(s)"
    else:  # pragma: no cover - argparse only produces the commands above
        raise ac.AdminError(f"unknown command {' '.join(cmd)}")
    print(ac.dumps(out) if getattr(args, "json", False) else text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `--workers`: what each worker is given
    if args.command == "start":
        return _start(args)
    if args.command == "store":
        return _store(args)
    if args.command == "namesrv":
        from namesrv.cli import run

        return run(args)
    if args.command == "analytics":
        from analytics.cli import run as run_analytics

        return run_analytics(args)
    if args.command == "bridge":
        from bridge.cli import run as run_bridge

        return run_bridge(args)
    return _admin(args)


__all__ = ["build_parser", "main", "settings_from_args"]

if __name__ == "__main__":
    sys.exit(main())
